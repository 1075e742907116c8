// The Prometheus endpoint of a real server: an in-process orthoserve Server (server/app) on
// 127.0.0.1:0 with the CPU backend and /metrics on an ephemeral port. Traffic from the C++ client
// (a streamed step with one bad matrix, a unary call, an info call) must show up in the scraped
// families with the right labels and values, and the endpoint must answer other paths and
// methods with 404 / 405.

#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/client/input_util.h"
#include "server/app/server.h"
#include "tests/util/http_get.h"
#include "tests/util/status_matchers.h"

namespace orthoserve::client {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string Http(int port, const std::string& request_line) { return ::orthoserve::testing::HttpExchange(port, request_line); }

// Sample lines of a text exposition: "name{labels}" → value (comments skipped).
std::map<std::string, double> Samples(const std::string& response) {
  std::map<std::string, double> samples;
  const size_t body = response.find("\r\n\r\n");
  for (absl::string_view line : absl::StrSplit(response.substr(body == std::string::npos ? 0 : body + 4), '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    double value = 0;
    if (space == absl::string_view::npos || !absl::SimpleAtod(line.substr(space + 1), &value)) continue;
    samples[std::string(line.substr(0, space))] = value;
  }
  return samples;
}

std::vector<float> Ramp(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 37) % 101) / 50.0f - 1.0f;
  return v;
}

using testing_util::F32Input;

TEST(MetricsScrapeTest, TrafficShowsUpInTheScrapedFamilies) {
  ServerOptions o;
  o.listen = "127.0.0.1:0";
  o.metrics_address = "127.0.0.1:0";
  o.fleet_listen = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(o);
  ASSERT_OK(server);
  ASSERT_GT((*server)->metrics_port(), 0);
  ClientOptions co;
  co.address = "127.0.0.1:" + std::to_string((*server)->port());
  co.timeout = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(co);
  ASSERT_OK(client);
  absl::Status health = (*client)->Health();
  for (int i = 0; i < 100 && !health.ok(); ++i) {  // The fleet forms in the background.
    absl::SleepFor(absl::Milliseconds(100));
    health = (*client)->Health();
  }
  ASSERT_OK(health);

  const std::vector<float> a = Ramp(64 * 32), b = Ramp(96 * 40);
  std::vector<MatrixInput> step = {F32Input("a", {64, 32}, a), F32Input("bad", {96, 40}, b)};
  step[1].options.split_qkv = {3, 2, 2};  // 96 rows are not divisible by 7: an in-band error.
  absl::StatusOr<std::vector<MatrixOutput>> streamed = (*client)->Step(StepOptions{}, step);
  ASSERT_OK(streamed);
  ASSERT_OK((*streamed)[0].status);
  ASSERT_FALSE((*streamed)[1].status.ok());
  const std::vector<MatrixInput> unary = {F32Input("b", {96, 40}, b)};
  ASSERT_OK((*client)->Orthogonalize(unary));
  ASSERT_OK((*client)->GetServerInfo());

  const int port = (*server)->metrics_port();
  std::map<std::string, double> s;
  // RequestDone is recorded as the RPC ends, which may be just after the client saw its reply.
  for (int i = 0; i < 50; ++i) {
    s = Samples(Http(port, "GET /metrics HTTP/1.1"));
    if (s["orthoserve_requests_total{code=\"OK\",method=\"Orthogonalize\"}"] >= 1 &&
        s["orthoserve_requests_total{code=\"OK\",method=\"OrthogonalizeStream\"}"] >= 1) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(s["orthoserve_requests_total{code=\"OK\",method=\"OrthogonalizeStream\"}"], 1);
  EXPECT_EQ(s["orthoserve_requests_total{code=\"OK\",method=\"Orthogonalize\"}"], 1);
  EXPECT_EQ(s["orthoserve_request_duration_seconds_count{method=\"OrthogonalizeStream\"}"], 1);
  EXPECT_GT(s["orthoserve_request_duration_seconds_sum{method=\"OrthogonalizeStream\"}"], 0);
  // Per-matrix outcomes: the good one OK, the bad one with its code.
  double ok_matrices = 0, failed_matrices = 0;
  for (const auto& [name, value] : s) {
    if (!absl::StartsWith(name, "orthoserve_matrices_total{")) continue;
    if (absl::StrContains(name, "method=\"OrthogonalizeStream\"")) {
      (absl::StrContains(name, "code=\"OK\"") ? ok_matrices : failed_matrices) += value;
    }
  }
  EXPECT_EQ(ok_matrices, 1);
  EXPECT_EQ(failed_matrices, 1);
  // Every data byte the stream carried, the failed matrix's included (the server discards them).
  EXPECT_GE(s["orthoserve_received_bytes_total{method=\"OrthogonalizeStream\"}"], (a.size() + b.size()) * 4.0);
  EXPECT_GE(s["orthoserve_sent_bytes_total{method=\"OrthogonalizeStream\"}"], a.size() * 4.0);
  EXPECT_GT(s["orthoserve_newton_schulz_flops_total"], 0);
  EXPECT_EQ(s["orthoserve_inflight_requests"], 0);
  EXPECT_EQ(s["orthoserve_fleet_ready"], 1);
  EXPECT_EQ(s["orthoserve_fleet_size"], 1);
  // The CPU backend has no device memory: both gauges exist and read 0.
  ASSERT_EQ(s.count("orthoserve_device_memory_bytes{kind=\"used\"}"), 1u);
  EXPECT_EQ(s["orthoserve_device_memory_bytes{kind=\"used\"}"], 0);
  EXPECT_EQ(s["orthoserve_device_memory_bytes{kind=\"budget\"}"], 0);
  // The configured limits, for alerts on use as a share of them, and the use gauges next to them.
  EXPECT_EQ(s["orthoserve_limit_inflight_bytes"], static_cast<double>(o.service.admission.max_inflight_bytes));
  EXPECT_EQ(s["orthoserve_limit_tenant_inflight_bytes"],
            static_cast<double>(o.service.admission.max_tenant_inflight_bytes));
  EXPECT_EQ(s["orthoserve_limit_concurrent_streams"], o.service.admission.max_concurrent_streams);
  EXPECT_EQ(s["orthoserve_limit_chunk_bytes"], static_cast<double>(o.service.chunk_bytes));
  EXPECT_EQ(s["orthoserve_limit_message_bytes"], static_cast<double>(o.service.max_message_bytes));
  EXPECT_EQ(s["orthoserve_limit_matrix_elements"], static_cast<double>(o.service.max_matrix_elements));
  EXPECT_EQ(s["orthoserve_limit_matrices_per_step"], o.service.max_matrices_per_step);
  EXPECT_EQ(s["orthoserve_limit_name_bytes"], o.service.max_name_bytes);
  EXPECT_EQ(s["orthoserve_limit_shape_dims"], o.service.max_shape_dims);
  EXPECT_EQ(s["orthoserve_limit_group_world"], o.service.max_group_world);
  EXPECT_EQ(s["orthoserve_limit_tenant_pending_steps"], o.service.max_tenant_pending_steps);
  EXPECT_EQ(s["orthoserve_limit_compute_workers"], o.workers);
  EXPECT_EQ(s["orthoserve_limit_rendezvous_timeout_seconds"], absl::ToDoubleSeconds(o.service.rendezvous_timeout));
  EXPECT_EQ(s["orthoserve_limit_collective_timeout_seconds"], absl::ToDoubleSeconds(o.collective_timeout));
  EXPECT_EQ(s["orthoserve_inflight_streams"], 0);
  // Tenants are not named by default (--tenant-labels off): "all", released: 0.
  ASSERT_EQ(s.count("orthoserve_tenant_inflight_bytes{tenant=\"all\"}"), 1u);
  EXPECT_EQ(s["orthoserve_tenant_inflight_bytes{tenant=\"all\"}"], 0);
  EXPECT_EQ(s["orthoserve_tenant_compute_seconds_total{tenant=\"all\"}"] > 0, true);
  EXPECT_EQ(s["orthoserve_tenant_queue_wait_seconds_count{tenant=\"all\"}"], 2);  // The unary and the good matrix.
  // The process metrics of the Prometheus client libraries.
  ASSERT_EQ(s.count("process_cpu_seconds_total"), 1u);
  EXPECT_GT(s["process_resident_memory_bytes"], 0);
  EXPECT_GT(s["process_open_fds"], 0);
  EXPECT_GE(s["process_max_fds"], s["process_open_fds"]);
  EXPECT_GT(s["process_threads"], 1);
  EXPECT_NEAR(s["process_start_time_seconds"], absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()), 3600);
  bool build_info = false;
  for (const auto& [name, value] : s) {
    if (absl::StartsWith(name, "orthoserve_build_info{") && absl::StrContains(name, "backend=\"cpu\"")) {
      build_info = value == 1;
    }
  }
  EXPECT_TRUE(build_info);

  EXPECT_THAT(Http(port, "GET /metrics HTTP/1.1"), HasSubstr("Content-Type: text/plain; version=0.0.4"));
  EXPECT_THAT(Http(port, "GET /other HTTP/1.1"), StartsWith("HTTP/1.1 404"));
  EXPECT_THAT(Http(port, "POST /metrics HTTP/1.1"), StartsWith("HTTP/1.1 405"));
  (*server)->Drain();
}

}  // namespace
}  // namespace orthoserve::client
