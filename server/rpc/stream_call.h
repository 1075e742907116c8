// One OrthogonalizeStream call on gRPC's callback API: it authenticates and admits the call,
// parses each message as it is read (stream_codec.h: chunk bytes are viewed where gRPC received
// them), admits each matrix's bytes and feeds the step layer (server/step/step.h); the step's
// results come back through StepSink and are written in the order they were produced, each
// write started when the previous one is done. No thread is held by a call: reads, writes and
// cancellation arrive as events, so idle streams cost memory, not threads.
//
// Lifetime: gRPC holds the reactor from Start until OnDone; the step's work in flight (compute
// jobs, a group step in the fleet) holds it as its sink for as long as that work runs, and the
// call drops everything the sink receives once it has finished.
#pragma once

#include <deque>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"
#include "server/rpc/service_state.h"
#include "server/rpc/stream_codec.h"

namespace orthoserve {

class StreamCall final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                         public StepSink,
                         public ProgressWatchdog::Call,
                         public std::enable_shared_from_this<StreamCall> {
 public:
  // Serves the call `context` of the service `state`.
  static grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Start(ServiceState& state,
                                                                           grpc::CallbackServerContext* context);

  // grpc::ServerBidiReactor.
  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

  // StepSink.
  void Result(int index, const MatrixPlan& plan, const Block& block, const absl::Status& status,
              absl::string_view data, std::shared_ptr<const void> owner) override;
  void Finished(StepEnd end) override;

  // ProgressWatchdog::Call.
  absl::Time stalled_since() const override;
  void ProgressTimedOut(absl::Duration stalled) override;
  // `bytes` more moved while waiting on the client: the window's mark moves to now once `moved`
  // reaches --stream-min-progress-bytes.
  void Progressed(int64_t bytes, absl::Time& mark, int64_t& moved) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

 private:
  struct Out {
    grpc::ByteBuffer message;
    double data_bytes = 0;  // Result bytes in this message (metrics once written).
  };

  StreamCall(ServiceState& state, grpc::CallbackServerContext* context);
  void Begin();
  absl::Status Admit();
  void ReadNext();
  // Handles the message just read; false when no more messages are wanted.
  bool Handle();
  bool OnHeader();
  bool OnSpec(const v1::MatrixSpec& spec);
  bool OnChunk(int index);
  // Half-close, or a broken read.
  void InputEnded();
  // Fails the call: through the step when there is one (it finishes the call), at once otherwise.
  void Fail(absl::Status status);
  void Enqueue(std::vector<grpc::ByteBuffer> messages, double data_bytes);
  // Finishes the call with `status` once everything queued is written (at once if the stream broke);
  // a status marked by MarkFleetChange finishes with the retryable trailer.
  void RequestFinish(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_);
  // Finishes the call with finish_status_ (output_ is kFinished).
  void DoFinish();

  ServiceState& s_;
  grpc::CallbackServerContext* const context_;
  StepServices services_;
  const SpecLimits spec_limits_;
  const absl::Time start_ = absl::Now();
  std::shared_ptr<StreamCall> self_;  // gRPC's hold, until OnDone.
  uint64_t watch_id_ = 0;

  // Reader's state (one read at a time; gRPC orders the reads and the reader's callbacks).
  StreamRequestView request_;
  std::string tenant_;
  int world_ = 1;
  std::string call_id_;  // StepHeader.call_id: the slices this call leases are held under it.
  int specs_ = 0;
  int64_t result_chunk_bytes_ = kDefaultResultChunkBytes;
  Admission::Ticket stream_slot_;
  Admission::Ticket bytes_;
  std::shared_ptr<Step> reader_step_;  // The reader's own reference to step_.

  // The write side of the call, in order: results are queued and written one at a time while
  // kOpen; kBroken when a write failed (the client is gone: nothing more is queued); kFinishing
  // once the finish is wanted (what is queued is written first); kFinished once Finish is called
  // (finish_status_ is no longer written).
  enum class Output { kOpen, kBroken, kFinishing, kFinished };

  mutable absl::Mutex mu_;
  std::shared_ptr<Step> step_ ABSL_GUARDED_BY(mu_);
  // Where the results of matrices whose spec named a result_region are written (by index), until
  // their Result.
  absl::flat_hash_map<int, v1::RegionSlice> result_regions_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;  // A read is outstanding while the step still wants input.
  // Progress while the call waits on its client, each way: since the mark, fewer than
  // stream_min_progress_bytes moved (the watchdog's measure; the mark moves on when that many have).
  absl::Time read_mark_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t read_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time write_mark_ ABSL_GUARDED_BY(mu_);
  int64_t written_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  Output output_ ABSL_GUARDED_BY(mu_) = Output::kOpen;
  std::deque<Out> queue_ ABSL_GUARDED_BY(mu_);  // queue_.front() is being written while writing_.
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  int results_ok_ ABSL_GUARDED_BY(mu_) = 0;
  int results_failed_ ABSL_GUARDED_BY(mu_) = 0;
  // How the call finishes: set when output_ becomes kFinishing, read (without the lock) once it
  // is kFinished, when nothing writes it any more.
  absl::Status finish_status_;
};

}  // namespace orthoserve
