// Implementation of batch_context.h: indexing this rank's blocks and reading/writing them.
#include "server/distributed/batch_context.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace orthoserve::distributed_internal {

BatchContext::BatchContext(const BatchPlan& plan, std::vector<absl::Status> statuses,
                           absl::Span<const LocalBlock> local, Backend& backend, Collective& collective,
                           const ExecuteOptions& options)
    : plan_(plan),
      backend_(backend),
      collective_(collective),
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
    const std::string what = absl::StrCat("matrix \"", mp.name, "\"");
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
             absl::InvalidArgumentError(absl::StrCat("matrix \"", plan_.matrices[m].name,
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

void BatchContext::ReadBlock(int m, int t, void* dst) const {
  const MatrixPlan& mp = plan_.matrices[m];
  const size_t bytes = InBytes(mp, mp.blocks[t].block);
  if (bytes == 0) return;
  const LocalBlock* lb = local_index_[m][t];
  if (!statuses_[m].ok() || lb == nullptr) {
    std::memset(dst, 0, bytes);
    return;
  }
  std::memcpy(dst, lb->in, bytes);
}

void BatchContext::WriteBlock(int m, int t, const void* src) const {
  const MatrixPlan& mp = plan_.matrices[m];
  const size_t bytes = OutBytes(mp, mp.blocks[t].block);
  const LocalBlock* lb = local_index_[m][t];
  if (bytes == 0 || lb == nullptr) return;
  std::memcpy(lb->out, src, bytes);
}

double EngineFlops(Matrix2d shape, const NsOptions& options, int64_t batch_rows) {
  if (batch_rows > 0) {
    return static_cast<double>(shape.rows / batch_rows) * NsFlops(batch_rows, shape.cols, options);
  }
  if (options.split_qkv.empty()) return NsFlops(shape.rows, shape.cols, options);
  const std::vector<int64_t>& split = options.split_qkv;
  const int64_t groups = shape.rows / (split[0] + split[1] + split[2]);
  double flops = 0;
  for (int64_t part : split) flops += NsFlops(groups * part, shape.cols, options);
  return flops;
}

}  // namespace orthoserve::distributed_internal
