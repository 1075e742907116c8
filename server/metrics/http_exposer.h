// A minimal HTTP endpoint that serves metric families at GET /metrics (Prometheus text format
// 0.0.4), collected anew for every scrape. We serve it ourselves instead of through prometheus-cpp's civetweb
// exposer: civetweb starts its threads with a ~100 KiB stack, which is smaller than the static
// TLS that cuBLAS (linked into GPU builds) adds to every thread, so civetweb could not start at
// all in a CUDA build. Scrapes are answered one at a time on one thread with a default stack.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/metric_family.h"

namespace orthoserve {

class HttpExposer {
 public:
  // What one scrape serves; called on the exposer's thread, one scrape at a time.
  using CollectFn = std::function<std::vector<prometheus::MetricFamily>()>;

  // Binds `address` (HOST:PORT, [V6]:PORT; port 0 picks one) and starts serving what `collect`
  // returns. INVALID_ARGUMENT for a malformed address, UNAVAILABLE when it cannot be bound (the
  // message says why). Whatever `collect` uses must outlive the exposer.
  static absl::StatusOr<std::unique_ptr<HttpExposer>> Create(const std::string& address, CollectFn collect);
  ~HttpExposer();  // Stops accepting and joins the serving thread.

  int port() const { return port_; }

 private:
  HttpExposer() = default;
  void Serve();
  void Answer(int connection);

  CollectFn collect_;
  int listen_fd_ = -1;
  int wake_fds_[2] = {-1, -1};  // Written by the destructor to end poll().
  int port_ = 0;
  std::thread thread_;
};

}  // namespace orthoserve
