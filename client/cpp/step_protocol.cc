// Implementation of client/cpp/step_protocol.h.
#include "client/cpp/step_protocol.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/cpp/chunking.h"
#include "client/cpp/run_id.h"
#include "common/status.h"

namespace orthoserve::client {
namespace {

absl::Status StreamBroken() { return absl::UnavailableError("the stream closed before the step was sent"); }

StepRequests::Request MessageRequest(const v1::StreamRequest* message, bool last) {
  StepRequests::Request request;
  request.message = message;
  request.last = last;
  return request;
}

}  // namespace

absl::Status WriteStep(const StepOptions& step, int attempt, absl::Span<const MatrixInput> inputs, size_t chunk_bytes,
                       const std::function<bool(const v1::StreamRequest&)>& write) {
  v1::StreamRequest chunk;
  return WriteStep(step, attempt, inputs, chunk_bytes, write, [&](int index, absl::string_view data) {
    chunk.mutable_chunk()->set_index(index);
    chunk.mutable_chunk()->set_data(data.data(), data.size());
    return write(chunk);
  });
}

StepRequests::StepRequests(const StepOptions& step, int attempt, absl::Span<const MatrixInput> inputs,
                           size_t chunk_bytes, const std::string& call_id)
    : inputs_(inputs), chunk_bytes_(chunk_bytes) {
  v1::StepHeader* header = request_.mutable_header();
  header->set_job(step.job);
  header->set_group(step.group);
  header->set_step(step.step);
  header->set_rank(step.rank);
  header->set_world(step.world);
  header->set_num_matrices(static_cast<int>(inputs.size()));
  header->set_attempt(attempt);
  if (step.world > 1) header->set_run_id(step.run_id.empty() ? DefaultRunId() : step.run_id);
  header->set_call_id(call_id);
}

std::optional<StepRequests::Request> StepRequests::Next() {
  while (true) {
    switch (stage_) {
      case Stage::kHeader:
        stage_ = Stage::kSpec;
        return MessageRequest(&request_, /*last=*/false);
      case Stage::kSpec:
        if (input_ == inputs_.size()) {
          request_.mutable_end();
          stage_ = Stage::kDone;
          return MessageRequest(&request_, /*last=*/true);
        }
        *request_.mutable_spec() = ToSpec(inputs_[input_]);
        chunks_ = SplitChunks(inputs_[input_].data, inputs_[input_].bytes, chunk_bytes_);
        next_chunk_ = 0;
        stage_ = Stage::kChunks;
        return MessageRequest(&request_, /*last=*/false);
      case Stage::kChunks:
        if (next_chunk_ < chunks_.size()) {
          Request chunk;
          chunk.chunk_index = static_cast<int>(input_);
          chunk.chunk_data = chunks_[next_chunk_++];
          return chunk;
        }
        ++input_;
        stage_ = Stage::kSpec;
        break;
      case Stage::kDone:
        return std::nullopt;
    }
  }
}

absl::Status WriteStep(const StepOptions& step, int attempt, absl::Span<const MatrixInput> inputs, size_t chunk_bytes,
                       const std::function<bool(const v1::StreamRequest&)>& write,
                       const std::function<bool(int index, absl::string_view data)>& write_chunk) {
  StepRequests requests(step, attempt, inputs, chunk_bytes);
  while (std::optional<StepRequests::Request> request = requests.Next()) {
    const bool written = request->message != nullptr ? write(*request->message)
                                                     : write_chunk(request->chunk_index, request->chunk_data);
    if (!written) return StreamBroken();
  }
  return absl::OkStatus();
}

StepResultAssembler::StepResultAssembler(std::vector<std::string> names)
    : names_(std::move(names)),
      outputs_(names_.size()),
      states_(names_.size(), State::kWaiting),
      expected_(names_.size(), 0),
      received_(names_.size(), 0) {}

namespace {
std::vector<std::string> NamesOf(absl::Span<const MatrixInput> inputs) {
  std::vector<std::string> names;
  names.reserve(inputs.size());
  for (const MatrixInput& input : inputs) names.push_back(input.name);
  return names;
}
}  // namespace

StepResultAssembler::StepResultAssembler(absl::Span<const MatrixInput> inputs)
    : StepResultAssembler(NamesOf(inputs)) {
  inputs_ = inputs;
}

absl::StatusOr<std::optional<int>> StepResultAssembler::Add(const v1::StreamResponse& response) {
  const int n = static_cast<int>(names_.size());
  if (summary_.has_value()) {
    return absl::InternalError("server protocol error: a message followed the StepSummary");
  }
  switch (response.kind_case()) {
    case v1::StreamResponse::kResult: {
      const v1::MatrixResult& r = response.result();
      const int i = r.index();
      if (i < 0 || i >= n) {
        return absl::InternalError(absl::StrCat("server protocol error: result index ", i, " outside 0..", n - 1));
      }
      if (states_[i] != State::kWaiting) {
        return absl::InternalError(absl::StrCat("server protocol error: second result for matrix ", i));
      }
      if (r.name() != names_[i]) {
        return absl::InternalError(absl::StrCat("server protocol error: result ", i, " is named \"", r.name(),
                                                "\", but matrix ", i, " is \"", names_[i], "\""));
      }
      if (!r.data().empty()) {
        return absl::InternalError(absl::StrCat("server protocol error: stream result ", i, " carries inline data"));
      }
      ASSIGN_OR_RETURN(outputs_[i], FromResult(r));
      expected_[i] = ExpectedBytes(outputs_[i]);
      if (!inputs_.empty() && outputs_[i].status.ok()) {
        RETURN_IF_ERROR(CheckResultRegion(inputs_[i], r));
        if (inputs_[i].result_region.has_value()) {  // Written into the region: no chunks follow.
          outputs_[i].in_place = true;
          outputs_[i].result_region = inputs_[i].result_region;
          expected_[i] = 0;
        } else {
          RETURN_IF_ERROR(CheckResultBuffer(inputs_[i], outputs_[i], expected_[i]));
          outputs_[i].in_place = inputs_[i].result != nullptr;
        }
      }
      if (!outputs_[i].in_place) outputs_[i].data.reserve(expected_[i]);
      states_[i] = expected_[i] == 0 ? State::kDone : State::kReceiving;
      if (states_[i] == State::kDone) return std::optional<int>(i);
      return std::optional<int>();
    }
    case v1::StreamResponse::kChunk: {
      const absl::string_view data = response.chunk().data();
      return AddChunk(response.chunk().index(), absl::MakeConstSpan(&data, 1));
    }
    case v1::StreamResponse::kSummary:
      summary_ = response.summary();
      return std::optional<int>();
    case v1::StreamResponse::KIND_NOT_SET:
      break;
  }
  return absl::InternalError("server protocol error: an empty StreamResponse");
}

absl::StatusOr<std::optional<int>> StepResultAssembler::AddChunk(int i, absl::Span<const absl::string_view> data) {
  if (summary_.has_value()) {
    return absl::InternalError("server protocol error: a message followed the StepSummary");
  }
  const int n = static_cast<int>(names_.size());
  if (i < 0 || i >= n || states_[i] != State::kReceiving) {
    return absl::InternalError(
        absl::StrCat("server protocol error: data chunk for matrix ", i, ", which has no open result"));
  }
  size_t size = 0;
  for (absl::string_view piece : data) size += piece.size();
  if (received_[i] + size > expected_[i]) {
    return absl::InternalError(absl::StrCat("server protocol error: matrix ", i, " \"", names_[i], "\" got ",
                                            received_[i] + size, " bytes, more than the ", expected_[i],
                                            " of its block"));
  }
  if (outputs_[i].in_place) {
    char* out = static_cast<char*>(inputs_[i].result) + received_[i];
    for (absl::string_view piece : data) {
      std::memcpy(out, piece.data(), piece.size());
      out += piece.size();
    }
  } else {
    std::vector<char>& out = outputs_[i].data;
    for (absl::string_view piece : data) out.insert(out.end(), piece.begin(), piece.end());
  }
  received_[i] += size;
  if (received_[i] < expected_[i]) return std::optional<int>();
  states_[i] = State::kDone;
  return std::optional<int>(i);
}

absl::Status StepResultAssembler::CheckComplete() const {
  for (size_t i = 0; i < states_.size(); ++i) {
    if (states_[i] == State::kWaiting) {
      return absl::InternalError(absl::StrCat("server protocol error: the stream ended without a result for matrix ", i,
                                              " \"", names_[i], "\""));
    }
    if (states_[i] == State::kReceiving) {
      return absl::InternalError(absl::StrCat("server protocol error: the stream ended with matrix ", i, " \"",
                                              names_[i], "\" at ", received_[i], " of ", expected_[i],
                                              " bytes"));
    }
  }
  if (!summary_.has_value())
    return absl::InternalError("server protocol error: the stream ended without a StepSummary");
  return absl::OkStatus();
}

}  // namespace orthoserve::client
