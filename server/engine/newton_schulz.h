// The engine's entry point: orthogonalize matrices on a Backend with the whole numerics
// contract of docs/numerics.md — option defaults resolved, split_qkv, the N-d view, the scale factor.
// Knows nothing of gRPC or collectives; the distributed algorithms call it on assembled
// matrices and the RPC layer calls it for lone clients.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "common/ns_options.h"
#include "common/shape.h"
#include "server/engine/backend.h"

namespace orthoserve {

// One matrix (or one block orthogonalized on its own) to orthogonalize.
struct MatrixJob {
  std::string name;          // Names the matrix in error messages.
  Matrix2d shape;            // 2-D view of `in`/`out`.
  Matrix2d scale_shape;      // Shape the scale factor is computed from (usually `shape`).
  DType in_dtype = DType::kF32;
  const void* in = nullptr;  // shape.rows × shape.cols elements, row-major, in `space`.
  DType out_dtype = DType::kF32;
  void* out = nullptr;
  const NsOptions* options = nullptr;
  // > 0: `shape` stacks shape.rows / batch_rows matrices of batch_rows rows (an ND_LAYOUT_BATCH
  // tensor), each orthogonalized and scaled on its own; then scale_shape must equal shape and
  // split_qkv be empty. 0: the job is one matrix.
  int64_t batch_rows = 0;
  // Where `in` and `out` live: host memory, or the backend's device memory (Backend::memory(),
  // whose space must then be kDevice). split_qkv's gathers then stay in that memory too.
  MemorySpace space = MemorySpace::kHost;
};

// Resolves options into kernel arguments for a rows × cols matrix whose scale factor is that of
// `scale_shape`. Requires ValidateNsOptions(options) to pass.
NsKernelArgs ResolveKernelArgs(const NsOptions& options, Matrix2d shape, Matrix2d scale_shape);

// Orthogonalizes each job: out = scale(scale_shape) · NS(in), with split_qkv applied when the
// options ask for it (Q, K and V gathered across query groups, each orthogonalized and scaled
// as its own matrix, written back interleaved), and each matrix of a batch job on its own.
// The options must have passed ValidateNsOptions (the server validates a matrix once, where it
// enters the process: server/plan/matrix_checks.h); the engine checks only what guards its
// buffers and shapes. Returns one status per job: INVALID_ARGUMENT for a missing buffer, a
// non-positive shape, a split_qkv that does not divide the rows or a batch_rows that does not
// (naming the job), or the backend's error.
// Thread-safe as the backend is.
std::vector<absl::Status> Orthogonalize(Backend& backend, absl::Span<const MatrixJob> jobs);

// Convenience for one job.
absl::Status OrthogonalizeOne(Backend& backend, const MatrixJob& job);

// One participant's side of TP_DISTRIBUTED NS of a matrix of global 2-D shape `global`, sharded
// along `partition_dim`. `shards` are this participant's trainer shards (their `shape` in the
// matrix's orientation). split_qkv splits each shard locally (shard rows must be divisible by
// q+k+v for partition_dim 0) and runs Q, K and V as three sharded matrices, each scaled by its
// global shape. Every participant must call this with the same options and global shape.
absl::Status OrthogonalizeSharded(Backend& backend, const std::string& name, Matrix2d global, int partition_dim,
                                  const NsOptions& options, absl::Span<const NsShard> shards, SumReducer& reducer);

}  // namespace orthoserve
