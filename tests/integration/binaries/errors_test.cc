// Error paths of the real binaries: unreadable and unsupported .npy files, invalid options, a
// matrix the server rejects, a dead server — each with its exit code and message — and the server
// keeps serving after every one. A SIGTERM while a large matrix is in flight drains it.
#include <signal.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/binaries/expectations.h"
#include "tests/integration/binaries/server_fixture.h"
#include "tests/util/status_matchers.h"

namespace orthoserve::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// orthoctl's documented exit codes.
constexpr int kExitUsage = 1;
constexpr int kExitRpc = 2;
constexpr int kExitIo = 3;

// A version-1.0 .npy file with a hand-written header dict (as numpy writes it) and raw data.
void WriteRawNpy(const std::string& path, const std::string& dict, const std::string& data) {
  std::string header = dict;
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string bytes = "\x93NUMPY";
  bytes += '\x01';
  bytes += '\x00';
  bytes += static_cast<char>(header.size() & 0xff);
  bytes += static_cast<char>(header.size() >> 8);
  bytes += header + data;
  std::ofstream(path, std::ios::binary) << bytes;
}

class ErrorsTest : public BinariesTest {
 protected:
  // Runs `orthoctl orthogonalize --in in --out out flags...`.
  ProcessResult RunOrthogonalize(const std::string& tag, const std::string& in, std::vector<std::string> flags = {}) {
    std::vector<std::string> args = {"orthogonalize", "--in", in, "--out", Path(tag + ".out.npy")};
    args.insert(args.end(), flags.begin(), flags.end());
    return Orthoctl(args, tag);
  }

  std::string GoodInput() {
    std::string path = Path("good.npy");
    EXPECT_OK(client::WriteNpy(path, RandomArray(DType::kF32, {8, 12}, 1)));
    return path;
  }
};

TEST_F(ErrorsTest, MissingInputFile) {
  const std::string missing = Path("does_not_exist.npy");
  ProcessResult r = RunOrthogonalize("missing", missing);
  EXPECT_EQ(r.exit_code, kExitIo);
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND"));
  EXPECT_THAT(r.err, HasSubstr(missing));
  ExpectStillServing("a missing input");
}

TEST_F(ErrorsTest, FortranOrderAndInt32NpyAreRejected) {
  const std::string fortran = Path("fortran.npy");
  WriteRawNpy(fortran, "{'descr': '<f4', 'fortran_order': True, 'shape': (3, 4), }", std::string(48, '\0'));
  ProcessResult r = RunOrthogonalize("fortran", fortran);
  EXPECT_EQ(r.exit_code, kExitIo);
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(r.err, HasSubstr("Fortran order"));

  const std::string int32 = Path("int32.npy");
  WriteRawNpy(int32, "{'descr': '<i4', 'fortran_order': False, 'shape': (3, 4), }", std::string(48, '\0'));
  r = RunOrthogonalize("int32", int32);
  EXPECT_EQ(r.exit_code, kExitIo);
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(r.err, HasSubstr("'<i4' is not supported"));

  // The same writer with '<f4' and C order is accepted: the rejections are about descr and order.
  const std::string ok = Path("raw_ok.npy");
  std::vector<float> values(12);
  for (int i = 0; i < 12; ++i) values[i] = static_cast<float>(i % 5) - 1.5f;
  WriteRawNpy(ok, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }",
              std::string(reinterpret_cast<const char*>(values.data()), 48));
  r = RunOrthogonalize("raw_ok", ok);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  ExpectStillServing("unsupported .npy files");
}

TEST_F(ErrorsTest, ArraysThatAreNotMatricesAreRejected) {
  const std::string vector = Path("vector.npy");
  WriteRawNpy(vector, "{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }", std::string(20, '\0'));
  ProcessResult r = RunOrthogonalize("vector", vector);
  EXPECT_EQ(r.exit_code, kExitIo);
  EXPECT_THAT(r.err, HasSubstr("vector.npy shape [5] has 1 dims; orthogonalization needs at least 2"));
  const std::string empty = Path("empty.npy");
  WriteRawNpy(empty, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4), }", "");
  r = RunOrthogonalize("empty", empty);
  EXPECT_EQ(r.exit_code, kExitIo);
  EXPECT_THAT(r.err, HasSubstr("empty.npy shape [0, 4] has dim 0 = 0; every dim must be positive"));
  // bfloat16 ('<V2') needs --bf16.
  const std::string bf16 = Path("bf16.npy");
  WriteRawNpy(bf16, "{'descr': '<V2', 'fortran_order': False, 'shape': (2, 3), }", std::string(12, '\0'));
  r = RunOrthogonalize("bf16_without_flag", bf16);
  EXPECT_EQ(r.exit_code, kExitIo);
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(r.err, HasSubstr("--bf16"));
  ExpectStillServing("arrays that are not matrices");
}

// A client deadline that expires while the server computes: DEADLINE_EXCEEDED, exit 2, and the
// server goes on serving others. Each attempt that runs out of --timeout is retried until
// --retry-deadline, whose end is final.
TEST_F(ErrorsTest, ClientDeadlineExpiresMidCall) {
  const std::string big = Path("big.npy");
  ASSERT_OK(client::WriteNpy(big, RandomArray(DType::kF32, {1024, 1024}, 2)));
  const absl::Time start = absl::Now();
  ProcessResult r = RunOrthogonalize("deadline", big,
                                     {"--precision", "highest", "--timeout", "0.05", "--retry-deadline", "0.3"});
  EXPECT_EQ(r.exit_code, kExitRpc);
  EXPECT_THAT(r.err, HasSubstr("DEADLINE_EXCEEDED"));
  EXPECT_THAT(r.err, HasSubstr("(retry deadline of 300ms reached)"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  r = RunOrthogonalize("deadline_no_retry", big, {"--precision", "highest", "--timeout", "0.05", "--no-retry"});
  EXPECT_EQ(r.exit_code, kExitRpc);
  EXPECT_THAT(r.err, HasSubstr("DEADLINE_EXCEEDED"));
  ExpectStillServing("a call whose deadline expired");
}

TEST_F(ErrorsTest, InvalidOptions) {
  const std::string in = GoodInput();
  // orthoctl validates options with the shared rules before sending anything.
  ProcessResult r = RunOrthogonalize("steps101", in, {"--steps", "101"});
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(r.err, HasSubstr("steps = 101 is out of range"));
  r = RunOrthogonalize("cubic5_steps4", in, {"--coefficients", "cubic5", "--steps", "4"});
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT"));
  r = RunOrthogonalize("split_not_dividing", in, {"--split-qkv", "2,2,1"});  // 8 rows, groups of 5.
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT"));
  r = RunOrthogonalize("bad_precision", in, {"--precision", "low"});
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("highest"));
  r = RunOrthogonalize("bad_wire", in, {"--wire-dtype", "int8"});
  EXPECT_EQ(r.exit_code, kExitUsage);
  ExpectStillServing("invalid options");
}

// Data the server itself rejects: its INVALID_ARGUMENT message is printed and the exit code is 2.
TEST_F(ErrorsTest, ServerRejectsNonFiniteData) {
  std::vector<double> values(8 * 12, 0.25);
  values[17] = std::numeric_limits<double>::quiet_NaN();
  const std::string path = Path("nan.npy");
  ASSERT_TRUE(client::WriteNpy(path, MakeArray(DType::kF32, {8, 12}, values)).ok());
  ProcessResult r = RunOrthogonalize("nan", path);
  EXPECT_EQ(r.exit_code, kExitRpc);
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(r.err, HasSubstr("non-finite value"));
  ExpectStillServing("a non-finite input");
}

TEST_F(ErrorsTest, ServerLimitOnMatrixSize) {
  ServerProcess limited = StartServer(Path("limited"), {"--max-matrix-elements", "64"});
  ASSERT_NE(limited.process, nullptr);
  const std::string in = GoodInput();  // 96 elements.
  ProcessResult r =
      Orthoctl({"orthogonalize", "--in", in, "--out", Path("limited.out.npy")}, "limited_call", limited.address);
  EXPECT_EQ(r.exit_code, kExitRpc);
  EXPECT_THAT(r.err, HasSubstr("RESOURCE_EXHAUSTED"));
  EXPECT_THAT(r.err, HasSubstr("--max-matrix-elements"));
  ProcessResult health = Orthoctl({"health"}, "limited_health", limited.address);
  EXPECT_EQ(health.exit_code, 0) << health.err;
  StopServerExpectCleanExit(limited);
}

TEST_F(ErrorsTest, HealthAndOrthogonalizeAgainstADeadPort) {
  absl::StatusOr<int> port = PickFreePort();
  ASSERT_TRUE(port.ok());
  const std::string dead = absl::StrCat("127.0.0.1:", *port);
  ProcessResult r = Orthoctl({"health", "--timeout", "2"}, "dead_health", dead);
  EXPECT_EQ(r.exit_code, kExitRpc);
  EXPECT_THAT(r.err, HasSubstr("UNAVAILABLE"));
  // UNAVAILABLE is retried (by default for 120 s); a short retry deadline gives up with it.
  const absl::Time start = absl::Now();
  r = Orthoctl({"orthogonalize", "--in", GoodInput(), "--out", Path("dead.out.npy"), "--timeout", "2",
                "--retry-deadline", "1"},
               "dead_call", dead);
  EXPECT_EQ(r.exit_code, kExitRpc);
  EXPECT_THAT(r.err, HasSubstr("UNAVAILABLE"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  r = Orthoctl({"orthogonalize", "--in", GoodInput(), "--out", Path("dead.out.npy"), "--timeout", "2", "--no-retry"},
               "dead_call_no_retry", dead);
  EXPECT_EQ(r.exit_code, kExitRpc);
  EXPECT_FALSE(r.err.empty());
  ExpectStillServing("calls to a dead port");
}

// --help lists every server flag with its default; --version prints the release.
TEST(ServerLifecycleTest, HelpListsTheFlagsAndVersionPrintsTheRelease) {
  const std::string dir = MakeScratchDir();
  ProcessResult help = RunProcess({OrthoserveBinary(), "--help"}, dir + "/help", absl::Seconds(30));
  const std::string text = help.out + help.err;
  EXPECT_THAT(text, Not(HasSubstr("No flags matched")));
  EXPECT_THAT(text, HasSubstr("Flags from server/app/flags.cc"));
  for (const char* flag : {"--listen", "--backend", "--world", "--chunk_bytes", "--max_inflight_bytes",
                           "--drain_timeout", "--metrics_address"}) {
    EXPECT_THAT(text, HasSubstr(flag)) << flag;
  }
  EXPECT_THAT(text, HasSubstr("default: 4194304"));  // --chunk_bytes, with its default.
  ProcessResult version = RunProcess({OrthoserveBinary(), "--version"}, dir + "/version", absl::Seconds(30));
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_THAT(version.out, ::testing::MatchesRegex("orthoserve [0-9]+\\.[0-9]+\\.[0-9]+\n"));
}

// --tenant-shares is checked at start: a good value is accepted by --check-config, a bad one
// names the entry and exits 2.
TEST(ServerLifecycleTest, TenantSharesAreCheckedAtStart) {
  const std::string dir = MakeScratchDir();
  ProcessResult good = RunProcess({OrthoserveBinary(), "--tenant-shares=alice=3,bob=1@1", "--check-config"},
                                  dir + "/good", absl::Seconds(30));
  EXPECT_EQ(good.exit_code, 0) << good.err;
  EXPECT_THAT(good.out, HasSubstr("--tenant-shares = alice=3,bob=1@1"));
  for (const std::string bad : {"alice", "alice=0", "alice=x", "=2", "alice=1,alice=2", "alice=1@high"}) {
    ProcessResult r = RunProcess({OrthoserveBinary(), "--tenant-shares=" + bad, "--check-config"}, dir + "/bad",
                                 absl::Seconds(30));
    EXPECT_EQ(r.exit_code, 2) << bad;
    EXPECT_THAT(r.err, HasSubstr("--tenant-shares")) << bad;
  }
}

// SIGTERM while a large matrix is being computed: the call in flight completes and the server exits 0.
TEST(ServerLifecycleTest, SigtermDrainsACallInFlightAndExitsZero) {
  const std::string dir = MakeScratchDir();
  // rpc=1 logs "stream step ..." once a stream's header is read: the call is then in flight.
  ServerProcess server = StartServer(dir + "/server", {"--log-verbose", "rpc=1"});
  ASSERT_NE(server.process, nullptr);
  const client::NpyArray in = RandomArray(DType::kF32, {1024, 1024}, 5);
  ASSERT_TRUE(client::WriteNpy(dir + "/in.npy", in).ok());
  NsOptions highest;
  highest.precision = Precision::kHighest;
  absl::StatusOr<client::NpyArray> expected = absl::UnknownError("not run");
  std::thread engine([&] { expected = EngineExpected(in, highest); });  // While the server computes.
  struct JoinOnExit {
    std::thread& thread;
    ~JoinOnExit() {
      if (thread.joinable()) thread.join();
    }
  } join_on_exit{engine};
  absl::StatusOr<std::unique_ptr<Subprocess>> call =
      Subprocess::Start({OrthoctlBinary(), "orthogonalize", "--server", server.address, "--in", dir + "/in.npy",
                         "--out", dir + "/out.npy", "--precision", "highest", "--steps", "5"},
                        dir + "/call");
  ASSERT_TRUE(call.ok()) << call.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (server.process->Stderr().find("stream step") == std::string::npos && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  ASSERT_NE(server.process->Stderr().find("stream step"), std::string::npos) << server.process->Stderr();
  StopServerExpectCleanExit(server);
  EXPECT_THAT(server.process->Stderr(), HasSubstr("draining: 1 calls in flight"));
  absl::StatusOr<int> code = (*call)->Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 0) << (*call)->Stderr();
  absl::StatusOr<client::NpyArray> out = client::ReadNpy(dir + "/out.npy");
  ASSERT_TRUE(out.ok()) << out.status();
  engine.join();
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_EQ(out->shape, in.shape);
  EXPECT_TRUE(out->data == expected->data) << "the drained call's result differs from the in-process engine";
  // Afterwards the port is closed.
  ProcessResult after =
      RunProcess({OrthoctlBinary(), "health", "--server", server.address, "--timeout", "2"}, dir + "/after");
  EXPECT_EQ(after.exit_code, kExitRpc);
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

}  // namespace
}  // namespace orthoserve::testing
