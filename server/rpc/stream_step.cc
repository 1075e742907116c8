// OrthogonalizeStream of server/rpc/orthogonalizer_service.h: one step of one trainer rank.
//
// Messages are processed as a small state machine (header, then spec / chunks per matrix, then
// StepEnd or half-close). They are read and written as raw bytes (stream_codec.h): a chunk's
// bytes go straight from gRPC's buffers into the matrix's buffer, and result chunks refer to the
// result buffer; lone matrices' buffers come from the service's BufferPool. A lone client on a
// one-rank fleet — or on a rank that is not a member of a formed fleet generation (the fleet is
// re-forming, or its coordinator is gone) — is pipelined locally: each matrix goes to the
// compute pool as soon as its bytes are in, and its result is handed to the ResultWriter's
// thread as soon as it is done, while later matrices are still arriving and being computed.
// Group steps (W > 1, or a lone client on a formed fleet of S > 1) are handed to the fleet once
// every matrix has arrived, and the results come back after the batch ran. A group step waits
// for its batch only while its client is there: a cancelled call (or the server's drain
// deadline) ends the wait at once.
#include <condition_variable>
#include <future>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "proto/convert/grpc_status.h"
#include "proto/convert/ns_options_proto.h"
#include "server/fleet/spec_codec.h"
#include "server/rpc/block_receiver.h"
#include "server/rpc/local_batch.h"
#include "server/rpc/orthogonalizer_service.h"
#include "server/rpc/result_writer.h"
#include "server/rpc/stream_codec.h"

namespace orthoserve {
namespace {

using Stream = ResultWriter::Stream;

constexpr int kMaxTrainerWorld = 1 << 16;
constexpr char kMethod[] = "OrthogonalizeStream";

std::atomic<int64_t> g_lone_group_counter{0};

}  // namespace

// One OrthogonalizeStream call.
class StreamStep {
 public:
  StreamStep(OrthogonalizerService& service, grpc::ServerContext* context, Stream* stream)
      : s_(service),
        context_(context),
        stream_(stream),
        writer_(stream, service.options_.chunk_bytes, service.metrics_, kMethod) {}

  absl::Status Run();
  // Writes every result queued; call before the RPC returns.
  void Close() { writer_.Close(); }
  // The failure was caused by a change of the fleet's membership: a retry may succeed.
  bool retryable() const { return retryable_; }

 private:
  struct Matrix {
    ParsedSpec spec;
    bool failed = false;  // Rejected in-band (lone) — its chunks are skipped.
    std::shared_ptr<PooledBuffer> input;  // Lone: the block's bytes.
    std::vector<char> group_input;        // Group: the block's bytes, handed to the fleet.
    BlockReceiver receiver;               // Fills `input` or `group_input`.
  };

  absl::Status ReadHeader();
  absl::Status OnSpec(const v1::MatrixSpec& spec);
  // The bytes of a DataChunk for matrix `index`, in `data` (views, in order).
  absl::Status OnChunk(int index, absl::Span<const absl::string_view> data);
  absl::Status Complete(int index);
  absl::Status FinishGroup();
  // Computes a lone client's step on this rank alone (the fleet could not take it).
  StepOutcome RunHere(TrainerStep& step);
  // Fails the step: a group step is aborted on every rank first.
  absl::Status Fail(absl::Status status);
  void ScheduleLone(int index);

  OrthogonalizerService& s_;
  grpc::ServerContext* context_;
  Stream* stream_;
  ResultWriter writer_;
  absl::Time start_ = absl::Now();
  std::string tenant_;
  std::string job_;  // The compute queue's job of this stream's matrices (ReadHeader).
  v1::StepHeader header_;
  int world_ = 1;
  bool lone_ = true;
  GroupKey key_;
  bool reported_ = false;  // The group step reached the fleet (it aborts it itself on failure).
  bool retryable_ = false;
  std::vector<Matrix> matrices_;
  int current_ = -1;  // Matrix whose bytes are arriving.
  Admission::Ticket ticket_;

  // Lone pipeline: jobs in the compute pool.
  std::mutex jobs_mu_;
  std::condition_variable jobs_cv_;
  int jobs_running_ = 0;
};

absl::Status StreamStep::Fail(absl::Status status) {
  if (!lone_ && !reported_ && !key_.job.empty()) {
    s_.fleet_->AbortStep(key_, header_.rank(), status, /*submission=*/0);
  }
  return status;
}

absl::Status StreamStep::ReadHeader() {
  StreamRequestView first;
  if (!stream_->Read(&first.raw)) {
    return context_->IsCancelled() ? absl::CancelledError("the client cancelled the stream")
                                   : absl::InvalidArgumentError("the stream ended before its StepHeader");
  }
  RETURN_IF_ERROR(ParseStreamRequest(&first));
  if (!first.message.has_header()) {
    return absl::InvalidArgumentError("the first message of a stream must be a StepHeader");
  }
  header_ = first.message.header();
  world_ = header_.world() == 0 ? 1 : header_.world();
  if (world_ < 1 || world_ > kMaxTrainerWorld) {
    return absl::InvalidArgumentError(
        absl::StrCat("header world = ", header_.world(), " is out of range; use 1 to ", kMaxTrainerWorld));
  }
  if (header_.rank() < 0 || header_.rank() >= world_) {
    return absl::InvalidArgumentError(
        absl::StrCat("header rank = ", header_.rank(), " is out of range for world = ", world_));
  }
  if (header_.step() < 0) return absl::InvalidArgumentError(absl::StrCat("header step = ", header_.step(), " is negative"));
  if (header_.num_matrices() < 1 || header_.num_matrices() > s_.options_.max_matrices_per_step) {
    return absl::InvalidArgumentError(absl::StrCat("header num_matrices = ", header_.num_matrices(),
                                                   " is out of range; use 1 to ", s_.options_.max_matrices_per_step));
  }
  if (world_ > 1 && header_.job().empty()) {
    return absl::InvalidArgumentError("header job is empty; a group step (world > 1) needs a job id to meet its ranks");
  }
  if (header_.attempt() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("header attempt = ", header_.attempt(), " is negative"));
  }
  if (header_.attempt() > 0) s_.metrics_->StepRetried(kMethod);
  if (header_.result_chunk_bytes() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("header result_chunk_bytes = ", header_.result_chunk_bytes(), " is negative"));
  }
  writer_.SetChunkBytes(ResultChunkBytes(header_.result_chunk_bytes(), s_.options_.chunk_bytes));
  // The compute queue is fair between tenants, and between a tenant's jobs: the header's job id,
  // or this stream on its own.
  job_ = header_.job().empty() ? absl::StrCat("stream ", reinterpret_cast<uintptr_t>(this)) : header_.job();
  // A lone client is served here alone when the fleet cannot take it (one rank, or this rank is
  // not in a formed generation), and through the fleet's batches otherwise.
  const bool fleet_ready = s_.fleet_->ready();
  lone_ = world_ == 1 && (s_.fleet_->world() == 1 || !fleet_ready);
  if (!lone_) {
    if (!fleet_ready) {
      retryable_ = true;
      return absl::UnavailableError(
          absl::StrCat("fleet rank ", s_.fleet_->rank(), " is not a member of a formed fleet generation (the fleet of up to ",
                       s_.fleet_->world(), " ranks is forming or re-forming); retry on a ready member"));
    }
    // Any member takes any trainer rank: clients spread a group over the members by preference
    // (FleetRankOfTrainer over the ready members), and a retry goes wherever one is ready.
    key_ = GroupKey{tenant_, header_.job(), header_.group(), header_.step()};
    if (world_ == 1 && key_.job.empty()) {
      // A lone client on a fleet: a group of one that nobody else can join.
      key_.job = absl::StrCat("lone-", s_.fleet_->rank(), "-", g_lone_group_counter.fetch_add(1));
    }
  }
  matrices_.reserve(header_.num_matrices());
  return absl::OkStatus();
}

absl::Status StreamStep::OnSpec(const v1::MatrixSpec& spec) {
  if (current_ >= 0 && !matrices_[current_].failed && !matrices_[current_].receiver.complete()) {
    const Matrix& m = matrices_[current_];
    return absl::InvalidArgumentError(absl::StrCat("matrix ", current_, " (\"", m.spec.plan.name, "\"): received ",
                                                   m.receiver.received(), " of its ", m.spec.block_bytes,
                                                   " bytes before the next spec"));
  }
  const int index = static_cast<int>(matrices_.size());
  if (index >= header_.num_matrices()) {
    return absl::InvalidArgumentError(
        absl::StrCat("more specs than the header's num_matrices = ", header_.num_matrices()));
  }
  absl::StatusOr<ParsedSpec> parsed =
      ParseMatrixSpec(spec, index, s_.options_.max_matrix_elements, /*whole_if_unset=*/world_ == 1);
  matrices_.emplace_back();
  current_ = index;
  Matrix& m = matrices_.back();
  if (!parsed.ok()) {
    if (!lone_) return parsed.status();
    // Lone clients get the error in-band and the stream goes on; the matrix's chunks are skipped.
    m.failed = true;
    m.spec.plan.name = spec.name();
    m.spec.plan.shape.assign(spec.shape().begin(), spec.shape().end());
    s_.metrics_->MatrixDone(kMethod, "unknown", "unknown", CodeName(parsed.status().code()));
    writer_.Write(index, m.spec.plan, Block{}, parsed.status(), {}, nullptr);
    return absl::OkStatus();
  }
  m.spec = std::move(*parsed);
  const int64_t out_bytes = m.spec.block.numel() * static_cast<int64_t>(ElementSize(m.spec.plan.result_dtype));
  RETURN_IF_ERROR(s_.admission_.AddBytes(ticket_, tenant_, m.spec.block_bytes + out_bytes,
                                         absl::StrCat("matrix ", index, " (\"", m.spec.plan.name, "\")")));
  char* dst;
  if (lone_) {
    ASSIGN_OR_RETURN(m.input, s_.buffers_->Get(static_cast<size_t>(m.spec.block_bytes)));
    dst = m.input->data();
  } else {
    m.group_input.resize(static_cast<size_t>(m.spec.block_bytes));
    dst = m.group_input.data();
  }
  m.receiver = BlockReceiver(m.spec.plan.dtype, dst, m.spec.block_bytes);
  if (m.spec.block_bytes == 0) return Complete(index);
  return absl::OkStatus();
}

absl::Status StreamStep::OnChunk(int index, absl::Span<const absl::string_view> data) {
  if (current_ < 0 || index != current_) {
    return absl::InvalidArgumentError(absl::StrCat("a data chunk for matrix ", index,
                                                   " arrived while matrix ", current_, " was expected"));
  }
  int64_t size = 0;
  for (absl::string_view piece : data) size += static_cast<int64_t>(piece.size());
  if (size > s_.options_.chunk_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("matrix ", current_, ": a chunk of ", size,
                                                   " bytes exceeds the chunk limit of ", s_.options_.chunk_bytes));
  }
  s_.metrics_->BytesIn(kMethod, static_cast<double>(size));  // Received, even when discarded below.
  s_.metrics_->TenantBytes(tenant_, "in", static_cast<double>(size));
  Matrix& m = matrices_[current_];
  if (m.failed) return absl::OkStatus();
  if (m.receiver.received() + size > m.spec.block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("matrix ", current_, " (\"", m.spec.plan.name, "\"): received more than its ",
                                                   m.spec.block_bytes, " bytes (block ", m.spec.block.rows, "x",
                                                   m.spec.block.cols, " of ", DTypeName(m.spec.plan.dtype), ")"));
  }
  for (absl::string_view piece : data) m.receiver.Append(piece);
  if (m.receiver.complete()) return Complete(current_);
  return absl::OkStatus();
}

absl::Status StreamStep::Complete(int index) {
  Matrix& m = matrices_[index];
  const int64_t bad = m.receiver.first_non_finite();
  if (bad >= 0) {
    absl::Status status = absl::InvalidArgumentError(
        absl::StrCat("matrix ", index, " (\"", m.spec.plan.name, "\") data holds a non-finite value (NaN or Inf) at element ",
                     bad, " of its block"));
    if (!lone_) return status;
    m.failed = true;
    s_.metrics_->MatrixDone(kMethod, AlgorithmName(m.spec.plan.algorithm), DTypeName(m.spec.plan.dtype),
                            CodeName(status.code()));
    m.input.reset();
    writer_.Write(index, m.spec.plan, m.spec.block, status, {}, nullptr);
    return absl::OkStatus();
  }
  if (lone_) ScheduleLone(index);
  return absl::OkStatus();
}

void StreamStep::ScheduleLone(int index) {
  {
    std::lock_guard<std::mutex> lock(jobs_mu_);
    ++jobs_running_;
  }
  s_.metrics_->queue_depth().Increment();
  const absl::Time queued = absl::Now();
  s_.compute_->Schedule(tenant_, job_, EstimatedCost(matrices_[index].spec.plan), [this, index, queued] {
    s_.metrics_->queue_depth().Decrement();
    const absl::Duration wait = absl::Now() - queued;
    s_.metrics_->StageTime(Stage::kQueue, wait);
    s_.metrics_->TenantQueueWait(tenant_, wait);
    Matrix& m = matrices_[index];
    std::shared_ptr<PooledBuffer> out;
    absl::StatusOr<BatchResult> result;
    if (context_->IsCancelled()) {
      // The client is gone (cancelled, or its deadline passed): do not compute for nobody.
      result = absl::CancelledError("the client cancelled the stream or its deadline passed");
    } else {
      absl::StatusOr<std::shared_ptr<PooledBuffer>> buffer = s_.buffers_->Get(
          static_cast<size_t>(m.spec.block.numel()) * ElementSize(m.spec.plan.result_dtype));
      if (buffer.ok()) {
        out = *std::move(buffer);
        result = RunLocalBatch({LocalMatrix{m.spec.plan, m.spec.block, m.input->data(), out->data()}}, *s_.backend_);
      } else {
        result = buffer.status();
      }
    }
    absl::Status status = result.ok() ? result->matrices[0] : result.status();
    if (result.ok()) {
      s_.metrics_->StageTime(Stage::kCompute, result->compute_time);
      s_.metrics_->TenantCompute(tenant_, result->compute_time);
      s_.metrics_->Flops(result->flops);
    }
    s_.metrics_->MatrixDone(kMethod, AlgorithmName(m.spec.plan.algorithm), DTypeName(m.spec.plan.dtype),
                            CodeName(status.code()));
    m.input.reset();  // The input is no longer needed.
    if (!status.ok()) out.reset();
    const absl::string_view data = out == nullptr ? absl::string_view() : absl::string_view(out->data(), out->size());
    writer_.Write(index, m.spec.plan, m.spec.block, status, data, out);
    std::lock_guard<std::mutex> lock(jobs_mu_);
    if (--jobs_running_ == 0) jobs_cv_.notify_all();
  });
}

absl::Status StreamStep::Run() {
  if (s_.draining_.load()) return absl::UnavailableError("the server is draining; retry on another rank");
  ASSIGN_OR_RETURN(tenant_, s_.auth_->Authenticate(*context_));
  writer_.SetTenant(tenant_);
  ASSIGN_OR_RETURN(Admission::Ticket stream_slot, s_.admission_.AcquireStream(tenant_));
  RETURN_IF_ERROR(ReadHeader());
  VLOG("rpc", 1) << "stream step rank " << header_.rank() << "/" << world_ << " " << header_.num_matrices()
                 << " matrices" << (lone_ ? " (lone)" : "");

  absl::Status status;
  StreamRequestView request;
  const v1::StreamRequest& message = request.message;
  bool ended = false;
  while (status.ok() && !ended) {
    if (!stream_->Read(&request.raw)) {
      if (context_->IsCancelled()) status = absl::CancelledError("the client cancelled the stream");
      ended = true;  // Half-close ends the step like StepEnd.
      break;
    }
    status = ParseStreamRequest(&request);
    if (!status.ok()) break;
    switch (message.kind_case()) {
      case v1::StreamRequest::kSpec: status = OnSpec(message.spec()); break;
      case v1::StreamRequest::kChunk: status = OnChunk(message.chunk().index(), request.chunk_data); break;
      case v1::StreamRequest::kEnd: ended = true; break;
      case v1::StreamRequest::kHeader: status = absl::InvalidArgumentError("a second StepHeader in one stream"); break;
      default: status = absl::InvalidArgumentError("an empty StreamRequest"); break;
    }
  }
  if (status.ok() && static_cast<int>(matrices_.size()) < header_.num_matrices()) {
    status = absl::InvalidArgumentError(absl::StrCat("the step ended after ", matrices_.size(), " of the header's ",
                                                     header_.num_matrices(), " matrices"));
  }
  if (status.ok() && current_ >= 0 && !matrices_[current_].failed && !matrices_[current_].receiver.complete()) {
    const Matrix& m = matrices_[current_];
    status = absl::InvalidArgumentError(absl::StrCat("matrix ", current_, " (\"", m.spec.plan.name, "\"): the step ended after ",
                                                     m.receiver.received(), " of its ", m.spec.block_bytes, " bytes"));
  }
  s_.metrics_->StageTime(Stage::kReceive, absl::Now() - start_);
  if (lone_) {
    // Pool jobs reference this object: wait for them whatever happened.
    std::unique_lock<std::mutex> lock(jobs_mu_);
    jobs_cv_.wait(lock, [this] { return jobs_running_ == 0; });
    if (!status.ok()) return status;
    writer_.Summary(s_.fleet_->rank(), start_);
    return absl::OkStatus();
  }
  if (!status.ok()) return Fail(status);
  return FinishGroup();
}

StepOutcome StreamStep::RunHere(TrainerStep& step) {
  std::vector<LocalMatrix> local;
  step.outputs.assign(step.matrices.size(), {});
  for (size_t i = 0; i < step.matrices.size(); ++i) {
    MatrixPlan plan = step.matrices[i];
    const Block block = plan.blocks[0].block;
    plan.blocks.clear();
    step.outputs[i].resize(static_cast<size_t>(block.numel()) * ElementSize(plan.result_dtype));
    local.push_back(LocalMatrix{std::move(plan), block, step.inputs[i].data(), step.outputs[i].data()});
  }
  StepOutcome outcome;
  absl::StatusOr<BatchResult> result = RunLocalBatch(std::move(local), *s_.backend_);
  if (!result.ok()) {
    outcome.status = result.status();
    return outcome;
  }
  s_.metrics_->StageTime(Stage::kCompute, result->compute_time);
  s_.metrics_->Flops(result->flops);
  outcome.matrices = std::move(result->matrices);
  return outcome;
}

absl::Status StreamStep::FinishGroup() {
  auto step = std::make_shared<TrainerStep>();
  step->key = key_;
  step->trainer_rank = header_.rank();
  step->trainer_world = world_;
  step->attempt = header_.attempt();
  step->submitted = absl::Now();
  for (Matrix& m : matrices_) {
    MatrixPlan plan = m.spec.plan;
    plan.blocks = {BlockPlacement{header_.rank(), s_.fleet_->rank(), m.spec.block}};
    step->matrices.push_back(std::move(plan));
    step->inputs.push_back(std::move(m.group_input));
  }
  auto promise = std::make_shared<std::promise<StepOutcome>>();
  std::future<StepOutcome> future = promise->get_future();
  reported_ = true;
  s_.metrics_->queue_depth().Increment();
  s_.fleet_->Submit(step, [promise](StepOutcome outcome) { promise->set_value(std::move(outcome)); });
  // Wait for the batch while the client is there. The fleet bounds the wait itself (rendezvous
  // timeout, collective timeouts, a lost coordinator fails waiting steps); a cancelled call —
  // the client went away, its deadline passed, or the server's drain deadline cancelled it —
  // ends it at once: the step is aborted asynchronously and the fleet drops its copy later.
  while (future.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
    if (context_->IsCancelled()) {
      s_.metrics_->queue_depth().Decrement();
      const bool draining = s_.draining_.load();
      // A drain is the server's doing: the other ranks keep waiting for this trainer's retry.
      absl::Status reason = draining ? absl::UnavailableError("the server drained before the step ran")
                                     : absl::CancelledError("the trainer cancelled its stream");
      s_.fleet_->AbortStep(key_, header_.rank(), reason, step->submission);
      if (draining) {
        retryable_ = true;
        return absl::UnavailableError("the server is draining; retry the step on another member");
      }
      return absl::CancelledError("the client cancelled the stream");
    }
  }
  s_.metrics_->queue_depth().Decrement();
  StepOutcome outcome = future.get();
  s_.metrics_->StageTime(Stage::kRendezvous, outcome.rendezvous_time);
  if (!outcome.status.ok() && world_ == 1 && outcome.status.code() == absl::StatusCode::kUnavailable) {
    // A lone client needs no other rank: the fleet could not run its step (its membership is
    // changing, or its coordinator is gone), so this rank computes it alone, as it would
    // outside the fleet. The results are the same (every algorithm gives the whole-matrix NS
    // for a lone client).
    LOG_WARNING("rpc") << "step " << key_.ToString() << ": " << outcome.status.message() << "; computing it here";
    outcome = RunHere(*step);
  }
  if (!outcome.status.ok()) {
    retryable_ = outcome.retryable;
    return outcome.status;
  }
  for (size_t i = 0; i < step->matrices.size(); ++i) {
    const MatrixPlan& plan = step->matrices[i];
    const absl::Status& s = outcome.matrices[i];
    s_.metrics_->MatrixDone(kMethod, AlgorithmName(plan.algorithm), DTypeName(plan.dtype), CodeName(s.code()));
    const std::vector<char>& out = step->outputs[i];
    writer_.Write(static_cast<int>(i), plan, plan.blocks[0].block, s,
                  s.ok() ? absl::string_view(out.data(), out.size()) : absl::string_view(),
                  std::shared_ptr<const void>(step, out.data()));
  }
  writer_.Summary(s_.fleet_->rank(), start_);
  return absl::OkStatus();
}

grpc::Status OrthogonalizerService::OrthogonalizeRawStream(grpc::ServerContext* context, Stream* stream) {
  const absl::Time start = absl::Now();
  metrics_->inflight_requests().Set(++inflight_);
  StreamStep step(*this, context, stream);
  absl::Status status = step.Run();
  step.Close();
  if (!status.ok() && step.retryable()) context->AddTrailingMetadata(kRetryableKey, kRetryableFleetChange);
  metrics_->inflight_requests().Set(--inflight_);
  metrics_->RequestDone(kMethod, CodeName(status.code()), absl::Now() - start);
  if (!status.ok()) VLOG("rpc", 1) << "stream failed: " << status;
  return ToGrpcStatus(status);
}

}  // namespace orthoserve
