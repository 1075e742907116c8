// Implementation of server/engine/cuda/context.h.
#include "server/engine/cuda/context.h"

#include "common/status.h"
#include "server/engine/cuda/kernels.h"

namespace orthoserve::cuda {

void Slot::Clear() {
  members.clear();
  pinned_in.Reset();
  pinned_out.Reset();
  io.Reset();
  x0.Reset();
  x1.Reset();
  a.Reset();
  b.Reset();
  norms.Reset();
}

absl::StatusOr<std::unique_ptr<Context>> Context::Create() {
  auto ctx = std::make_unique<Context>();
  ASSIGN_OR_RETURN(ctx->h2d, CreateStream());
  ASSIGN_OR_RETURN(ctx->compute, CreateStream());
  ASSIGN_OR_RETURN(ctx->d2h, CreateStream());
  for (int i = 0; i < kSideLanes; ++i) {
    ASSIGN_OR_RETURN(ctx->side_streams[i], CreateStream());
    ASSIGN_OR_RETURN(ctx->side_done[i], CreateEvent());
  }
  ASSIGN_OR_RETURN(ctx->fork, CreateEvent());
  ASSIGN_OR_RETURN(ctx->lt, LtGemm::Create());
  ASSIGN_OR_RETURN(ctx->workspaces, AllocateDevice((1 + kSideLanes) * kWorkspaceBytes));
  ASSIGN_OR_RETURN(ctx->scratch, AllocateDevice((kSumSquaresMaxScratch + 8) * sizeof(double)));
  ASSIGN_OR_RETURN(ctx->host_scalars, AllocatePinned(8 * sizeof(double)));
  for (Slot& slot : ctx->slots) {
    ASSIGN_OR_RETURN(slot.uploaded, CreateEvent());
    ASSIGN_OR_RETURN(slot.computed, CreateEvent());
    ASSIGN_OR_RETURN(slot.downloaded, CreateEvent());
  }
  return ctx;
}

BlasDevice Context::Blas(const GemmPrecision& precision, int64_t symmetric_min_size) const {
  char* ws = static_cast<char*>(workspaces.get());
  BlasDevice dev;
  dev.lt = lt.get();
  dev.main = Lane{compute.get(), Workspace{ws, kWorkspaceBytes}, nullptr};
  for (int i = 0; i < kSideLanes; ++i) {
    dev.side.push_back(Lane{side_streams[i].get(), Workspace{ws + (1 + i) * kWorkspaceBytes, kWorkspaceBytes},
                            side_done[i].get()});
  }
  dev.fork = fork.get();
  dev.precision = precision;
  dev.symmetric_min_size = symmetric_min_size;
  return dev;
}

double* Context::sumsq_scratch() const { return static_cast<double*>(scratch.get()); }
double* Context::device_scalar(int i) const { return static_cast<double*>(scratch.get()) + kSumSquaresMaxScratch + i; }
double* Context::host_scalar(int i) const { return static_cast<double*>(host_scalars.get()) + i; }

void Context::SyncAll() {
  cudaStreamSynchronize(h2d.get());
  cudaStreamSynchronize(compute.get());
  cudaStreamSynchronize(d2h.get());
  for (const Stream& s : side_streams) cudaStreamSynchronize(s.get());
  // Clear the error state left by whatever failed, so that it is not reported again by the next
  // launch of another task (sticky device errors are reported again anyway).
  cudaGetLastError();
}

}  // namespace orthoserve::cuda
