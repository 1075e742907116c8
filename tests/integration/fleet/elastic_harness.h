// The fault tests' harness (elastic_test.cc: the static coordinator; elected_test.cc: etcd):
// S real orthoserve rank processes on loopback, started and signalled one by one, and a W = 4
// trainer group plus a lone client stepping continuously through the C++ clients, checking every
// result against the fault-free run and timing how long each fault held them up.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cpp/client.h"
#include "client/cpp/group_client.h"
#include "common/shape.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/binaries/subprocess.h"
#include "tests/integration/fleet/fleet_test_util.h"
#include "tests/util/status_matchers.h"

namespace orthoserve::elastic {

using client::Client;
using client::ClientOptions;
using client::GroupClient;
using client::MatrixInput;
using client::MatrixOutput;
using testing::Subprocess;
using testing::StatusIs;

inline constexpr int kFleet = 3;
inline constexpr int kWorld = 4;
inline constexpr int kVariants = 4;  // Distinct inputs; step s uses variant s % kVariants.
inline constexpr absl::Duration kPeer = absl::Seconds(2);
inline constexpr absl::Duration kDrain = absl::Seconds(5);
inline constexpr absl::Duration kRestartDelay = absl::Milliseconds(500);
// A rank must be gone within the drain timeout plus its graceful leave and teardown.
inline constexpr absl::Duration kExitMargin = absl::Seconds(6);
// The fleet must be whole again this long after a fault ends.
inline constexpr absl::Duration kReformBound = absl::Seconds(15);
// The clients' keepalive: a call on a stopped rank ends this long after the stop at most
// (a ping after a second without one, unanswered for a second).
inline constexpr absl::Duration kClientKeepalive = absl::Seconds(1);
// A trainer stalls at most the peer timeout plus this when a rank stops (issue #26).
inline constexpr absl::Duration kStallMargin = absl::Seconds(3);

// The options of a fault test's clients (the group's and the lone one): `addresses`, a 60 s
// attempt, and the keepalive the harness's stall bounds count on (kClientKeepalive).
inline ClientOptions WorkloadClient(std::vector<std::string> addresses) {
  ClientOptions o;
  o.addresses = std::move(addresses);
  o.timeout = absl::Seconds(60);
  o.keepalive_time = kClientKeepalive;
  o.keepalive_timeout = kClientKeepalive;
  return o;
}

// S rank processes, started, signalled and restarted one by one.
class Fleet {
 public:
  // `membership`: empty for the static coordinator (rank 0), or "etcd://HOSTS/PREFIX" for an
  // elected one; `extra` flags go to every rank.
  explicit Fleet(int world, const std::string& name, std::string membership = "",
                 std::vector<std::string> extra = {})
      : world_(world), membership_(std::move(membership)), extra_(std::move(extra)), ranks_(world) {
    base_ = testing::FreeBasePort(world, 30000);
    dir_ = ::testing::TempDir() + "/" + name + "-" + std::to_string(getpid());
    std::system(("mkdir -p " + dir_).c_str());
  }
  ~Fleet() {
    for (auto& r : ranks_) r.reset();  // SIGKILL whatever still runs.
  }

  std::string Address(int r) const { return absl::StrCat(Host(r), ":", base_ + r); }
  // Rank r's loopback address: 127.0.0.1, or 127.0.0.(10+r) after DistinctHosts.
  std::string Host(int r) const { return distinct_hosts_ ? absl::StrCat("127.0.0.", 10 + r) : "127.0.0.1"; }
  // From now on rank r listens (public, fleet and collective ports) on its own loopback address,
  // 127.0.0.(10+r) (not 127.0.0.1, where etcd and the clients are), so that the traffic between
  // two ranks can be told apart (partition_test.cc).
  void DistinctHosts() { distinct_hosts_ = true; }
  // From now on rank r's command is `wrap(r)` followed by the server's (e.g. setpriv running it
  // under a uid of its own).
  void Wrap(std::function<std::vector<std::string>(int)> wrap) { wrap_ = std::move(wrap); }

  void Start(int r) {
    std::vector<std::string> argv;
    if (wrap_) argv = wrap_(r);
    argv.insert(argv.end(), {ORTHOSERVE_BINARY,
                                     "--rank", std::to_string(r),
                                     "--world", std::to_string(world_),
                                     "--listen", Address(r),
                                     "--fleet-listen", absl::StrCat(Host(r), ":", base_ + 50 + r),
                                     "--metrics-address", "",
                                     "--fleet-peer-timeout", absl::StrCat(absl::ToInt64Seconds(kPeer), "s"),
                                     "--drain-timeout", absl::StrCat(absl::ToInt64Seconds(kDrain), "s"),
                                     "--rendezvous-timeout", "30s",
                                     // The clients below ping every second (kClientKeepalive).
                                     "--grpc-min-client-ping-interval", "500ms"});
    if (membership_.empty()) {
      argv.insert(argv.end(), {"--coordinator", absl::StrCat(Host(0), ":", base_ + 50)});
    } else {
      argv.insert(argv.end(), {"--membership", membership_});
    }
    argv.insert(argv.end(), extra_.begin(), extra_.end());
    auto p = Subprocess::Start(argv, absl::StrCat(dir_, "/rank", r, "-", starts_++));
    ASSERT_OK(p);
    ranks_[r] = std::move(*p);
  }
  void StartAll() {
    for (int r = 0; r < world_; ++r) Start(r);
  }
  Subprocess& rank(int r) { return *ranks_[r]; }

  // Ready members as rank r sees them (-1 when it does not answer, or is not ready itself).
  int ReadyMembers(int r) {
    absl::StatusOr<v1::ServerInfo> info = Info(r);
    if (!info.ok() || !info->ready()) return -1;
    int n = 0;
    for (const v1::FleetMember& m : info->members()) n += m.ready() ? 1 : 0;
    return n;
  }
  // Rank r's GetServerInfo: one attempt of at most a second.
  absl::StatusOr<v1::ServerInfo> Info(int r) {
    ClientOptions o;
    o.address = Address(r);
    o.timeout = absl::Seconds(1);
    o.retry.enabled = false;
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Create(o);
    if (!c.ok()) return c.status();
    return (*c)->GetServerInfo();
  }
  // Every rank's address, in rank order.
  std::vector<std::string> Addresses() const {
    std::vector<std::string> out;
    for (int r = 0; r < world_; ++r) out.push_back(Address(r));
    return out;
  }
  // Waits until every rank is a member of a formed generation of all S ranks.
  absl::Duration WaitWhole(absl::Duration timeout) {
    const absl::Time start = absl::Now();
    while (absl::Now() - start < timeout) {
      bool whole = true;
      for (int r = 0; r < world_ && whole; ++r) whole = ReadyMembers(r) == world_;
      if (whole) return absl::Now() - start;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return absl::InfiniteDuration();
  }
  // Waits until rank `observer` no longer lists `gone` among the ready members.
  absl::Duration WaitDropped(int observer, absl::Duration timeout) {
    const absl::Time start = absl::Now();
    while (absl::Now() - start < timeout) {
      const int n = ReadyMembers(observer);
      if (n >= 0 && n < world_) return absl::Now() - start;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return absl::InfiniteDuration();
  }

 private:
  const int world_;
  const std::string membership_;
  const std::vector<std::string> extra_;
  int base_ = 0;
  int starts_ = 0;
  bool distinct_hosts_ = false;
  std::function<std::vector<std::string>(int)> wrap_;
  std::string dir_;
  std::vector<std::unique_ptr<Subprocess>> ranks_;
};

struct Case {
  std::string name;
  Matrix2d shape;
  v1::Algorithm algorithm;
  int partition_dim;
};

// Every algorithm whose result does not depend on how the fleet is cut (TP_DISTRIBUTED sums its
// Gram in an order that follows the placement, so it agrees within tolerance only; the
// distributed tests hold it to that).
inline const std::vector<Case>& Batch() {
  static const std::vector<Case> cases = {
      {"auto_rows", {48, 32}, v1::ALGORITHM_AUTO, 0},
      {"auto_cols", {24, 64}, v1::ALGORITHM_AUTO, 1},
      {"row_sharded", {40, 24}, v1::ALGORITHM_ROW_SHARDED, 0},
      {"gathered", {36, 36}, v1::ALGORITHM_GATHERED, 1},
      {"tp_duplicated", {32, 48}, v1::ALGORITHM_TP_DUPLICATED, 1},
      {"tp_blockwise", {32, 24}, v1::ALGORITHM_TP_BLOCKWISE, 0},
  };
  return cases;
}

inline Block BlockOf(const Case& c, int rank, int world) { return testing::ChunkBlock(c.shape, c.partition_dim, rank, world); }

inline std::vector<float> Random(Matrix2d m, uint32_t seed) { return testing::RandomMatrix(m, seed); }

// Trainer rank r's blocks of variant v, owned here.
struct TrainerInputs {
  std::vector<std::vector<float>> data;
  std::vector<MatrixInput> inputs;
};

inline TrainerInputs MakeInputs(int variant, int r, int world = kWorld) {
  TrainerInputs t;
  const std::vector<Case>& cases = Batch();
  t.data.resize(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const std::vector<float> full = Random(c.shape, 1000 * variant + static_cast<uint32_t>(i));
    const Block b = BlockOf(c, r, world);
    t.data[i].resize(static_cast<size_t>(b.numel()));
    CopyBlockOut(full.data(), c.shape.cols, b, sizeof(float), t.data[i].data());
    MatrixInput in;
    in.name = c.name;
    in.shape = {c.shape.rows, c.shape.cols};
    in.data = t.data[i].data();
    in.bytes = t.data[i].size() * sizeof(float);
    in.algorithm = c.algorithm;
    in.partition_dim = c.partition_dim;
    in.block = b;
    in.options.precision = Precision::kHighest;
    t.inputs.push_back(in);
  }
  return t;
}

// What a workload thread saw.
struct Tally {
  std::atomic<int64_t> steps{0};
  std::mutex mu;
  std::vector<std::string> errors;      // Failures that reached the caller.
  std::vector<std::string> mismatches;  // Results that differ from the fault-free run.
  void Error(const std::string& e) {
    std::lock_guard<std::mutex> lock(mu);
    if (errors.size() < 20) errors.push_back(e);
  }
  void Mismatch(const std::string& e) {
    std::lock_guard<std::mutex> lock(mu);
    if (mismatches.size() < 20) mismatches.push_back(e);
  }
};

using Bytes = std::vector<std::vector<char>>;  // One result per matrix.

inline Bytes ResultBytes(const std::vector<MatrixOutput>& out) {
  Bytes b;
  for (const MatrixOutput& o : out) b.emplace_back(o.data.begin(), o.data.end());
  return b;
}

// The W = 4 group and the lone client, stepping until told to stop.
class Workload {
 public:
  Workload(GroupClient* group, Client* lone) : group_(group), lone_(lone) {
    for (int v = 0; v < kVariants; ++v) {
      for (int r = 0; r < kWorld; ++r) inputs_[v][r] = MakeInputs(v, r);
    }
    lone_data_ = Random({64, 40}, 77);
  }

  void Start() {
    for (int r = 0; r < kWorld; ++r) threads_.emplace_back([this, r] { Trainer(r); });
    threads_.emplace_back([this] { Lone(); });
  }
  // Every trainer runs every step up to one past the furthest started, then all stop.
  void Stop() {
    last_step_.store(started_.load() + 1);
    stop_lone_.store(true);
    for (std::thread& t : threads_) t.join();
  }
  int64_t group_steps() const { return done_.load(); }
  // The longest time the group (or the lone client) went without completing a step within
  // [from, to], counted from its last step before `from`: what a trainer saw of a fault.
  absl::Duration LongestStall(absl::Time from, absl::Time to, bool group) {
    std::lock_guard<std::mutex> lock(done_mu_);
    const std::vector<absl::Time>& done = group ? group_done_at_ : lone_done_at_;
    absl::Time prev = from;
    for (absl::Time t : done) {
      if (t <= from) prev = t;
    }
    absl::Duration longest = absl::ZeroDuration();
    for (absl::Time t : done) {
      if (t <= from || t > to) continue;
      longest = std::max(longest, t - prev);
      prev = t;
    }
    return std::max(longest, to - prev);
  }
  int64_t lone_steps() const { return lone_tally_.steps.load(); }
  // Waits until `n` more group and lone steps have completed (bounded).
  bool Progress(int n, absl::Duration timeout) {
    const int64_t g = group_steps(), l = lone_steps();
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      if (group_steps() >= g + n && lone_steps() >= l + n) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }
  Tally& trainers() { return tally_; }
  Tally& lone() { return lone_tally_; }

 private:
  void Trainer(int r) {
    for (int64_t s = 0; s <= last_step_.load(); ++s) {
      int64_t seen = started_.load();
      while (seen < s && !started_.compare_exchange_weak(seen, s)) {
      }
      const int v = static_cast<int>(s % kVariants);
      absl::StatusOr<std::vector<MatrixOutput>> out =
          group_->Step("elastic", "g", s, r, kWorld, inputs_[v][r].inputs);
      if (!out.ok()) {
        tally_.Error(absl::StrCat("trainer ", r, " step ", s, ": ", out.status().ToString()));
        continue;
      }
      for (const MatrixOutput& o : *out) {
        if (!o.status.ok()) tally_.Error(absl::StrCat("trainer ", r, " step ", s, " ", o.name, ": ", o.status.ToString()));
      }
      Bytes got = ResultBytes(*out);
      {
        std::lock_guard<std::mutex> lock(ref_mu_);
        if (s < kVariants) {
          reference_[v][r] = got;  // The fault-free run.
        } else if (got != reference_[v][r]) {
          tally_.Mismatch(absl::StrCat("trainer ", r, " step ", s));
        }
      }
      if (r == 0) {
        done_.fetch_add(1);
        std::lock_guard<std::mutex> lock(done_mu_);
        group_done_at_.push_back(absl::Now());
      }
      tally_.steps.fetch_add(1);
    }
  }

  void Lone() {
    MatrixInput in;
    in.name = "lone";
    in.shape = {64, 40};
    in.data = lone_data_.data();
    in.bytes = lone_data_.size() * sizeof(float);
    in.options.precision = Precision::kHighest;
    Bytes first;
    while (!stop_lone_.load()) {
      absl::StatusOr<std::vector<MatrixOutput>> out = lone_->Step(client::StepOptions{}, {in});
      if (!out.ok()) {
        lone_tally_.Error(out.status().ToString());
        continue;
      }
      if (!(*out)[0].status.ok()) lone_tally_.Error((*out)[0].status.ToString());
      Bytes got = ResultBytes(*out);
      if (first.empty()) {
        first = got;
      } else if (got != first) {
        lone_tally_.Mismatch(absl::StrCat("lone step ", lone_tally_.steps.load()));
      }
      lone_tally_.steps.fetch_add(1);
      std::lock_guard<std::mutex> lock(done_mu_);
      lone_done_at_.push_back(absl::Now());
    }
  }

  GroupClient* group_;
  Client* lone_;
  TrainerInputs inputs_[kVariants][kWorld];
  std::vector<float> lone_data_;
  std::mutex ref_mu_;
  Bytes reference_[kVariants][kWorld];
  std::atomic<int64_t> started_{0};
  std::atomic<int64_t> last_step_{std::numeric_limits<int64_t>::max()};
  std::atomic<int64_t> done_{0};
  std::atomic<bool> stop_lone_{false};
  std::mutex done_mu_;
  std::vector<absl::Time> group_done_at_;  // When each group step completed (on trainer 0).
  std::vector<absl::Time> lone_done_at_;
  Tally tally_;
  Tally lone_tally_;
  std::vector<std::thread> threads_;
};

inline std::string FormatSeconds(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return "never";
  return absl::StrFormat("%.2f s", absl::ToDoubleSeconds(d));
}


// The end of every fault test's run: no failure and no wrong result reached a caller, and the
// group made progress.
inline void ExpectCleanRun(Workload& work) {
  EXPECT_THAT(work.trainers().errors, ::testing::IsEmpty());
  EXPECT_THAT(work.trainers().mismatches, ::testing::IsEmpty());
  EXPECT_THAT(work.lone().errors, ::testing::IsEmpty());
  EXPECT_THAT(work.lone().mismatches, ::testing::IsEmpty());
  EXPECT_GT(work.group_steps(), 20);
}

// Nothing is left hanging: every rank of `fleet` (world `world`) exits 0 on SIGTERM within the
// drain timeout and its margin.
inline void ExpectEveryRankExitsOnSigterm(Fleet& fleet, int world) {
  for (int r = 0; r < world; ++r) fleet.rank(r).Signal(SIGTERM);
  for (int r = 0; r < world; ++r) {
    absl::StatusOr<int> code = fleet.rank(r).Wait(kDrain + kExitMargin);
    ASSERT_TRUE(code.ok()) << code.status() << "rank " << r << " did not exit";
    EXPECT_EQ(*code, 0) << "rank " << r;
  }
}

}  // namespace orthoserve::elastic
