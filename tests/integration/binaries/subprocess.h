// Child processes for the binaries test: fork/exec of a fixed argv (no shell), stdout and
// stderr captured in files, waits with a deadline, signals. Not thread-safe per object.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace orthoserve::testing {

// What a finished process left: exit code (128 + signal when killed by one) and its output.
struct ProcessResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

class Subprocess {
 public:
  // Starts argv[0] (a path) with argv, stdout/stderr redirected to `log_prefix`.out/.err. The
  // environment is the test's minus ORTHOSERVE_* (so no stray fallback changes a flag).
  // INTERNAL when fork fails or the log files cannot be created; an exec failure shows as exit 127.
  static absl::StatusOr<std::unique_ptr<Subprocess>> Start(const std::vector<std::string>& argv,
                                                           const std::string& log_prefix);

  // Kills (SIGKILL) and reaps a process still running.
  ~Subprocess();

  pid_t pid() const { return pid_; }

  // Whether the process has not exited yet (reaps it when it has).
  bool Running();

  // Waits up to `timeout` for the exit; DEADLINE_EXCEEDED when it is still running.
  absl::StatusOr<int> Wait(absl::Duration timeout);

  // Sends `signal` (no-op once reaped).
  void Signal(int signal);

  // The captured output so far.
  std::string Stdout() const;
  std::string Stderr() const;

 private:
  Subprocess(pid_t pid, std::string log_prefix) : pid_(pid), log_prefix_(std::move(log_prefix)) {}

  pid_t pid_;
  std::string log_prefix_;
  bool reaped_ = false;
  int exit_code_ = -1;
};

// Runs argv to completion (killed after `timeout`, exit code -1 then). Output files go to
// `log_prefix`.out/.err.
ProcessResult RunProcess(const std::vector<std::string>& argv, const std::string& log_prefix,
                         absl::Duration timeout = absl::Seconds(120));

// A loopback TCP port that was free a moment ago (bound to 127.0.0.1:0 and released), never
// one this process was given before.
absl::StatusOr<int> PickFreePort();

// The whole file as a string ("" when it cannot be read).
std::string ReadFileOrEmpty(const std::string& path);

}  // namespace orthoserve::testing
