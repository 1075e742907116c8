// Metadata limits of the real orthoserve process (issue 24's "Done when"): a lone stream of 4096
// one-element specs whose shapes have 10000 dims each, and one of 4096 specs with 64 KiB names,
// are each refused at the first offending spec with an INVALID_ARGUMENT the client receives
// whole (its message fits gRPC's metadata limit, so it does not turn into the client's own
// RESOURCE_EXHAUSTED), the server's resident memory grows by less than 50 MiB, and the server
// still serves a normal step afterwards.
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "orthoserve/v1/orthogonalizer.grpc.pb.h"
#include "tests/integration/binaries/server_fixture.h"

namespace orthoserve::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kSpecs = 4096;
constexpr int64_t kMaxRssGrowth = int64_t{50} << 20;
// A refusal's message is far below gRPC's default metadata limit (8 KiB).
constexpr size_t kSmallMessage = 1024;

struct Outcome {
  grpc::Status status;
  int results = 0;     // MatrixResults received.
  int results_ok = 0;  // ... with code OK.
  int written = 0;     // Messages the client managed to write.
  absl::Duration elapsed;
};

// One lone stream: a header of kSpecs matrices, then for each a spec (`spec`, the same every
// time) and its one fp32 element, written on a separate thread that stops at the first failed
// write (the server may end the call long before the client is done writing). Bounded by a
// deadline.
Outcome RunLoneStream(v1::Orthogonalizer::Stub& stub, const v1::MatrixSpec& spec, int specs) {
  const absl::Time start = absl::Now();
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto stream = stub.OrthogonalizeStream(&context);
  Outcome out;
  std::thread writer([&] {
    v1::StreamRequest header;
    header.mutable_header()->set_num_matrices(specs);
    if (!stream->Write(header)) return;
    ++out.written;
    v1::StreamRequest spec_message;
    *spec_message.mutable_spec() = spec;
    const float one = 0.5f;
    v1::StreamRequest chunk;
    chunk.mutable_chunk()->set_data(std::string(reinterpret_cast<const char*>(&one), sizeof(one)));
    for (int i = 0; i < specs; ++i) {
      chunk.mutable_chunk()->set_index(i);
      if (!stream->Write(spec_message) || !stream->Write(chunk)) return;
      out.written += 2;
    }
    v1::StreamRequest end;
    end.mutable_end();
    if (stream->Write(end)) ++out.written;
    stream->WritesDone();
  });
  v1::StreamResponse response;
  while (stream->Read(&response)) {
    if (!response.has_result()) continue;
    ++out.results;
    if (response.result().code() == 0) ++out.results_ok;
  }
  writer.join();
  out.status = stream->Finish();
  out.elapsed = absl::Now() - start;
  return out;
}

v1::MatrixSpec OneElementSpec(const std::string& name, int dims) {
  v1::MatrixSpec spec;
  spec.set_name(name);
  for (int d = 0; d < dims; ++d) spec.add_shape(1);
  spec.set_dtype(v1::DTYPE_FP32);
  return spec;
}

TEST(MetadataLimitsBinaryTest, OversizedMetadataIsRefusedAtTheFirstSpecWithoutGrowingTheServer) {
  const std::string dir = MakeScratchDir();
  ServerProcess server = StartServer(dir + "/orthoserve");
  ASSERT_NE(server.process, nullptr);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  auto stub =
      v1::Orthogonalizer::NewStub(grpc::CreateCustomChannel(server.address, grpc::InsecureChannelCredentials(), args));

  // Warm up the server's paths (threads, pools, gRPC's buffers) with a normal step, so that what
  // is measured is what the refused streams cost.
  Outcome warm = RunLoneStream(*stub, OneElementSpec("w", 2), 64);
  ASSERT_TRUE(warm.status.ok()) << warm.status.error_message();
  EXPECT_EQ(warm.results_ok, 64);

  struct Case {
    std::string name;
    v1::MatrixSpec spec;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"10000 dims", OneElementSpec("w", 10000),
       "matrix 0 (\"w\") shape has 10000 dims; at most 16 are accepted (--max-shape-dims)"},
      {"64 KiB names", OneElementSpec(std::string(64 << 10, 'n'), 2),
       "...(65536 bytes)\") name has 65536 bytes; at most 1024 are accepted (--max-name-bytes)"},
  };
  for (const Case& c : cases) {
    const int64_t before = ResidentBytes(server.process->pid());
    ASSERT_GT(before, 0);
    Outcome out = RunLoneStream(*stub, c.spec, kSpecs);
    const int64_t after = ResidentBytes(server.process->pid());
    std::cerr << c.name << ": " << out.status.error_code() << " \"" << out.status.error_message().substr(0, 300)
              << "\" after " << out.written << " messages written, " << absl::FormatDuration(out.elapsed)
              << "; server VmRSS " << (before >> 10) << " KiB -> " << (after >> 10) << " KiB ("
              << ((after - before) >> 10) << " KiB)\n";
    EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.name << ": " << out.status.error_message();
    EXPECT_THAT(out.status.error_message(), HasSubstr(c.message)) << c.name;
    EXPECT_THAT(out.status.error_message(), HasSubstr("matrix 0 (")) << c.name << ": not the first spec";
    EXPECT_LT(out.status.error_message().size(), kSmallMessage) << c.name;
    EXPECT_EQ(out.results, 0) << c.name << ": refused as a whole, not answered in-band";
    EXPECT_LT(after - before, kMaxRssGrowth) << c.name;
    EXPECT_LT(out.elapsed, absl::Seconds(30)) << c.name;
  }

  // A normal step afterwards.
  Outcome normal = RunLoneStream(*stub, OneElementSpec("w", 2), 16);
  EXPECT_TRUE(normal.status.ok()) << normal.status.error_message();
  EXPECT_EQ(normal.results_ok, 16);
  StopServerExpectCleanExit(server);
}

}  // namespace
}  // namespace orthoserve::testing
