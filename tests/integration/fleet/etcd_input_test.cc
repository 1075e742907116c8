// etcd content is input (issue 38): a 2-rank fleet with an elected coordinator (--membership
// etcd://, a one-member etcd started here) and fleet mutual TLS (throw-away certificates from
// deploy/local/fleet_certs.sh), the real binary on loopback. A key under the election prefix put
// before the ranks start is what etcd names leader; while it stays:
//  - value "2147483647 <address>" (a rank outside --world; with fleet TLS, main's ranks died of
//    SIGSEGV looking up its member name), "<rank> <address>" on no lease, or garbage: every rank
//    keeps running, reports no coordinator (rank -1), and counts the value once in
//    orthoserve_integrity_refusals_total{cause="etcd_value"};
//  - once the key is deleted a coordinator is elected, and the fleet forms, within the leader
//    TTL (+ 1 s for a loaded machine; about 0.3 s measured).
// Malformed liveness keys under PREFIX/members/ list nobody and change nothing.
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/etcd/etcd_client.h"
#include "tests/integration/binaries/subprocess.h"
#include "tests/integration/fleet/fleet_info_util.h"
#include "tests/integration/fleet/fleet_test_util.h"
#include "tests/unit/etcd/etcd_process.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using client::Client;
using client::ClientOptions;
using testing::Subprocess;

constexpr int kFleet = 2;
constexpr absl::Duration kLeaderTtl = absl::Seconds(2);
// What a rank may take beyond the TTL to see etcd's new leader (its check interval is TTL / 3,
// and the watch wakes it at once) on a loaded machine.
constexpr absl::Duration kElectMargin = absl::Seconds(1);

// The fleet's processes, certificates and etcd. Rank r: public port P + r, fleet port P + 50 + r,
// metrics P + 100 + r.
class ElectedTlsFleet {
 public:
  ElectedTlsFleet() {
    base_ = testing::FreeBasePort(kFleet, 36000);
    dir_ = absl::StrCat(::testing::TempDir(), "/etcd-input-", getpid(), "-", ++instances_);
    prefix_ = absl::StrCat("/orthoserve/etcd-input-", getpid(), "-", instances_);
    made_ = base_ > 0 &&
            std::system(absl::StrCat(ORTHOSERVE_FLEET_CERTS_SCRIPT, " fleet ", dir_, " ", kFleet).c_str()) == 0;
  }
  ~ElectedTlsFleet() {
    for (auto& r : ranks_) r.reset();  // SIGKILL whatever still runs.
    std::system(absl::StrCat("rm -rf ", dir_).c_str());
  }

  absl::Status StartEtcd() {
    ASSIGN_OR_RETURN(etcd_, testing::EtcdCluster::Start(1));
    etcd::EtcdOptions o;
    o.endpoints = etcd_->endpoints();
    ASSIGN_OR_RETURN(client_, etcd::EtcdClient::Create(o));
    return absl::OkStatus();
  }
  bool made() const { return made_; }
  etcd::EtcdClient& etcd() { return *client_; }
  const std::string& prefix() const { return prefix_; }
  std::string Address(int r) const { return absl::StrCat("127.0.0.1:", base_ + r); }
  std::string FleetAddress(int r) const { return absl::StrCat("127.0.0.1:", base_ + 50 + r); }

  void StartAll() {
    ranks_.resize(kFleet);
    for (int r = 0; r < kFleet; ++r) {
      const std::string cert = absl::StrCat(dir_, "/rank", r);
      // Flag and value pairs, one pair a line.
      // clang-format off
      const std::vector<std::string> argv = {ORTHOSERVE_BINARY,
          "--rank", std::to_string(r),
          "--world", std::to_string(kFleet),
          "--listen", Address(r),
          "--fleet-listen", FleetAddress(r),
          "--membership", absl::StrCat("etcd://", etcd_->endpoints(), prefix_),
          "--fleet-leader-ttl", absl::StrCat(absl::ToInt64Seconds(kLeaderTtl), "s"),
          "--metrics-address", absl::StrCat("127.0.0.1:", base_ + 100 + r),
          "--fleet-peer-timeout", "3s",
          "--fleet-tls-cert", cert + ".crt",
          "--fleet-tls-key", cert + ".key",
          "--fleet-tls-ca", absl::StrCat(dir_, "/ca.crt")};
      // clang-format on
      auto p = Subprocess::Start(argv, absl::StrCat(dir_, "/rank", r));
      ASSERT_OK(p);
      ranks_[r] = *std::move(p);
    }
  }
  bool Running(int r) { return ranks_[r] != nullptr && ranks_[r]->Running(); }
  std::string Log(int r) const { return ranks_[r] == nullptr ? "" : ranks_[r]->Stderr(); }

  // Rank r's GetServerInfo (one attempt).
  absl::StatusOr<v1::ServerInfo> Info(int r) const {
    ClientOptions o;
    o.address = Address(r);
    o.timeout = absl::Seconds(1);
    o.retry.enabled = false;
    ASSIGN_OR_RETURN(std::unique_ptr<Client> c, Client::Create(o));
    return c->GetServerInfo();
  }
  // Waits until every rank names the same elected coordinator (rank >= 0, same term).
  bool WaitElected(absl::Duration timeout) const {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      absl::StatusOr<v1::ServerInfo> first = Info(0);
      bool agree = first.ok() && first->coordinator().rank() >= 0 && first->coordinator().term() > 0;
      for (int r = 1; r < kFleet && agree; ++r) {
        absl::StatusOr<v1::ServerInfo> info = Info(r);
        agree = info.ok() && info->coordinator().rank() == first->coordinator().rank() &&
                info->coordinator().term() == first->coordinator().term();
      }
      if (agree) return true;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  }
  // Waits until every rank reports a formed generation of all members.
  bool WaitWhole(absl::Duration timeout) const {
    return testing::WaitWholeFleet([this](int r) { return Info(r); }, kFleet, timeout);
  }
  // orthoserve_integrity_refusals_total{cause="etcd_value"} on rank r (-1: not scraped).
  double EtcdValueRefusals(int r) const { return testing::IntegrityRefusals(base_ + 100 + r, "etcd_value"); }

 private:
  static inline int instances_ = 0;
  int base_ = 0;
  std::string dir_;
  std::string prefix_;
  bool made_ = false;
  std::unique_ptr<testing::EtcdCluster> etcd_;
  std::unique_ptr<etcd::EtcdClient> client_;
  std::vector<std::unique_ptr<Subprocess>> ranks_;
};

class EtcdInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fleet_.made()) << "could not make certificates with " << ORTHOSERVE_FLEET_CERTS_SCRIPT;
    ASSERT_OK(fleet_.StartEtcd());
  }
  // While a key no rank wrote leads: every rank runs, names no coordinator, counts the value;
  // then the key is deleted and the fleet elects a coordinator within the TTL, and forms.
  void ExpectRanksRideItOutUntilItIsDeleted(const std::string& key) {
    absl::SleepFor(3 * kLeaderTtl);
    for (int r = 0; r < kFleet; ++r) {
      ASSERT_TRUE(fleet_.Running(r)) << "rank " << r << " died:\n" << fleet_.Log(r);
      absl::StatusOr<v1::ServerInfo> info = fleet_.Info(r);
      ASSERT_OK(info);
      EXPECT_EQ(info->coordinator().rank(), -1) << "rank " << r << " follows a leader key it should refuse";
      EXPECT_GT(info->coordinator().term(), 0) << "rank " << r;
      EXPECT_FALSE(info->ready()) << "rank " << r;
      EXPECT_EQ(fleet_.EtcdValueRefusals(r), 1) << "rank " << r;
    }
    const absl::Time removed = absl::Now();
    ASSERT_OK(fleet_.etcd().Delete(key));
    ASSERT_TRUE(fleet_.WaitElected(kLeaderTtl + kElectMargin)) << "no coordinator within the TTL of the removal";
    const absl::Duration elected = absl::Now() - removed;
    ASSERT_TRUE(fleet_.WaitWhole(kLeaderTtl + kElectMargin - elected)) << "the fleet did not form within the TTL";
    std::cout << "elected " << absl::FormatDuration(elected) << " and formed "
              << absl::FormatDuration(absl::Now() - removed) << " after the key's removal\n";
    for (int r = 0; r < kFleet; ++r) EXPECT_TRUE(fleet_.Running(r)) << "rank " << r;
  }

  ElectedTlsFleet fleet_;
};

TEST_F(EtcdInputTest, ALeaderNamingRankTwoToThe31MinusOneCrashesNoRank) {
  absl::StatusOr<etcd::Lease> lease = fleet_.etcd().GrantLease(absl::Seconds(120));
  ASSERT_OK(lease);
  const std::string key = fleet_.prefix() + "/coordinator/0";
  ASSERT_OK(fleet_.etcd().Put(key, absl::StrCat("2147483647 ", fleet_.FleetAddress(0)), lease->id));
  fleet_.StartAll();
  ExpectRanksRideItOutUntilItIsDeleted(key);
}

TEST_F(EtcdInputTest, ALeaderKeyWithoutALeaseLeadsNobody) {
  const std::string key = fleet_.prefix() + "/coordinator/0";
  ASSERT_OK(fleet_.etcd().Put(key, absl::StrCat("0 ", fleet_.FleetAddress(0))));  // Rank 0's value, no lease.
  fleet_.StartAll();
  ExpectRanksRideItOutUntilItIsDeleted(key);
}

TEST_F(EtcdInputTest, ALeaderKeyOfGarbageLeadsNobody) {
  absl::StatusOr<etcd::Lease> lease = fleet_.etcd().GrantLease(absl::Seconds(120));
  ASSERT_OK(lease);
  const std::string key = fleet_.prefix() + "/coordinator/0";
  ASSERT_OK(fleet_.etcd().Put(key, std::string("0 \x01\xff:99999 extra"), lease->id));
  fleet_.StartAll();
  ExpectRanksRideItOutUntilItIsDeleted(key);
}

TEST_F(EtcdInputTest, MalformedLivenessKeysListNobody) {
  absl::StatusOr<etcd::Lease> lease = fleet_.etcd().GrantLease(absl::Seconds(120));
  ASSERT_OK(lease);
  const std::string members = fleet_.prefix() + "/members/";
  ASSERT_OK(fleet_.etcd().Put(members + "2147483647", "7 127.0.0.1:1", lease->id));
  ASSERT_OK(fleet_.etcd().Put(members + "-1", "7 127.0.0.1:1", lease->id));
  ASSERT_OK(fleet_.etcd().Put(members + "x", "garbage", lease->id));
  fleet_.StartAll();
  ASSERT_TRUE(fleet_.WaitWhole(absl::Seconds(30))) << "the fleet did not form";
  absl::SleepFor(2 * kLeaderTtl);  // Listings go on: nothing changes.
  for (int r = 0; r < kFleet; ++r) {
    ASSERT_TRUE(fleet_.Running(r)) << "rank " << r << " died:\n" << fleet_.Log(r);
    EXPECT_EQ(fleet_.EtcdValueRefusals(r), 3) << "rank " << r;
  }
  EXPECT_TRUE(fleet_.WaitWhole(absl::Seconds(5))) << "the fleet did not stay whole";
}

}  // namespace
}  // namespace orthoserve
