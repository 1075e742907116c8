// The binaries test's fixture: a real `orthoserve` process on a free loopback port per test suite
// (started in SetUpTestSuite, SIGTERMed in TearDownTestSuite, which checks it exits 0 within the
// drain timeout), a scratch directory, and helpers that run the real `orthoctl`.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/cpp/npy.h"
#include "gtest/gtest.h"
#include "tests/integration/binaries/subprocess.h"

namespace orthoserve::testing {

// Paths of the binaries under test (compile definitions set by CMake).
const char* OrthoserveBinary();
const char* OrthoctlBinary();

// The drain timeout every test server is started with; SIGTERM must end it well within this.
inline constexpr absl::Duration kDrainTimeout = absl::Seconds(20);

// A started server: the process and its address.
struct ServerProcess {
  std::unique_ptr<Subprocess> process;
  std::string address;  // 127.0.0.1:PORT
};

// Starts orthoserve on a free loopback port with `extra_flags`, logs under `log_prefix`, and waits
// until `orthoctl health` answers SERVING (retrying on another port when the port was taken).
// ADD_FAILUREs and returns an empty process when it does not come up.
ServerProcess StartServer(const std::string& log_prefix, const std::vector<std::string>& extra_flags = {});

// SIGTERMs the server and expects exit code 0 within kDrainTimeout (failures carry the log). The
// reaped process stays in `server` so its log can still be read.
void StopServerExpectCleanExit(ServerProcess& server);

// VmRSS of process `pid` in bytes, from /proc/PID/status (-1 when it cannot be read).
int64_t ResidentBytes(pid_t pid);

// A new scratch directory under $TMPDIR (or /tmp).
std::string MakeScratchDir();

class BinariesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite();
  static void TearDownTestSuite();

  // A scratch path `name` for this suite.
  static std::string Path(const std::string& name);

  // `orthoctl ARGS... --server ADDRESS`, output captured under Path(log).
  static ProcessResult Orthoctl(const std::vector<std::string>& args, const std::string& log,
                                const std::string& address = "");

  // Writes `in` to Path(tag + ".in.npy"), runs `orthoctl orthogonalize` with `flags` and returns
  // the output array; ADD_FAILUREs (with stderr) and returns nullopt when the run fails.
  static std::optional<client::NpyArray> OrthogonalizeViaBinary(const std::string& tag, const client::NpyArray& in,
                                                                const std::vector<std::string>& flags);

  // Expects the server to still serve: health is SERVING and a tiny matrix orthogonalizes.
  static void ExpectStillServing(const std::string& after);

  static std::string* dir_;
  static ServerProcess* server_;
};

}  // namespace orthoserve::testing
