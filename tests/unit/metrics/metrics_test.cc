// server/metrics without a server: the process_* collector (parsing /proc text, a fake /proc
// tree with known values, and this very process), the orthoserve_limit_* gauges, the label values
// each family starts with (and that its HELP names them), TimedCollective's reports by
// operation, and the HTTP endpoint serving the process families next to the registry's.
#include "server/metrics/metrics.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/collective/local_collective.h"
#include "server/collective/timed_collective.h"
#include "server/metrics/process_collector.h"
#include "tests/util/http_get.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using ::orthoserve::testing::StatusIs;
using ::prometheus::MetricFamily;
using ::prometheus::MetricType;
using ::testing::HasSubstr;

const MetricFamily* Find(const std::vector<MetricFamily>& families, const std::string& name) {
  for (const MetricFamily& f : families) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

// The value of the series of `name` with exactly `labels` (a histogram: its count), if any.
std::optional<double> Value(const std::vector<MetricFamily>& families, const std::string& name,
                            const std::map<std::string, std::string>& labels = {}) {
  const MetricFamily* f = Find(families, name);
  if (f == nullptr) return std::nullopt;
  for (const prometheus::ClientMetric& m : f->metric) {
    std::map<std::string, std::string> have;
    for (const auto& l : m.label) have[l.name] = l.value;
    if (have != labels) continue;
    switch (f->type) {
      case MetricType::Counter:
        return m.counter.value;
      case MetricType::Gauge:
        return m.gauge.value;
      case MetricType::Histogram:
        return static_cast<double>(m.histogram.sample_count);
      default:
        return m.untyped.value;
    }
  }
  return std::nullopt;
}

// The values of label `label` over the series of `name`.
std::set<std::string> LabelValues(const std::vector<MetricFamily>& families, const std::string& name,
                                  const std::string& label) {
  std::set<std::string> out;
  const MetricFamily* f = Find(families, name);
  if (f == nullptr) return out;
  for (const prometheus::ClientMetric& m : f->metric) {
    for (const auto& l : m.label) {
      if (l.name == label) out.insert(l.value);
    }
  }
  return out;
}

std::unique_ptr<Metrics> NewMetrics(Metrics::Options options = {}) {
  absl::StatusOr<std::unique_ptr<Metrics>> m = Metrics::Create(options);
  EXPECT_OK(m.status());
  return m.ok() ? *std::move(m) : nullptr;
}

// ---- /proc parsing ---------------------------------------------------------------------------------

// A /proc/<pid>/stat line of a process whose command name holds spaces and parentheses.
constexpr char kStat[] =
    "4242 (orthoserve (rank 1)) S 1 4242 4242 0 -1 4194560 5000 0 0 0 250 150 0 0 20 0 37 0 123456 "
    "2147483648 51200 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 3 0 0 0 0 0\n";

// The backend's copy totals become counters by direction that advance by what is new (0 on the
// cpu backend, present from the start).
TEST(MetricsTest, DeviceCopiesAdvanceByWhatIsNew) {
  Metrics::Options o;
  o.process_metrics = false;
  std::unique_ptr<Metrics> m = *Metrics::Create(o);
  auto value = [&](const std::string& name, const std::string& direction) {
    for (const MetricFamily& f : m->Collect()) {
      if (f.name != name) continue;
      for (const prometheus::ClientMetric& c : f.metric) {
        if (c.label.size() == 1 && c.label[0].name == "direction" && c.label[0].value == direction) {
          return c.counter.value;
        }
      }
    }
    return -1.0;
  };
  EXPECT_EQ(value("orthoserve_device_copy_bytes_total", "h2d"), 0);
  EXPECT_EQ(value("orthoserve_device_copies_total", "d2h"), 0);
  EXPECT_EQ(value("orthoserve_device_copies_total", "d2d"), 0);
  m->DeviceCopies("h2d", 1000, 2);
  m->DeviceCopies("d2h", 500, 1);
  m->DeviceCopies("h2d", 1000, 2);  // Nothing new.
  m->DeviceCopies("d2h", 500, 1);
  m->DeviceCopies("h2d", 1600, 3);
  m->DeviceCopies("d2h", 900, 2);
  m->DeviceCopies("d2d", 4096, 8);
  EXPECT_EQ(value("orthoserve_device_copy_bytes_total", "h2d"), 1600);
  EXPECT_EQ(value("orthoserve_device_copies_total", "h2d"), 3);
  EXPECT_EQ(value("orthoserve_device_copy_bytes_total", "d2h"), 900);
  EXPECT_EQ(value("orthoserve_device_copies_total", "d2h"), 2);
  EXPECT_EQ(value("orthoserve_device_copy_bytes_total", "d2d"), 4096);
  EXPECT_EQ(value("orthoserve_device_copies_total", "d2d"), 8);
}

// build_info's labels, the fleet protocol among them (docs/operations.md, "Upgrades").
TEST(MetricsTest, BuildInfoNamesVersionBackendDeviceAndFleetProtocol) {
  Metrics::Options o;
  o.process_metrics = false;
  o.version = "9.9.9";
  o.backend = "cpu";
  o.device = "test";
  o.fleet_protocol = 2;
  std::unique_ptr<Metrics> m = *Metrics::Create(o);
  std::map<std::string, std::string> labels;
  double value = 0;
  for (const MetricFamily& f : m->Collect()) {
    if (f.name != "orthoserve_build_info") continue;
    ASSERT_EQ(f.metric.size(), 1u);
    for (const prometheus::ClientMetric::Label& l : f.metric[0].label) labels[l.name] = l.value;
    value = f.metric[0].gauge.value;
  }
  EXPECT_EQ(value, 1);
  EXPECT_EQ(labels, (std::map<std::string, std::string>{
                        {"version", "9.9.9"}, {"backend", "cpu"}, {"device", "test"}, {"fleet_protocol", "2"}}));
}

TEST(ProcStatTest, CountsFieldsFromTheLastParenthesis) {
  absl::StatusOr<ProcStat> s = ParseProcStat(kStat);
  ASSERT_OK(s);
  EXPECT_EQ(s->utime_ticks, 250u);
  EXPECT_EQ(s->stime_ticks, 150u);
  EXPECT_EQ(s->threads, 37);
  EXPECT_EQ(s->start_ticks, 123456u);
  EXPECT_EQ(s->virtual_bytes, 2147483648u);
  EXPECT_EQ(s->resident_pages, 51200);
}

TEST(ProcStatTest, RejectsWhatIsNotAStatLine) {
  EXPECT_THAT(ParseProcStat(""), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("comm")));
  EXPECT_THAT(ParseProcStat("1 (x) S 1 2 3"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("fields")));
  std::string bad = kStat;
  bad.replace(bad.find(" 250 "), 5, " 2x0 ");
  EXPECT_THAT(ParseProcStat(bad), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a number")));
}

TEST(ProcStatTest, BootTimeIsTheBtimeLine) {
  absl::StatusOr<int64_t> boot = ParseBootTime("cpu  1 2 3\nintr 5\nbtime 1700000000\nprocesses 9\n");
  ASSERT_OK(boot);
  EXPECT_EQ(*boot, 1700000000);
  EXPECT_THAT(ParseBootTime("cpu 1 2 3\n"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("btime")));
}

// ---- the collector ----------------------------------------------------------------------------------

class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/metrics_test.XXXXXX";
    path_ = mkdtemp(pattern);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(ProcessCollectorTest, ReportsTheValuesOfAFakeProcTree) {
  TempDir proc;
  std::filesystem::create_directories(proc.path() + "/4242/fd");
  for (int fd = 0; fd < 5; ++fd) Write(absl::StrCat(proc.path(), "/4242/fd/", fd), "");
  Write(proc.path() + "/4242/stat", kStat);
  Write(proc.path() + "/stat", "cpu  1 2 3\nbtime 1700000000\n");
  const std::vector<MetricFamily> f = ProcessCollector(proc.path(), "4242").Collect();
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  EXPECT_DOUBLE_EQ(*Value(f, "process_cpu_seconds_total"), 400 / ticks);
  EXPECT_EQ(Find(f, "process_cpu_seconds_total")->type, MetricType::Counter);
  EXPECT_DOUBLE_EQ(*Value(f, "process_resident_memory_bytes"), 51200 * page);
  EXPECT_DOUBLE_EQ(*Value(f, "process_virtual_memory_bytes"), 2147483648.0);
  EXPECT_DOUBLE_EQ(*Value(f, "process_threads"), 37);
  EXPECT_DOUBLE_EQ(*Value(f, "process_start_time_seconds"), 1700000000 + 123456 / ticks);
  EXPECT_DOUBLE_EQ(*Value(f, "process_open_fds"), 5);
  rlimit nofile{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &nofile), 0);
  EXPECT_DOUBLE_EQ(*Value(f, "process_max_fds"), static_cast<double>(nofile.rlim_cur));
  for (const MetricFamily& family : f) {
    EXPECT_TRUE(absl::StartsWith(family.name, "process_")) << family.name;
    EXPECT_FALSE(family.help.empty()) << family.name;
  }
}

TEST(ProcessCollectorTest, LeavesOutWhatCannotBeRead) {
  TempDir proc;  // Empty: no <pid>/stat, no <pid>/fd, no btime.
  const std::vector<MetricFamily> f = ProcessCollector(proc.path(), "1").Collect();
  for (const char* absent : {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_threads",
                             "process_start_time_seconds", "process_open_fds"}) {
    EXPECT_EQ(Find(f, absent), nullptr) << absent;
  }
  EXPECT_NE(Find(f, "process_max_fds"), nullptr);  // getrlimit, not /proc.
}

TEST(ProcessCollectorTest, ThisProcessIsMeasuredAtEachCollect) {
  ProcessCollector collector;
  const std::vector<MetricFamily> before = collector.Collect();
  ASSERT_TRUE(Value(before, "process_open_fds").has_value()) << "no /proc/self/fd";
  const double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  const double start = *Value(before, "process_start_time_seconds");
  EXPECT_LE(start, now + 1);
  EXPECT_GT(start, now - 3600);  // This test binary started moments ago.
  EXPECT_GE(*Value(before, "process_threads"), 1);
  EXPECT_GT(*Value(before, "process_resident_memory_bytes"), 1 << 20);
  EXPECT_GE(*Value(before, "process_virtual_memory_bytes"), *Value(before, "process_resident_memory_bytes"));

  // Two more files and a thread show up in the next collect; CPU time only grows.
  const int a = open("/dev/null", O_RDONLY | O_CLOEXEC), b = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  std::atomic<bool> stop{false};
  std::thread spin([&stop] {
    volatile double x = 0;
    while (!stop.load()) x = x + 1;
  });
  absl::SleepFor(absl::Milliseconds(100));
  const std::vector<MetricFamily> after = collector.Collect();
  stop.store(true);
  spin.join();
  close(a);
  close(b);
  EXPECT_EQ(*Value(after, "process_open_fds"), *Value(before, "process_open_fds") + 2);
  EXPECT_EQ(*Value(after, "process_threads"), *Value(before, "process_threads") + 1);
  EXPECT_GT(*Value(after, "process_cpu_seconds_total"), *Value(before, "process_cpu_seconds_total"));
  EXPECT_EQ(*Value(after, "process_start_time_seconds"), start);
}

// ---- Metrics ------------------------------------------------------------------------------------------

TEST(MetricsTest, ConfiguredLimitsAreGaugesAndUnsetOnesAreLeftOut) {
  Metrics::Options o;
  o.limits.inflight_bytes = int64_t{4} << 30;
  o.limits.tenant_inflight_bytes = int64_t{2} << 30;
  o.limits.concurrent_streams = 64;
  o.limits.tenant_concurrent_streams = 16;
  o.limits.chunk_bytes = int64_t{4} << 20;
  o.limits.message_bytes = int64_t{64} << 20;
  o.limits.matrix_elements = int64_t{1} << 28;
  o.limits.matrices_per_step = 4096;
  o.limits.compute_workers = 3;
  o.limits.rendezvous_timeout = absl::Seconds(60);
  o.limits.collective_timeout = absl::Milliseconds(1500);
  std::unique_ptr<Metrics> m = NewMetrics(o);
  std::vector<MetricFamily> f = m->Collect();
  EXPECT_EQ(*Value(f, "orthoserve_limit_inflight_bytes"), 4294967296.0);
  EXPECT_EQ(*Value(f, "orthoserve_limit_tenant_inflight_bytes"), 2147483648.0);
  EXPECT_EQ(*Value(f, "orthoserve_limit_concurrent_streams"), 64);
  EXPECT_EQ(*Value(f, "orthoserve_limit_tenant_concurrent_streams"), 16);
  EXPECT_EQ(*Value(f, "orthoserve_limit_chunk_bytes"), 4194304);
  EXPECT_EQ(*Value(f, "orthoserve_limit_message_bytes"), 67108864);
  EXPECT_EQ(*Value(f, "orthoserve_limit_matrix_elements"), 268435456);
  EXPECT_EQ(*Value(f, "orthoserve_limit_matrices_per_step"), 4096);
  EXPECT_EQ(*Value(f, "orthoserve_limit_compute_workers"), 3);
  EXPECT_EQ(*Value(f, "orthoserve_limit_rendezvous_timeout_seconds"), 60);
  EXPECT_EQ(*Value(f, "orthoserve_limit_collective_timeout_seconds"), 1.5);
  for (const MetricFamily& family : f) {
    if (absl::StartsWith(family.name, "orthoserve_limit_")) {
      EXPECT_EQ(family.type, MetricType::Gauge) << family.name;
      EXPECT_THAT(family.help, HasSubstr("--")) << family.name << " must name its flag";
    }
  }

  // Nothing configured (a Metrics for tests or tools): no limit gauge at all, rather than a 0
  // that would make every "use / limit" +Inf.
  for (const MetricFamily& family : NewMetrics()->Collect()) {
    EXPECT_FALSE(absl::StartsWith(family.name, "orthoserve_limit_")) << family.name;
  }
}

TEST(MetricsTest, InFlightUseGaugesAreThereToDivideByTheLimits) {
  Metrics::Options o;
  o.tenant_labels = TenantLabels::kName;
  std::unique_ptr<Metrics> m = NewMetrics(o);
  m->inflight_streams().Set(3);
  m->TenantInflightBytes("team-a", 1024, 4096);
  std::vector<MetricFamily> f = m->Collect();
  EXPECT_EQ(*Value(f, "orthoserve_inflight_streams"), 3);
  EXPECT_EQ(*Value(f, "orthoserve_tenant_inflight_bytes", {{"tenant", "team-a"}}), 1024);
  EXPECT_EQ(*Value(f, "orthoserve_inflight_bytes"), 0);
}

// Tenant names appear only when asked for: off (the default) reports every tenant as "all" —
// sums for counters, the largest tenant's figure for the in-flight gauge —, hash a stable
// pseudonym, name the name.
TEST(MetricsTest, TenantLabelsAreOptIn) {
  std::unique_ptr<Metrics> off = NewMetrics();
  off->TenantInflightBytes("team-a", 1024, 4096);
  off->TenantCompute("team-a", absl::Seconds(2));
  off->TenantCompute("team-b", absl::Seconds(3));
  off->TenantQueueWait("team-b", absl::Milliseconds(5));
  off->TenantBytes("team-a", "in", 100);
  off->TenantRefused("team-b", "tenant_inflight_bytes");
  std::vector<MetricFamily> f = off->Collect();
  for (const char* family : {"orthoserve_tenant_inflight_bytes", "orthoserve_tenant_compute_seconds_total",
                             "orthoserve_tenant_queue_wait_seconds", "orthoserve_tenant_bytes_total",
                             "orthoserve_tenant_refusals_total"}) {
    EXPECT_EQ(LabelValues(f, family, "tenant"), (std::set<std::string>{"all"})) << family;
  }
  EXPECT_EQ(*Value(f, "orthoserve_tenant_inflight_bytes", {{"tenant", "all"}}), 4096);
  EXPECT_EQ(*Value(f, "orthoserve_tenant_compute_seconds_total", {{"tenant", "all"}}), 5);
  EXPECT_EQ(*Value(f, "orthoserve_tenant_refusals_total", {{"tenant", "all"}, {"limit", "tenant_inflight_bytes"}}), 1);
  // Every refusal limit has its series from the start.
  EXPECT_EQ(LabelValues(f, "orthoserve_tenant_refusals_total", "limit"),
            (std::set<std::string>(std::begin(kRefusalLimits), std::end(kRefusalLimits))));
  // So has every cause of a cut; a cut counts there, not as a refusal.
  off->TenantCut("team-a", "not_sending");
  off->TenantCut("team-b", "pushed_out");
  off->TenantCut("team-b", "pushed_out");
  f = off->Collect();
  EXPECT_EQ(LabelValues(f, "orthoserve_tenant_cuts_total", "cause"),
            (std::set<std::string>(std::begin(kCutCauses), std::end(kCutCauses))));
  EXPECT_EQ(LabelValues(f, "orthoserve_tenant_cuts_total", "tenant"), (std::set<std::string>{"all"}));
  EXPECT_EQ(*Value(f, "orthoserve_tenant_cuts_total", {{"tenant", "all"}, {"cause", "not_sending"}}), 1);
  EXPECT_EQ(*Value(f, "orthoserve_tenant_cuts_total", {{"tenant", "all"}, {"cause", "pushed_out"}}), 2);
  EXPECT_EQ(*Value(f, "orthoserve_tenant_refusals_total", {{"tenant", "all"}, {"limit", "tenant_inflight_bytes"}}), 1);

  Metrics::Options o;
  o.tenant_labels = TenantLabels::kHash;
  std::unique_ptr<Metrics> hashed = NewMetrics(o);
  const std::string a = hashed->TenantLabel("team-a");
  EXPECT_THAT(a, ::testing::MatchesRegex("t-[0-9a-f]{12}"));
  EXPECT_EQ(a, NewMetrics(o)->TenantLabel("team-a"));  // Stable.
  EXPECT_NE(a, hashed->TenantLabel("team-b"));
  EXPECT_THAT(a, ::testing::Not(HasSubstr("team")));
  o.tenant_labels = TenantLabels::kName;
  EXPECT_EQ(NewMetrics(o)->TenantLabel("team-a"), "team-a");
  std::unique_ptr<Metrics> named = NewMetrics(o);
  named->TenantCut("team-a", "not_reading");
  named->TenantRefused("team-b", "unary_waiters");
  f = named->Collect();
  EXPECT_EQ(*Value(f, "orthoserve_tenant_cuts_total", {{"tenant", "team-a"}, {"cause", "not_reading"}}), 1);
  EXPECT_EQ(*Value(f, "orthoserve_tenant_refusals_total", {{"tenant", "team-b"}, {"limit", "unary_waiters"}}), 1);

  TenantLabels parsed;
  EXPECT_OK(ParseTenantLabels("hash", &parsed));
  EXPECT_EQ(parsed, TenantLabels::kHash);
  EXPECT_THAT(ParseTenantLabels("names", &parsed), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("off, name or hash")));
}

TEST(MetricsTest, IntegrityRefusalsStartWithEveryCauseItsHelpNames) {
  std::unique_ptr<Metrics> m = NewMetrics();
  std::vector<MetricFamily> f = m->Collect();
  const std::set<std::string> expected(std::begin(kIntegrityRefusalCauses), std::end(kIntegrityRefusalCauses));
  EXPECT_EQ(LabelValues(f, "orthoserve_integrity_refusals_total", "cause"),
            (std::set<std::string>{"run_mismatch", "digest_mismatch", "not_a_member", "limit", "etcd_value"}));
  const std::string help = Find(f, "orthoserve_integrity_refusals_total")->help;
  for (const std::string& cause : expected) EXPECT_THAT(help, HasSubstr(cause + " (")) << cause;
  m->IntegrityRefused("run_mismatch");
  f = m->Collect();
  double run_mismatch = -1;
  for (const auto& metric : Find(f, "orthoserve_integrity_refusals_total")->metric) {
    for (const auto& label : metric.label) {
      if (label.name == "cause" && label.value == "run_mismatch") run_mismatch = metric.counter.value;
    }
  }
  EXPECT_EQ(run_mismatch, 1);
}

TEST(MetricsTest, StepsAbortedStartsWithEveryReasonItsHelpNames) {
  std::unique_ptr<Metrics> m = NewMetrics();
  std::vector<MetricFamily> f = m->Collect();
  const std::set<std::string> expected(std::begin(kStepAbortReasons), std::end(kStepAbortReasons));
  EXPECT_EQ(LabelValues(f, "orthoserve_steps_aborted_total", "reason"),
            (std::set<std::string>{"timeout", "cancelled", "aborted", "invalid", "collective", "fleet_change",
                                   "run_mismatch", "digest_mismatch", "limit"}));
  EXPECT_EQ(LabelValues(f, "orthoserve_steps_aborted_total", "reason"), expected);
  const std::string help = Find(f, "orthoserve_steps_aborted_total")->help;
  for (const std::string& reason : expected) EXPECT_THAT(help, HasSubstr(reason + " (")) << reason;
  // Words that once were in the HELP without any code path emitting them.
  EXPECT_THAT(help, ::testing::Not(HasSubstr("drain")));
  for (const std::string& reason : expected) {
    m->StepAborted(reason);
    EXPECT_EQ(*Value(m->Collect(), "orthoserve_steps_aborted_total", {{"reason", reason}}), 1) << reason;
  }
}

TEST(MetricsTest, CollectiveDurationStartsWithEveryOpTimedCollectiveReports) {
  std::unique_ptr<Metrics> m = NewMetrics();
  std::vector<MetricFamily> f = m->Collect();
  std::set<std::string> ops;
  for (absl::string_view op : {kCollectiveOpAllToAllv, kCollectiveOpAllGatherv, kCollectiveOpAllReduce,
                               kCollectiveOpBroadcast, kCollectiveOpBarrier}) {
    ops.insert(std::string(op));
  }
  EXPECT_EQ(LabelValues(f, "orthoserve_collective_duration_seconds", "op"), ops);
  const std::string help = Find(f, "orthoserve_collective_duration_seconds")->help;
  for (const std::string& op : ops) EXPECT_THAT(help, HasSubstr(op));
}

TEST(MetricsTest, ProcessFamiliesAreCollectedUnlessTurnedOff) {
  std::vector<MetricFamily> with = NewMetrics()->Collect();
  for (const char* name : {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_virtual_memory_bytes",
                           "process_open_fds", "process_max_fds", "process_start_time_seconds", "process_threads"}) {
    EXPECT_NE(Find(with, name), nullptr) << name;
  }
  Metrics::Options o;
  o.process_metrics = false;
  for (const MetricFamily& family : NewMetrics(o)->Collect()) {
    EXPECT_FALSE(absl::StartsWith(family.name, "process_")) << family.name;
  }
}

// ---- TimedCollective -------------------------------------------------------------------------------

// A Collective whose every call sleeps `delay`, then fails with `status`.
class SlowCollective final : public Collective {
 public:
  SlowCollective(absl::Duration delay, absl::Status status) : delay_(delay), status_(std::move(status)) {}
  int rank() const override { return 0; }
  int world() const override { return 1; }
  std::string name() const override { return "slow"; }
  bool TakesDeviceMemory() const override { return true; }  // As NCCL's: TimedCollective must say so too.
  absl::Status AllToAllv(const void*, absl::Span<const size_t>, void*, absl::Span<const size_t>,
                         absl::Duration) override {
    return Wait();
  }
  absl::Status AllGatherv(const void*, size_t, void*, absl::Span<const size_t>, absl::Duration) override {
    return Wait();
  }
  absl::Status AllReduceSum(absl::Span<float>, absl::Duration) override { return Wait(); }
  absl::Status AllReduceSum(absl::Span<double>, absl::Duration) override { return Wait(); }
  absl::Status Broadcast(void*, size_t, int, absl::Duration) override { return Wait(); }
  absl::Status Barrier(absl::Duration) override { return Wait(); }
  void Abort(absl::string_view reason) override { aborted = std::string(reason); }
  std::string aborted;

 private:
  absl::Status Wait() {
    absl::SleepFor(delay_);
    return status_;
  }
  absl::Duration delay_;
  absl::Status status_;
};

TEST(TimedCollectiveTest, ReportsEveryCallByOpWithItsDurationFailuresIncluded) {
  std::vector<std::pair<std::string, absl::Duration>> seen;
  auto inner = std::make_unique<SlowCollective>(absl::Milliseconds(20), absl::DeadlineExceededError("late"));
  SlowCollective* raw = inner.get();
  TimedCollective timed(std::move(inner),
                        [&seen](absl::string_view op, absl::Duration d) { seen.emplace_back(std::string(op), d); });
  EXPECT_EQ(timed.name(), "slow");
  EXPECT_FALSE(timed.ReducesDeviceMemory());  // What its inner collective says.
  EXPECT_TRUE(timed.TakesDeviceMemory());
  char byte = 0;
  const size_t one[1] = {1};
  float f = 1;
  double d = 1;
  EXPECT_THAT(timed.AllToAllv(&byte, one, &byte, one, absl::Seconds(1)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("late")));
  EXPECT_FALSE(timed.AllGatherv(&byte, 1, &byte, one, absl::Seconds(1)).ok());
  EXPECT_FALSE(timed.AllReduceSum(absl::MakeSpan(&f, 1), absl::Seconds(1)).ok());
  EXPECT_FALSE(timed.AllReduceSum(absl::MakeSpan(&d, 1), absl::Seconds(1)).ok());
  EXPECT_FALSE(timed.Broadcast(&byte, 1, 0, absl::Seconds(1)).ok());
  EXPECT_FALSE(timed.Barrier(absl::Seconds(1)).ok());
  timed.Abort("peer gone");
  EXPECT_EQ(raw->aborted, "peer gone");
  ASSERT_EQ(seen.size(), 6u);
  const std::vector<std::string> ops = {"all_to_allv", "all_gatherv", "all_reduce",
                                        "all_reduce",  "broadcast",   "barrier"};
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].first, ops[i]);
    EXPECT_GE(seen[i].second, absl::Milliseconds(20)) << ops[i];
  }
}

TEST(TimedCollectiveTest, ForwardsResultsUnchangedIntoTheMetric) {
  std::unique_ptr<Metrics> m = NewMetrics();
  Metrics* metrics = m.get();
  TimedCollective timed(std::make_unique<LocalCollective>(),
                        [metrics](absl::string_view op, absl::Duration d) { metrics->CollectiveTime(op, d); });
  EXPECT_TRUE(timed.ReducesDeviceMemory());  // LocalCollective's answer, forwarded.
  const std::vector<char> send = {'a', 'b', 'c'};
  std::vector<char> recv(3);
  const size_t sizes[1] = {3};
  ASSERT_OK(timed.AllGatherv(send.data(), 3, recv.data(), sizes, absl::Seconds(1)));
  EXPECT_EQ(recv, send);
  ASSERT_OK(timed.Barrier(absl::Seconds(1)));
  ASSERT_OK(timed.Barrier(absl::Seconds(1)));
  std::vector<MetricFamily> f = m->Collect();
  EXPECT_EQ(*Value(f, "orthoserve_collective_duration_seconds", {{"op", "all_gatherv"}}), 1);
  EXPECT_EQ(*Value(f, "orthoserve_collective_duration_seconds", {{"op", "barrier"}}), 2);
  EXPECT_EQ(*Value(f, "orthoserve_collective_duration_seconds", {{"op", "broadcast"}}), 0);
}

// ---- the endpoint -------------------------------------------------------------------------------------

std::string Get(int port, const std::string& path) {
  return ::orthoserve::testing::HttpExchange(port, absl::StrCat("GET ", path, " HTTP/1.1"));
}

TEST(MetricsEndpointTest, ServesTheRegistryAndTheProcessFamilies) {
  Metrics::Options o;
  o.address = "127.0.0.1:0";
  o.limits.inflight_bytes = 1 << 20;
  std::unique_ptr<Metrics> m = NewMetrics(o);
  ASSERT_GT(m->port(), 0);
  const std::string scrape = Get(m->port(), "/metrics");
  EXPECT_THAT(scrape, HasSubstr("HTTP/1.1 200 OK"));
  EXPECT_THAT(scrape, HasSubstr("# TYPE process_cpu_seconds_total counter\n"));
  EXPECT_THAT(scrape, HasSubstr("# TYPE process_open_fds gauge\n"));
  EXPECT_THAT(scrape,
              HasSubstr("# TYPE orthoserve_limit_inflight_bytes gauge\northoserve_limit_inflight_bytes 1048576\n"));
  EXPECT_THAT(scrape, HasSubstr("orthoserve_steps_aborted_total{reason=\"timeout\"} 0\n"));
}

}  // namespace
}  // namespace orthoserve
