// Implementation of common/logging.h.
#include "common/logging.h"

#include <cstdio>
#include <map>
#include <memory>

#include "absl/base/const_init.h"
#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace orthoserve {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
std::atomic<int> g_rank{-1};

// The verbosity map is replaced whole, under a mutex, and read through a shared_ptr copy.
ABSL_CONST_INIT absl::Mutex g_verbosity_mu(absl::kConstInit);
std::shared_ptr<const std::map<std::string, int, std::less<>>> g_verbosity ABSL_GUARDED_BY(g_verbosity_mu) =
    std::make_shared<const std::map<std::string, int, std::less<>>>();

char LevelLetter(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return 'D';
    case LogLevel::kInfo: return 'I';
    case LogLevel::kWarning: return 'W';
    case LogLevel::kError: return 'E';
  }
  return '?';
}

}  // namespace

absl::Status ParseLogLevel(absl::string_view text, LogLevel* level) {
  if (text == "debug") *level = LogLevel::kDebug;
  else if (text == "info") *level = LogLevel::kInfo;
  else if (text == "warning") *level = LogLevel::kWarning;
  else if (text == "error") *level = LogLevel::kError;
  else
    return absl::InvalidArgumentError(
        absl::StrCat("log level \"", text, "\" is not one of debug, info, warning, error"));
  return absl::OkStatus();
}

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level), std::memory_order_relaxed); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed)); }
void SetLogRank(int rank) { g_rank.store(rank, std::memory_order_relaxed); }

absl::Status SetLogVerbosity(absl::string_view spec) {
  auto parsed = std::make_shared<std::map<std::string, int, std::less<>>>();
  for (absl::string_view entry : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(entry, absl::MaxSplits('=', 1));
    int n = 0;
    if (kv.first.empty() || !absl::SimpleAtoi(kv.second, &n) || n < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "log verbosity entry \"", entry, "\" is not SUBSYSTEM=N with N >= 0 (example: rpc=2,fleet=1)"));
    }
    (*parsed)[std::string(kv.first)] = n;
  }
  absl::MutexLock lock(&g_verbosity_mu);
  g_verbosity = std::move(parsed);
  return absl::OkStatus();
}

int GetLogVerbosity(absl::string_view subsystem) {
  std::shared_ptr<const std::map<std::string, int, std::less<>>> map;
  {
    absl::MutexLock lock(&g_verbosity_mu);
    map = g_verbosity;
  }
  auto it = map->find(subsystem);
  return it == map->end() ? 0 : it->second;
}

namespace internal {

LogLine::LogLine(LogLevel level, absl::string_view subsystem, const char* file, int line) {
  stream_ << absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()) << ' '
          << LevelLetter(level);
  int rank = g_rank.load(std::memory_order_relaxed);
  if (rank >= 0) stream_ << " rank=" << rank;
  absl::string_view base(file);
  size_t slash = base.rfind('/');
  if (slash != absl::string_view::npos) base.remove_prefix(slash + 1);
  stream_ << ' ' << subsystem << ' ' << base << ':' << line << "] ";
}

LogLine::~LogLine() {
  stream_ << '\n';
  const std::string text = stream_.str();
  std::fwrite(text.data(), 1, text.size(), stderr);
}

}  // namespace internal
}  // namespace orthoserve
