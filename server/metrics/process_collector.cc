// Implementation of server/metrics/process_collector.h.
#include "server/metrics/process_collector.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace orthoserve {
namespace {

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// Entries of a directory other than "." and ".."; nullopt when it cannot be listed.
std::optional<int64_t> CountEntries(const std::string& path) {
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) return std::nullopt;
  int64_t n = 0;
  while (const dirent* e = readdir(dir)) {
    const absl::string_view name = e->d_name;
    if (name != "." && name != "..") ++n;
  }
  closedir(dir);
  return n;
}

// The soft limit of `resource`, -1 when unlimited.
std::optional<double> SoftLimit(int resource) {
  rlimit limit{};
  if (getrlimit(resource, &limit) != 0) return std::nullopt;
  return limit.rlim_cur == RLIM_INFINITY ? -1.0 : static_cast<double>(limit.rlim_cur);
}

prometheus::MetricFamily Family(const char* name, const char* help, prometheus::MetricType type, double value) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = type;
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(metric);
  return family;
}

}  // namespace

absl::StatusOr<ProcStat> ParseProcStat(absl::string_view text) {
  const size_t close = text.rfind(')');
  if (close == absl::string_view::npos || text.find('(') == absl::string_view::npos) {
    return absl::InvalidArgumentError("/proc/<pid>/stat: no \"(comm)\" field");
  }
  // Fields from 3 (state) on: fields[i] is field i + 3.
  std::vector<absl::string_view> fields =
      absl::StrSplit(absl::StripAsciiWhitespace(text.substr(close + 1)), ' ', absl::SkipEmpty());
  if (fields.size() < 22) {
    return absl::InvalidArgumentError(absl::StrCat("/proc/<pid>/stat: ", fields.size() + 2, " fields, not >= 24"));
  }
  ProcStat s;
  const auto field = [&fields](int number) { return fields[static_cast<size_t>(number - 3)]; };
  if (!absl::SimpleAtoi(field(14), &s.utime_ticks) || !absl::SimpleAtoi(field(15), &s.stime_ticks) ||
      !absl::SimpleAtoi(field(20), &s.threads) || !absl::SimpleAtoi(field(22), &s.start_ticks) ||
      !absl::SimpleAtoi(field(23), &s.virtual_bytes) || !absl::SimpleAtoi(field(24), &s.resident_pages)) {
    return absl::InvalidArgumentError("/proc/<pid>/stat: a field is not a number");
  }
  return s;
}

absl::StatusOr<int64_t> ParseBootTime(absl::string_view text) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, "btime ")) continue;
    int64_t seconds = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &seconds)) return seconds;
    break;
  }
  return absl::InvalidArgumentError("/proc/stat: no btime line");
}

ProcessCollector::ProcessCollector(std::string proc, std::string pid) : proc_(std::move(proc)), pid_(std::move(pid)) {
  const long ticks = sysconf(_SC_CLK_TCK);
  const long page = sysconf(_SC_PAGESIZE);
  ticks_per_second_ = ticks > 0 ? ticks : 100;
  page_bytes_ = page > 0 ? page : 4096;
  if (std::optional<std::string> stat = ReadFile(proc_ + "/stat")) {
    absl::StatusOr<int64_t> boot = ParseBootTime(*stat);
    if (boot.ok()) boot_time_ = *boot;
  }
}

std::vector<prometheus::MetricFamily> ProcessCollector::Collect() const {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  const std::string dir = absl::StrCat(proc_, "/", pid_);
  if (std::optional<std::string> text = ReadFile(dir + "/stat")) {
    absl::StatusOr<ProcStat> s = ParseProcStat(*text);
    if (s.ok()) {
      const double ticks = static_cast<double>(ticks_per_second_);
      out.push_back(Family("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
                           MetricType::Counter, static_cast<double>(s->utime_ticks + s->stime_ticks) / ticks));
      out.push_back(Family("process_resident_memory_bytes", "Resident memory size in bytes.", MetricType::Gauge,
                           static_cast<double>(s->resident_pages) * static_cast<double>(page_bytes_)));
      out.push_back(Family("process_virtual_memory_bytes", "Virtual memory size in bytes.", MetricType::Gauge,
                           static_cast<double>(s->virtual_bytes)));
      out.push_back(Family("process_threads", "Number of OS threads in the process.", MetricType::Gauge,
                           static_cast<double>(s->threads)));
      if (boot_time_.has_value()) {
        out.push_back(Family("process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
                             MetricType::Gauge,
                             static_cast<double>(*boot_time_) + static_cast<double>(s->start_ticks) / ticks));
      }
    }
  }
  if (std::optional<int64_t> fds = CountEntries(dir + "/fd")) {
    out.push_back(
        Family("process_open_fds", "Number of open file descriptors.", MetricType::Gauge, static_cast<double>(*fds)));
  }
  // Limits are this process's own (getrlimit), whatever `pid_` names.
  if (std::optional<double> max_fds = SoftLimit(RLIMIT_NOFILE)) {
    out.push_back(Family("process_max_fds", "Maximum number of open file descriptors.", MetricType::Gauge, *max_fds));
  }
  if (std::optional<double> max_vm = SoftLimit(RLIMIT_AS)) {
    out.push_back(Family("process_virtual_memory_max_bytes",
                         "Maximum amount of virtual memory available in bytes (-1: unlimited).", MetricType::Gauge,
                         *max_vm));
  }
  return out;
}

}  // namespace orthoserve
