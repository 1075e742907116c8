// ProcessCollector: the standard process_* metrics every Prometheus client library exports
// (https://prometheus.io/docs/instrumenting/writing_clientlibs/#process-metrics), read from
// /proc on every scrape. prometheus-cpp (1.0.1 in Debian 12) has no process collector of its own.
//
//   process_cpu_seconds_total        user + system CPU time (counter)
//   process_resident_memory_bytes    resident set size
//   process_virtual_memory_bytes     virtual memory size
//   process_virtual_memory_max_bytes RLIMIT_AS (-1: unlimited)
//   process_start_time_seconds       start time, seconds since the Unix epoch
//   process_open_fds                 open file descriptors
//   process_max_fds                  RLIMIT_NOFILE (soft)
//   process_threads                  threads (an orthoserve rank runs many: gRPC, compute, Gloo)
//
// A value that cannot be read (no /proc: not Linux, or a restricted sandbox) is left out of the
// scrape rather than reported as 0.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace orthoserve {

// The fields of /proc/<pid>/stat this collector uses, in their raw units.
struct ProcStat {
  uint64_t utime_ticks = 0;    // Field 14, clock ticks.
  uint64_t stime_ticks = 0;    // Field 15, clock ticks.
  int64_t threads = 0;         // Field 20.
  uint64_t start_ticks = 0;    // Field 22, clock ticks after boot.
  uint64_t virtual_bytes = 0;  // Field 23.
  int64_t resident_pages = 0;  // Field 24.
};

// Parses the text of /proc/<pid>/stat. The command name (field 2) is in parentheses and may hold
// spaces and parentheses itself, so fields are counted from its last ')'. INVALID_ARGUMENT for a
// line that is not of that form.
absl::StatusOr<ProcStat> ParseProcStat(absl::string_view text);
// The boot time (the "btime" line, seconds since the epoch) from the text of /proc/stat.
absl::StatusOr<int64_t> ParseBootTime(absl::string_view text);

class ProcessCollector final : public prometheus::Collectable {
 public:
  // `proc` is the proc file system's mount point; `pid` "self" or a process id (tests).
  explicit ProcessCollector(std::string proc = "/proc", std::string pid = "self");

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  std::string proc_;
  std::string pid_;
  std::optional<int64_t> boot_time_;  // Read once: it does not change while the system runs.
  int64_t ticks_per_second_;
  int64_t page_bytes_;
};

}  // namespace orthoserve
