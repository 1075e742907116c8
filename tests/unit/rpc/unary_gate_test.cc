// Unary call slots and their waiter queue (server/rpc/unary_gate.h): fair between tenants, a cap
// per tenant, a bounded queue in which a tenant under its part pushes out the tenant most over
// its part, and cancelled waits. Time is a fake clock, never a sleep.
#include "server/rpc/unary_gate.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using ::orthoserve::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// One call's side of the gate: its slot, and how its wait ended.
struct Call {
  std::string tenant;
  UnaryGate::Slot slot;
  uint64_t wait = 0;
  bool done = false;
  absl::Status status;
};

class UnaryGateTest : public ::testing::Test {
 protected:
  void Make(int limit, int waiters, std::vector<std::string> tenants, FairShares shares = {}, int cap = 0,
            Metrics* metrics = nullptr) {
    UnaryGate::Options options;
    options.max_concurrent = limit;
    options.max_tenant_concurrent = cap;
    options.max_waiters = waiters;
    options.tenants = std::move(tenants);
    options.tenant_shares = std::move(shares);
    options.clock = [this] { return now_; };
    gate_ = std::make_unique<UnaryGate>(options, metrics);
  }
  // A new call of `tenant` asks for a slot.
  Call* Ask(const std::string& tenant) {
    calls_.push_back(std::make_unique<Call>());
    Call* c = calls_.back().get();
    c->tenant = tenant;
    c->wait = gate_->Acquire(&c->slot, tenant, [c](absl::Status s) {
      c->done = true;
      c->status = std::move(s);
    });
    return c;
  }
  // Calls of `tenant` holding a slot.
  int Holding(const std::string& tenant) {
    int n = 0;
    for (const auto& c : calls_) n += c->tenant == tenant && c->slot.held();
    return n;
  }
  // Ends the oldest call of `tenant` that holds a slot.
  void EndOne(const std::string& tenant) {
    for (auto& c : calls_) {
      if (c->tenant == tenant && c->slot.held()) {
        c->slot.Release();
        return;
      }
    }
    ADD_FAILURE() << tenant << " holds no slot";
  }

  absl::Time now_ = absl::UnixEpoch();
  std::unique_ptr<UnaryGate> gate_;
  std::vector<std::unique_ptr<Call>> calls_;
};

TEST_F(UnaryGateTest, ATenantAloneUsesEverySlotAndItsWaitersGoInArrivalOrder) {
  Make(/*limit=*/3, /*waiters=*/8, {});
  for (int i = 0; i < 3; ++i) {
    Call* c = Ask("default");
    EXPECT_TRUE(c->done && c->status.ok() && c->slot.held());
    EXPECT_EQ(c->wait, 0u);
  }
  Call* fourth = Ask("default");
  Call* fifth = Ask("default");
  EXPECT_FALSE(fourth->done);
  EXPECT_FALSE(fifth->done);
  EXPECT_EQ(gate_->waiting(), 2u);
  EndOne("default");
  EXPECT_TRUE(fourth->done && fourth->status.ok() && fourth->slot.held());
  EXPECT_FALSE(fifth->done);
  EXPECT_EQ(gate_->held(), 3);
}

TEST_F(UnaryGateTest, AFloodingTenantLeavesAnotherTenantItsKeptSlotAndItsShare) {
  Make(/*limit=*/8, /*waiters=*/100, {"alice", "bob"});
  // Alice alone with traffic: all but bob's kept slot; her other calls wait.
  for (int i = 0; i < 20; ++i) Ask("alice");
  EXPECT_EQ(Holding("alice"), 7);
  EXPECT_EQ(gate_->waiting(), 13u);
  // Bob is served at once, though alice has been waiting longer.
  Call* bob = Ask("bob");
  EXPECT_TRUE(bob->done && bob->status.ok());
  // Bob's next call waits, and the slots alice frees go to bob up to his share of 4.
  Call* bob2 = Ask("bob");
  Call* bob3 = Ask("bob");
  Call* bob4 = Ask("bob");
  Call* bob5 = Ask("bob");
  EXPECT_FALSE(bob2->done);
  EndOne("alice");
  EXPECT_TRUE(bob2->done && bob2->status.ok());
  EndOne("alice");
  EndOne("alice");
  EXPECT_TRUE(bob3->done && bob4->done);
  EXPECT_EQ(Holding("bob"), 4);
  EXPECT_EQ(Holding("alice"), 4);
  // At their shares, a freed slot of alice's goes back to alice's queue (fewest per weight).
  EndOne("alice");
  EXPECT_EQ(Holding("alice"), 4);
  EXPECT_FALSE(bob5->done);
  EXPECT_EQ(gate_->held(), 8);
}

TEST_F(UnaryGateTest, WeightsSetTheShares) {
  FairShares shares;
  shares["alice"].weight = 3;
  Make(/*limit=*/8, /*waiters=*/100, {"alice", "bob"}, shares);
  for (int i = 0; i < 10; ++i) Ask("alice");
  for (int i = 0; i < 10; ++i) Ask("bob");
  EXPECT_EQ(Holding("alice"), 7);
  EXPECT_EQ(Holding("bob"), 1);
  // alice's share is 6 (3/4 of 8), bob's 2: each freed slot goes to the waiting tenant with the
  // fewest slots per weight — bob (1 for 1) before alice (6 for 3), then alice (5 for 3) before
  // bob (2 for 1).
  for (int i = 0; i < 3; ++i) EndOne("alice");
  EXPECT_EQ(Holding("bob"), 2);
  EXPECT_EQ(Holding("alice"), 6);
}

TEST_F(UnaryGateTest, ATenantAtItsCapWaitsWhileSlotsAreFree) {
  Make(/*limit=*/8, /*waiters=*/100, {"alice", "bob"}, {}, /*cap=*/2);
  Ask("alice");
  Ask("alice");
  Call* third = Ask("alice");
  EXPECT_FALSE(third->done);
  EXPECT_EQ(gate_->held(), 2);
  Call* bob = Ask("bob");
  EXPECT_TRUE(bob->done && bob->status.ok());
  EndOne("alice");
  EXPECT_TRUE(third->done && third->status.ok());
}

// The counter of `family` with labels tenant=`tenant` and `key`=`value` (0 when absent).
double Count(Metrics& metrics, const std::string& family, const std::string& tenant, const std::string& key,
             const std::string& value) {
  for (const prometheus::MetricFamily& f : metrics.Collect()) {
    if (f.name != family) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      bool match = true;
      for (const prometheus::ClientMetric::Label& l : m.label) {
        if (l.name == "tenant") match = match && l.value == tenant;
        if (l.name == key) match = match && l.value == value;
      }
      if (match) return m.counter.value;
    }
  }
  return 0;
}

TEST_F(UnaryGateTest, AFullQueueRefusesTheTenantAtItsPartAndPushesItOutForAnother) {
  Metrics::Options metrics_options;
  metrics_options.process_metrics = false;
  metrics_options.tenant_labels = TenantLabels::kName;
  absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::Create(metrics_options);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  Make(/*limit=*/2, /*waiters=*/4, {}, {}, 0, metrics->get());
  for (int i = 0; i < 6; ++i) Ask("alice");  // 2 hold, 4 wait.
  EXPECT_EQ(Holding("alice"), 2);
  EXPECT_EQ(gate_->waiting(), 4u);
  Call* refused = Ask("alice");
  EXPECT_TRUE(refused->done);
  EXPECT_THAT(refused->status, StatusIs(absl::StatusCode::kResourceExhausted,
                                        AllOf(HasSubstr("its limit of 4 waiting"), HasSubstr("--max-unary-waiters"),
                                              HasSubstr("tenant \"alice\" has 4 waiting"))));
  // Bob is under his part (2 of 4): alice's newest waiter is pushed out for him, then another.
  Call* alice_newest = calls_[5].get();
  Call* bob = Ask("bob");
  EXPECT_FALSE(bob->done);
  EXPECT_TRUE(alice_newest->done);
  EXPECT_THAT(alice_newest->status, StatusIs(absl::StatusCode::kResourceExhausted,
                                             AllOf(HasSubstr("pushed out"), HasSubstr("--max-unary-waiters"))));
  Call* bob2 = Ask("bob");
  EXPECT_FALSE(bob2->done);
  EXPECT_TRUE(calls_[4]->done);
  EXPECT_EQ(gate_->waiting(), 4u);
  // Two each: a third of bob's is refused, and so is a new one of alice's.
  Call* bob3 = Ask("bob");
  EXPECT_THAT(bob3->status, StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("bob\" has 2 waiting")));
  Call* alice = Ask("alice");
  EXPECT_THAT(alice->status, StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--max-unary-waiters")));
  int pushed = 0;
  for (const auto& c : calls_) pushed += c->done && absl::StrContains(c->status.message(), "pushed out");
  EXPECT_EQ(pushed, 2);
  // Refused at the door: alice twice, bob once; cut from the queue: two of alice's.
  Metrics& m = **metrics;
  EXPECT_EQ(Count(m, "orthoserve_tenant_refusals_total", "alice", "limit", "unary_waiters"), 2);
  EXPECT_EQ(Count(m, "orthoserve_tenant_refusals_total", "bob", "limit", "unary_waiters"), 1);
  EXPECT_EQ(Count(m, "orthoserve_tenant_cuts_total", "alice", "cause", "pushed_out"), 2);
  EXPECT_EQ(Count(m, "orthoserve_tenant_cuts_total", "bob", "cause", "pushed_out"), 0);
  // The freed slot goes to the tenant with the fewest slots: bob.
  EndOne("alice");
  EXPECT_TRUE(bob->done && bob->status.ok());
  EXPECT_EQ(Holding("bob"), 1);
}

TEST_F(UnaryGateTest, ACancelledWaitNeverRunsAndFreesItsPlace) {
  Make(/*limit=*/1, /*waiters=*/1, {});
  Ask("default");
  Call* waiting = Ask("default");
  ASSERT_NE(waiting->wait, 0u);
  EXPECT_TRUE(gate_->CancelWait(waiting->wait));
  EXPECT_FALSE(gate_->CancelWait(waiting->wait));
  EXPECT_EQ(gate_->waiting(), 0u);
  Call* next = Ask("default");
  EXPECT_FALSE(next->done);
  EndOne("default");
  EXPECT_FALSE(waiting->done);
  EXPECT_TRUE(next->done && next->status.ok());
}

TEST_F(UnaryGateTest, AWaiterIsServedFirstHoweverLongItWaited) {
  Make(/*limit=*/4, /*waiters=*/100, {});
  for (int i = 0; i < 4; ++i) Ask("alice");
  Call* bob = Ask("bob");  // Waits: alice holds every slot.
  EXPECT_FALSE(bob->done);
  now_ += FairSlots::kFairShareMemory * 3;
  // Alice's new call comes long after bob's refusal; bob still waits, so he keeps his claim.
  Call* alice = Ask("alice");
  EndOne("alice");
  EXPECT_TRUE(bob->done && bob->status.ok());
  EXPECT_FALSE(alice->done);
}

TEST_F(UnaryGateTest, NoQueueRefusesAtOnce) {
  Make(/*limit=*/1, /*waiters=*/0, {});
  Ask("default");
  Call* second = Ask("default");
  EXPECT_THAT(second->status, StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--max-unary-waiters")));
}

}  // namespace
}  // namespace orthoserve
