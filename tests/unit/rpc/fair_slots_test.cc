// Fair stream slots (server/rpc/admission.h): with several tenants, none holds the server-wide
// stream slots another needs; each gets its weighted share, by reservation rather than
// preemption; a tenant alone uses the whole limit. Time is a fake clock, never a sleep; and
// issue #27's case end to end on a Server on 127.0.0.1:0.
#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/client_callback.h"
#include "gtest/gtest.h"
#include "proto/convert/raw_message.h"
#include "server/rpc/admission.h"
#include "tests/unit/rpc/held_call.h"
#include "tests/unit/rpc/rpc_test_util.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using ::orthoserve::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

class FairSlotsTest : public ::testing::Test {
 protected:
  // An Admission of `limit` streams for the token file's `tenants` with `shares`.
  void Make(int limit, std::vector<std::string> tenants, FairShares shares = {}, int tenant_cap = 0) {
    Admission::Options options;
    options.max_concurrent_streams = limit;
    options.max_tenant_concurrent_streams = tenant_cap;
    options.tenants = std::move(tenants);
    options.tenant_shares = std::move(shares);
    options.clock = [this] { return now_; };
    admission_ = std::make_unique<Admission>(options, nullptr);
  }

  // Takes slots for `tenant` until one is refused; returns how many it got.
  int TakeAll(const std::string& tenant) {
    for (int got = 0;; ++got) {
      absl::StatusOr<Admission::Ticket> t = admission_->AcquireStream(tenant);
      if (!t.ok()) {
        last_refusal_ = t.status();
        return got;
      }
      held_[tenant].push_back(*std::move(t));
    }
  }
  bool Take(const std::string& tenant) {
    absl::StatusOr<Admission::Ticket> t = admission_->AcquireStream(tenant);
    if (!t.ok()) {
      last_refusal_ = t.status();
      return false;
    }
    held_[tenant].push_back(*std::move(t));
    return true;
  }
  void ReleaseOne(const std::string& tenant) { held_[tenant].pop_back(); }
  int Held(const std::string& tenant) { return static_cast<int>(held_[tenant].size()); }

  absl::Time now_ = absl::UnixEpoch();
  std::unique_ptr<Admission> admission_;
  std::map<std::string, std::vector<Admission::Ticket>> held_;
  absl::Status last_refusal_;
};

TEST_F(FairSlotsTest, ATenantAloneUsesTheWholeLimit) {
  Make(8, {});  // No token file.
  EXPECT_EQ(TakeAll("default"), 8);
  EXPECT_THAT(last_refusal_,
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("serving 8 streams, its limit of 8"), HasSubstr("--max-concurrent-streams"))));
  held_.clear();
  Make(8, {"alice", "alice"});  // A token file of one tenant (two tokens).
  EXPECT_EQ(TakeAll("alice"), 8);
}

TEST_F(FairSlotsTest, AnIdleTenantOfTheTokenFileKeepsASlotAndThenGetsItsShareFromReleases) {
  Make(8, {"alice", "bob"});
  // Alice cannot take the slot kept for bob.
  EXPECT_EQ(TakeAll("alice"), 7);
  EXPECT_THAT(last_refusal_,
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("tenant \"alice\" has 7 streams open and its fair share is 7 of the server's 8"),
                             HasSubstr("--tenant-shares"), HasSubstr("1 tenants of the token file with no streams"))));
  // Bob's first stream is served at once, and nothing of alice's is taken away.
  ASSERT_TRUE(Take("bob"));
  EXPECT_EQ(Held("alice"), 7);
  EXPECT_FALSE(Take("bob"));  // Full: bob now waits for his share (4).
  EXPECT_THAT(last_refusal_, StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--max-concurrent-streams")));
  // Each slot alice releases goes to bob, not back to her, until bob holds his share.
  for (int bob = 1; bob < 4; ++bob) {
    ReleaseOne("alice");
    EXPECT_FALSE(Take("alice"));
    EXPECT_THAT(last_refusal_, StatusIs(absl::StatusCode::kResourceExhausted,
                                        AllOf(HasSubstr("its fair share is 4"),
                                              HasSubstr("kept for 1 other tenants waiting for their share"))));
    EXPECT_TRUE(Take("bob"));
  }
  EXPECT_EQ(Held("alice"), 4);
  EXPECT_EQ(Held("bob"), 4);
  // At their shares, a released slot goes to whoever asks.
  ReleaseOne("alice");
  EXPECT_TRUE(Take("alice"));
}

TEST_F(FairSlotsTest, ARefusedTenantsReserveLapsesAfterItStopsAsking) {
  Make(8, {"alice", "bob"});
  EXPECT_EQ(TakeAll("alice"), 7);
  ASSERT_TRUE(Take("bob"));
  EXPECT_FALSE(Take("bob"));
  ReleaseOne("bob");
  ReleaseOne("alice");
  EXPECT_FALSE(Take("alice"));  // Bob, refused just now, lacks 4 to his share: the 2 free are kept.
  now_ += Admission::kFairShareMemory - absl::Milliseconds(1);
  EXPECT_FALSE(Take("alice"));
  now_ += absl::Milliseconds(1);
  // Bob has not asked for kFairShareMemory: alice may borrow all but bob's kept slot again.
  EXPECT_TRUE(Take("alice"));
  EXPECT_FALSE(Take("alice"));
  EXPECT_EQ(Held("alice"), 7);
}

TEST_F(FairSlotsTest, SharesFollowTheWeights) {
  // Bob weighs 3: his share beside alice is 6 of 8.
  Make(8, {"alice", "bob"}, {{"bob", FairShare{3.0, 0}}});
  EXPECT_EQ(TakeAll("alice"), 7);
  ASSERT_TRUE(Take("bob"));
  EXPECT_FALSE(Take("bob"));
  for (int bob = 1; bob < 6; ++bob) {
    ReleaseOne("alice");
    EXPECT_FALSE(Take("alice"));
    EXPECT_TRUE(Take("bob"));
  }
  EXPECT_EQ(Held("bob"), 6);
  EXPECT_EQ(Held("alice"), 2);
  ReleaseOne("alice");
  EXPECT_TRUE(Take("alice"));  // Bob holds his share.

  // Alice weighs 3: bob's share is 2, and he gets no more while alice waits.
  held_.clear();
  Make(8, {"alice", "bob"}, {{"alice", FairShare{3.0, 0}}});
  EXPECT_EQ(TakeAll("bob"), 7);  // One slot kept for alice.
  ASSERT_TRUE(Take("alice"));
  EXPECT_FALSE(Take("alice"));  // Full: alice waits for her share of 6.
  for (int alice = 1; alice < 6; ++alice) {
    ReleaseOne("bob");
    EXPECT_FALSE(Take("bob"));
    EXPECT_TRUE(Take("alice"));
  }
  EXPECT_EQ(Held("alice"), 6);
  EXPECT_EQ(Held("bob"), 2);
}

TEST_F(FairSlotsTest, ThreeTenantsEachGetTheirShare) {
  Make(9, {"alice", "bob", "carol"});
  EXPECT_EQ(TakeAll("alice"), 7);  // One slot kept for each of bob and carol.
  EXPECT_THAT(last_refusal_,
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("2 tenants of the token file with no streams")));
  EXPECT_TRUE(Take("bob"));
  EXPECT_FALSE(Take("bob"));  // Carol's slot stays kept.
  EXPECT_THAT(last_refusal_, StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("fair share is 4")));
  EXPECT_TRUE(Take("carol"));
  EXPECT_FALSE(Take("carol"));
  // Bob and carol are waiting for 3 each (9 / 3); alice's releases go to them, in any order.
  for (int i = 0; i < 4; ++i) {
    ReleaseOne("alice");
    EXPECT_FALSE(Take("alice"));
    EXPECT_TRUE(Take(i % 2 == 0 ? "bob" : "carol"));
  }
  EXPECT_EQ(Held("alice"), 3);
  EXPECT_EQ(Held("bob"), 3);
  EXPECT_EQ(Held("carol"), 3);
  EXPECT_FALSE(Take("bob"));
  EXPECT_THAT(last_refusal_, StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--max-concurrent-streams")));
}

TEST_F(FairSlotsTest, ATenantNotInTheTokenFileIsStillCountedWhileItHasTraffic) {
  // No token file: two tenant names (as in the unit tests of admission) share by who asks.
  Make(4, {});
  EXPECT_EQ(TakeAll("alice"), 4);
  EXPECT_FALSE(Take("bob"));  // Nobody knew bob: alice borrowed every slot.
  ReleaseOne("alice");
  EXPECT_FALSE(Take("alice"));  // Bob waits for his share of 2.
  EXPECT_TRUE(Take("bob"));
}

TEST_F(FairSlotsTest, PerTenantCapsStayOnTop) {
  Make(8, {"alice", "bob"}, {}, /*tenant_cap=*/3);
  EXPECT_EQ(TakeAll("alice"), 3);
  EXPECT_THAT(last_refusal_,
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("its limit of 3"), HasSubstr("--max-tenant-concurrent-streams"))));
  EXPECT_EQ(TakeAll("bob"), 3);
  // Shares are capped too (3 each): carol, not in the token file, gets the rest.
  EXPECT_EQ(TakeAll("carol"), 2);
}

TEST_F(FairSlotsTest, SharesSmallerThanASlotKeepNothing) {
  // Ten tenants, four slots: no one's part is a slot, so nothing is kept; first come, first served.
  std::vector<std::string> tenants;
  for (int i = 0; i < 10; ++i) tenants.push_back("t" + std::to_string(i));
  Make(4, tenants);
  EXPECT_EQ(TakeAll("t0"), 4);
  EXPECT_FALSE(Take("t1"));
  EXPECT_THAT(last_refusal_, StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--max-concurrent-streams")));
}

}  // namespace
}  // namespace orthoserve

namespace orthoserve::testing {
namespace {

// Issue #27's case with default flags but --max-concurrent-streams 8: tenant alice opens every
// stream she can and leaves them waiting; tenant bob's stream is served within a second, and
// none of alice's is cut.
TEST(FairSlotsServiceTest, AnotherTenantIsServedWithinASecondWhileOneHoldsEverySlotItCanOpen) {
  const std::string path = ::testing::TempDir() + "/fair_slot_tokens.txt";
  {
    std::ofstream out(path);
    out << "secret-a alice\nsecret-b bob\n";
  }
  ServerOptions options = TestServerOptions();
  options.token_file = path;
  options.service.admission.max_concurrent_streams = 8;
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(options);
  ASSERT_OK(server);
  const std::string address = "127.0.0.1:" + std::to_string((*server)->port());
  grpc::GenericStub alice_stub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));

  // More than the limit: the server keeps bob's slot, so alice holds 7 and the rest are refused.
  constexpr int kTries = 10;
  std::vector<std::unique_ptr<HeldCall>> alice;
  const auto refused = [&] {
    int n = 0;
    for (auto& s : alice) n += s->done() ? 1 : 0;
    return n;
  };
  // On every way out, a failed ASSERT included: a reactor must outlive its call, so alice's
  // streams are cancelled and awaited (and leaked if they do not end).
  struct CancelOnExit {
    std::vector<std::unique_ptr<HeldCall>>& streams;
    ~CancelOnExit() {
      for (auto& s : streams) s->Cancel();
      const bool ended = WaitFor(
          [&] {
            for (auto& s : streams) {
              if (!s->done()) return false;
            }
            return true;
          },
          absl::Seconds(10));
      if (!ended) {
        for (auto& s : streams) s.release();
      }
    }
  } cancel_on_exit{alice};
  for (int i = 0; i < kTries; ++i) alice.push_back(HeldCall::HeaderOnlyStream(alice_stub, "secret-a"));
  ASSERT_TRUE(WaitFor([&] { return refused() == kTries - 7 && (*server)->inflight_calls() == 7; }, absl::Seconds(10)))
      << refused() << " of alice's streams refused, " << (*server)->inflight_calls() << " calls open";
  for (auto& s : alice) {
    if (!s->done()) continue;
    EXPECT_EQ(s->status().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(s->status().error_message(), ::testing::HasSubstr("its fair share is 7 of the server's 8"));
  }

  // Bob's connection is up before the clock starts (GetServerInfo takes no stream slot).
  std::unique_ptr<v1::Orthogonalizer::Stub> bob = StubFor(**server);
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer secret-b");
    v1::ServerInfo info;
    ASSERT_TRUE(bob->GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok());
  }
  NsOptions ns;
  const std::string in = Bytes(RandomMatrix(16, 8, 5), DType::kF32);
  std::vector<v1::StreamRequest> messages = {HeaderMessage(1)};
  AppendMatrix(messages, 0, Spec("w", {16, 8}, DType::kF32, ns), in);
  messages.push_back(EndMessage());
  grpc::ClientContext context;
  context.AddMetadata("authorization", "Bearer secret-b");
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
  StreamOutcome out = RunStream(*bob, messages, &context);
  ASSERT_TRUE(out.status.ok()) << out.status.error_code() << ": " << out.status.error_message();
  EXPECT_EQ(out.data[0], Reference(in, {16, 8}, DType::kF32, DType::kF32, ns));

  // Reservation, not preemption: alice's streams are all still open.
  EXPECT_EQ(refused(), kTries - 7);
  for (auto& s : alice) s->Cancel();
  EXPECT_TRUE(WaitFor([&] { return refused() == kTries; }, absl::Seconds(10)));
  EXPECT_TRUE(WaitFor([&] { return (*server)->inflight_calls() == 0; }, absl::Seconds(10)));
}

}  // namespace
}  // namespace orthoserve::testing
