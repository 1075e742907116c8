// The fleet service's calls without a network (FleetCalls): a reader that is behind gets the
// entries in responses of bounded size, in order, none lost, and reads on from where each response
// ended; a waiting ReadLog or StoreGet holds no thread and is answered when an entry is appended or
// the key is set, when its wait ends, or at shutdown. And the fleet protocol handshake
// (fleet.proto, "Versions"): the service refuses a Join of another protocol, and a rank does not
// join a coordinator of another protocol (in process on 127.0.0.1:0).
#include "server/fleet/wire/fleet_service.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <memory>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/server_context.h"
#include "gtest/gtest.h"
#include "server/fleet/wire/fleet_client.h"
#include "server/fleet/wire/fleet_codec.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

constexpr int kSteps = 10, kWorld = 64, kMatrices = 8;
const Member kMe{0, "127.0.0.1:5000", 10};

// A one-rank fleet's coordinator whose log holds its membership entry and ten batches of 64
// trainer ranks × 8 matrices (a few KB each), none of them read yet.
std::unique_ptr<Coordinator> CoordinatorWithBatches() {
  Coordinator::Options options;
  options.fleet_world = 1;
  options.reform_delay = absl::Milliseconds(1);
  auto c = Coordinator::Create(options);
  EXPECT_OK(c);
  if (!c.ok()) return nullptr;
  EXPECT_OK((*c)->Join(kMe).status());
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while ((*c)->generation().number < 1 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(2));
  EXPECT_EQ((*c)->generation().number, 1);
  for (int step = 1; step <= kSteps; ++step) {
    for (int r = 0; r < kWorld; ++r) {
      ReadyReport report;
      report.key = GroupKey{"t", "j", "g", step, "run"};
      report.trainer_rank = r;
      report.trainer_world = kWorld;
      report.fleet_rank = 0;
      report.incarnation = kMe.incarnation;
      report.epoch = (*c)->epoch();
      report.submission = 1 + r;
      SpecList specs;
      std::vector<Block> blocks;
      for (int i = 0; i < kMatrices; ++i) {
        MatrixPlan m;
        m.name = absl::StrCat("w", i);
        m.shape = {kWorld, 16};
        m.view = Matrix2d{kWorld, 16};
        specs.push_back(m);
        blocks.push_back(Block{r, 0, 1, 16});
      }
      report.sent = SenderBlocks(std::move(specs), std::move(blocks));
      EXPECT_OK((*c)->Report(report));
    }
  }
  return *std::move(c);
}

// The threads of this process.
int Threads() {
  int n = 0;
  for ([[maybe_unused]] const auto& task : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// A call's outcome, waited for (bounded).
class Outcome {
 public:
  FleetCalls::Done done() {
    return [this](grpc::Status status) {
      status_ = std::move(status);
      finished_.Notify();
    };
  }
  bool finished() const { return finished_.HasBeenNotified(); }
  grpc::Status Wait() {
    EXPECT_TRUE(finished_.WaitForNotificationWithTimeout(absl::Seconds(10)));
    return status_;
  }

 private:
  absl::Notification finished_;
  grpc::Status status_;
};

fleet::v1::ReadLogRequest ReadRequest(const Coordinator& c, int64_t from, int64_t timeout_ms = 0) {
  fleet::v1::ReadLogRequest request;
  request.set_reader(0);
  request.set_from(from);
  request.set_epoch(c.epoch());
  request.set_incarnation(kMe.incarnation);
  request.set_timeout_ms(timeout_ms);
  return request;
}

// Entry i of a ReadLog response (each travels serialized).
fleet::v1::LogEntry EntryOf(const fleet::v1::ReadLogResponse& response, int i) {
  fleet::v1::LogEntry entry;
  EXPECT_TRUE(entry.ParseFromString(response.entries(i))) << "entry " << i << " does not parse";
  return entry;
}

fleet::v1::ReadLogResponse Read(FleetCalls& service, const Coordinator& c, int64_t from) {
  grpc::ServerContext context;
  fleet::v1::ReadLogResponse response;
  Outcome outcome;
  service.ReadLog(context, ReadRequest(c, from), &response, outcome.done());
  EXPECT_TRUE(outcome.Wait().ok());
  return response;
}

TEST(FleetServiceTest, ReadLogCapsAResponseAndTheReaderReadsOn) {
  size_t entry_bytes = 0;
  {
    std::unique_ptr<Coordinator> c = CoordinatorWithBatches();
    ASSERT_NE(c, nullptr);
    FleetCalls unbounded(nullptr, c.get());
    const fleet::v1::ReadLogResponse all = Read(unbounded, *c, 0);
    ASSERT_EQ(all.entries_size(), 1 + kSteps);
    entry_bytes = all.entries(1).size();
    ASSERT_GT(entry_bytes, 500u);  // Placements by rule (torch.chunk): names and options, mostly.
  }
  // Room for three batch entries a response; a limit below one entry still sends one.
  for (size_t limit : {3 * entry_bytes + 100, entry_bytes / 2}) {
    std::unique_ptr<Coordinator> c = CoordinatorWithBatches();
    ASSERT_NE(c, nullptr);
    FleetCalls capped(nullptr, c.get(), limit);
    std::vector<int64_t> indices;
    int64_t from = 0;
    int reads = 0;
    for (; reads < 2 * (kSteps + 1) && from < 1 + kSteps; ++reads) {
      const fleet::v1::ReadLogResponse response = Read(capped, *c, from);
      ASSERT_GT(response.entries_size(), 0);
      EXPECT_LE(response.ByteSizeLong(), std::max(limit, entry_bytes) + 16 * response.entries_size());
      for (int i = 0; i < response.entries_size(); ++i) {
        const fleet::v1::LogEntry e = EntryOf(response, i);
        indices.push_back(e.index());
        const absl::StatusOr<LogEntry> entry = LogEntryFromProto(e);
        ASSERT_OK(entry.status());
        if (e.index() > 0) {
          ASSERT_OK(entry->status);
          EXPECT_EQ(entry->key.step, e.index());
          EXPECT_EQ(entry->plan.matrices.size(), static_cast<size_t>(kMatrices));
        }
      }
      from = EntryOf(response, response.entries_size() - 1).index() + 1;
    }
    std::vector<int64_t> expected;
    for (int64_t i = 0; i <= kSteps; ++i) expected.push_back(i);
    EXPECT_EQ(indices, expected) << "limit " << limit;
    EXPECT_EQ(reads, limit > entry_bytes ? 4 : 1 + kSteps) << "limit " << limit;
  }
}

TEST(FleetServiceTest, AJoinOfAnotherProtocolIsRefusedAndTheProtocolIsAnswered) {
  std::unique_ptr<Coordinator> c = CoordinatorWithBatches();
  ASSERT_NE(c, nullptr);
  FleetCalls service(nullptr, c.get());
  for (int protocol : {0, kFleetProtocol - 1, kFleetProtocol + 1}) {
    grpc::ServerContext context;
    fleet::v1::JoinRequest request;
    *request.mutable_member() = MemberToProto(Member{3, "127.0.0.1:5003", 33});
    request.set_protocol(protocol);
    fleet::v1::JoinResponse response;
    const grpc::Status status = service.Join(context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << protocol;
    EXPECT_THAT(status.error_message(), ::testing::HasSubstr(absl::StrCat("speaks fleet protocol ", protocol)));
  }
  grpc::ServerContext context;
  fleet::v1::StoreGetRequest get;
  get.set_key(kFleetProtocolKey);
  fleet::v1::StoreGetResponse value;
  Outcome got;
  service.StoreGet(context, get, &value, got.done());
  ASSERT_TRUE(got.Wait().ok());
  EXPECT_TRUE(value.found());
  EXPECT_EQ(value.value(), std::to_string(kFleetProtocol));
}

// A reader that has read everything waits without a thread: its call is answered when the next
// entry is appended (here the failure of a step another trainer rank reports), and a waiting
// reader whose wait ends gets an empty response. Many waiting readers start no thread each.
TEST(FleetServiceTest, AWaitingReadLogIsAnsweredByTheNextEntryWithoutAThreadOfItsOwn) {
  std::unique_ptr<Coordinator> c = CoordinatorWithBatches();
  ASSERT_NE(c, nullptr);
  FleetCalls service(nullptr, c.get());
  const int64_t end = 1 + kSteps;
  ASSERT_EQ(Read(service, *c, 0).entries_size(), end);

  constexpr int kWaiting = 200;
  const int threads = Threads();
  grpc::ServerContext context;
  std::vector<fleet::v1::ReadLogResponse> responses(kWaiting);
  std::vector<std::unique_ptr<Outcome>> outcomes;
  for (int i = 0; i < kWaiting; ++i) {
    outcomes.push_back(std::make_unique<Outcome>());
    service.ReadLog(context, ReadRequest(*c, end, /*timeout_ms=*/10000), &responses[i], outcomes.back()->done());
  }
  absl::SleepFor(absl::Milliseconds(50));
  for (const auto& o : outcomes) EXPECT_FALSE(o->finished());
  EXPECT_EQ(Threads(), threads);  // Every call returned; none holds a thread while it waits.
  // A world out of range fails its step at once: one failure entry, which every waiting read gets.
  ReadyReport bad;
  bad.key = GroupKey{"t", "j", "g", 99, "run"};
  bad.trainer_rank = 5;
  bad.trainer_world = 2;
  bad.fleet_rank = 0;
  bad.incarnation = kMe.incarnation;
  bad.epoch = c->epoch();
  ASSERT_OK(c->Report(bad));
  for (int i = 0; i < kWaiting; ++i) {
    ASSERT_TRUE(outcomes[i]->Wait().ok()) << i;
    ASSERT_EQ(responses[i].entries_size(), 1) << i;
    EXPECT_EQ(EntryOf(responses[i], 0).index(), end);
    EXPECT_EQ(EntryOf(responses[i], 0).code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  }

  // A wait that ends with nothing new: OK and empty, after about its timeout.
  fleet::v1::ReadLogResponse empty;
  Outcome waited;
  const absl::Time start = absl::Now();
  service.ReadLog(context, ReadRequest(*c, end + 1, /*timeout_ms=*/200), &empty, waited.done());
  ASSERT_TRUE(waited.Wait().ok());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(190));
  EXPECT_EQ(empty.entries_size(), 0);

  // At shutdown a waiting reader is answered at once with UNAVAILABLE.
  fleet::v1::ReadLogResponse cut;
  Outcome shut;
  service.ReadLog(context, ReadRequest(*c, end + 1, /*timeout_ms=*/10000), &cut, shut.done());
  c->Shutdown();
  EXPECT_EQ(shut.Wait().error_code(), grpc::StatusCode::UNAVAILABLE);
}

// A StoreGet of a key not yet set waits in the store and is answered when it is set; one whose
// wait ends says "not found"; StopWaits (the fleet shutting down) answers a waiting one with
// CANCELLED, and a later one at once.
TEST(FleetServiceTest, AWaitingStoreGetIsAnsweredWhenTheKeyIsSet) {
  std::unique_ptr<Coordinator> c = CoordinatorWithBatches();
  ASSERT_NE(c, nullptr);
  InMemoryStore store;
  FleetCalls service(&store, c.get());
  grpc::ServerContext context;
  fleet::v1::StoreGetRequest get;
  get.set_key("gen-1/rank-3");
  get.set_timeout_ms(10000);
  fleet::v1::StoreGetResponse value;
  Outcome got;
  service.StoreGet(context, get, &value, got.done());
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(got.finished());
  fleet::v1::StoreSetRequest set;
  set.set_key("gen-1/rank-3");
  set.set_value("127.0.0.1:7003");
  ASSERT_TRUE(service.StoreSet(context, set).ok());
  ASSERT_TRUE(got.Wait().ok());
  EXPECT_TRUE(value.found());
  EXPECT_EQ(value.value(), "127.0.0.1:7003");

  get.set_key("never");
  get.set_timeout_ms(100);
  fleet::v1::StoreGetResponse missing;
  Outcome timed_out;
  service.StoreGet(context, get, &missing, timed_out.done());
  ASSERT_TRUE(timed_out.Wait().ok());
  EXPECT_FALSE(missing.found());

  get.set_timeout_ms(10000);
  fleet::v1::StoreGetResponse stopped;
  Outcome stopping;
  service.StoreGet(context, get, &stopped, stopping.done());
  store.StopWaits();
  EXPECT_EQ(stopping.Wait().error_code(), grpc::StatusCode::CANCELLED);
  fleet::v1::StoreGetResponse later;
  Outcome after;
  service.StoreGet(context, get, &later, after.done());
  EXPECT_TRUE(after.finished());
  EXPECT_EQ(after.Wait().error_code(), grpc::StatusCode::CANCELLED);
}

// A coordinator of the release before the handshake: no protocol key in its store, and it would
// admit anyone who asks.
class OldCoordinator final : public fleet::v1::Fleet::Service {
 public:
  grpc::Status StoreGet(grpc::ServerContext*, const fleet::v1::StoreGetRequest*,
                        fleet::v1::StoreGetResponse* response) override {
    response->set_found(false);
    return grpc::Status::OK;
  }
  grpc::Status Join(grpc::ServerContext*, const fleet::v1::JoinRequest*, fleet::v1::JoinResponse*) override {
    ++joins;
    return grpc::Status::OK;
  }
  std::atomic<int> joins{0};
};

// Serves `service` on 127.0.0.1:0 and returns a log source connected to it.
struct Served {
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<RemoteLogSource> log;
};
Served Serve(grpc::Service* service) {
  Served s;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service);
  s.server = builder.BuildAndStart();
  EXPECT_GT(port, 0);
  s.log = std::make_unique<RemoteLogSource>(MakeFleetChannel(absl::StrCat("127.0.0.1:", port)).value());
  return s;
}

TEST(FleetServiceTest, ARankDoesNotJoinACoordinatorOfAnotherProtocol) {
  OldCoordinator old;
  Served to_old = Serve(&old);
  absl::StatusOr<LogSource::Joined> refused = to_old.log->Join(Member{1, "127.0.0.1:5001", 11});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), ::testing::HasSubstr("until rank 0 runs its release"));
  EXPECT_EQ(old.joins.load(), 0);  // It asked first, so the old coordinator never admitted it.
  to_old.server->Shutdown();

  // A coordinator of this release: the rank joins.
  Coordinator::Options options;
  options.fleet_world = 2;
  auto c = Coordinator::Create(options);
  ASSERT_OK(c);
  FleetService current(nullptr, c->get());
  Served to_current = Serve(&current);
  absl::StatusOr<LogSource::Joined> joined = to_current.log->Join(Member{1, "127.0.0.1:5001", 11});
  ASSERT_OK(joined.status());
  EXPECT_EQ(joined->epoch, (*c)->epoch());
  to_current.server->Shutdown();
}

}  // namespace
}  // namespace orthoserve
