// A minimal HTTP endpoint that serves metric families at GET /metrics (Prometheus text format
// 0.0.4), collected anew for every scrape. We serve it ourselves instead of through prometheus-cpp's civetweb
// exposer: civetweb starts its threads with a ~100 KiB stack, which is smaller than the static
// TLS that cuBLAS (linked into GPU builds) adds to every thread, so civetweb could not start at
// all in a CUDA build. Connections are answered by a few threads with a default stack, each
// within a deadline from its accept (reading the request and writing the answer together), so a
// slow or stalled client (a slowloris) holds one thread for at most that long and never delays
// another scrape. Collections themselves run one at a time.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "prometheus/metric_family.h"

namespace orthoserve {

class HttpExposer {
 public:
  // What one scrape serves; called on one of the exposer's threads, one scrape at a time.
  using CollectFn = std::function<std::vector<prometheus::MetricFamily>()>;

  struct Options {
    int threads = 4;                                        // Connections answered at once.
    absl::Duration connection_deadline = absl::Seconds(5);  // From accept to the last byte of the answer.
    size_t max_waiting = 64;  // Accepted connections waiting for a thread; more are closed at once.
  };

  // Binds `address` (HOST:PORT, [V6]:PORT; port 0 picks one) and starts serving what `collect`
  // returns. INVALID_ARGUMENT for a malformed address or options, UNAVAILABLE when it cannot be
  // bound (the message says why). Whatever `collect` uses must outlive the exposer.
  static absl::StatusOr<std::unique_ptr<HttpExposer>> Create(const std::string& address, CollectFn collect,
                                                             const Options& options);
  static absl::StatusOr<std::unique_ptr<HttpExposer>> Create(const std::string& address, CollectFn collect) {
    return Create(address, std::move(collect), Options{});
  }
  ~HttpExposer();  // Stops accepting, ends the connections in progress and joins the threads.

  int port() const { return port_; }

 private:
  struct Waiting {
    int fd;
    absl::Time deadline;
  };
  explicit HttpExposer(const Options& options) : options_(options) {}
  void Accept();  // The accepting thread.
  void Work();    // An answering thread.
  // Answers one connection by `deadline` (or gives up then, or when the exposer stops).
  void Answer(int connection, absl::Time deadline);
  // The serialized families (collections one at a time).
  std::string Scrape() ABSL_LOCKS_EXCLUDED(collect_mu_);

  const Options options_;
  CollectFn collect_;
  int listen_fd_ = -1;
  int wake_fds_[2] = {-1, -1};  // Written by the destructor: every poll() here watches it.
  int port_ = 0;
  absl::Mutex mu_;
  absl::CondVar work_cv_;
  std::deque<Waiting> waiting_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex collect_mu_;  // Held while collecting.
  std::thread acceptor_;
  std::vector<std::thread> workers_;
};

}  // namespace orthoserve
