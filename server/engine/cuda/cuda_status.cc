// Implementation of server/engine/cuda/cuda_status.h.
#include "server/engine/cuda/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace orthoserve::cuda {

absl::Status CudaCall(cudaError_t error, absl::string_view call) {
  if (error == cudaSuccess) return absl::OkStatus();
  std::string message = absl::StrCat(call, ": ", cudaGetErrorName(error), ": ", cudaGetErrorString(error));
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorCallRequiresNewerDriver:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorNotSupported:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status CublasCall(cublasStatus_t status, absl::string_view call) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  std::string message = absl::StrCat(call, ": ", cublasLtGetStatusName(status), ": ", cublasLtGetStatusString(status));
  if (status == CUBLAS_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

}  // namespace orthoserve::cuda
