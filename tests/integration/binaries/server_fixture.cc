// Implementation of tests/integration/binaries/server_fixture.h.
#include "tests/integration/binaries/server_fixture.h"

#include <signal.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace orthoserve::testing {

const char* OrthoserveBinary() { return ORTHOSERVE_BINARY; }
const char* OrthoctlBinary() { return ORTHOCTL_BINARY; }

std::string MakeScratchDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/binaries_test.XXXXXX");
  if (mkdtemp(templ.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp " << templ << " failed";
    return "/tmp";
  }
  return templ;
}

ServerProcess StartServer(const std::string& log_prefix, const std::vector<std::string>& extra_flags) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    absl::StatusOr<int> port = PickFreePort();
    if (!port.ok()) {
      ADD_FAILURE() << port.status();
      return {};
    }
    ServerProcess server;
    server.address = absl::StrCat("127.0.0.1:", *port);
    std::vector<std::string> argv = {OrthoserveBinary(),
                                     "--listen",
                                     server.address,
                                     "--metrics-address",
                                     "",
                                     "--blas-threads",
                                     "1",
                                     "--drain-timeout",
                                     absl::StrCat(absl::ToInt64Seconds(kDrainTimeout), "s")};
    argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
    const std::string prefix = absl::StrCat(log_prefix, ".", attempt);
    absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Start(argv, prefix);
    if (!p.ok()) {
      ADD_FAILURE() << p.status();
      return {};
    }
    server.process = *std::move(p);
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (server.process->Running() && absl::Now() < deadline) {
      ProcessResult health =
          RunProcess({OrthoctlBinary(), "health", "--server", server.address, "--timeout", "2"}, prefix + ".health");
      if (health.exit_code == 0 && health.out == "SERVING\n") return server;
      absl::SleepFor(absl::Milliseconds(50));
    }
    if (server.process->Running()) {
      ADD_FAILURE() << "orthoserve on " << server.address << " did not become healthy in 30 s; log:\n"
                    << server.process->Stderr();
      return {};
    }
    // Exited: most likely the port was taken between PickFreePort and bind; try another.
    std::cerr << "orthoserve on " << server.address << " exited early (attempt " << attempt << "):\n"
              << server.process->Stderr() << "\n";
  }
  ADD_FAILURE() << "orthoserve did not start in 3 attempts";
  return {};
}

void StopServerExpectCleanExit(ServerProcess& server) {
  if (server.process == nullptr) return;
  ASSERT_TRUE(server.process->Running()) << "orthoserve died before SIGTERM; log:\n" << server.process->Stderr();
  const absl::Time start = absl::Now();
  server.process->Signal(SIGTERM);
  absl::StatusOr<int> code = server.process->Wait(kDrainTimeout);
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(code.ok()) << code.status() << "; log:\n" << server.process->Stderr();
  EXPECT_EQ(*code, 0) << "log:\n" << server.process->Stderr();
  EXPECT_LT(took, kDrainTimeout);
  EXPECT_NE(server.process->Stderr().find("draining"), std::string::npos) << server.process->Stderr();
  std::cerr << "orthoserve " << server.address << " exited " << *code << " " << absl::FormatDuration(took)
            << " after SIGTERM\n";
}

std::string* BinariesTest::dir_ = nullptr;
ServerProcess* BinariesTest::server_ = nullptr;

void BinariesTest::SetUpTestSuite() {
  dir_ = new std::string(MakeScratchDir());
  server_ = new ServerProcess(StartServer(Path("server")));
}

void BinariesTest::TearDownTestSuite() {
  StopServerExpectCleanExit(*server_);
  delete server_;
  server_ = nullptr;
  std::error_code ignored;
  std::filesystem::remove_all(*dir_, ignored);
  delete dir_;
  dir_ = nullptr;
}

std::string BinariesTest::Path(const std::string& name) { return absl::StrCat(*dir_, "/", name); }

ProcessResult BinariesTest::Orthoctl(const std::vector<std::string>& args, const std::string& log,
                                     const std::string& address) {
  std::vector<std::string> argv = {OrthoctlBinary()};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--server");
  argv.push_back(address.empty() ? server_->address : address);
  return RunProcess(argv, Path(log));
}

std::optional<client::NpyArray> BinariesTest::OrthogonalizeViaBinary(const std::string& tag, const client::NpyArray& in,
                                                                     const std::vector<std::string>& flags) {
  const std::string in_path = Path(tag + ".in.npy");
  const std::string out_path = Path(tag + ".out.npy");
  if (absl::Status w = client::WriteNpy(in_path, in); !w.ok()) {
    ADD_FAILURE() << w;
    return std::nullopt;
  }
  std::vector<std::string> args = {"orthogonalize", "--in", in_path, "--out", out_path};
  args.insert(args.end(), flags.begin(), flags.end());
  ProcessResult r = Orthoctl(args, tag);
  if (r.exit_code != 0) {
    ADD_FAILURE() << tag << ": orthoctl exited " << r.exit_code << "\nstdout: " << r.out << "\nstderr: " << r.err;
    return std::nullopt;
  }
  client::NpyReadOptions read_options;
  read_options.void2_as_bf16 = in.dtype == DType::kBF16;  // orthoctl writes bf16 results as '<V2'.
  absl::StatusOr<client::NpyArray> out = client::ReadNpy(out_path, read_options);
  std::error_code ignored;
  std::filesystem::remove(in_path, ignored);
  std::filesystem::remove(out_path, ignored);
  if (!out.ok()) {
    ADD_FAILURE() << tag << ": " << out.status();
    return std::nullopt;
  }
  return *std::move(out);
}

void BinariesTest::ExpectStillServing(const std::string& after) {
  SCOPED_TRACE("server still serving after " + after);
  ProcessResult health = Orthoctl({"health"}, "health_after");
  EXPECT_EQ(health.exit_code, 0) << health.err;
  EXPECT_EQ(health.out, "SERVING\n");
  client::NpyArray tiny;
  tiny.shape = {2, 3};
  const float values[6] = {1, 2, 3, -1, 0.5f, 2};
  tiny.data.assign(reinterpret_cast<const char*>(values), reinterpret_cast<const char*>(values) + sizeof(values));
  std::optional<client::NpyArray> out = OrthogonalizeViaBinary("tiny_after", tiny, {"--precision", "highest"});
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->shape, tiny.shape);
  EXPECT_EQ(out->data.size(), tiny.data.size());
}

int64_t ResidentBytes(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (!absl::StartsWith(line, "VmRSS:")) continue;
    int64_t kib = 0;
    std::string digits;
    for (char c : line) {
      if (c >= '0' && c <= '9') digits += c;
    }
    if (absl::SimpleAtoi(digits, &kib)) return kib << 10;
  }
  return -1;
}

}  // namespace orthoserve::testing
