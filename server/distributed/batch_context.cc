// Implementation of batch_context.h: indexing this rank's blocks and reading/writing them.
#include "server/distributed/batch_context.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/message_text.h"
#include "common/status.h"

namespace orthoserve::distributed_internal {

BatchContext::BatchContext(const BatchPlan& plan, std::vector<absl::Status> statuses,
                           absl::Span<const LocalBlock> local, Backend& backend, Collective& collective,
                           const ExecuteOptions& options)
    : plan_(plan),
      backend_(backend),
      collective_(collective),
      memory_(backend.memory().space() == MemorySpace::kDevice && collective.TakesDeviceMemory()
                  ? &backend.memory()
                  : static_cast<Memory*>(&host_memory_)),
      options_(options),
      statuses_(std::move(statuses)),
      failure_(plan.matrices.size(), FailureKind::kNone) {
  valid_.reserve(statuses_.size());
  for (size_t m = 0; m < statuses_.size(); ++m) {
    valid_.push_back(statuses_[m].ok());
    if (!statuses_[m].ok()) failure_[m] = FailureKind::kPrimary;
  }
  IndexLocal(local);
}

void BatchContext::Fail(int m, absl::Status status, FailureKind kind) {
  if (!statuses_[m].ok()) return;
  statuses_[m] = std::move(status);
  failure_[m] = kind;
}

void BatchContext::IndexLocal(absl::Span<const LocalBlock> local) {
  const int matrices = static_cast<int>(plan_.matrices.size());
  local_index_.resize(matrices);
  for (int m = 0; m < matrices; ++m) {
    if (valid_[m]) local_index_[m].assign(plan_.trainer_world, nullptr);
  }
  // A LocalBlock that names no valid matrix cannot be attributed to one: it fails every matrix
  // on this rank (a caller bug; the batch still runs its collectives so that peers do not hang).
  for (const LocalBlock& lb : local) {
    if (lb.matrix < 0 || lb.matrix >= matrices) {
      const absl::Status bad = absl::InvalidArgumentError(
          absl::StrCat("local block for matrix index ", lb.matrix, " outside the plan's ", matrices, " matrices"));
      for (int m = 0; m < matrices; ++m) Fail(m, bad, FailureKind::kPrimary);
      continue;
    }
    if (!valid_[lb.matrix]) continue;
    const MatrixPlan& mp = plan_.matrices[lb.matrix];
    const std::string what = absl::StrCat("matrix \"", BoundedText(mp.name), "\"");
    if (lb.trainer_rank < 0 || lb.trainer_rank >= plan_.trainer_world) {
      Fail(lb.matrix,
           absl::InvalidArgumentError(absl::StrCat(what, ": local block for trainer rank ", lb.trainer_rank,
                                                   " outside the group of ", plan_.trainer_world)),
           FailureKind::kPrimary);
      continue;
    }
    const BlockPlacement& p = mp.blocks[lb.trainer_rank];
    if (p.fleet_rank != rank()) {
      Fail(lb.matrix,
           absl::InvalidArgumentError(absl::StrCat(what, ": the block of trainer rank ", lb.trainer_rank,
                                                   " belongs on fleet rank ", p.fleet_rank, ", not on rank ", rank())),
           FailureKind::kPrimary);
      continue;
    }
    if (local_index_[lb.matrix][lb.trainer_rank] != nullptr) {
      Fail(lb.matrix,
           absl::InvalidArgumentError(absl::StrCat(what, ": two local blocks for trainer rank ", lb.trainer_rank)),
           FailureKind::kPrimary);
      continue;
    }
    if (lb.space == MemorySpace::kDevice && !on_device()) {
      Fail(lb.matrix,
           absl::InvalidArgumentError(absl::StrCat(what, ": the block of trainer rank ", lb.trainer_rank,
                                                   " is in device memory, but this batch keeps its blocks in host "
                                                   "memory (its collective takes host memory only)")),
           FailureKind::kPrimary);
      continue;
    }
    if (!p.block.empty() && (lb.in == nullptr || lb.out == nullptr)) {
      Fail(lb.matrix,
           absl::InvalidArgumentError(
               absl::StrCat(what, ": the block of trainer rank ", lb.trainer_rank, " has no input or output buffer")),
           FailureKind::kPrimary);
      continue;
    }
    local_index_[lb.matrix][lb.trainer_rank] = &lb;
  }
  for (int m = 0; m < matrices; ++m) {
    if (!valid_[m]) continue;
    for (int t : TrainersOn(m, rank())) {
      if (local_index_[m][t] == nullptr && !plan_.matrices[m].blocks[t].block.empty()) {
        Fail(m,
             absl::InvalidArgumentError(absl::StrCat("matrix \"", BoundedText(plan_.matrices[m].name),
                                                     "\": the block of trainer rank ", t, " is missing on fleet rank ",
                                                     rank())),
             FailureKind::kPrimary);
      }
    }
  }
}

std::vector<int> BatchContext::TrainersOn(int m, int fleet_rank) const {
  std::vector<int> trainers;
  for (const BlockPlacement& p : plan_.matrices[m].blocks) {
    if (p.fleet_rank == fleet_rank) trainers.push_back(p.trainer_rank);
  }
  return trainers;
}

absl::StatusOr<MemoryBuffer> BatchContext::Allocate(size_t bytes, bool zero, const std::string& what) {
  absl::StatusOr<MemoryBuffer> buffer = memory_->Allocate(bytes, zero, what.c_str());
  if (buffer.ok()) return buffer;
  const std::string message = absl::StrCat(what, ": ", buffer.status().message());
  collective_.Abort(message);
  return absl::Status(buffer.status().code(), message);
}

namespace {

// The copy between a block's dense bytes (`dense`) and its rectangle in a row-major matrix with
// `ld` elements per row (`matrix`), or between two dense buffers when `ld` is 0.
Copy2dArgs BlockCopy(const Block& b, size_t elem, int64_t ld, void* dst, MemorySpace dst_space, const void* src,
                     MemorySpace src_space, bool dst_is_matrix) {
  const size_t row_bytes = static_cast<size_t>(b.cols) * elem;
  if (ld == 0) {
    const size_t bytes = row_bytes * static_cast<size_t>(b.rows);
    return Copy2dArgs{dst, bytes, dst_space, src, bytes, src_space, 1, bytes};
  }
  const size_t pitch = static_cast<size_t>(ld) * elem;
  const size_t offset = (static_cast<size_t>(b.row_offset) * static_cast<size_t>(ld) + static_cast<size_t>(b.col_offset)) * elem;
  if (dst_is_matrix) {
    return Copy2dArgs{static_cast<char*>(dst) + offset, pitch, dst_space, src, row_bytes, src_space,
                      static_cast<size_t>(b.rows), row_bytes};
  }
  return Copy2dArgs{dst, row_bytes, dst_space, static_cast<const char*>(src) + offset, pitch, src_space,
                    static_cast<size_t>(b.rows), row_bytes};
}

}  // namespace

void BatchContext::ReadBlock(int m, int t, void* dst, int64_t ld) {
  const MatrixPlan& mp = plan_.matrices[m];
  const Block& block = mp.blocks[t].block;
  if (block.empty()) return;
  const LocalBlock* lb = local_index_[m][t];
  absl::Status status;
  if (!statuses_[m].ok() || lb == nullptr) {
    // Zeros, in the shape the bytes travel in (a dense block; a rectangle only ever lands in a
    // matrix that is not computed once its matrix failed here).
    status = ld == 0 ? memory_->Zero(dst, InBytes(mp, block)) : absl::OkStatus();
  } else {
    status =
        memory_->Copy2d(BlockCopy(block, ElementSize(mp.dtype), ld, dst, memory_->space(), lb->in, lb->space, true));
  }
  if (!status.ok()) {
    Fail(m, Annotate(status, absl::StrCat("matrix \"", BoundedText(mp.name), "\" block upload")),
         FailureKind::kPrimary);
  }
}

void BatchContext::WriteBlock(int m, int t, const void* src, int64_t ld) {
  const MatrixPlan& mp = plan_.matrices[m];
  const Block& block = mp.blocks[t].block;
  const LocalBlock* lb = local_index_[m][t];
  if (block.empty() || lb == nullptr) return;
  const absl::Status status = memory_->Copy2d(
      BlockCopy(block, ElementSize(mp.result_dtype), ld, lb->out, lb->space, src, memory_->space(), false));
  if (!status.ok()) {
    Fail(m, Annotate(status, absl::StrCat("matrix \"", BoundedText(mp.name), "\" result download")),
         FailureKind::kPrimary);
  }
}

void BatchContext::MoveBlock(int m, const Block& block, const void* src, void* dst, bool into) {
  if (block.empty()) return;
  const MatrixPlan& mp = plan_.matrices[m];
  const size_t elem = ElementSize(into ? mp.dtype : mp.result_dtype);
  const absl::Status status =
      memory_->Copy2d(BlockCopy(block, elem, mp.view.cols, dst, memory_->space(), src, memory_->space(), into));
  if (!status.ok()) {
    Fail(m, Annotate(status, absl::StrCat("matrix \"", BoundedText(mp.name), "\" block copy")), FailureKind::kPrimary);
  }
}

}  // namespace orthoserve::distributed_internal
