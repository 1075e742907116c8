// Streams on the callback API in process on 127.0.0.1:0: a thousand idle streams hold a bounded
// number of threads, and --stream-progress-timeout ends streams whose client stopped sending
// or stopped reading, and a client that trickles below --stream-min-progress-bytes per timeout,
// but not a slow client above that rate, nor a step waiting on the server.
#include <dirent.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/client_callback.h"
#include "gtest/gtest.h"
#include "proto/convert/raw_message.h"
#include "tests/unit/rpc/held_call.h"
#include "tests/unit/rpc/rpc_test_util.h"

namespace orthoserve::testing {
namespace {

using ::testing::HasSubstr;

int ThreadsOfThisProcess() {
  int n = 0;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n;
}

TEST(StreamProgressTest, AUnaryCallWhoseRequestNeverComesIsEndedAndItsRoomReleased) {
  ServerOptions options = TestServerOptions();
  options.service.stream_progress_timeout = absl::Seconds(1);
  auto server = Server::Create(options);
  ASSERT_OK(server);
  grpc::GenericStub stub(grpc::CreateChannel("127.0.0.1:" + std::to_string((*server)->port()),
                                             grpc::InsecureChannelCredentials()));
  constexpr int kCalls = 12;  // Each reserves 2 × --max-message-bytes: 12 fit the tenant's 2 GiB.
  std::vector<std::unique_ptr<HeldCall>> calls;
  const absl::Time start = absl::Now();
  for (int i = 0; i < kCalls; ++i) calls.push_back(HeldCall::SilentUnary(stub));
  ASSERT_TRUE(WaitFor([&] {
    for (auto& c : calls) {
      if (!c->done()) return false;
    }
    return true;
  }, absl::Seconds(10)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  for (auto& c : calls) {
    EXPECT_EQ(c->status().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << c->status().error_message();
    EXPECT_THAT(c->status().error_message(), HasSubstr("--stream-progress-timeout"));
  }
  EXPECT_TRUE(WaitFor([&] { return (*server)->inflight_calls() == 0; }, absl::Seconds(5)));
  // The room is back: a real call is served.
  auto real = StubFor(**server);
  v1::OrthogonalizeRequest request;
  *request.add_matrices()->mutable_spec() = Spec("w", {4, 4}, DType::kF32, NsOptions());
  request.mutable_matrices(0)->set_data(Bytes(RandomMatrix(4, 4, 9), DType::kF32));
  v1::OrthogonalizeResponse response;
  grpc::ClientContext context;
  EXPECT_TRUE(real->Orthogonalize(&context, request, &response).ok());
}

TEST(StreamProgressTest, AThousandIdleStreamsHoldBoundedThreadsUntilTheirProgressTimeoutEndsThem) {
  constexpr int kChannels = 10;
  constexpr int kStreamsPerChannel = 100;
  constexpr int kStreams = kChannels * kStreamsPerChannel;
  ServerOptions options = TestServerOptions();
  options.service.admission.max_concurrent_streams = kStreams + 10;
  options.service.stream_progress_timeout = absl::Seconds(6);
  auto server = Server::Create(options);
  ASSERT_OK(server);
  const int threads_before = ThreadsOfThisProcess();

  std::vector<std::unique_ptr<grpc::GenericStub>> stubs;
  for (int c = 0; c < kChannels; ++c) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // One connection per channel.
    stubs.push_back(std::make_unique<grpc::GenericStub>(grpc::CreateCustomChannel(
        "127.0.0.1:" + std::to_string((*server)->port()), grpc::InsecureChannelCredentials(), args)));
  }
  std::vector<std::unique_ptr<HeldCall>> streams;
  for (int i = 0; i < kStreams; ++i) streams.push_back(HeldCall::HeaderOnlyStream(*stubs[i % kChannels]));

  ASSERT_TRUE(WaitFor([&] { return (*server)->inflight_calls() == kStreams; }, absl::Seconds(5)))
      << (*server)->inflight_calls() << " of " << kStreams << " streams open";
  // A thread per stream (the synchronous API) would be a thousand more; gRPC's callback
  // threads, the compute pool and the client's own are a few dozen at most.
  const int threads_open = ThreadsOfThisProcess();
  EXPECT_LT(threads_open - threads_before, 100) << threads_before << " threads before, " << threads_open << " with "
                                                << kStreams << " idle streams open";

  ASSERT_TRUE(WaitFor([&] {
    for (auto& s : streams) {
      if (!s->done()) return false;
    }
    return true;
  }, absl::Seconds(20)));
  for (auto& s : streams) {
    EXPECT_EQ(s->status().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(s->status().error_message(), HasSubstr("--stream-progress-timeout"));
  }
  EXPECT_TRUE(WaitFor([&] { return (*server)->inflight_calls() == 0; }, absl::Seconds(5)));
}

TEST(StreamProgressTest, AStreamThatStopsReadingIsCancelled) {
  ServerOptions options = TestServerOptions();
  options.service.stream_progress_timeout = absl::Seconds(1);
  auto server = Server::Create(options);
  ASSERT_OK(server);
  auto stub = StubFor(**server);
  // A 16 MiB result, far more than HTTP/2's flow-control windows hold, for a client that never
  // reads it (steps = 0: no iterations, so computing takes no time).
  NsOptions ns;
  ns.steps = 0;
  std::vector<v1::StreamRequest> messages = {HeaderMessage(1)};
  AppendMatrix(messages, 0, Spec("big", {4096, 1024}, DType::kF32, ns), Bytes(RandomMatrix(4096, 1024, 7), DType::kF32),
               1 << 20);
  messages.push_back(EndMessage());
  grpc::ClientContext context;
  auto stream = stub->OrthogonalizeStream(&context);
  for (const v1::StreamRequest& m : messages) ASSERT_TRUE(stream->Write(m));
  ASSERT_TRUE(stream->WritesDone());
  // The server writes until the windows are full, waits a progress timeout, and cancels.
  EXPECT_TRUE(WaitFor([&] { return (*server)->inflight_calls() == 0; }, absl::Seconds(10)));
  v1::StreamResponse response;
  while (stream->Read(&response)) {
  }
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

TEST(StreamProgressTest, AClientThatTricklesBelowTheMinimumRateIsEndedWithinTheWindow) {
  // A message every 300 ms keeps the idle timer quiet, but 16 bytes a message is far below the
  // minimum of 16 KiB per 1 s window: the stream is ended about one window after it began.
  ServerOptions options = TestServerOptions();
  options.service.stream_progress_timeout = absl::Seconds(1);
  options.service.stream_min_progress_bytes = 16 << 10;
  auto server = Server::Create(options);
  ASSERT_OK(server);
  auto stub = StubFor(**server);
  std::vector<v1::StreamRequest> messages = {HeaderMessage(1)};
  AppendMatrix(messages, 0, Spec("trickle", {64, 64}, DType::kF32, NsOptions()),
               Bytes(RandomMatrix(64, 64, 5), DType::kF32), 16);
  grpc::ClientContext context;
  auto stream = stub->OrthogonalizeStream(&context);
  const absl::Time start = absl::Now();
  for (const v1::StreamRequest& m : messages) {
    if (!stream->Write(m)) break;  // Ended by the server.
    absl::SleepFor(absl::Milliseconds(300));
    if (absl::Now() - start > absl::Seconds(10)) break;
  }
  stream->WritesDone();
  v1::StreamResponse response;
  while (stream->Read(&response)) {
  }
  const grpc::Status status = stream->Finish();
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("--stream-min-progress-bytes = 16384"));
  EXPECT_LT(took, absl::Seconds(4));
}

TEST(StreamProgressTest, AClientThatGoesOnSlowlyAndAGroupWaitingForItsRanksAreNotCut) {
  ServerOptions options = TestServerOptions();
  options.service.stream_progress_timeout = absl::Milliseconds(600);
  options.service.stream_min_progress_bytes = 1024;  // The slow client below moves ~4 KiB per 600 ms.
  options.service.rendezvous_timeout = absl::Seconds(10);
  auto server = Server::Create(options);
  ASSERT_OK(server);
  auto stub = StubFor(**server);
  NsOptions ns;
  const std::vector<float> values = RandomMatrix(64, 32, 3);

  // A lone client that sends a message every 300 ms for 1.8 s: 3× the timeout in all.
  {
    std::vector<v1::StreamRequest> messages = {HeaderMessage(1)};
    AppendMatrix(messages, 0, Spec("slow", {64, 32}, DType::kF32, ns), Bytes(values, DType::kF32), 1024);
    messages.push_back(EndMessage());
    grpc::ClientContext context;
    auto stream = stub->OrthogonalizeStream(&context);
    for (size_t i = 0; i < messages.size(); ++i) {
      if (i > 0 && i % 2 == 0) absl::SleepFor(absl::Milliseconds(300));
      ASSERT_TRUE(stream->Write(messages[i]));
    }
    ASSERT_TRUE(stream->WritesDone());
    v1::StreamResponse response;
    int results = 0;
    while (stream->Read(&response)) results += response.has_result();
    const grpc::Status finished = stream->Finish();
    ASSERT_TRUE(finished.ok()) << finished.error_message();
    EXPECT_EQ(results, 1);
  }

  // A two-rank group whose second rank comes 2 s after the first: the first waits on the
  // server (the rendezvous), which is no stall of its client.
  auto group_rank = [&](int rank) {
    std::vector<v1::StreamRequest> messages = {HeaderMessage(1, rank, 2, "job", 1)};
    v1::MatrixSpec spec = Spec("w", {64, 32}, DType::kF32, ns);
    *spec.mutable_block() = BlockToProto(Block{rank * 32, 0, 32, 32});
    const std::vector<float> half(values.begin() + rank * 32 * 32, values.begin() + (rank + 1) * 32 * 32);
    AppendMatrix(messages, 0, spec, Bytes(half, DType::kF32));
    messages.push_back(EndMessage());
    return RunStream(*stub, messages);
  };
  StreamOutcome first;
  std::thread early([&] { first = group_rank(0); });
  absl::SleepFor(absl::Seconds(2));
  StreamOutcome second = group_rank(1);
  early.join();
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  ASSERT_TRUE(second.status.ok()) << second.status.error_message();
  EXPECT_EQ(first.results.size(), 1u);
  EXPECT_EQ(second.results.size(), 1u);
}

}  // namespace
}  // namespace orthoserve::testing
