// A minimal HTTP endpoint that serves one prometheus-cpp Registry at GET /metrics (Prometheus
// text format 0.0.4). We serve it ourselves instead of through prometheus-cpp's civetweb
// exposer: civetweb starts its threads with a ~100 KiB stack, which is smaller than the static
// TLS that cuBLAS (linked into GPU builds) adds to every thread, so civetweb could not start at
// all in a CUDA build. Scrapes are answered one at a time on one thread with a default stack.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "prometheus/registry.h"

namespace orthoserve {

class HttpExposer {
 public:
  // Binds `address` (HOST:PORT, [V6]:PORT; port 0 picks one) and starts serving. INVALID_ARGUMENT
  // for a malformed address, UNAVAILABLE when it cannot be bound (the message says why).
  static absl::StatusOr<std::unique_ptr<HttpExposer>> Create(const std::string& address,
                                                             std::shared_ptr<prometheus::Registry> registry);
  ~HttpExposer();  // Stops accepting and joins the serving thread.

  int port() const { return port_; }

 private:
  HttpExposer() = default;
  void Serve();
  void Answer(int connection);

  std::shared_ptr<prometheus::Registry> registry_;
  int listen_fd_ = -1;
  int wake_fds_[2] = {-1, -1};  // Written by the destructor to end poll().
  int port_ = 0;
  std::thread thread_;
};

}  // namespace orthoserve
