// What real fleets in this process record: every call of a two-rank Gloo fleet's collective is
// timed by op on both ranks (orthoserve_collective_duration_seconds, never observed before), and
// each way the coordinator fails a group step is counted under its own reason in
// orthoserve_steps_aborted_total — timeout for a rendezvous timeout (also counted in
// orthoserve_rendezvous_timeouts_total), cancelled for a trainer whose client went away, aborted
// for a trainer whose call failed otherwise, invalid for trainers that disagree. Also the use
// gauges admission keeps next to the limit gauges (streams, bytes per tenant).
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "gtest/gtest.h"
#include "server/engine/cpu/cpu_backend.h"
#include "server/fleet/wire/fleet.h"
#include "server/fleet/wire/fleet_codec.h"
#include "server/metrics/metrics.h"
#include "server/rpc/admission.h"
#include "tests/unit/fleet/trainer_step_util.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using ::orthoserve::testing::StatusIs;
using ::testing::HasSubstr;

// The value of the series of `name` with exactly `labels` (a histogram: its count), or 0.
double Value(const Metrics& m, const std::string& name, const std::map<std::string, std::string>& labels = {}) {
  for (const prometheus::MetricFamily& f : m.Collect()) {
    if (f.name != name) continue;
    for (const prometheus::ClientMetric& c : f.metric) {
      std::map<std::string, std::string> have;
      for (const auto& l : c.label) have[l.name] = l.value;
      if (have != labels) continue;
      if (f.type == prometheus::MetricType::Histogram) return static_cast<double>(c.histogram.sample_count);
      return f.type == prometheus::MetricType::Counter ? c.counter.value : c.gauge.value;
    }
  }
  return 0;
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t length = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length);
  close(fd);
  return ntohs(addr.sin_port);
}

std::unique_ptr<Metrics> NewMetrics(TenantLabels tenant_labels = TenantLabels::kOff) {
  Metrics::Options o;
  o.process_metrics = false;
  o.tenant_labels = tenant_labels;
  return *Metrics::Create(o);
}

constexpr int kRows = 16;
constexpr int kCols = 8;

// Trainer rank `r` of `world`'s row block of a kRows x kCols matrix (any values will do here).
std::shared_ptr<TrainerStep> Step(const GroupKey& key, int r, int world, Algorithm algorithm = Algorithm::kAuto) {
  std::vector<float> full(kRows * kCols);
  for (size_t i = 0; i < full.size(); ++i) full[i] = static_cast<float>((i * 7) % 11) - 5.0f;
  return testing::RowBlockStep(key, r, world, kRows, kCols, full, NsOptions(), algorithm);
}

std::future<StepOutcome> Submit(Fleet& fleet, std::shared_ptr<TrainerStep> step) {
  auto promise = std::make_shared<std::promise<StepOutcome>>();
  std::future<StepOutcome> future = promise->get_future();
  fleet.Submit(std::move(step), [promise](StepOutcome o) { promise->set_value(std::move(o)); });
  return future;
}

StepOutcome Wait(std::future<StepOutcome>& f) {
  if (f.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    ADD_FAILURE() << "the step did not finish";
    StepOutcome o;
    o.status = absl::DeadlineExceededError("test wait");
    return o;
  }
  return f.get();
}

class FleetMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // As the server does: every gRPC server of the process also serves reflection. (A fleet
    // port with only the health service is not enough for gRPC to start it.)
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    absl::StatusOr<std::unique_ptr<CpuBackend>> backend = CpuBackend::Create({});
    ASSERT_OK(backend);
    backend_ = *std::move(backend);
  }

  // A fleet of `world` ranks on loopback, each with its own Metrics; waits until all are ready.
  void StartFleet(int world, absl::Duration rendezvous_timeout = absl::Seconds(30)) {
    const std::string coordinator = absl::StrCat("127.0.0.1:", FreePort());
    for (int rank = 0; rank < world; ++rank) {
      metrics_.push_back(NewMetrics());
      Fleet::Options o;
      o.rank = rank;
      o.world = world;
      o.coordinator = world > 1 ? coordinator : "";
      o.fleet_listen = world == 1 ? "" : rank == 0 ? coordinator : absl::StrCat("127.0.0.1:", FreePort());
      o.advertise_address = absl::StrCat("127.0.0.1:", 1000 + rank);
      o.rendezvous_timeout = rendezvous_timeout;
      o.peer_timeout = absl::Seconds(5);
      o.collective = "gloo";
      o.backend = backend_.get();
      o.metrics = metrics_.back().get();
      absl::StatusOr<std::unique_ptr<Fleet>> fleet = Fleet::Create(o);
      ASSERT_OK(fleet);
      fleets_.push_back(*std::move(fleet));
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    for (auto& f : fleets_) {
      while ((!f->ready() || static_cast<int>(f->generation_size()) != world) && absl::Now() < deadline) {
        absl::SleepFor(absl::Milliseconds(20));
      }
      ASSERT_TRUE(f->ready()) << "rank " << f->rank() << " did not join a formed generation of " << world;
    }
  }

  void TearDown() override {
    for (auto& f : fleets_) f->Shutdown();
    fleets_.clear();
  }

  std::unique_ptr<CpuBackend> backend_;
  std::vector<std::unique_ptr<Metrics>> metrics_;
  std::vector<std::unique_ptr<Fleet>> fleets_;
};

TEST_F(FleetMetricsTest, EveryCollectiveCallOfAGlooFleetIsTimedByOpOnEveryRank) {
  StartFleet(2);
  for (Algorithm algorithm : {Algorithm::kAuto, Algorithm::kTpDistributed}) {
    const GroupKey key{"default", "job", absl::StrCat("g", static_cast<int>(algorithm)), 1, "run"};
    std::future<StepOutcome> a = Submit(*fleets_[0], Step(key, 0, 2, algorithm));
    std::future<StepOutcome> b = Submit(*fleets_[1], Step(key, 1, 2, algorithm));
    for (auto* f : {&a, &b}) {
      StepOutcome o = Wait(*f);
      ASSERT_OK(o.status);
      ASSERT_EQ(o.matrices.size(), 1u);
      ASSERT_OK(o.matrices[0]);
    }
  }
  for (int rank = 0; rank < 2; ++rank) {
    const Metrics& m = *metrics_[rank];
    double calls = 0;
    for (const char* op : {"all_to_allv", "all_gatherv", "all_reduce", "broadcast", "barrier"}) {
      calls += Value(m, "orthoserve_collective_duration_seconds", {{"op", op}});
    }
    // Each batch ends with at least the status exchange (an all-gather) on every rank.
    EXPECT_GE(Value(m, "orthoserve_collective_duration_seconds", {{"op", "all_gatherv"}}), 2) << "rank " << rank;
    EXPECT_GE(calls, 2) << "rank " << rank;
    // The per-batch collective stage is recorded too.
    EXPECT_EQ(Value(m, "orthoserve_stage_duration_seconds", {{"stage", "collective"}}), 2) << "rank " << rank;
    EXPECT_EQ(Value(m, "orthoserve_steps_aborted_total", {{"reason", "collective"}}), 0);
  }
}

TEST_F(FleetMetricsTest, EachWayTheCoordinatorFailsAStepHasItsOwnReason) {
  StartFleet(1, /*rendezvous_timeout=*/absl::Seconds(2));
  Fleet& fleet = *fleets_[0];
  const Metrics& m = *metrics_[0];
  auto reason = [&m](const char* r) { return Value(m, "orthoserve_steps_aborted_total", {{"reason", r}}); };

  // timeout: trainer rank 1 of 2 never comes.
  std::future<StepOutcome> alone = Submit(fleet, Step(GroupKey{"default", "job", "timeout", 1, "run"}, 0, 2));
  EXPECT_THAT(Wait(alone).status, StatusIs(absl::StatusCode::kAborted, HasSubstr("rendezvous timeout")));
  EXPECT_EQ(reason("timeout"), 1);
  EXPECT_EQ(Value(m, "orthoserve_rendezvous_timeouts_total"), 1);

  // cancelled: trainer rank 0's client went away while rank 1 waited.
  const GroupKey cancelled{"default", "job", "cancelled", 1, "run"};
  std::future<StepOutcome> left = Submit(fleet, Step(cancelled, 1, 2));
  fleet.AbortStep(cancelled, 0, absl::CancelledError("the trainer cancelled its stream"), 0);
  EXPECT_THAT(Wait(left).status, StatusIs(absl::StatusCode::kAborted, HasSubstr("trainer rank 0 failed")));
  EXPECT_EQ(reason("cancelled"), 1);

  // aborted: trainer rank 0's call failed for another reason (a bad chunk, say).
  const GroupKey failed{"default", "job", "failed", 1, "run"};
  std::future<StepOutcome> other = Submit(fleet, Step(failed, 1, 2));
  fleet.AbortStep(failed, 0, absl::InvalidArgumentError("a chunk of 9 bytes"), 0);
  EXPECT_THAT(Wait(other).status, StatusIs(absl::StatusCode::kAborted, HasSubstr("a chunk of 9 bytes")));
  EXPECT_EQ(reason("aborted"), 1);

  // invalid: the trainer ranks disagree about the group's world.
  const GroupKey invalid{"default", "job", "invalid", 1, "run"};
  std::future<StepOutcome> two = Submit(fleet, Step(invalid, 0, 2));
  std::future<StepOutcome> four = Submit(fleet, Step(invalid, 1, 4));
  EXPECT_THAT(Wait(two).status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("world")));
  Wait(four);
  EXPECT_EQ(reason("invalid"), 1);

  // A drain withdraws its trainer's report: nothing is aborted, the step waits for the retry.
  const GroupKey drained{"default", "job", "drained", 1, "run"};
  std::future<StepOutcome> stays = Submit(fleet, Step(drained, 1, 2));
  fleet.AbortStep(drained, 0, absl::UnavailableError("the server drained before the step ran"), 0);
  std::future<StepOutcome> retry = Submit(fleet, Step(drained, 0, 2));
  ASSERT_OK(Wait(stays).status);
  ASSERT_OK(Wait(retry).status);

  EXPECT_EQ(reason("timeout"), 1);
  EXPECT_EQ(reason("cancelled"), 1);
  EXPECT_EQ(reason("aborted"), 1);
  EXPECT_EQ(reason("collective"), 0);
  EXPECT_EQ(reason("fleet_change"), 0);
  EXPECT_EQ(Value(m, "orthoserve_rendezvous_timeouts_total"), 1);
}

TEST(AdmissionMetricsTest, StreamsAndTenantBytesFollowWhatIsAdmitted) {
  std::unique_ptr<Metrics> m = NewMetrics(TenantLabels::kName);
  Admission::Options o;
  o.max_inflight_bytes = 1000;
  o.max_tenant_inflight_bytes = 600;
  o.max_concurrent_streams = 2;
  Admission admission(o, m.get());
  {
    absl::StatusOr<Admission::Ticket> stream = admission.AcquireStream("team-a");
    ASSERT_OK(stream);
    EXPECT_EQ(Value(*m, "orthoserve_inflight_streams"), 1);
    ASSERT_OK(admission.AddBytes(*stream, "team-a", 400, "matrix 0"));
    Admission::Ticket other;
    ASSERT_OK(admission.AddBytes(other, "team-b", 300, "matrix 0"));
    EXPECT_EQ(Value(*m, "orthoserve_tenant_inflight_bytes", {{"tenant", "team-a"}}), 400);
    EXPECT_EQ(Value(*m, "orthoserve_tenant_inflight_bytes", {{"tenant", "team-b"}}), 300);
    EXPECT_EQ(Value(*m, "orthoserve_inflight_bytes"), 700);
    // Refused (over the tenant's limit): nothing changes.
    EXPECT_THAT(admission.AddBytes(*stream, "team-a", 250, "matrix 1"),
                StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--max-tenant-inflight-bytes")));
    EXPECT_EQ(Value(*m, "orthoserve_tenant_inflight_bytes", {{"tenant", "team-a"}}), 400);
    EXPECT_EQ(Value(*m, "orthoserve_tenant_refusals_total", {{"tenant", "team-a"}, {"limit", "tenant_inflight_bytes"}}),
              1);
    other.Release();
    EXPECT_EQ(Value(*m, "orthoserve_tenant_inflight_bytes", {{"tenant", "team-b"}}), 0);
    EXPECT_EQ(Value(*m, "orthoserve_inflight_bytes"), 400);
  }
  EXPECT_EQ(Value(*m, "orthoserve_inflight_streams"), 0);
  EXPECT_EQ(Value(*m, "orthoserve_tenant_inflight_bytes", {{"tenant", "team-a"}}), 0);
  EXPECT_EQ(Value(*m, "orthoserve_inflight_bytes"), 0);
}

TEST(FleetCodecTest, AFailuresReasonTravelsToTheOtherRanks) {
  // Ranks other than 0 read the log over gRPC: the reason must survive the codec.
  LogEntry entry;
  entry.key = GroupKey{"default", "job", "g", 3, "run"};
  entry.status = absl::AbortedError("rendezvous timeout");
  entry.failure = kStepFailureTimeout;
  absl::StatusOr<LogEntry> back = LogEntryFromProto(LogEntryToProto(entry));
  ASSERT_OK(back);
  EXPECT_EQ(back->failure, "timeout");
  EXPECT_THAT(back->status, StatusIs(absl::StatusCode::kAborted, HasSubstr("rendezvous timeout")));
}

TEST(FleetCodecTest, APartOfADividedStepTravelsAsAPart) {
  // Where a part starts in its step and whether more follow: members resolve the step after its last part.
  LogEntry entry;
  entry.key = GroupKey{"default", "job", "g", 4, "run"};
  entry.generation = 7;
  entry.plan.trainer_world = 1;
  entry.plan.fleet_world = 2;
  entry.submissions = {11};
  entry.part_offset = 6;
  entry.more_parts = true;
  absl::StatusOr<LogEntry> back = LogEntryFromProto(LogEntryToProto(entry));
  ASSERT_OK(back);
  EXPECT_EQ(back->part_offset, 6);
  EXPECT_TRUE(back->more_parts);
  entry.part_offset = 8;
  entry.more_parts = false;
  back = LogEntryFromProto(LogEntryToProto(entry));
  ASSERT_OK(back);
  EXPECT_EQ(back->part_offset, 8);
  EXPECT_FALSE(back->more_parts);
}

}  // namespace
}  // namespace orthoserve
