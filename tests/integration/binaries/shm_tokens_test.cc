// The real orthoserve binary refuses shared-memory regions without tokens on a public port that is
// not loopback (issue #38, item 5): --shm-socket without --token-file on --listen 0.0.0.0:PORT would
// make every client that reaches the port tenant "default", free to list, read and write every
// region. --check-config refuses it (exit 2, saying what to change), and so does a start; loopback,
// a token file or the explicit opt-in --shm-allow-without-tokens (warned of) are accepted. No case
// here serves on a port: the accepted ones only check the configuration.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/binaries/server_fixture.h"
#include "tests/integration/binaries/subprocess.h"

namespace orthoserve::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kExitInvalidConfiguration = 2;  // server/main.cc: invalid flags, with or without --check-config.

class ShmTokensTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = MakeScratchDir(); }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  // Runs orthoserve with --shm-socket (in the scratch dir) and `flags`; `name` names its logs.
  ProcessResult Run(const std::string& name, std::vector<std::string> flags) {
    std::vector<std::string> argv = {OrthoserveBinary(), "--backend", "cpu", "--metrics-address", "",
                                     "--shm-socket", Socket()};
    argv.insert(argv.end(), flags.begin(), flags.end());
    return RunProcess(argv, dir_ + "/" + name, absl::Seconds(30));
  }
  std::string Socket() const { return dir_ + "/shm.sock"; }

  std::string dir_;
};

TEST_F(ShmTokensTest, CheckConfigRefusesRegionsWithoutTokensOnAPublicPort) {
  for (const std::string listen : {"0.0.0.0:50051", "[::]:50051", "10.0.0.5:50051"}) {
    SCOPED_TRACE(listen);
    ProcessResult r = Run("public", {"--listen", listen, "--check-config"});
    EXPECT_EQ(r.exit_code, kExitInvalidConfiguration) << r.out << r.err;
    EXPECT_THAT(r.err, AllOf(HasSubstr(absl::StrCat("--shm-socket without --token-file on --listen ", listen)),
                             HasSubstr("give a --token-file, listen on loopback"),
                             HasSubstr("--shm-allow-without-tokens")));
    EXPECT_THAT(r.out, Not(HasSubstr("configuration OK")));
  }
}

TEST_F(ShmTokensTest, CheckConfigAcceptsALoopbackPortOrATokenFileWithoutAWarning) {
  for (const std::string listen : {"127.0.0.1:50051", "[::1]:50051", "localhost:50051"}) {
    SCOPED_TRACE(listen);
    ProcessResult r = Run("loopback", {"--listen", listen, "--check-config"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr("configuration OK"));
    EXPECT_THAT(r.out, Not(HasSubstr("warning:")));
  }
  const std::string tokens = dir_ + "/tokens";
  std::ofstream(tokens) << "secret-token alice\n";
  ProcessResult r = Run("tokens", {"--listen", "0.0.0.0:50051", "--token-file", tokens, "--check-config"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("configuration OK"));
  EXPECT_THAT(r.out, Not(HasSubstr("warning:")));
}

TEST_F(ShmTokensTest, CheckConfigAcceptsTheOptInAndSaysWhatItAllows) {
  ProcessResult r = Run("opt_in", {"--listen", "0.0.0.0:50051", "--shm-allow-without-tokens", "--check-config"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("--shm-allow-without-tokens = true"));
  EXPECT_THAT(r.out, HasSubstr("warning: --shm-allow-without-tokens: --shm-socket without --token-file on --listen "
                               "0.0.0.0:50051 (not loopback): every client that reaches the port is tenant "
                               "\"default\" and can list, read and write every shared-memory region"));
  EXPECT_THAT(r.out, HasSubstr("configuration OK"));
}

// Without --check-config the server stops before it serves anything: no socket file, no port.
// 192.0.2.1 (TEST-NET-1, assigned to no host) is as public as 0.0.0.0 to the check, and a server
// that wrongly went on could not bind it: this test never opens a port beyond loopback.
TEST_F(ShmTokensTest, AStartIsRefusedBeforeAnythingIsServed) {
  const absl::Time start = absl::Now();
  ProcessResult r = Run("start", {"--listen", "192.0.2.1:50051"});
  EXPECT_EQ(r.exit_code, kExitInvalidConfiguration) << r.out << r.err;
  EXPECT_THAT(r.err, AllOf(HasSubstr("--shm-socket without --token-file on --listen 192.0.2.1:50051"),
                           HasSubstr("--shm-allow-without-tokens")));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_FALSE(std::filesystem::exists(Socket()));
}

}  // namespace
}  // namespace orthoserve::testing
