// Writes one OrthogonalizeStream's responses from a thread of its own, so that whoever produces
// a result (a compute thread) hands it over and goes on with the next matrix while gRPC sends
// this one (docs/architecture.md: results stream back while later matrices are computed and still arrive).
// Results are written in the order they are handed over, each matrix's header and chunks
// together; the chunks refer to the result's bytes (stream_codec.h), they are not copied.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"
#include "server/distributed/batch.h"
#include "server/metrics/metrics.h"

namespace orthoserve {

class ResultWriter {
 public:
  using Stream = grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;

  // `stream` and `metrics` must outlive the writer; `method` names the RPC in metrics.
  ResultWriter(Stream* stream, int64_t chunk_bytes, Metrics* metrics, const char* method);
  // Close().
  ~ResultWriter();

  // Largest DataChunk.data of the results, from the step header; call before the first Write
  // (results are produced only after the header).
  void SetChunkBytes(int64_t chunk_bytes) { chunk_bytes_ = chunk_bytes; }
  // The tenant whose bytes the results are (per-tenant metrics); call before the first Write.
  void SetTenant(std::string tenant) { tenant_ = std::move(tenant); }

  // Queues matrix `index`'s result: its header and, when `status` is OK, `data` in chunks.
  // `owner` keeps `data` alive and unchanged until gRPC has sent it. Returns at once.
  // Thread-safe.
  void Write(int index, const MatrixPlan& plan, const Block& block, const absl::Status& status, absl::string_view data,
             const std::shared_ptr<const void>& owner);

  // Queues the StepSummary (after every result queued so far), counting the results written
  // and the time since `start`.
  void Summary(int fleet_rank, absl::Time start);

  // Writes everything queued and stops the thread. Once the stream is broken (the client is
  // gone) the rest is dropped. Call it before the RPC returns; later Writes are dropped.
  void Close();

 private:
  struct Item {
    std::vector<grpc::ByteBuffer> messages;  // Empty for the summary.
    bool ok = false;                         // A successful result (counted in matrices_ok).
    double data_bytes = 0;
    int fleet_rank = 0;  // Summary only.
    absl::Time start;    // Summary only.
  };

  void Loop();
  // Writes `item`; false when the stream broke.
  bool WriteItem(Item& item);

  Stream* stream_;
  int64_t chunk_bytes_;
  std::string tenant_;
  Metrics* metrics_;
  const char* method_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool closing_ = false;
  // Written by the writer thread only.
  int ok_ = 0;
  int failed_ = 0;
  std::thread thread_;
};

}  // namespace orthoserve
