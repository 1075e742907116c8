// The C++ client's shared-memory regions (client/cpp/region.h) against the real orthoserve binary
// on loopback, started with --shm-socket and a token file of two tenants (and, for the refusals,
// one started without it): results through regions are bit-identical to results through bytes in
// unary and stream calls, a result goes into a second region, the server's OUT_OF_RANGE and
// NOT_FOUND come back as such, a server without regions gives FAILED_PRECONDITION, a call naming a
// region stays on the region's address, `orthoctl bench --shm` runs, and the region of an orthoctl
// killed with SIGKILL (by its pid) is dropped by the server (its lifeline closed with the process).
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "client/cpp/group_client.h"
#include "client/cpp/handover.h"
#include "client/cpp/orthoctl/commands.h"
#include "client/cpp/region.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "orthoserve/v1/orthogonalizer.grpc.pb.h"
#include "tests/integration/binaries/server_fixture.h"
#include "tests/integration/binaries/subprocess.h"
#include "tests/util/status_matchers.h"

namespace orthoserve::client {
namespace {

using ::orthoserve::testing::ServerProcess;
using ::orthoserve::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::_;

constexpr char kAlice[] = "shm-token-alice";
constexpr char kBob[] = "shm-token-bob";

std::vector<float> Random(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (float& f : v) {
    x = x * 1664525u + 1013904223u;
    f = static_cast<float>(static_cast<int32_t>(x >> 8) % 2001 - 1000) / 1000.0f;
  }
  return v;
}

// A whole matrix of `shape` in `dtype`, its elements random (seeded), as bytes.
struct TestMatrix {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype;
  std::vector<char> bytes;
};

TestMatrix MakeMatrix(const std::string& name, std::vector<int64_t> shape, DType dtype, uint32_t seed) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const std::vector<float> values = Random(static_cast<size_t>(n), seed);
  TestMatrix m{name, std::move(shape), dtype, std::vector<char>(static_cast<size_t>(n) * ElementSize(dtype))};
  ConvertFromF32(dtype, values.data(), values.size(), m.bytes.data());
  return m;
}

// Options every call here uses (the same for bytes and regions).
MatrixInput Describe(const TestMatrix& m) {
  MatrixInput in;
  in.name = m.name;
  in.shape = m.shape;
  in.dtype = m.dtype;
  in.options.precision = Precision::kHighest;
  in.options.steps = 7;
  return in;
}

MatrixInput WithBytes(const TestMatrix& m) {
  MatrixInput in = Describe(m);
  in.data = m.bytes.data();
  in.bytes = m.bytes.size();
  return in;
}

int64_t AlignUp(int64_t n) { return (n + 63) / 64 * 64; }

std::string RegionBytes(const Region& region, const RegionSlice& slice) {
  return std::string(region.data() + slice.offset, static_cast<size_t>(slice.size));
}

std::string Bytes(const MatrixOutput& out) { return std::string(out.data.begin(), out.data.end()); }

class ClientShmTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(testing::MakeScratchDir());
    tokens_ = new std::string(*dir_ + "/tokens");
    {
      std::ofstream out(*tokens_);
      out << kAlice << " alice\n" << kBob << " bob\n";
    }
    socket_ = new std::string(*dir_ + "/shm.sock");
    // A 4 KiB chunk limit: the byte calls compared with regions go through the chunked path.
    server_ = new ServerProcess(testing::StartServer(
        *dir_ + "/server", {"--token-file", *tokens_, "--shm-socket", *socket_, "--chunk-bytes", "4096"}));
  }
  static void TearDownTestSuite() {
    if (server_ != nullptr) testing::StopServerExpectCleanExit(*server_);
    delete server_;
    server_ = nullptr;
    EXPECT_FALSE(std::filesystem::exists(*socket_)) << "the server left its socket behind";
    std::error_code ignored;
    std::filesystem::remove_all(*dir_, ignored);
    delete dir_;
    delete tokens_;
    delete socket_;
  }
  void SetUp() override { ASSERT_NE(server_->process, nullptr) << "the server did not start"; }

  static std::unique_ptr<Client> Connect(const std::string& token, std::vector<std::string> addresses = {}) {
    ClientOptions o;
    o.address = server_->address;
    o.addresses = std::move(addresses);
    o.timeout = absl::Seconds(30);
    o.bearer_token = token;
    o.retry.deadline = absl::Seconds(20);
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Create(o);
    EXPECT_OK(c);
    return *std::move(c);
  }

  static std::unique_ptr<Region> MakeRegion(Client& client, int64_t size, const std::string& name = "test") {
    RegionOptions o;
    o.name = name;
    absl::StatusOr<std::unique_ptr<Region>> r = client.CreateRegion(size, o);
    EXPECT_OK(r);
    return r.ok() ? *std::move(r) : nullptr;
  }

  static std::string* dir_;
  static std::string* tokens_;
  static std::string* socket_;
  static ServerProcess* server_;
};

std::string* ClientShmTest::dir_ = nullptr;
std::string* ClientShmTest::tokens_ = nullptr;
std::string* ClientShmTest::socket_ = nullptr;
ServerProcess* ClientShmTest::server_ = nullptr;

// The call under test: unary Orthogonalize or a lone stream Step.
enum class Method { kUnary, kStream };

absl::StatusOr<std::vector<MatrixOutput>> Call(Client& client, Method method, absl::Span<const MatrixInput> inputs) {
  return method == Method::kUnary ? client.Orthogonalize(inputs) : client.Step(StepOptions{}, inputs);
}

class ClientShmMethodTest : public ClientShmTest, public ::testing::WithParamInterface<Method> {};

TEST_P(ClientShmMethodTest, ResultsThroughARegionAreBitIdenticalToResultsThroughBytes) {
  std::unique_ptr<Client> client = Connect(kAlice);
  const std::vector<TestMatrix> matrices = {MakeMatrix("a", {64, 96}, DType::kF32, 1),
                                            MakeMatrix("b", {96, 48}, DType::kF16, 2),
                                            MakeMatrix("c", {3, 16, 8}, DType::kF32, 3)};
  std::vector<MatrixInput> plain;
  for (const TestMatrix& m : matrices) plain.push_back(WithBytes(m));
  absl::StatusOr<std::vector<MatrixOutput>> expected = Call(*client, GetParam(), plain);
  ASSERT_OK(expected);

  // Every input, then every result, in one region.
  std::unique_ptr<Region> region = MakeRegion(*client, 1 << 20, "momenta");
  ASSERT_NE(region, nullptr);
  EXPECT_EQ(region->id().size(), 32u);
  EXPECT_EQ(region->address(), server_->address);
  std::vector<MatrixInput> in_region;
  int64_t offset = 0;
  for (const TestMatrix& m : matrices) {
    MatrixInput in = Describe(m);
    const int64_t size = static_cast<int64_t>(m.bytes.size());
    std::memcpy(region->data() + offset, m.bytes.data(), m.bytes.size());
    in.input_region = region->Slice(offset, size);
    offset = AlignUp(offset + size);
    in.result_region = region->Slice(offset, size);
    std::memset(region->data() + offset, 0x7f, m.bytes.size());  // Not a result by chance.
    offset = AlignUp(offset + size);
    in_region.push_back(in);
  }
  absl::StatusOr<std::vector<MatrixOutput>> got = Call(*client, GetParam(), in_region);
  ASSERT_OK(got);
  ASSERT_EQ(got->size(), matrices.size());
  for (size_t i = 0; i < matrices.size(); ++i) {
    SCOPED_TRACE(matrices[i].name);
    const MatrixOutput& e = (*expected)[i];
    const MatrixOutput& g = (*got)[i];
    ASSERT_OK(e.status);
    ASSERT_OK(g.status);
    EXPECT_TRUE(g.in_place);
    EXPECT_TRUE(g.data.empty());
    ASSERT_TRUE(g.result_region.has_value());
    EXPECT_EQ(g.result_region->offset, in_region[i].result_region->offset);
    EXPECT_EQ(g.dtype, e.dtype);
    EXPECT_EQ(g.block, e.block);
    EXPECT_FALSE(e.data.empty());
    EXPECT_TRUE(RegionBytes(*region, *in_region[i].result_region) == Bytes(e)) << "results differ from bytes";
  }

  // Input in the region, result as bytes; input as bytes, result in the region.
  MatrixInput input_only = in_region[0];
  input_only.result_region.reset();
  absl::StatusOr<std::vector<MatrixOutput>> a = Call(*client, GetParam(), {&input_only, 1});
  ASSERT_OK(a);
  ASSERT_OK((*a)[0].status);
  EXPECT_FALSE((*a)[0].in_place);
  EXPECT_FALSE((*a)[0].result_region.has_value());
  EXPECT_EQ(Bytes((*a)[0]), Bytes((*expected)[0]));
  const RegionSlice result_slice = region->Slice(in_region[0].result_region->offset, in_region[0].result_region->size);
  MatrixInput result_only = plain[0];
  result_only.result_region = result_slice;
  std::memset(region->data() + result_slice.offset, 0, static_cast<size_t>(result_slice.size));
  absl::StatusOr<std::vector<MatrixOutput>> b = Call(*client, GetParam(), {&result_only, 1});
  ASSERT_OK(b);
  ASSERT_OK((*b)[0].status);
  EXPECT_TRUE((*b)[0].in_place);
  EXPECT_EQ(RegionBytes(*region, result_slice), Bytes((*expected)[0]));
}

TEST_P(ClientShmMethodTest, ResultIntoASecondRegion) {
  std::unique_ptr<Client> client = Connect(kAlice);
  const TestMatrix m = MakeMatrix("w", {40, 72}, DType::kF32, 4);
  MatrixInput plain = WithBytes(m);
  absl::StatusOr<std::vector<MatrixOutput>> expected = Call(*client, GetParam(), {&plain, 1});
  ASSERT_OK(expected);
  ASSERT_OK((*expected)[0].status);

  std::unique_ptr<Region> inputs = MakeRegion(*client, 64 << 10, "inputs");
  std::unique_ptr<Region> results = MakeRegion(*client, 64 << 10, "results");
  ASSERT_NE(inputs, nullptr);
  ASSERT_NE(results, nullptr);
  EXPECT_NE(inputs->id(), results->id());
  const int64_t size = static_cast<int64_t>(m.bytes.size());
  std::memcpy(inputs->data() + 128, m.bytes.data(), m.bytes.size());
  MatrixInput in = Describe(m);
  in.input_region = inputs->Slice(128, size);
  in.result_region = results->Slice(4096, size);
  absl::StatusOr<std::vector<MatrixOutput>> got = Call(*client, GetParam(), {&in, 1});
  ASSERT_OK(got);
  ASSERT_OK((*got)[0].status);
  ASSERT_TRUE((*got)[0].result_region.has_value());
  EXPECT_EQ((*got)[0].result_region->region_id, results->id());
  EXPECT_EQ(RegionBytes(*results, *in.result_region), Bytes((*expected)[0]));
  // The input is left as it was.
  EXPECT_EQ(std::memcmp(inputs->data() + 128, m.bytes.data(), m.bytes.size()), 0);
}

TEST_P(ClientShmMethodTest, ASliceOutsideItsRegionIsOutOfRange) {
  std::unique_ptr<Client> client = Connect(kAlice);
  const TestMatrix m = MakeMatrix("x", {16, 16}, DType::kF32, 5);  // 1 KiB.
  std::unique_ptr<Region> region = MakeRegion(*client, 4096);
  ASSERT_NE(region, nullptr);
  MatrixInput in = Describe(m);
  in.input_region = region->Slice(4096 - 512, 1024);  // Runs 512 bytes past the end.
  MatrixInput out = WithBytes(m);
  out.result_region = region->Slice(int64_t{1} << 40, 1024);  // Starts far beyond it.
  for (const MatrixInput& input : {in, out}) {
    absl::StatusOr<std::vector<MatrixOutput>> r = Call(*client, GetParam(), {&input, 1});
    const char* field = input.input_region.has_value() ? "input_region" : "result_region";
    if (GetParam() == Method::kUnary) {  // The unary call is all or nothing: the call fails.
      EXPECT_THAT(r, StatusIs(absl::StatusCode::kOutOfRange, HasSubstr(field)));
    } else {  // A lone stream step answers a bad spec in-band.
      ASSERT_OK(r);
      EXPECT_THAT((*r)[0].status, StatusIs(absl::StatusCode::kOutOfRange, HasSubstr(field)));
      EXPECT_FALSE((*r)[0].result_region.has_value());
    }
  }
  // The server is still serving, and the region still works.
  std::memcpy(region->data(), m.bytes.data(), m.bytes.size());
  in.input_region = region->Slice(0, 1024);
  absl::StatusOr<std::vector<MatrixOutput>> ok = Call(*client, GetParam(), {&in, 1});
  ASSERT_OK(ok);
  EXPECT_OK((*ok)[0].status);
}

TEST_P(ClientShmMethodTest, UnregisteredOrAnotherTenantsRegionIsNotFound) {
  std::unique_ptr<Client> alice = Connect(kAlice);
  std::unique_ptr<Client> bob = Connect(kBob);
  const TestMatrix m = MakeMatrix("y", {8, 8}, DType::kF32, 6);
  std::unique_ptr<Region> region = MakeRegion(*alice, 4096);
  ASSERT_NE(region, nullptr);
  std::memcpy(region->data(), m.bytes.data(), m.bytes.size());
  MatrixInput in = Describe(m);
  in.input_region = region->Slice(0, static_cast<int64_t>(m.bytes.size()));
  absl::StatusOr<std::vector<MatrixOutput>> mine = Call(*alice, GetParam(), {&in, 1});
  ASSERT_OK(mine);
  ASSERT_OK((*mine)[0].status);

  auto expect_not_found = [&](Client& client, const char* who) {
    SCOPED_TRACE(who);
    absl::StatusOr<std::vector<MatrixOutput>> r = Call(client, GetParam(), {&in, 1});
    if (GetParam() == Method::kUnary) {
      EXPECT_THAT(r, StatusIs(absl::StatusCode::kNotFound, HasSubstr("input_region")));
    } else {
      ASSERT_OK(r);
      EXPECT_THAT((*r)[0].status, StatusIs(absl::StatusCode::kNotFound, HasSubstr("input_region")));
    }
  };
  expect_not_found(*bob, "bob names alice's region");
  ASSERT_OK(region->Unregister());
  EXPECT_FALSE(region->registered());
  expect_not_found(*alice, "alice names her region after unregistering it");
  EXPECT_OK(region->Unregister());  // Once is enough; again is a no-op.
}

// An attempt whose deadline passes while the server computes its matrix into a result slice is
// fenced before its error comes back, so the abandoned computation never lands in the slice
// after the caller reused it: the next call's result, written into the same bytes by the other
// compute worker, stays as that call left it (issue #38: before fences, the abandoned matrix
// overwrote it about two seconds later, with no error anywhere).
TEST_P(ClientShmMethodTest, AnAbandonedCallsLateResultNeverLandsInTheNextCallsSlice) {
  ClientOptions o;
  o.address = server_->address;
  o.bearer_token = kAlice;
  o.timeout = absl::Milliseconds(300);
  o.retry.enabled = false;  // One attempt: its DEADLINE_EXCEEDED is the caller's.
  absl::StatusOr<std::unique_ptr<Client>> impatient = Client::Create(o);
  ASSERT_OK(impatient);
  std::unique_ptr<Client> client = Connect(kAlice);
  const TestMatrix slow = MakeMatrix("slow", {1536, 1536}, DType::kF32, 11);  // Seconds of compute at 12 steps.
  const TestMatrix next = MakeMatrix("next", {1536, 1536}, DType::kF32, 12);
  const int64_t size = static_cast<int64_t>(slow.bytes.size());
  std::unique_ptr<Region> region = MakeRegion(*client, 3 * size, "late");
  ASSERT_NE(region, nullptr);
  std::memcpy(region->data(), slow.bytes.data(), slow.bytes.size());
  std::memcpy(region->data() + size, next.bytes.data(), next.bytes.size());
  const RegionSlice out = region->Slice(2 * size, size);

  MatrixInput first = Describe(slow);
  first.options.steps = 12;
  first.input_region = region->Slice(0, size);
  first.result_region = out;
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<MatrixOutput>> abandoned = Call(**impatient, GetParam(), {&first, 1});
  ASSERT_THAT(abandoned.status(), StatusIs(absl::StatusCode::kDeadlineExceeded, _)) << "computed within 300 ms?";
  const absl::Duration fenced_after = absl::Now() - start;

  // The caller reuses the slice at once, for a quick matrix that the server's second worker would
  // compute while the first one still ran.
  MatrixInput second = Describe(next);
  second.options.steps = 1;
  MatrixInput second_bytes = WithBytes(next);
  second_bytes.options.steps = 1;
  absl::StatusOr<std::vector<MatrixOutput>> expected = Call(*client, GetParam(), {&second_bytes, 1});
  ASSERT_OK(expected);
  second.input_region = region->Slice(size, size);
  second.result_region = out;
  absl::StatusOr<std::vector<MatrixOutput>> got = Call(*client, GetParam(), {&second, 1});
  ASSERT_OK(got);
  ASSERT_OK((*got)[0].status);
  EXPECT_EQ(RegionBytes(*region, out), Bytes((*expected)[0]));
  // Long after the abandoned matrix can have finished, the slice still holds the second result.
  absl::SleepFor(std::max(absl::ZeroDuration(), start + fenced_after + absl::Seconds(2) - absl::Now()));
  EXPECT_EQ(RegionBytes(*region, out), Bytes((*expected)[0]));
  EXPECT_GT(fenced_after, absl::Milliseconds(300)) << "the error came back before the server let go of the slice";
}

INSTANTIATE_TEST_SUITE_P(Methods, ClientShmMethodTest, ::testing::Values(Method::kUnary, Method::kStream),
                         [](const ::testing::TestParamInfo<Method>& info) {
                           return info.param == Method::kUnary ? std::string("Unary") : std::string("Stream");
                         });

TEST_F(ClientShmTest, ServerWithoutShmSocketRefusesRegions) {
  ServerProcess plain = testing::StartServer(*dir_ + "/plain");
  ASSERT_NE(plain.process, nullptr);
  ClientOptions o;
  o.address = plain.address;
  o.timeout = absl::Seconds(30);
  o.retry.enabled = false;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(o);
  ASSERT_OK(client);
  // The client sees no socket in the server's info.
  EXPECT_THAT((*client)->CreateRegion(4096),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("--shm-socket")));
  // Handed over on the other server's socket, the ticket is still refused here: regions are off.
  RegionOptions elsewhere;
  elsewhere.socket_path = *socket_;
  EXPECT_THAT((*client)->CreateRegion(4096, elsewhere),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("regions are off")));
  // And so is a matrix that names a region.
  const TestMatrix m = MakeMatrix("z", {8, 8}, DType::kF32, 7);
  MatrixInput in = Describe(m);
  in.input_region = RegionSlice{"00000000000000000000000000000000", plain.address, 0, 256};
  EXPECT_THAT((*client)->Orthogonalize({&in, 1}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("--shm-socket")));
  testing::StopServerExpectCleanExit(plain);
}

TEST_F(ClientShmTest, ACallNamingARegionGoesToItsAddressOnly) {
  // The client prefers an address where nothing listens; the region is on the server.
  absl::StatusOr<int> free_port = testing::PickFreePort();
  ASSERT_OK(free_port);
  const std::string nowhere = absl::StrCat("127.0.0.1:", *free_port);
  ClientOptions o;
  o.addresses = {nowhere, server_->address};
  o.timeout = absl::Seconds(10);
  o.bearer_token = kAlice;
  o.retry.max_attempts = 2;
  o.retry.initial_backoff = absl::Milliseconds(10);
  o.fence_timeout = absl::Seconds(1);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(o);
  ASSERT_OK(client);
  RegionOptions on_server;
  on_server.address = server_->address;
  absl::StatusOr<std::unique_ptr<Region>> region = (*client)->CreateRegion(4096, on_server);
  ASSERT_OK(region);
  const TestMatrix m = MakeMatrix("p", {8, 8}, DType::kF32, 8);
  std::memcpy((*region)->data(), m.bytes.data(), m.bytes.size());
  MatrixInput in = Describe(m);
  in.input_region = (*region)->Slice(0, 256);
  absl::StatusOr<std::vector<MatrixOutput>> r = (*client)->Step(StepOptions{}, {&in, 1});
  ASSERT_OK(r);
  EXPECT_OK((*r)[0].status);
  EXPECT_EQ((*client)->retries(), 0);        // Straight to the region's address...
  EXPECT_EQ((*client)->address(), nowhere);  // ...which does not become the preferred one.

  // A slice on an address the client does not have, and slices on two addresses, are refused.
  MatrixInput stranger = in;
  stranger.input_region->address = "127.0.0.1:1";
  EXPECT_THAT((*client)->Orthogonalize({&stranger, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not one of this client's addresses")));
  MatrixInput other = Describe(m);
  other.name = "q";
  other.input_region = RegionSlice{(*region)->id(), nowhere, 0, 256};
  std::vector<MatrixInput> mixed = {in, other};
  EXPECT_THAT((*client)->Step(StepOptions{}, mixed),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("one call goes to one server rank")));

  // A call pinned to an address that does not answer fails there (it is not failed over to the
  // server that answers), and as its failed attempt cannot be fenced there either, it is not
  // retried and says that its slices may still be written (fences, docs/shared_memory.md).
  absl::StatusOr<std::vector<MatrixOutput>> down = (*client)->Orthogonalize({&other, 1});
  EXPECT_THAT(down, StatusIs(absl::StatusCode::kFailedPrecondition,
                             HasSubstr(absl::StrCat("may still be written by the server at ", nowhere))));
}

// A group step through GroupClient (W = 2 trainer ranks on the one-rank server): rank 0's block
// in a region made on the server's connection and its result written into the region, rank 1's
// in bytes; both get the bits of the same step in bytes. The client is told of a second member
// (fleet rank 0, where nothing listens) that routing would send trainer rank 0 to: the step that
// names the region goes to the region's member instead.
TEST_F(ClientShmTest, AGroupStepThroughARegionGoesToItsMemberWithTheBitsOfBytes) {
  GroupClient::Options go;
  go.client.address = server_->address;
  go.client.timeout = absl::Seconds(30);
  go.client.bearer_token = kAlice;
  go.client.retry.deadline = absl::Seconds(20);
  go.run_id = "client-shm-group";
  v1::ServerInfo info;
  info.set_fleet_world(2);
  info.set_fleet_rank(1);
  v1::FleetMember* gone = info.add_members();
  gone->set_rank(0);
  gone->set_address("127.0.0.1:1");
  gone->set_ready(true);
  v1::FleetMember* here = info.add_members();
  here->set_rank(1);
  here->set_address(server_->address);
  here->set_ready(true);
  absl::StatusOr<std::unique_ptr<GroupClient>> group = GroupClient::CreateFromInfo(go, info, nullptr);
  ASSERT_OK(group);
  ASSERT_EQ((*group)->FleetRankFor(0, 2), 0);  // Where routing alone would send trainer rank 0.
  const TestMatrix m = MakeMatrix("g", {32, 24}, DType::kF32, 9);
  const size_t half_bytes = m.bytes.size() / 2;
  auto half = [&](int rank) {
    MatrixInput in = Describe(m);
    in.block = Block{16 * rank, 0, 16, 24};
    in.data = m.bytes.data() + rank * half_bytes;
    in.bytes = half_bytes;
    return in;
  };
  auto run = [&](int64_t step, MatrixInput rank0, MatrixInput rank1) {
    auto other = std::async(std::launch::async, [&] { return (*group)->Step("job", "grp", step, 1, 2, {&rank1, 1}); });
    absl::StatusOr<std::vector<MatrixOutput>> first = (*group)->Step("job", "grp", step, 0, 2, {&rank0, 1});
    return std::make_pair(std::move(first), other.get());
  };
  // The reference: both trainer ranks in bytes, through the server alone.
  GroupClient::Options one = go;
  one.run_id = "client-shm-group-bytes";
  absl::StatusOr<std::unique_ptr<GroupClient>> bytes_group = GroupClient::Create(one);
  ASSERT_OK(bytes_group);
  MatrixInput plain0 = half(0), plain1 = half(1);
  auto bytes1_call = std::async(std::launch::async,
                                [&] { return (*bytes_group)->Step("job", "grp", 1, 1, 2, {&plain1, 1}); });
  absl::StatusOr<std::vector<MatrixOutput>> bytes0 = (*bytes_group)->Step("job", "grp", 1, 0, 2, {&plain0, 1});
  absl::StatusOr<std::vector<MatrixOutput>> bytes1 = bytes1_call.get();
  ASSERT_OK(bytes0);
  ASSERT_OK(bytes1);
  ASSERT_OK((*bytes0)[0].status);

  Client* member = (*group)->member_client(1);
  ASSERT_NE(member, nullptr);
  std::unique_ptr<Region> region = MakeRegion(*member, 64 << 10, "group");
  ASSERT_NE(region, nullptr);
  std::memcpy(region->data(), m.bytes.data(), half_bytes);
  MatrixInput in = half(0);
  in.data = nullptr;
  in.bytes = 0;
  in.input_region = region->Slice(0, static_cast<int64_t>(half_bytes));
  in.result_region = region->Slice(4096, static_cast<int64_t>(half_bytes));
  auto [got0, got1] = run(2, in, half(1));
  ASSERT_OK(got0);
  ASSERT_OK(got1);
  ASSERT_OK((*got0)[0].status);
  ASSERT_TRUE((*got0)[0].result_region.has_value());
  EXPECT_EQ(RegionBytes(*region, *in.result_region), Bytes((*bytes0)[0]));
  EXPECT_EQ(Bytes((*got1)[0]), Bytes((*bytes1)[0]));
}

TEST_F(ClientShmTest, InputsThatMixRegionsAndBytesAreRefusedBeforeSending) {
  std::unique_ptr<Client> client = Connect(kAlice);
  const TestMatrix m = MakeMatrix("r", {8, 8}, DType::kF32, 9);
  std::vector<char> result(m.bytes.size());
  MatrixInput both = WithBytes(m);
  both.input_region = RegionSlice{"id", server_->address, 0, 256};
  EXPECT_THAT(client->Orthogonalize({&both, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("give one or the other")));
  MatrixInput two_results = WithBytes(m);
  two_results.result = result.data();
  two_results.result_bytes = result.size();
  two_results.result_region = RegionSlice{"id", server_->address, 0, 256};
  EXPECT_THAT(client->Step(StepOptions{}, {&two_results, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("give one or the other")));
  MatrixInput short_result = Describe(m);  // In a region, its result into a buffer too small.
  short_result.input_region = RegionSlice{"id", server_->address, 0, 256};
  short_result.result = result.data();
  short_result.result_bytes = result.size() - 4;
  EXPECT_THAT(client->Orthogonalize({&short_result, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("result buffer of 252 bytes")));
  MatrixInput no_id = Describe(m);
  no_id.input_region = RegionSlice{"", server_->address, 0, 256};
  EXPECT_THAT(client->Step(StepOptions{}, {&no_id, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("Region::Slice")));
  EXPECT_THAT(client->CreateRegion(0), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at least one byte")));
}

TEST_F(ClientShmTest, TheServersRefusalOfAHandoverKeepsItsCode) {
  // A descriptor that is not a memfd (a pipe): the server answers "ERR INVALID_ARGUMENT ...".
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  EXPECT_THAT(HandOverMemfd(*socket_, pipe_fds[0], absl::Seconds(10)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a memfd")));
  close(pipe_fds[0]);
  close(pipe_fds[1]);
  // A memfd without the seal.
  const int unsealed = memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(unsealed, 0);
  ASSERT_EQ(ftruncate(unsealed, 4096), 0);
  EXPECT_THAT(HandOverMemfd(*socket_, unsealed, absl::Seconds(10)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("F_SEAL_SHRINK")));
  close(unsealed);
  // No socket at all.
  EXPECT_THAT(HandOverMemfd(*dir_ + "/no.sock", 0, absl::Seconds(10)),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("no.sock")));
  // An explicit socket path that does not exist, through the client.
  std::unique_ptr<Client> client = Connect(kAlice);
  RegionOptions wrong;
  wrong.socket_path = *dir_ + "/no.sock";
  EXPECT_THAT(client->CreateRegion(4096, wrong), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("connect")));
}

TEST(HandoverAnswer, ParsesTicketsAndErrorCodes) {
  EXPECT_THAT(ParseHandoverAnswer("OK 0123abcd\n"), ::orthoserve::testing::IsOkAndHolds(std::string("0123abcd")));
  EXPECT_THAT(ParseHandoverAnswer("ERR OUT_OF_RANGE the memfd holds 9 bytes\n"),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("refused the memfd: the memfd holds 9 bytes")));
  EXPECT_THAT(ParseHandoverAnswer("ERR PERMISSION_DENIED uid 7 may not"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("uid 7")));
  EXPECT_THAT(ParseHandoverAnswer("ERR RESOURCE_EXHAUSTED full"),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("full")));
  EXPECT_THAT(ParseHandoverAnswer("ERR NO_SUCH_CODE what"), StatusIs(absl::StatusCode::kUnknown, HasSubstr("what")));
  EXPECT_THAT(ParseHandoverAnswer("OK \n"), StatusIs(absl::StatusCode::kUnknown, HasSubstr("not OK or ERR")));
  EXPECT_THAT(ParseHandoverAnswer("hello"), StatusIs(absl::StatusCode::kUnknown, HasSubstr("\"hello\"")));
}

TEST_F(ClientShmTest, OrthoctlBenchThroughARegion) {
  const std::string token_file = *dir_ + "/alice.token";
  {
    std::ofstream out(token_file);
    out << kAlice << "\n";
  }
  std::ostringstream out, err;
  const int rc = orthoctl::RunBench({"--shm", "--shape", "48,32", "--matrices", "3", "--iters", "3", "--warmup", "1",
                                     "--server", server_->address, "--token-file", token_file, "--timeout", "30"},
                                    out, err);
  EXPECT_EQ(rc, orthoctl::kExitOk) << err.str();
  EXPECT_THAT(out.str(), HasSubstr("3 x [48, 32] fp32 per step, 3 iters after 1 warmup, stream, inputs and results in "
                                   "shared-memory region"));
  EXPECT_THAT(out.str(), HasSubstr(absl::StrCat("on ", server_->address)));
  EXPECT_THAT(out.str(), HasSubstr("throughput:"));
  std::ostringstream unary_out, unary_err;
  EXPECT_EQ(orthoctl::RunBench({"--shm", "--unary", "--shape", "16,16", "--iters", "2", "--server", server_->address,
                                "--token-file", token_file},
                               unary_out, unary_err),
            orthoctl::kExitOk)
      << unary_err.str();
  EXPECT_THAT(unary_out.str(), HasSubstr("unary, inputs and results in shared-memory region"));
  // Without a tenant token the server refuses the registration; orthoctl says so and exits 2.
  std::ostringstream refused_out, refused_err;
  EXPECT_EQ(
      orthoctl::RunBench({"--shm", "--shape", "16,16", "--iters", "1", "--server", server_->address, "--no-retry"},
                         refused_out, refused_err),
      orthoctl::kExitRpc);
  EXPECT_THAT(refused_err.str(), HasSubstr("UNAUTHENTICATED"));
  EXPECT_THAT(refused_err.str(), HasSubstr("--shm"));
}

// The ids of the regions `token`'s tenant has on the server (empty, and a failure, when the call fails).
std::vector<std::string> RegionIds(const std::string& address, const std::string& token) {
  auto stub = v1::SharedMemory::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ListRegionsResponse response;
  const grpc::Status status = stub->ListRegions(&context, v1::ListRegionsRequest(), &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  std::vector<std::string> ids;
  for (const v1::Region& r : response.regions()) ids.push_back(r.region_id());
  return ids;
}

// Polls `done` every 20 ms until it holds or `timeout` passed; whether it held.
bool Eventually(const std::function<bool()>& done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

TEST_F(ClientShmTest, TheRegionOfAClientKilledWithoutUnregisteringIsDropped) {
  const std::string token_file = *dir_ + "/bob.token";
  {
    std::ofstream out(token_file);
    out << kBob << "\n";
  }
  const std::vector<std::string> before = RegionIds(server_->address, kBob);
  // orthoctl bench --shm registers one region and steps through it for far longer than this test.
  absl::StatusOr<std::unique_ptr<testing::Subprocess>> bench = testing::Subprocess::Start(
      {ORTHOCTL_BINARY, "bench", "--shm", "--shape", "64,64", "--matrices", "2", "--iters", "100000000", "--server",
       server_->address, "--token-file", token_file, "--timeout", "30"},
      *dir_ + "/killed-bench");
  ASSERT_OK(bench.status());
  std::string id;
  ASSERT_TRUE(Eventually(
      [&] {
        for (const std::string& r : RegionIds(server_->address, kBob)) {
          if (std::find(before.begin(), before.end(), r) == before.end()) id = r;
        }
        return !id.empty() || !(*bench)->Running();
      },
      absl::Seconds(60)));
  ASSERT_FALSE(id.empty()) << "orthoctl registered no region: " << (*bench)->Stderr();
  (*bench)->Signal(SIGKILL);  // By its pid: it cannot unregister.
  absl::StatusOr<int> code = (*bench)->Wait(absl::Seconds(30));
  ASSERT_OK(code.status());
  EXPECT_EQ(*code, 128 + SIGKILL);
  EXPECT_TRUE(Eventually(
      [&] {
        const std::vector<std::string> now = RegionIds(server_->address, kBob);
        return std::find(now.begin(), now.end(), id) == now.end();
      },
      absl::Seconds(10)))
      << "the killed client's region " << id << " is still registered";
  // The tenant registers (and unregisters) as before.
  std::unique_ptr<Client> bob = Connect(kBob);
  absl::StatusOr<std::unique_ptr<Region>> region = bob->CreateRegion(4096);
  ASSERT_OK(region.status());
  EXPECT_OK((*region)->Unregister());
  EXPECT_EQ(RegionIds(server_->address, kBob), before);
}

}  // namespace
}  // namespace orthoserve::client
