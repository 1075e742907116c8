// Implementation of server/rpc/result_writer.h.
#include "server/rpc/result_writer.h"

#include <algorithm>
#include <utility>

#include "proto/convert/ns_options_proto.h"
#include "server/rpc/stream_codec.h"

namespace orthoserve {

ResultWriter::ResultWriter(Stream* stream, int64_t chunk_bytes, Metrics* metrics, const char* method)
    : stream_(stream), chunk_bytes_(chunk_bytes), metrics_(metrics), method_(method), thread_([this] { Loop(); }) {}

ResultWriter::~ResultWriter() { Close(); }

void ResultWriter::Write(int index, const MatrixPlan& plan, const Block& block, const absl::Status& status,
                         absl::string_view data, const std::shared_ptr<const void>& owner) {
  Item item;
  v1::StreamResponse header;
  v1::MatrixResult* r = header.mutable_result();
  r->set_index(index);
  r->set_name(plan.name);
  r->set_dtype(DTypeToProto(plan.result_dtype));
  for (int64_t d : plan.shape) r->add_shape(d);
  r->set_nd_layout(NdLayoutToProto(plan.layout));
  *r->mutable_block() = BlockToProto(block);
  r->set_code(static_cast<int>(status.code()));
  r->set_message(std::string(status.message()));
  item.messages.push_back(SerializeToByteBuffer(header));
  item.ok = status.ok();
  if (status.ok()) {
    for (size_t offset = 0; offset < data.size(); offset += static_cast<size_t>(chunk_bytes_)) {
      const size_t n = std::min(static_cast<size_t>(chunk_bytes_), data.size() - offset);
      item.messages.push_back(ChunkResponse(index, data.substr(offset, n), owner));
    }
    item.data_bytes = static_cast<double>(data.size());
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (closing_) return;
  queue_.push_back(std::move(item));
  cv_.notify_one();
}

void ResultWriter::Summary(int fleet_rank, absl::Time start) {
  Item item;
  item.fleet_rank = fleet_rank;
  item.start = start;
  std::lock_guard<std::mutex> lock(mu_);
  if (closing_) return;
  queue_.push_back(std::move(item));
  cv_.notify_one();
}

void ResultWriter::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
    cv_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

void ResultWriter::Loop() {
  bool broken = false;
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return closing_ || !queue_.empty(); });
      if (queue_.empty()) return;  // Closing, and everything is written.
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    // Once broken, the rest is dropped (its buffers released) without writing.
    if (!broken) broken = !WriteItem(item);
  }
}

bool ResultWriter::WriteItem(Item& item) {
  if (item.messages.empty()) {
    v1::StreamResponse response;
    v1::StepSummary* s = response.mutable_summary();
    s->set_matrices_ok(ok_);
    s->set_matrices_failed(failed_);
    s->set_fleet_rank(item.fleet_rank);
    s->set_server_seconds(absl::ToDoubleSeconds(absl::Now() - item.start));
    return stream_->Write(SerializeToByteBuffer(response));
  }
  const absl::Time start = absl::Now();
  for (grpc::ByteBuffer& message : item.messages) {
    if (!stream_->Write(message)) return false;
  }
  if (item.ok) {
    metrics_->BytesOut(method_, item.data_bytes);
    metrics_->TenantBytes(tenant_, "out", item.data_bytes);
  }
  (item.ok ? ok_ : failed_)++;
  metrics_->StageTime(Stage::kSend, absl::Now() - start);
  return true;
}

}  // namespace orthoserve
