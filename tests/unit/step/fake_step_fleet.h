// A StepFleet for tests of the step layer: no network, no executor. Group steps submitted to it
// wait until the test completes them; lone matrices go where the test says, and a "peer" either
// computes them with this process's backend (as a member's Peer service would) or fails.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "server/engine/backend.h"
#include "server/fleet/logic/lone_compute.h"
#include "server/fleet/logic/step_fleet.h"
#include "server/plan/matrix_checks.h"

namespace orthoserve {

class FakeStepFleet final : public StepFleet {
 public:
  struct Submitted {
    std::shared_ptr<TrainerStep> step;
    StepCallback done;
  };
  struct Abort {
    GroupKey key;
    int trainer_rank = 0;
    absl::Status reason;
    uint64_t submission = 0;
  };

  FakeStepFleet(int rank, int world, Backend* backend) : rank_(rank), world_(world), backend_(backend) {}

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  bool ready() const override { return ready_; }

  void Submit(std::shared_ptr<TrainerStep> step, StepCallback done) override {
    std::lock_guard<std::mutex> lock(mu_);
    step->submission = ++submissions_;
    submitted_.push_back(Submitted{std::move(step), std::move(done)});
  }
  void AbortStep(const GroupKey& key, int trainer_rank, const absl::Status& reason, uint64_t submission) override {
    std::lock_guard<std::mutex> lock(mu_);
    aborts_.push_back(Abort{key, trainer_rank, reason, submission});
  }

  std::shared_ptr<const LoneTarget> PickLoneRank(double cost) override {
    std::lock_guard<std::mutex> lock(mu_);
    costs_.push_back(cost);
    auto target = std::make_shared<LoneTarget>();
    target->rank = peer_rank_ < 0 ? rank_ : peer_rank_;
    if (peer_rank_ >= 0) target->address = "peer.invalid:1";
    return target;
  }
  void ComputeOnPeer(const LoneTarget& target, const PeerMatrix& matrix,
                     std::function<void(absl::StatusOr<PeerResult>)> done) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++peer_calls_;
    }
    if (!peer_computes_) {
      done(absl::UnavailableError("fleet rank " + std::to_string(target.rank) + " is gone"));
      return;
    }
    PeerResult result;
    result.data.resize(static_cast<size_t>(matrix.block.numel()) * ElementSize(matrix.plan.result_dtype));
    const LoneComputation c =
        ComputeLoneMatrix(matrix.plan, matrix.block, matrix.data.data(), result.data.data(), *backend_, nullptr, "");
    result.status = c.status;
    done(std::move(result));
  }

  // Test controls.
  void set_ready(bool ready) { ready_ = ready; }
  // Lone matrices go to fleet rank `rank` (a peer; -1: here), which computes them or fails.
  void ForwardTo(int rank, bool computes) {
    peer_rank_ = rank;
    peer_computes_ = computes;
  }
  std::vector<Submitted> submitted() {
    std::lock_guard<std::mutex> lock(mu_);
    return submitted_;
  }
  std::vector<Abort> aborts() {
    std::lock_guard<std::mutex> lock(mu_);
    return aborts_;
  }
  std::vector<double> costs() {
    std::lock_guard<std::mutex> lock(mu_);
    return costs_;
  }
  int peer_calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return peer_calls_;
  }

 private:
  const int rank_;
  const int world_;
  Backend* const backend_;
  bool ready_ = true;
  int peer_rank_ = -1;
  bool peer_computes_ = true;
  std::mutex mu_;
  uint64_t submissions_ = 0;
  std::vector<Submitted> submitted_;
  std::vector<Abort> aborts_;
  std::vector<double> costs_;
  int peer_calls_ = 0;
};

// A checked ParsedSpec of an f32 rows × cols matrix named `name` (as the public ingress makes
// one), whose sender holds `block` (the whole matrix when left empty).
inline ParsedSpec TestSpec(const std::string& name, int64_t rows, int64_t cols, Block block = Block{},
                           Algorithm algorithm = Algorithm::kAuto) {
  ParsedSpec p;
  p.plan.name = name;
  p.plan.shape = {rows, cols};
  p.plan.view = Matrix2d{rows, cols};
  p.plan.algorithm = algorithm;
  p.plan.checked = CheckMatrix(p.plan, name).ok();
  p.block = block.rows == 0 && block.cols == 0 ? WholeBlock(p.plan.view) : block;
  p.block_bytes = p.block.numel() * static_cast<int64_t>(ElementSize(p.plan.dtype));
  p.cost = EstimatedCost(p.plan);
  return p;
}

}  // namespace orthoserve
