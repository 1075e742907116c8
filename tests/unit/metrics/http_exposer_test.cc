// The /metrics endpoint (server/metrics/http_exposer.h) under slow and stalled clients: a
// slowloris that trickles its request, or a client that connects and sends nothing, holds one
// thread until its connection deadline at most, and a real scrape is answered meanwhile.
#include "server/metrics/http_exposer.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"
#include "tests/util/http_get.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

// A connected socket to 127.0.0.1:port (-1 on failure).
int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}

class HttpExposerTest : public ::testing::Test {
 protected:
  void Start(const HttpExposer::Options& options) {
    auto& family = prometheus::BuildCounter().Name("test_scrapes_total").Help("Scrapes.").Register(*registry_);
    counter_ = &family.Add({});
    auto exposer = HttpExposer::Create(
        "127.0.0.1:0",
        [this] {
          counter_->Increment();
          return registry_->Collect();
        },
        options);
    ASSERT_OK(exposer);
    exposer_ = *std::move(exposer);
  }
  // A whole scrape and how long it took.
  std::string Scrape(absl::Duration* took) {
    const absl::Time start = absl::Now();
    std::string response = testing::HttpExchange(exposer_->port(), "GET /metrics HTTP/1.1");
    *took = absl::Now() - start;
    return response;
  }
  // `n` clients that send one byte of a request head every 200 ms and never finish it, until stopped.
  void Slowloris(int n) {
    for (int i = 0; i < n; ++i) {
      loris_.emplace_back([this] {
        const int fd = Connect(exposer_->port());
        const std::string head = "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ";
        for (size_t k = 0; fd >= 0 && !stop_.load(); ++k) {
          const char c = k < head.size() ? head[k] : 'a';
          if (send(fd, &c, 1, MSG_NOSIGNAL) != 1) break;  // Closed by the server.
          absl::SleepFor(absl::Milliseconds(200));
        }
        if (fd >= 0) close(fd);
      });
    }
    absl::SleepFor(absl::Milliseconds(300));  // They hold their threads.
  }
  void TearDown() override {
    stop_.store(true);
    for (std::thread& t : loris_) t.join();
    exposer_.reset();
  }

  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  prometheus::Counter* counter_ = nullptr;
  std::unique_ptr<HttpExposer> exposer_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> loris_;
};

TEST_F(HttpExposerTest, AScrapeIsAnsweredWhileASlowlorisTricklesItsRequest) {
  Start(HttpExposer::Options{});
  Slowloris(1);
  absl::Duration took;
  const std::string response = Scrape(&took);
  EXPECT_TRUE(absl::StartsWith(response, "HTTP/1.1 200 OK")) << response;
  EXPECT_TRUE(absl::StrContains(response, "test_scrapes_total 1")) << response;
  EXPECT_LT(took, absl::Seconds(3));
}

TEST_F(HttpExposerTest, ASlowClientIsCutAtItsConnectionDeadline) {
  HttpExposer::Options options;
  options.connection_deadline = absl::Milliseconds(600);
  Start(options);
  // Connects and sends nothing: closed (nothing answered) at the deadline.
  const int fd = Connect(exposer_->port());
  ASSERT_GE(fd, 0);
  const absl::Time start = absl::Now();
  char c;
  EXPECT_EQ(recv(fd, &c, 1, 0), 0);  // The server closed it.
  const absl::Duration held = absl::Now() - start;
  close(fd);
  EXPECT_GE(held, absl::Milliseconds(500));
  EXPECT_LT(held, absl::Seconds(3));
}

TEST_F(HttpExposerTest, WithEveryThreadHeldAScrapeWaitsNoLongerThanOneDeadline) {
  HttpExposer::Options options;
  options.threads = 2;
  options.connection_deadline = absl::Seconds(1);
  Start(options);
  Slowloris(2);
  absl::Duration took;
  const std::string response = Scrape(&took);
  EXPECT_TRUE(absl::StartsWith(response, "HTTP/1.1 200 OK")) << response;
  EXPECT_LT(took, absl::Seconds(3));  // Within a deadline of a thread coming free (and its own).
}

TEST_F(HttpExposerTest, BadOptionsAreRefused) {
  HttpExposer::Options none;
  none.threads = 0;
  EXPECT_FALSE(HttpExposer::Create("127.0.0.1:0", [] { return std::vector<prometheus::MetricFamily>{}; }, none).ok());
}

}  // namespace
}  // namespace orthoserve
