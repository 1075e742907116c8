// The client side of one OrthogonalizeStream step, without gRPC: the request messages a step
// consists of (StepRequests, WriteStep) and the reassembly of the server's responses (StepResultAssembler).
// client.cc drives both over a real stream; tests drive them directly.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/cpp/matrix.h"
#include "orthoserve/v1/orthogonalizer.pb.h"

namespace orthoserve::client {

// The request messages of one step, pulled one at a time (for a writer that sends the next message
// when the previous one is done): a StepHeader (with `attempt`: 0 on the first try, +1 per retry),
// then for each input its MatrixSpec followed by DataChunks of at most `chunk_bytes` carrying
// exactly its bytes, then StepEnd. The inputs must have passed CheckInput, and their bytes must
// outlive the object (chunks are views of them). Not thread-safe.
class StepRequests {
 public:
  // One message: a DataChunk when `message` is null (matrix `chunk_index`, bytes `chunk_data`, a
  // view into the input: no copy is made here); otherwise the header, a spec or the end, valid
  // until the next call of Next.
  struct Request {
    const v1::StreamRequest* message = nullptr;
    int chunk_index = -1;
    absl::string_view chunk_data;
    bool last = false;  // The StepEnd: no message follows.
  };

  // `call_id`: StepHeader.call_id (empty: none; run_id.h's NewCallId for a call naming regions).
  StepRequests(const StepOptions& step, int attempt, absl::Span<const MatrixInput> inputs, size_t chunk_bytes,
               const std::string& call_id = "");
  StepRequests(const StepRequests&) = delete;
  StepRequests& operator=(const StepRequests&) = delete;

  // The next message; nullopt once the StepEnd was returned.
  std::optional<Request> Next();

 private:
  enum class Stage { kHeader, kSpec, kChunks, kDone };
  const absl::Span<const MatrixInput> inputs_;
  const size_t chunk_bytes_;
  v1::StreamRequest request_;  // The header (set at construction), then the current spec, then the end.
  Stage stage_ = Stage::kHeader;
  size_t input_ = 0;                        // The input whose spec or chunks come next.
  std::vector<absl::string_view> chunks_;  // Input input_'s chunks (kChunks).
  size_t next_chunk_ = 0;
};

// Emits one step (the messages of StepRequests, in order) through `write`. The inputs must have
// passed CheckInput. `write` returns false
// when the stream is broken; WriteStep then stops and returns UNAVAILABLE (the stream's own status,
// read by the caller, says why). `write` may reuse nothing of the message after it returns.
absl::Status WriteStep(const StepOptions& step, int attempt, absl::Span<const MatrixInput> inputs, size_t chunk_bytes,
                       const std::function<bool(const v1::StreamRequest&)>& write);

// WriteStep that hands each DataChunk to `write_chunk` as its matrix index and a view of its bytes
// in the input (no copy is made here); every other message goes through `write`. Both return
// false when the stream is broken.
absl::Status WriteStep(const StepOptions& step, int attempt, absl::Span<const MatrixInput> inputs, size_t chunk_bytes,
                       const std::function<bool(const v1::StreamRequest&)>& write,
                       const std::function<bool(int index, absl::string_view data)>& write_chunk);

// Reassembles the StreamResponse messages of one step of `names.size()` matrices: a MatrixResult
// opens a matrix, its DataChunks (by index, possibly interleaved with other matrices') fill it,
// and one StepSummary closes the step. Not thread-safe; one instance per step.
class StepResultAssembler {
 public:
  // `names[i]` is the name sent for matrix i; a result must carry the same name. Results go into
  // MatrixOutput::data.
  explicit StepResultAssembler(std::vector<std::string> names);
  // For the (checked) inputs of a step: their names, and their result buffers where they have one
  // (the output is then `in_place`; a result of another size is a protocol error), and their
  // result regions (an OK result must echo the slice and completes on its MatrixResult: the
  // server wrote the data into the region, and the output is `in_place` with its result_region;
  // CheckResultRegion). The inputs must outlive the assembler.
  explicit StepResultAssembler(absl::Span<const MatrixInput> inputs);

  // Consumes one message. Returns the index of the matrix this message completed, if any (an error
  // result or an empty block completes on its MatrixResult). INTERNAL, naming what was wrong, when
  // the server breaks the protocol: an index out of range, a duplicate result, a name mismatch, a
  // chunk for a matrix without an open result or beyond its bytes, a message after the summary,
  // an empty message.
  absl::StatusOr<std::optional<int>> Add(const v1::StreamResponse& response);

  // Add for a DataChunk of matrix `index` whose bytes are `data` (views, in order), wherever they
  // lie: they are copied once, into the matrix's output.
  absl::StatusOr<std::optional<int>> AddChunk(int index, absl::Span<const absl::string_view> data);

  // The completed output of matrix `index` (valid after Add reported it complete).
  const MatrixOutput& output(int index) const { return outputs_[index]; }

  // OK when every matrix is complete and the summary arrived; INTERNAL naming the first missing
  // piece otherwise. Call when the stream ended with an OK status.
  absl::Status CheckComplete() const;

  // The outputs in input order; leaves the assembler empty.
  std::vector<MatrixOutput> TakeOutputs() { return std::move(outputs_); }

  const std::optional<v1::StepSummary>& summary() const { return summary_; }

 private:
  enum class State { kWaiting, kReceiving, kDone };
  std::vector<std::string> names_;
  std::vector<MatrixOutput> outputs_;
  std::vector<State> states_;
  std::vector<size_t> expected_;
  std::vector<size_t> received_;
  absl::Span<const MatrixInput> inputs_;  // Empty: no result buffers.
  std::optional<v1::StepSummary> summary_;
};

}  // namespace orthoserve::client
