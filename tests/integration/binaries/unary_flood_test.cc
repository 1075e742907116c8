// Issue #27's done-when (b) on the real orthoserve process over 127.0.0.1: one tenant opens 500
// unary calls that stall — calls that never send their request, holding every slot the tenant
// may take and then waiting in the queue, or after the first 40 such, calls that send a 512 KiB
// request and wait in the queue — while another tenant's unary call is served within a second,
// none of the 500 is dropped, and the server's resident memory stays within its in-flight limit
// + 64 MiB the whole time (sampled every 20 ms from /proc/PID/status).
#include <atomic>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/client_callback.h"
#include "gtest/gtest.h"
#include "orthoserve/v1/orthogonalizer.grpc.pb.h"
#include "tests/integration/binaries/server_fixture.h"

namespace orthoserve::testing {
namespace {

constexpr char kUnaryMethod[] = "/orthoserve.v1.Orthogonalizer/Orthogonalize";
constexpr int kCalls = 500;
constexpr int64_t kInflightBytes = int64_t{64} << 20;  // --max-inflight-bytes
constexpr int64_t kMessageBytes = int64_t{1} << 20;    // --max-message-bytes: 32 unary slots.
constexpr int64_t kRssAllowance = int64_t{64} << 20;
constexpr int kChannels = 4;  // Under --grpc-max-streams-per-connection (256) each.

// A request of one fp32 matrix rows × cols of ones.
grpc::ByteBuffer Request(int rows, int cols) {
  v1::OrthogonalizeRequest request;
  v1::Matrix* m = request.add_matrices();
  m->mutable_spec()->set_name("w");
  m->mutable_spec()->add_shape(rows);
  m->mutable_spec()->add_shape(cols);
  m->mutable_spec()->set_dtype(v1::DTYPE_FP32);
  std::vector<float> data(static_cast<size_t>(rows) * cols, 1.0f);
  for (int i = 0; i < std::min(rows, cols); ++i) data[static_cast<size_t>(i) * cols + i] = 2.0f;
  m->set_data(data.data(), data.size() * sizeof(float));
  std::string bytes = request.SerializeAsString();
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// A unary call as alice's stalled client makes it: its request (or none) is written, never
// half-closed, and the call waits until the server ends it or the test cancels it.
class StalledCall : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  StalledCall(grpc::GenericStub& stub, const grpc::ByteBuffer* request, const std::string& token) {
    context_.AddMetadata("authorization", "Bearer " + token);
    stub.PrepareBidiStreamingCall(&context_, kUnaryMethod, grpc::StubOptions(), this);
    if (request != nullptr) {
      request_ = *request;
      StartWrite(&request_);
    }
    StartRead(&response_);
    StartCall();
  }
  void OnReadDone(bool) override {}
  void OnDone(const grpc::Status& status) override {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = status;
    done_ = true;
  }
  bool done() {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  grpc::Status status() {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }
  void Cancel() { context_.TryCancel(); }

 private:
  grpc::ClientContext context_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
  std::mutex mu_;
  bool done_ = false;
  grpc::Status status_;
};

std::shared_ptr<grpc::Channel> OwnChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // A connection of its own.
  args.SetMaxSendMessageSize(static_cast<int>(kMessageBytes));
  args.SetMaxReceiveMessageSize(static_cast<int>(kMessageBytes));
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

// How alice's stalled calls look, and the server's transport flags.
struct Flood {
  const char* name;
  int silent;                      // Calls that never send their request; the rest send 512 KiB.
  std::vector<std::string> flags;  // Beyond the test's limits.
  bool bounded;  // Whether RSS must stay within the in-flight limit + 64 MiB and none of alice's calls end.
};

class UnaryFloodTest : public ::testing::TestWithParam<Flood> {};

TEST_P(UnaryFloodTest, AnotherTenantIsServedWithinASecondAndMemoryStaysBounded) {
  const Flood& flood = GetParam();
  const std::string dir = MakeScratchDir();
  const std::string tokens = dir + "/tokens.txt";
  {
    std::ofstream out(tokens);
    out << "secret-a alice\nsecret-b bob\n";
  }
  std::vector<std::string> flags = {"--token-file",         tokens,
                                    "--max-inflight-bytes", absl::StrCat(kInflightBytes),
                                    "--max-message-bytes",  absl::StrCat(kMessageBytes),
                                    "--chunk-bytes",        "262144",
                                    "--max-unary-waiters",  absl::StrCat(kCalls)};
  flags.insert(flags.end(), flood.flags.begin(), flood.flags.end());
  ServerProcess server = StartServer(dir + "/server", flags);
  ASSERT_NE(server.process, nullptr);
  const pid_t pid = server.process->pid();
  // The bound is on what the flood adds to the idle server: its shared libraries' pages (the
  // CUDA and NCCL libraries of a CUDA build alone are ~150 MiB resident) are no request's memory.
  const int64_t rss_growth_limit = kInflightBytes + kRssAllowance;

  // Resident memory, sampled every 20 ms from here to the end of bob's call.
  std::atomic<bool> sampling{true};
  std::atomic<int64_t> peak{ResidentBytes(pid)};
  std::thread sampler([&] {
    while (sampling.load()) {
      const int64_t rss = ResidentBytes(pid);
      if (rss > peak.load()) peak.store(rss);
      absl::SleepFor(absl::Milliseconds(20));
    }
  });
  const int64_t start_rss = peak.load();
  const int64_t rss_limit = start_rss + rss_growth_limit;

  // Bob's connection is up before the flood (GetServerInfo takes no unary slot).
  std::unique_ptr<v1::Orthogonalizer::Stub> bob = v1::Orthogonalizer::NewStub(OwnChannel(server.address));
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer secret-b");
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ServerInfo info;
    ASSERT_TRUE(bob->GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok());
  }

  std::vector<std::unique_ptr<grpc::GenericStub>> alice_stubs;
  for (int i = 0; i < kChannels; ++i)
    alice_stubs.push_back(std::make_unique<grpc::GenericStub>(OwnChannel(server.address)));
  std::vector<std::unique_ptr<StalledCall>> alice;
  // A reactor must outlive its call: on every way out alice's calls are cancelled and awaited
  // (and leaked if they do not end).
  struct CancelOnExit {
    std::vector<std::unique_ptr<StalledCall>>& calls;
    std::atomic<bool>& sampling;
    std::thread& sampler;
    ~CancelOnExit() {
      sampling.store(false);
      if (sampler.joinable()) sampler.join();
      for (auto& c : calls) c->Cancel();
      const absl::Time end = absl::Now() + absl::Seconds(20);
      bool ended = false;
      while (!ended && absl::Now() < end) {
        ended = true;
        for (auto& c : calls) ended = ended && c->done();
        if (!ended) absl::SleepFor(absl::Milliseconds(20));
      }
      if (!ended) {
        for (auto& c : calls) c.release();
      }
    }
  } cancel_on_exit{alice, sampling, sampler};

  // The silent calls first, so that they hold alice's slots; then the rest with a 1 MiB request.
  for (int i = 0; i < flood.silent; ++i) {
    alice.push_back(std::make_unique<StalledCall>(*alice_stubs[i % kChannels], nullptr, "secret-a"));
  }
  absl::SleepFor(absl::Seconds(1));
  const grpc::ByteBuffer body = Request(256, 512);
  for (int i = flood.silent; i < kCalls; ++i) {
    alice.push_back(std::make_unique<StalledCall>(*alice_stubs[i % kChannels], &body, "secret-a"));
  }
  // Time for every request to reach the server (they are 460 MiB in all) — were any of them read,
  // it would be computed and answered.
  absl::SleepFor(absl::Seconds(3));

  // Bob's call, timed from its start.
  v1::OrthogonalizeRequest request;
  {
    v1::Matrix* m = request.add_matrices();
    m->mutable_spec()->set_name("bob");
    m->mutable_spec()->add_shape(64);
    m->mutable_spec()->add_shape(32);
    m->mutable_spec()->set_dtype(v1::DTYPE_FP32);
    std::vector<float> data(64 * 32, 0.5f);
    data[0] = 1.0f;
    m->set_data(data.data(), data.size() * sizeof(float));
  }
  grpc::ClientContext context;
  context.AddMetadata("authorization", "Bearer secret-b");
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::OrthogonalizeResponse response;
  const absl::Time start = absl::Now();
  const grpc::Status status = bob->Orthogonalize(&context, request, &response);
  const absl::Duration elapsed = absl::Now() - start;
  absl::SleepFor(absl::Milliseconds(200));  // One more sample after it.
  sampling.store(false);
  sampler.join();

  // Alice's calls still hold their slot or wait. Only where their requests may fill gRPC's
  // buffers (BDP probing turned on) may some end: cancelled by the memory quota (RESOURCE_EXHAUSTED,
  // "Buffers full"), or served in a slot that such a cancellation freed.
  int ended = 0;
  int other = 0;
  std::string sample;
  for (auto& c : alice) {
    if (!c->done()) continue;
    ++ended;
    if (c->status().error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED && !c->status().ok()) {
      ++other;
      sample = absl::StrCat(c->status().error_code(), ": ", c->status().error_message());
    } else if (sample.empty()) {
      sample = c->status().error_message();
    }
  }
  std::cerr << flood.name << ": bob's unary call: " << status.error_code() << " in " << absl::FormatDuration(elapsed)
            << "; server VmRSS " << (start_rss >> 20) << " MiB at start, peak " << (peak.load() >> 20)
            << " MiB (limit: start + " << (rss_growth_limit >> 20) << " MiB); " << ended << " of alice's " << kCalls << " calls ended, " << other
            << " not with RESOURCE_EXHAUSTED (e.g. \"" << sample << "\")\n";
  ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  ASSERT_EQ(response.results_size(), 1);
  EXPECT_EQ(response.results(0).code(), 0);
  EXPECT_LT(elapsed, absl::Seconds(1));
  EXPECT_EQ(other, 0) << sample;
  if (flood.bounded) {
    EXPECT_EQ(ended, 0) << sample;
    EXPECT_LE(peak.load(), rss_limit);
  }
  EXPECT_GT(start_rss, 0);
}

// "silent" and "requests" run the server with its default transport flags: fixed 64 KiB
// initial HTTP/2 windows, so each of the 460 waiting calls holds at most 64 KiB of its request in
// gRPC's buffers. With BDP probing turned on (--grpc-bdp-probe=true), each waiting call may be
// sent a window of its request (all 512 KiB of it on loopback) that gRPC buffers, so memory is
// not bounded by the in-flight limit there (the memory quota, --grpc-memory-quota-bytes, is the
// backstop): that case checks bob and the codes only, and prints what it measured.
INSTANTIATE_TEST_SUITE_P(Floods, UnaryFloodTest,
                         ::testing::Values(Flood{"silent", kCalls, {}, true}, Flood{"requests", 40, {}, true},
                                           Flood{"requests_with_bdp_probing", 40, {"--grpc-bdp-probe=true"}, false}),
                         [](const ::testing::TestParamInfo<Flood>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace orthoserve::testing
