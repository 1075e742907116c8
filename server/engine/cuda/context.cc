// Implementation of server/engine/cuda/context.h.
#include "server/engine/cuda/context.h"

#include "common/status.h"
#include "server/engine/cuda/kernels.h"

namespace orthoserve::cuda {

void Slot::Clear() {
  task = nullptr;
  pinned_in.Reset();
  pinned_out.Reset();
  io.Reset();
  x0.Reset();
  x1.Reset();
  a.Reset();
  b.Reset();
}

absl::StatusOr<std::unique_ptr<Context>> Context::Create() {
  auto ctx = std::make_unique<Context>();
  ASSIGN_OR_RETURN(ctx->h2d, CreateStream());
  ASSIGN_OR_RETURN(ctx->compute, CreateStream());
  ASSIGN_OR_RETURN(ctx->d2h, CreateStream());
  ASSIGN_OR_RETURN(ctx->blas, CreateCublas(ctx->compute.get()));
  ASSIGN_OR_RETURN(ctx->scratch, AllocateDevice((kSumSquaresScratch + 8) * sizeof(double)));
  ASSIGN_OR_RETURN(ctx->host_scalars, AllocatePinned(8 * sizeof(double)));
  for (Slot& slot : ctx->slots) {
    ASSIGN_OR_RETURN(slot.uploaded, CreateEvent());
    ASSIGN_OR_RETURN(slot.computed, CreateEvent());
    ASSIGN_OR_RETURN(slot.downloaded, CreateEvent());
  }
  return ctx;
}

double* Context::sumsq_scratch() const { return static_cast<double*>(scratch.get()); }
double* Context::device_scalar(int i) const { return static_cast<double*>(scratch.get()) + kSumSquaresScratch + i; }
double* Context::host_scalar(int i) const { return static_cast<double*>(host_scalars.get()) + i; }

void Context::SyncAll() {
  cudaStreamSynchronize(h2d.get());
  cudaStreamSynchronize(compute.get());
  cudaStreamSynchronize(d2h.get());
}

}  // namespace orthoserve::cuda
