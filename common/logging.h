// Logging with a level threshold and per-subsystem verbosity, e.g. `--log-verbose=rpc=2,fleet=1`.
//
//   LOG_INFO("rpc") << "stream " << id << " opened";
//   VLOG("fleet", 2) << "ready report " << key;   // printed when fleet verbosity >= 2
//
// Every line carries a UTC timestamp, the level, this process's fleet rank and the subsystem.
// The configuration is process-wide (set once at start-up by main, before threads start; read
// with relaxed atomics afterwards): logging is the one piece of global state we accept, because
// threading a logger through every constructor buys nothing here. Thread-safe: each line is
// formatted privately and written with one call.
#pragma once

#include <atomic>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace orthoserve {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Parses "debug", "info", "warning" or "error". INVALID_ARGUMENT names the accepted values.
absl::Status ParseLogLevel(absl::string_view text, LogLevel* level);

// Sets the threshold below which lines are dropped (default kInfo).
void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();

// Parses "subsystem=N,subsystem=N" and installs it; VLOG(s, n) prints when n <= level of s.
// INVALID_ARGUMENT on a malformed entry.
absl::Status SetLogVerbosity(absl::string_view spec);
int GetLogVerbosity(absl::string_view subsystem);

// Sets the rank shown on every line (-1, the default, shows no rank).
void SetLogRank(int rank);

namespace internal {

// One log line; written to stderr when destroyed.
class LogLine {
 public:
  LogLine(LogLevel level, absl::string_view subsystem, const char* file, int line);
  ~LogLine();
  LogLine(const LogLine&) = delete;
  LogLine& operator=(const LogLine&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

// Swallows the stream expression of a disabled line.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace internal
}  // namespace orthoserve

#define ORTHOSERVE_LOG_IF(level, subsystem, condition)                                      \
  !(condition) ? (void)0                                                                    \
               : ::orthoserve::internal::Voidify() &                                        \
                     ::orthoserve::internal::LogLine(level, subsystem, __FILE__, __LINE__).stream()

#define LOG_AT(level, subsystem) \
  ORTHOSERVE_LOG_IF(level, subsystem, static_cast<int>(level) >= static_cast<int>(::orthoserve::GetLogLevel()))
#define LOG_DEBUG(subsystem) LOG_AT(::orthoserve::LogLevel::kDebug, subsystem)
#define LOG_INFO(subsystem) LOG_AT(::orthoserve::LogLevel::kInfo, subsystem)
#define LOG_WARNING(subsystem) LOG_AT(::orthoserve::LogLevel::kWarning, subsystem)
#define LOG_ERROR(subsystem) LOG_AT(::orthoserve::LogLevel::kError, subsystem)
#define VLOG(subsystem, n) \
  ORTHOSERVE_LOG_IF(::orthoserve::LogLevel::kInfo, subsystem, ::orthoserve::GetLogVerbosity(subsystem) >= (n))
