// Prometheus metrics of one server rank (DESIGN §6): a registry with every orthoserve_ family,
// typed accessors for the code that records, and an optional HTTP exposer at /metrics.
//
// Names carry the orthoserve_ prefix and base units (seconds, bytes); counters end in _total;
// histograms use the explicit buckets below. Thread-safe: prometheus-cpp metrics are atomic and
// label lookups (Family::Add) are internally locked.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/metrics/http_exposer.h"

namespace orthoserve {

// Stages of a request whose durations are recorded (orthoserve_stage_duration_seconds{stage}).
enum class Stage { kReceive, kQueue, kRendezvous, kCollective, kCompute, kSend };
absl::string_view StageName(Stage stage);

class Metrics {
 public:
  struct Options {
    std::string address;  // HOST:PORT of the /metrics HTTP endpoint; empty: no exposer.
    std::string version;  // build_info labels.
    std::string backend;
    std::string device;
  };

  // INVALID_ARGUMENT for a malformed `address`, UNAVAILABLE when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(const Options& options);

  // The port the exposer listens on (resolves ":0"), or 0 without an exposer.
  int port() const;
  prometheus::Registry& registry() { return *registry_; }

  void RequestDone(absl::string_view method, absl::string_view code, absl::Duration duration);
  void MatrixDone(absl::string_view method, absl::string_view algorithm, absl::string_view dtype,
                  absl::string_view code);
  void StageTime(Stage stage, absl::Duration duration);
  void CollectiveTime(absl::string_view op, absl::Duration duration);
  void BytesIn(absl::string_view method, double bytes);
  void BytesOut(absl::string_view method, double bytes);
  void Flops(double flops);
  void RendezvousTimeout();
  void StepAborted(absl::string_view reason);
  // A step arrived with attempt > 0 (a client retried it).
  void StepRetried(absl::string_view method);
  // The coordinator started a generation; reason: joined, restarted, left, lost, collective_failed.
  void Reformation(absl::string_view reason);
  // Time this rank saw the fleet below its configured size (or itself outside it).
  void Degraded(absl::Duration duration);

  prometheus::Gauge& inflight_requests() { return *inflight_requests_; }
  prometheus::Gauge& inflight_bytes() { return *inflight_bytes_; }
  prometheus::Gauge& queue_depth() { return *queue_depth_; }
  prometheus::Gauge& fleet_size() { return *fleet_size_; }
  prometheus::Gauge& fleet_members_ready() { return *fleet_members_ready_; }
  prometheus::Gauge& fleet_ready() { return *fleet_ready_; }
  prometheus::Gauge& fleet_generation() { return *fleet_generation_; }
  prometheus::Gauge& device_memory(absl::string_view kind);

 private:
  Metrics() = default;

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<HttpExposer> exposer_;

  prometheus::Family<prometheus::Counter>* requests_ = nullptr;
  prometheus::Family<prometheus::Counter>* matrices_ = nullptr;
  prometheus::Family<prometheus::Histogram>* request_duration_ = nullptr;
  prometheus::Family<prometheus::Histogram>* stage_duration_ = nullptr;
  prometheus::Family<prometheus::Histogram>* collective_duration_ = nullptr;
  prometheus::Family<prometheus::Counter>* bytes_in_ = nullptr;
  prometheus::Family<prometheus::Counter>* bytes_out_ = nullptr;
  prometheus::Family<prometheus::Counter>* steps_aborted_ = nullptr;
  prometheus::Family<prometheus::Gauge>* device_memory_ = nullptr;
  prometheus::Family<prometheus::Counter>* steps_retried_ = nullptr;
  prometheus::Family<prometheus::Counter>* reformations_ = nullptr;
  prometheus::Counter* degraded_seconds_ = nullptr;
  prometheus::Gauge* fleet_generation_ = nullptr;
  prometheus::Counter* flops_ = nullptr;
  prometheus::Counter* rendezvous_timeouts_ = nullptr;
  prometheus::Gauge* inflight_requests_ = nullptr;
  prometheus::Gauge* inflight_bytes_ = nullptr;
  prometheus::Gauge* queue_depth_ = nullptr;
  prometheus::Gauge* fleet_size_ = nullptr;
  prometheus::Gauge* fleet_members_ready_ = nullptr;
  prometheus::Gauge* fleet_ready_ = nullptr;
};

}  // namespace orthoserve
