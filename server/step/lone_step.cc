// LoneStep of server/step/step_impl.h: a lone client's matrices, each computed as soon as its
// bytes are in — here, in the compute queue (fair between tenants, and between a tenant's jobs:
// the header's job id, or this step on its own), or on the member the fleet picks (Peer
// service), whose result comes back the same way. The buffers come from the server's BufferPool.
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "server/fleet/logic/lone_compute.h"
#include "server/step/step_impl.h"

namespace orthoserve {

absl::Status LoneStep::Reject(int index, absl::Status status) {
  if (request_.all_or_nothing) return status;  // Fails the step.
  Matrix& m = matrices_[index];
  m.failed = true;
  m.input.reset();
  m.memory = MatrixMemory{};
  s_.metrics->MatrixDone(s_.method, m.parsed ? AlgorithmName(m.spec.plan.algorithm) : "unknown",
                         m.parsed ? DTypeName(m.spec.plan.dtype) : "unknown", absl::StatusCodeToString(status.code()));
  sink_->Result(index, m.spec.plan, m.parsed ? m.spec.block : Block{}, status, {}, nullptr);
  return absl::OkStatus();
}

absl::StatusOr<char*> LoneStep::Destination(Matrix& m) {
  ASSIGN_OR_RETURN(m.input, s_.buffers->Get(static_cast<size_t>(m.spec.block_bytes)));
  return m.input->data();
}

absl::Status LoneStep::Complete(int index) {
  if (request_.all_or_nothing) {
    held_.push_back(index);  // Computed once every matrix has arrived whole (InputEnded).
  } else {
    Place(index);
  }
  return absl::OkStatus();
}

void LoneStep::Place(int index) {
  if (job_.empty()) {
    job_ = request_.job.empty() ? absl::StrCat("step ", reinterpret_cast<uintptr_t>(this)) : request_.job;
  }
  Matrix& m = matrices_[index];  // On the reader's thread: the reference goes to the others.
  if (m.memory.input != nullptr || m.memory.result != nullptr) {
    // Its memory is mapped here only: it is computed here, on no peer.
    s_.metrics->LoneMatrix("here");
    ComputeHere(index, m, nullptr);
    return;
  }
  std::shared_ptr<const LoneTarget> target = s_.fleet->PickLoneRank(m.spec.cost);
  s_.metrics->LoneMatrix(target->here() ? "here" : "peer");
  if (target->here()) {
    ComputeHere(index, m, std::move(target));
  } else {
    Forward(index, m, std::move(target));
  }
}

void LoneStep::ComputeHere(int index, Matrix& m, std::shared_ptr<const LoneTarget> target) {
  BeginWork();
  s_.metrics->queue_depth().Increment();
  const absl::Time queued = absl::Now();
  std::shared_ptr<StepBase> self = shared_from_this();
  Matrix* matrix = &m;
  s_.compute->Schedule(request_.tenant, job_, m.spec.cost, [this, self, index, matrix, queued, target] {
    Compute(index, *matrix, queued);
    EndWork();
  });
}

void LoneStep::Forward(int index, Matrix& m, std::shared_ptr<const LoneTarget> target) {
  BeginWork();
  std::shared_ptr<StepBase> self = shared_from_this();
  const PeerMatrix matrix{request_.tenant, job_, m.spec.plan, m.spec.block,
                          absl::string_view(m.input->data(), m.input->size())};
  Matrix* held = &m;
  s_.fleet->ComputeOnPeer(*target, matrix, [this, self, index, held, target](absl::StatusOr<PeerResult> result) {
    if (!result.ok()) {
      // The member is gone or could not take it: this rank computes the matrix itself (the same
      // computation, so the same bits).
      LOG_WARNING("step") << "fleet rank " << target->rank << " did not compute a lone matrix (" << result.status()
                          << "); computing it here";
      s_.metrics->LoneMatrix("fallback");
      if (!cancelled_.load()) ComputeHere(index, *held, nullptr);
      EndWork();
      return;
    }
    held->input.reset();
    auto owner = std::make_shared<PeerResult>(*std::move(result));
    const absl::string_view data = owner->status.ok() ? absl::string_view(owner->data) : absl::string_view();
    Deliver(index, *held, owner->status, data, owner);
    EndWork();
  });
}

void LoneStep::Compute(int index, Matrix& m, absl::Time queued) {
  s_.metrics->queue_depth().Decrement();
  const absl::Duration wait = absl::Now() - queued;
  s_.metrics->StageTime(Stage::kQueue, wait);
  s_.metrics->TenantQueueWait(request_.tenant, wait);
  // The client is gone (cancelled, or its deadline passed): nothing is computed for nobody.
  if (cancelled_.load()) {
    m.input.reset();
    m.memory = MatrixMemory{};
    return;
  }
  const char* in = m.memory.input != nullptr ? m.memory.input : m.input->data();
  const MemorySpace in_space = m.memory.input != nullptr ? m.memory.input_space : MemorySpace::kHost;
  const MemorySpace out_space = m.memory.result != nullptr ? m.memory.result_space : MemorySpace::kHost;
  const size_t out_bytes = static_cast<size_t>(m.spec.block.numel()) * ElementSize(m.spec.plan.result_dtype);
  std::shared_ptr<const void> owner;
  char* out = nullptr;
  absl::Status status;
  if (m.memory.result != nullptr) {
    // Written straight into the client's region; the leases own the result.
    out = m.memory.result;
    owner = m.memory.owner;
  } else {
    absl::StatusOr<std::shared_ptr<PooledBuffer>> buffer = s_.buffers->Get(out_bytes);
    if (buffer.ok()) {
      out = (*buffer)->data();
      owner = *std::move(buffer);
    } else {
      status = buffer.status();
    }
  }
  if (status.ok()) {
    status = ComputeLoneMatrix(m.spec.plan, m.spec.block, in, out, *s_.backend, s_.metrics, request_.tenant, in_space,
                               out_space)
                 .status;
  }
  if (!status.ok() && m.receiver.scan_deferred()) {
    // The backend looked for NaN and Inf as it computed (BlockReceiver::TakeUnscanned); whether
    // one is why it failed, and where, is found now, and answered as the scan on arrival would.
    const int64_t bad = FindNonFinite(m.spec.plan.dtype, in, static_cast<size_t>(m.spec.block.numel()));
    if (bad >= 0) status = NonFiniteData(index, m, bad);
  }
  m.input.reset();               // The input is no longer needed,
  m.memory = MatrixMemory{};     // nor the regions' leases (a result in one keeps them through `owner`).
  if (!status.ok()) owner.reset();
  // A result on the device stays there: the sink gets no view of it (step.h).
  const absl::string_view data =
      owner == nullptr || out_space == MemorySpace::kDevice ? absl::string_view() : absl::string_view(out, out_bytes);
  Deliver(index, m, status, data, std::move(owner));
}

void LoneStep::Deliver(int index, const Matrix& m, const absl::Status& status, absl::string_view data,
                       std::shared_ptr<const void> owner) {
  s_.metrics->MatrixDone(s_.method, AlgorithmName(m.spec.plan.algorithm), DTypeName(m.spec.plan.dtype),
                         absl::StatusCodeToString(status.code()));
  sink_->Result(index, m.spec.plan, m.spec.block, status, data, std::move(owner));
}

void LoneStep::InputEnded() {
  for (int index : held_) Place(index);
  held_.clear();
  FinishWhenIdle(StepEnd{});
}

void LoneStep::Cancel(bool draining) {
  cancelled_.store(true);
  FinishWhenIdle(draining ? StepEnd{MarkFleetChange(absl::UnavailableError("the server is draining; retry on another rank"))}
                          : StepEnd{absl::CancelledError("the client cancelled the stream or its deadline passed")});
}

}  // namespace orthoserve
