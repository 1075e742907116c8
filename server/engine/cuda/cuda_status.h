// Turns cudaError_t and cublasStatus_t into absl::Status at the call site, with the library's
// own name and message for the error. Only for code inside server/engine/cuda.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace orthoserve::cuda {

// OK for cudaSuccess. Otherwise "<call>: <cudaErrorName>: <message>" with code
// RESOURCE_EXHAUSTED for an allocation failure, FAILED_PRECONDITION when there is no usable
// device (no device, no driver, driver too old), INTERNAL for everything else.
absl::Status CudaCall(cudaError_t error, absl::string_view call);

// OK for CUBLAS_STATUS_SUCCESS, otherwise INTERNAL "<call>: CUBLAS_STATUS_...: <message>"
// (RESOURCE_EXHAUSTED for CUBLAS_STATUS_ALLOC_FAILED).
absl::Status CublasCall(cublasStatus_t status, absl::string_view call);

}  // namespace orthoserve::cuda
