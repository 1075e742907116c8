// The step layer: one trainer rank's step, from its header to its last result, with no gRPC
// (docs/architecture.md). The RPC layer parses and admits what arrives and feeds it here
// message by message; the step computes — on this rank alone, or through the fleet — and hands
// every result, then its end, to a StepSink, which streams them back.
//
// Two implementations behind one interface, chosen by OpenStep:
//  - a lone step (W = 1) is pipelined: each matrix goes, as soon as its bytes are in, to this
//    rank's compute queue or, on a formed fleet of S > 1, to the member the fleet picks
//    (StepFleet::PickLoneRank, the Peer service), and its result goes to the sink as soon as it is
//    done, while later matrices still arrive. A matrix with a bad spec or data is answered
//    in-band (its result carries the error) and the step goes on — unless the step is all or
//    nothing (StepRequest::all_or_nothing, a unary call), which computes nothing until every
//    matrix arrived whole and fails as a whole on the first bad one.
//  - a group step (W > 1) is handed to the fleet once every matrix has arrived; results come
//    back after its batch ran. Any bad input fails the whole step, on every rank (the others are
//    told at once, not at their rendezvous timeout).
//
// Threading: AddMatrix, AddData and End are called by one reader at a time, in the order the
// messages arrived. Cancel may be called from any thread at any time. The sink is called from
// the reader's thread, compute threads and fleet threads, never after Finished.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/buffer_pool.h"
#include "common/fair_pool.h"
#include "common/fleet_change.h"
#include "common/shared_span.h"
#include "server/plan/matrix_plan.h"
#include "server/engine/backend.h"
#include "server/fleet/logic/step_fleet.h"
#include "server/metrics/metrics.h"

namespace orthoserve {

// What admission counts for the server's own structures of one matrix, on top of its variable
// metadata (name, dims, coefficients: SpecMetadataBytes in server/rpc/stream_codec.h), so that a
// step of many tiny matrices is charged for what it holds. Half is the step layer's: a step's
// StepBase::Matrix (360 bytes on x86-64 with libstdc++) and, for a group step, the copy of its
// plan it submits with the placement, buffer headers and status (320 bytes); half the RPC
// layer's: a unary call's request view, parsed spec, result slot and response header (750
// bytes), or a stream's queued result messages. The rest of each half covers the allocator's
// headers of these objects' separate allocations. step.cc and unary_call.cc check with
// static_asserts that their half covers what they hold.
inline constexpr int64_t kMatrixOverheadBytes = 2048;

// A step header, as the RPC layer validated it.
struct StepRequest {
  std::string tenant;
  std::string job;    // The trainer job; may be empty for a lone client.
  std::string group;  // The trainer group within the job.
  int64_t step = 0;
  int rank = 0;       // This trainer's rank, 0 <= rank < world.
  int world = 1;      // Trainer ranks in the group (W).
  int attempt = 0;    // The client's attempt number.
  int num_matrices = 1;
  std::string run;    // The trainers' run (StepHeader.run_id); group steps only.
  // All or nothing (a unary call; lone steps only): every matrix is checked as it arrives (its
  // spec, its data's length, NaN and Inf) and none is computed before all have arrived whole;
  // the first that fails fails the whole step (no in-band answers).
  bool all_or_nothing = false;
};

// What a step needs of the server. None of the pointers is owned; all outlive every step.
struct StepServices {
  StepFleet* fleet = nullptr;
  FairPool* compute = nullptr;
  Backend* backend = nullptr;
  BufferPool* buffers = nullptr;  // Lone steps' input and result buffers.
  Metrics* metrics = nullptr;
  const char* method = "";        // The RPC, in metrics.
};

// A matrix's memory outside the step's buffers — slices of registered shared-memory regions
// (server/shm) that the RPC layer resolved and leased: the step reads the input and writes the
// result there, copying neither (docs/shared_memory.md). A slice of a CUDA IPC region is device
// memory of the backend's GPU (space kDevice): the step checks it and the backend computes on it
// there, and no host code reads or writes it.
struct MatrixMemory {
  const char* input = nullptr;  // The block's spec.block_bytes bytes; null: they arrive through AddData.
  char* result = nullptr;       // Room for the result (block numel × result dtype); null: a buffer of the step's.
  // Keeps `input` and `result` valid (the regions' leases). The step drops it once the matrix is
  // computed, or hands it to the sink as the owner of a result written to `result`.
  std::shared_ptr<const void> owner;
  MemorySpace input_space = MemorySpace::kHost;   // Where `input` is.
  MemorySpace result_space = MemorySpace::kHost;  // Where `result` is.
  // The slices as every process on this host names them (RegionLease::span): the overlap checks
  // compare these, not addresses, so that one memfd registered twice, or on two server processes,
  // is seen to be one memory. Empty (unknown memory) where there is no slice.
  SharedSpan input_span{};
  SharedSpan result_span{};
};

// How a step ended. `status` OK: every matrix's result was handed to the sink before. Otherwise
// the step failed; a failure that came from a change of the fleet, after which a retry of the
// whole step (elsewhere) may succeed, carries the mark of MarkFleetChange (common/fleet_change.h).
struct StepEnd {
  absl::Status status;
};

// Receives a step's results. Implementations must be thread-safe.
class StepSink {
 public:
  virtual ~StepSink() = default;
  // Matrix `index`'s result: its status and, when OK, `data` (block.numel() elements of
  // plan.result_dtype) kept alive and unchanged by `owner` for as long as the sink holds it. A
  // result written into device memory (MatrixMemory::result_space kDevice) comes with empty
  // `data`: it is in the client's region, where host code cannot read it.
  virtual void Result(int index, const MatrixPlan& plan, const Block& block, const absl::Status& status,
                      absl::string_view data, std::shared_ptr<const void> owner) = 0;
  // The step is over; called exactly once, after every Result.
  virtual void Finished(StepEnd end) = 0;
};

class Step {
 public:
  virtual ~Step() = default;

  // Matrix number `count so far`: its parsed spec, or why it could not be parsed (`name` and
  // `shape` as sent, for the in-band answer). False when the step failed (Finished follows, or
  // came already): stop feeding it.
  virtual bool AddMatrix(absl::StatusOr<ParsedSpec> spec, absl::string_view name, std::vector<int64_t> shape) = 0;
  // Like AddMatrix with a valid spec, for a matrix whose input and/or result live in `memory`
  // (see MatrixMemory). With memory.input no AddData follows for this matrix: its bytes are
  // checked for NaN and Inf where they are (on the device, by the backend's Memory, for device
  // memory). In a lone step such a matrix is computed on this rank, never forwarded to a fleet
  // peer. In a group step the block is handed to the fleet where it is (TrainerStep::input_at,
  // output_at): the batch reads it in place (copying it only into the fleet exchange's buffers)
  // and writes this trainer rank's result block into `result`; the memory's owner is held until
  // the batch ran and the result was delivered (the fleet keeps a copy of the input for replays,
  // never the memory). Device memory is refused in a group step (FAILED_PRECONDITION, failing
  // the step), and on a backend that computes in host memory (FAILED_PRECONDITION, like a bad
  // spec). False when the step failed.
  virtual bool AddMatrixInMemory(ParsedSpec spec, MatrixMemory memory) = 0;
  // Bytes of matrix `index`'s block, in order (views of one chunk). False when the step failed.
  virtual bool AddData(int index, absl::Span<const absl::string_view> data) = 0;
  // Every input has arrived (StepEnd or half-close): the step checks it got every matrix whole
  // and finishes when its results are out.
  virtual void End() = 0;
  // Fails the step with `status` (e.g. a refused admission); a group step is aborted on every
  // rank. No-op once finished.
  virtual void Fail(absl::Status status) = 0;
  // The client is gone (cancelled, its deadline passed, or the server's drain deadline cut the
  // call: `draining`): nothing more is computed for it, and a group step stops waiting at once.
  virtual void Cancel(bool draining) = 0;

  // Served on this rank alone (pipelined), not through the fleet.
  virtual bool lone() const = 0;
};

// Opens a step of `request` whose results go to `sink`. UNAVAILABLE, marked as a fleet change,
// for a group step on a rank that does not take group steps (StepFleet::takes_group_steps: not a
// member of a formed fleet generation, and not holding steps for the next one).
absl::StatusOr<std::shared_ptr<Step>> OpenStep(const StepServices& services, StepRequest request,
                                               std::shared_ptr<StepSink> sink);

}  // namespace orthoserve
