// Internal to server/distributed: the state one ExecuteBatch call shares between the algorithm
// files — the plan, this rank's blocks indexed by (matrix, trainer rank), the per-matrix
// statuses, the memory the batch's blocks are kept in, and the timed wrappers around the
// collective and the backend.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/collective/collective.h"
#include "server/distributed/batch.h"
#include "server/engine/backend.h"

namespace orthoserve::distributed_internal {

// Why a matrix failed on this rank. kPrimary: this rank saw the error itself (a bad local block,
// a backend error); kSecondary: it only learned that another rank failed, and the status
// exchange replaces it with that rank's primary error.
enum class FailureKind { kNone, kPrimary, kSecondary };

class BatchContext {
 public:
  // `plan` must have passed ValidatePlan for the matrices marked OK in `statuses` (the others
  // are skipped by every algorithm). Indexes `local`; a bad local block fails its matrix here.
  BatchContext(const BatchPlan& plan, std::vector<absl::Status> statuses, absl::Span<const LocalBlock> local,
               Backend& backend, Collective& collective, const ExecuteOptions& options);

  const BatchPlan& plan() const { return plan_; }
  const MatrixPlan& matrix(int m) const { return plan_.matrices[m]; }
  int rank() const { return collective_.rank(); }
  int world() const { return collective_.world(); }
  Backend& backend() { return backend_; }
  Collective& collective() { return collective_; }
  absl::Duration timeout() const { return options_.collective_timeout; }

  // The memory the algorithms keep blocks in between the caller's buffers, the collective and the
  // backend (send and receive buffers, assembled matrices): the backend's device memory when it
  // has one and the collective moves device memory (NCCL), so that a block goes up once, travels
  // device to device and comes down once; host memory otherwise, where nothing is copied that
  // need not be (an owner holding a whole matrix computes on the caller's buffers).
  Memory& memory() { return *memory_; }
  bool on_device() const { return memory_->space() == MemorySpace::kDevice; }
  // A buffer of `memory()`. When it cannot be had, the batch cannot make its collective calls:
  // the collective is aborted (so that peers fail at once rather than at their timeout) and the
  // error, annotated with `what`, is returned for the phase to return.
  absl::StatusOr<MemoryBuffer> Allocate(size_t bytes, bool zero, const std::string& what);

  // Whether matrix `m` passed validation (identical on every rank). Algorithms run exactly the
  // valid matrices, so their collective calls agree on every rank.
  bool Valid(int m) const { return valid_[m]; }
  // Whether matrix `m` has not failed on this rank so far.
  bool Ok(int m) const { return statuses_[m].ok(); }
  const absl::Status& status(int m) const { return statuses_[m]; }
  FailureKind failure(int m) const { return failure_[m]; }
  // Records a failure of matrix `m` on this rank; the first one wins.
  void Fail(int m, absl::Status status, FailureKind kind);
  // Replaces the status of `m` (the status exchange's merged verdict).
  void SetStatus(int m, absl::Status status) { statuses_[m] = std::move(status); }

  // This rank's copy of trainer rank `t`'s block of matrix `m`, or nullptr when it is not here
  // (an empty block may be absent). Only placements with fleet_rank == rank() can be present.
  const LocalBlock* Local(int m, int t) const { return local_index_[m][t]; }
  // Trainer ranks of matrix `m` placed on fleet rank `fleet_rank`, ascending.
  std::vector<int> TrainersOn(int m, int fleet_rank) const;

  // Copies trainer rank `t`'s input block of `m` from the caller's buffer into `dst` (memory():
  // block bytes in the matrix dtype, dense, or, with `ld` > 0, the block's rectangle of a matrix
  // with `ld` elements per row); zeros when the block is not usable here (its matrix has already
  // failed on this rank). A failed copy fails the matrix (primary).
  void ReadBlock(int m, int t, void* dst, int64_t ld = 0);
  // Copies `src` (memory(): the block's bytes in the result dtype, dense or, with `ld` > 0, its
  // rectangle of a matrix) into trainer rank `t`'s output block in the caller's buffer.
  void WriteBlock(int m, int t, const void* src, int64_t ld = 0);
  // Copies block `block` of matrix `m` between a dense buffer and a whole matrix (row-major, view
  // columns per row), both in memory(): into the matrix (`into` true, input dtype) or out of it
  // (result dtype). A failed copy fails the matrix (primary).
  void MoveBlock(int m, const Block& block, const void* src, void* dst, bool into);

  // Runs one collective call, adding its duration to the collective time; annotates an error
  // with `what` (the call and the phase).
  template <typename Call>
  absl::Status Collect(const std::string& what, Call&& call) {
    const absl::Time start = absl::Now();
    absl::Status status = call();
    result_.collective_time += absl::Now() - start;
    if (!status.ok()) return absl::Status(status.code(), what + ": " + std::string(status.message()));
    return status;
  }
  // Runs `call` on the backend, adding its duration (less `minus`, e.g. reductions inside a
  // sharded task) to the compute time and `flops` to the FLOP count.
  template <typename Call>
  auto Compute(double flops, Call&& call) {
    const absl::Time start = absl::Now();
    const absl::Duration collective_before = result_.collective_time;
    auto out = call();
    result_.compute_time += (absl::Now() - start) - (result_.collective_time - collective_before);
    result_.flops += flops;
    return out;
  }

  BatchResult& result() { return result_; }
  std::vector<absl::Status>& statuses() { return statuses_; }

 private:
  void IndexLocal(absl::Span<const LocalBlock> local);

  const BatchPlan& plan_;
  Backend& backend_;
  Collective& collective_;
  HostMemory host_memory_;
  Memory* memory_;
  const ExecuteOptions options_;
  std::vector<bool> valid_;
  std::vector<absl::Status> statuses_;
  std::vector<FailureKind> failure_;
  std::vector<std::vector<const LocalBlock*>> local_index_;
  BatchResult result_;
};

// Element size helpers for a matrix's input and result bytes.
inline size_t InBytes(const MatrixPlan& m, const Block& b) {
  return static_cast<size_t>(b.numel()) * ElementSize(m.dtype);
}
inline size_t OutBytes(const MatrixPlan& m, const Block& b) {
  return static_cast<size_t>(b.numel()) * ElementSize(m.result_dtype);
}

}  // namespace orthoserve::distributed_internal
