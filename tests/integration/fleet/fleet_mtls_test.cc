// A fleet that only its members can use (issue 24), with the real binaries on loopback: a 3-rank
// CPU fleet running with fleet mutual TLS (throw-away certificates from
// deploy/local/fleet_certs.sh) while a W = 3 trainer group steps continuously, retries off.
//  - Callers without a fleet certificate (plaintext, and TLS without a client certificate) and a
//    caller with a certificate of the fleet's CA that names no member each call Join as rank 1,
//    Abort on a live step's key, StoreSet and Peer Compute: every call is refused (at the
//    handshake, or PERMISSION_DENIED naming what the certificate names), the live step and the
//    group's steps succeed, the generation does not change, and the refusals are counted.
//  - A second orthoserve process claiming rank 1 (no fleet certificate; then rank 2's) leaves
//    the generation number and the membership unchanged for 12 s while group steps succeed.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "client/cpp/group_client.h"
#include "common/shape.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "orthoserve/fleet/v1/fleet.grpc.pb.h"
#include "proto/convert/grpc_status.h"
#include "server/fleet/wire/fleet_client.h"
#include "server/fleet/wire/fleet_codec.h"
#include "server/fleet/wire/fleet_tls.h"
#include "server/fleet/wire/plan_codec.h"
#include "tests/integration/binaries/subprocess.h"
#include "tests/integration/fleet/fleet_info_util.h"
#include "tests/integration/fleet/fleet_test_util.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using client::Client;
using client::ClientOptions;
using client::GroupClient;
using client::MatrixInput;
using client::MatrixOutput;
using ::orthoserve::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing::Subprocess;

constexpr int kFleet = 3;
constexpr int kWorld = 3;  // Trainer ranks of the steady group.
constexpr Matrix2d kShape{48, 32};
constexpr absl::Duration kWatch = absl::Seconds(12);  // How long a rogue rank 1 is watched.

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The fleet's processes and certificates. Rank r: public port P + r, fleet port P + 50 + r,
// metrics P + 100 + r.
class MtlsFleet {
 public:
  MtlsFleet() {
    base_ = testing::FreeBasePort(kFleet + 1, 33000);
    dir_ = absl::StrCat(::testing::TempDir(), "/fleet-mtls-", getpid(), "-", ++instances_);
    const std::string certs = ORTHOSERVE_FLEET_CERTS_SCRIPT;
    made_ = base_ > 0 && std::system(absl::StrCat(certs, " fleet ", dir_, " ", kFleet).c_str()) == 0 &&
            std::system(absl::StrCat(certs, " cert ", dir_, " nobody DNS:somebody-else DNS:localhost").c_str()) == 0;
  }
  ~MtlsFleet() {
    for (auto& r : ranks_) r.reset();  // SIGKILL whatever still runs.
    rogue_.reset();
    std::system(absl::StrCat("rm -rf ", dir_).c_str());
  }
  bool made() const { return made_; }

  std::string Address(int r) const { return absl::StrCat("127.0.0.1:", base_ + r); }
  std::string FleetAddress(int r) const { return absl::StrCat("127.0.0.1:", base_ + 50 + r); }
  int MetricsPort(int r) const { return base_ + 100 + r; }
  std::string Cert(const std::string& name) const { return absl::StrCat(dir_, "/", name); }

  // The arguments of a rank process as rank `rank` on ports of slot `slot` (a rogue uses slot
  // kFleet), with certificate `cert` ("": none).
  std::vector<std::string> Args(int rank, int slot, const std::string& cert) const {
    // Flag and value pairs, one pair a line.
    // clang-format off
    std::vector<std::string> argv = {ORTHOSERVE_BINARY,
                                     "--rank", std::to_string(rank),
                                     "--world", std::to_string(kFleet),
                                     "--listen", Address(slot),
                                     "--fleet-listen", FleetAddress(slot),
                                     "--coordinator", FleetAddress(0),
                                     "--metrics-address", absl::StrCat("127.0.0.1:", MetricsPort(slot)),
                                     "--fleet-peer-timeout", "3s",
                                     "--rendezvous-timeout", "30s"};
    // clang-format on
    if (!cert.empty()) {
      for (const std::string& a : {std::string("--fleet-tls-cert"), Cert(cert + ".crt"), std::string("--fleet-tls-key"),
                                   Cert(cert + ".key"), std::string("--fleet-tls-ca"), Cert("ca.crt")}) {
        argv.push_back(a);
      }
    }
    return argv;
  }
  void StartAll() {
    ranks_.resize(kFleet);
    for (int r = 0; r < kFleet; ++r) {
      auto p = Subprocess::Start(Args(r, r, absl::StrCat("rank", r)), absl::StrCat(dir_, "/rank", r));
      ASSERT_OK(p);
      ranks_[r] = *std::move(p);
    }
  }
  // A second process claiming rank 1, on its own ports, with certificate `cert` ("": none).
  void StartRogue(const std::string& cert) {
    auto p = Subprocess::Start(Args(1, kFleet, cert), absl::StrCat(dir_, "/rogue-", cert.empty() ? "plain" : cert));
    ASSERT_OK(p);
    rogue_ = *std::move(p);
  }
  Subprocess* rogue() { return rogue_.get(); }
  void StopRogue() { rogue_.reset(); }
  std::string RankLog(int r) const { return ranks_[r] == nullptr ? "" : ranks_[r]->Stderr(); }

  // Rank r's GetServerInfo (no retries).
  absl::StatusOr<v1::ServerInfo> Info(int r) const {
    ClientOptions o;
    o.address = Address(r);
    o.timeout = absl::Seconds(2);
    o.retry.enabled = false;
    auto c = Client::Create(o);
    if (!c.ok()) return c.status();
    return (*c)->GetServerInfo();
  }
  // Waits until every rank reports a formed generation of all S members.
  bool WaitWhole(absl::Duration timeout) const {
    return testing::WaitWholeFleet([this](int r) { return Info(r); }, kFleet, timeout);
  }

  // orthoserve_integrity_refusals_total{cause="not_a_member"} on rank r (-1: not scraped).
  double NotAMember(int r) const { return testing::IntegrityRefusals(MetricsPort(r), "not_a_member"); }

 private:
  static inline int instances_ = 0;
  int base_ = 0;
  std::string dir_;
  bool made_ = false;
  std::vector<std::unique_ptr<Subprocess>> ranks_;
  std::unique_ptr<Subprocess> rogue_;
};

// The generation and the membership as rank 0 lists them: "generation G: r@address ready, ...".
std::string Membership(const v1::ServerInfo& info) {
  std::string out = absl::StrCat("generation ", info.fleet_generation(), ":");
  for (const v1::FleetMember& m : info.members()) {
    absl::StrAppend(&out, " ", m.rank(), "@", m.address(), m.ready() ? " ready" : " out");
  }
  return out;
}

// Trainer rank r of `world`'s row block of the seeded kShape matrix, owned here.
struct TrainerInput {
  std::vector<float> data;
  MatrixInput input;
};
TrainerInput MakeInput(int r, int world, uint32_t seed) {
  TrainerInput t;
  const std::vector<float> full = testing::RandomMatrix(kShape, seed);
  const Block b = testing::ChunkBlock(kShape, 0, r, world);
  t.data.resize(static_cast<size_t>(b.numel()));
  CopyBlockOut(full.data(), kShape.cols, b, sizeof(float), t.data.data());
  t.input.name = "w";
  t.input.shape = {kShape.rows, kShape.cols};
  t.input.data = t.data.data();
  t.input.bytes = t.data.size() * sizeof(float);
  t.input.block = b;
  t.input.options.precision = Precision::kHighest;
  return t;
}

GroupClient::Options GroupOptions(const MtlsFleet& fleet, const std::string& run) {
  GroupClient::Options o;
  o.client.address = fleet.Address(0);
  o.client.timeout = absl::Seconds(30);
  o.client.retry.enabled = false;  // Any disturbance of the fleet shows as a failed step.
  o.run_id = run;
  return o;
}

// A W = 3 group stepping until stopped: every step must succeed with the bits of its first.
class SteadyGroup {
 public:
  explicit SteadyGroup(GroupClient* group) : group_(group) {
    for (int r = 0; r < kWorld; ++r) inputs_.push_back(MakeInput(r, kWorld, 7));
    for (int r = 0; r < kWorld; ++r) threads_.emplace_back([this, r] { Trainer(r); });
  }
  ~SteadyGroup() { Stop(); }
  void Stop() {
    last_.store(std::min(last_.load(), started_.load() + 1));
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  int64_t steps() const { return done_.load(); }
  bool Progress(int n, absl::Duration timeout) const {
    const int64_t from = steps();
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline && steps() < from + n) absl::SleepFor(absl::Milliseconds(20));
    return steps() >= from + n;
  }
  std::vector<std::string> errors() {
    std::lock_guard<std::mutex> lock(mu_);
    return errors_;
  }

 private:
  void Trainer(int r) {
    std::vector<char> first;
    for (int64_t s = 0; s <= last_.load(); ++s) {
      int64_t seen = started_.load();
      while (seen < s && !started_.compare_exchange_weak(seen, s)) {
      }
      absl::StatusOr<std::vector<MatrixOutput>> out = group_->Step("steady", "g", s, r, kWorld, {inputs_[r].input});
      std::string error;
      if (!out.ok()) {
        error = out.status().ToString();
      } else if (out->size() != 1 || !(*out)[0].status.ok()) {
        error = out->empty() ? "no result" : (*out)[0].status.ToString();
      } else if (first.empty()) {
        first.assign((*out)[0].data.begin(), (*out)[0].data.end());
      } else if (!std::equal(first.begin(), first.end(), (*out)[0].data.begin(), (*out)[0].data.end())) {
        error = "a result differs from the first step's";
      }
      if (!error.empty()) {
        std::lock_guard<std::mutex> lock(mu_);
        if (errors_.size() < 10) errors_.push_back(absl::StrCat("trainer ", r, " step ", s, ": ", error));
      }
      if (r == 0) done_.fetch_add(1);
    }
  }

  GroupClient* group_;
  std::vector<TrainerInput> inputs_;
  std::atomic<int64_t> started_{0};
  std::atomic<int64_t> last_{std::numeric_limits<int64_t>::max()};
  std::atomic<int64_t> done_{0};
  std::mutex mu_;
  std::vector<std::string> errors_;
  std::vector<std::thread> threads_;
};

// The four calls an outsider makes, over `fleet_channel` (to rank 0's fleet port) and
// `peer_channel` (to rank 1's), each returning its status.
struct Attack {
  absl::Status join, abort, store_set, compute;
};
Attack AttackOver(const std::shared_ptr<grpc::Channel>& fleet_channel,
                  const std::shared_ptr<grpc::Channel>& peer_channel, const GroupKey& live) {
  auto deadline = [] { return std::chrono::system_clock::now() + std::chrono::seconds(5); };
  auto fleet = fleet::v1::Fleet::NewStub(fleet_channel);
  Attack a;
  {
    grpc::ClientContext context;
    context.set_deadline(deadline());
    fleet::v1::JoinRequest request;
    *request.mutable_member() = MemberToProto(Member{1, "127.0.0.1:1", 4242, 0});
    request.set_protocol(kFleetProtocol);
    fleet::v1::JoinResponse response;
    a.join = FromGrpcStatus(fleet->Join(&context, request, &response));
  }
  {
    grpc::ClientContext context;
    context.set_deadline(deadline());
    fleet::v1::AbortRequest request;
    *request.mutable_key() = GroupKeyToProto(live);
    request.set_trainer_rank(1);
    request.set_code(static_cast<int>(absl::StatusCode::kCancelled));
    request.set_message("an outsider's abort");
    request.set_fleet_rank(1);
    request.set_incarnation(4242);
    fleet::v1::AbortResponse response;
    a.abort = FromGrpcStatus(fleet->Abort(&context, request, &response));
  }
  {
    grpc::ClientContext context;
    context.set_deadline(deadline());
    fleet::v1::StoreSetRequest request;
    request.set_key("outsider");
    request.set_value("x");
    fleet::v1::StoreSetResponse response;
    a.store_set = FromGrpcStatus(fleet->StoreSet(&context, request, &response));
  }
  {
    auto peer = fleet::v1::Peer::NewStub(peer_channel);
    grpc::ClientContext context;
    context.set_deadline(deadline());
    fleet::v1::ComputeRequest request;
    request.set_tenant("default");
    request.set_job("outsider");
    MatrixPlan plan;
    plan.name = "w";
    plan.shape = {8, 4};
    plan.view = Matrix2d{8, 4};
    *request.mutable_plan() = MatrixPlanToProto(plan);
    const std::vector<float> data = testing::RandomMatrix(plan.view, 3);
    request.set_data(std::string(reinterpret_cast<const char*>(data.data()), data.size() * sizeof(float)));
    fleet::v1::ComputeResponse response;
    a.compute = FromGrpcStatus(peer->Compute(&context, request, &response));
    if (a.compute.ok()) a.compute = StatusFromCode(response.code(), response.message());
  }
  return a;
}

class FleetMtlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fleet_.made()) << "no free ports or no certificates (" << ORTHOSERVE_FLEET_CERTS_SCRIPT << ")";
    fleet_.StartAll();
    ASSERT_TRUE(fleet_.WaitWhole(absl::Seconds(40))) << "the fleet did not form; rank 0's log:\n" << fleet_.RankLog(0);
    auto group = GroupClient::Create(GroupOptions(fleet_, "steady-run"));
    ASSERT_OK(group);
    group_ = *std::move(group);
    steady_ = std::make_unique<SteadyGroup>(group_.get());
    ASSERT_TRUE(steady_->Progress(3, absl::Seconds(30))) << "the group does not step";
  }
  void TearDown() override {
    if (steady_ != nullptr) steady_->Stop();
  }

  MtlsFleet fleet_;
  std::unique_ptr<GroupClient> group_;
  std::unique_ptr<SteadyGroup> steady_;
};

TEST_F(FleetMtlsTest, OutsidersCannotJoinAbortUseTheStoreOrComputeOnAPeer) {
  absl::StatusOr<v1::ServerInfo> before = fleet_.Info(0);
  ASSERT_OK(before);
  const double refused0 = fleet_.NotAMember(0), refused1 = fleet_.NotAMember(1);
  ASSERT_GE(refused0, 0);
  ASSERT_GE(refused1, 0);

  // A live step: trainer 0 of a W = 2 group has reported; trainer 1 comes after the attacks.
  auto victim = GroupClient::Create(GroupOptions(fleet_, "victim-run"));
  ASSERT_OK(victim);
  const TrainerInput in0 = MakeInput(0, 2, 11), in1 = MakeInput(1, 2, 11);
  auto first = std::async(std::launch::async, [&] { return (*victim)->Step("victim", "g", 1, 0, 2, {in0.input}); });
  absl::SleepFor(absl::Milliseconds(500));
  const GroupKey live{"default", "victim", "g", 1, "victim-run"};

  // No fleet certificate: plaintext, and TLS with the fleet's CA but no client certificate.
  grpc::SslCredentialsOptions no_cert;
  no_cert.pem_root_certs = Slurp(fleet_.Cert("ca.crt"));
  auto tls_channel = [&](const std::string& address, const std::string& name) {
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride(name);
    return grpc::CreateCustomChannel(address, grpc::SslCredentials(no_cert), args);
  };
  const Attack plaintext =
      AttackOver(grpc::CreateChannel(fleet_.FleetAddress(0), grpc::InsecureChannelCredentials()),
                 grpc::CreateChannel(fleet_.FleetAddress(1), grpc::InsecureChannelCredentials()), live);
  const Attack certless = AttackOver(tls_channel(fleet_.FleetAddress(0), "orthoserve-rank-0"),
                                     tls_channel(fleet_.FleetAddress(1), "orthoserve-rank-1"), live);
  for (const Attack* a : {&plaintext, &certless}) {
    // Refused at the handshake: the call never reaches a handler.
    EXPECT_THAT(a->join, StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
    EXPECT_THAT(a->abort, StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
    EXPECT_THAT(a->store_set, StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
    EXPECT_THAT(a->compute, StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
  }

  // A certificate of the fleet's CA that names no member: past the handshake, refused by name.
  FleetTlsOptions nobody_files{fleet_.Cert("nobody.crt"), fleet_.Cert("nobody.key"), fleet_.Cert("ca.crt")};
  absl::StatusOr<std::shared_ptr<const FleetTls>> nobody = FleetTls::Load(nobody_files, kFleet);
  ASSERT_OK(nobody);
  const Attack named_nobody = AttackOver(MakeFleetChannel(fleet_.FleetAddress(0), nobody->get(), 0).value(),
                                         MakeFleetChannel(fleet_.FleetAddress(1), nobody->get(), 1).value(), live);
  EXPECT_THAT(named_nobody.join,
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("Join refused: the caller claims fleet rank 1 (\"orthoserve-rank-1\") but its "
                                 "certificate names no fleet member (DNS:somebody-else, DNS:localhost)")));
  EXPECT_THAT(named_nobody.abort, StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("Abort refused")));
  EXPECT_THAT(named_nobody.store_set,
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("StoreSet refused: the caller's certificate "
                                                                      "names no fleet member")));
  EXPECT_THAT(named_nobody.compute, StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("Peer Compute refused")));
  // Even a member's certificate cannot abort for a process that is not that member.
  FleetTlsOptions rank2_files{fleet_.Cert("rank2.crt"), fleet_.Cert("rank2.key"), fleet_.Cert("ca.crt")};
  absl::StatusOr<std::shared_ptr<const FleetTls>> rank2 = FleetTls::Load(rank2_files, kFleet);
  ASSERT_OK(rank2);
  {
    auto stub = fleet::v1::Fleet::NewStub(MakeFleetChannel(fleet_.FleetAddress(0), rank2->get(), 0).value());
    grpc::ClientContext context;
    fleet::v1::AbortRequest request;
    *request.mutable_key() = GroupKeyToProto(live);
    request.set_code(static_cast<int>(absl::StatusCode::kCancelled));
    request.set_fleet_rank(2);
    request.set_incarnation(4242);  // Not the real rank 2's.
    fleet::v1::AbortResponse response;
    EXPECT_THAT(FromGrpcStatus(stub->Abort(&context, request, &response)),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("is not a member of generation")));
  }

  // The live step completes for both of its trainers, as if nothing had happened.
  absl::StatusOr<std::vector<MatrixOutput>> second = (*victim)->Step("victim", "g", 1, 1, 2, {in1.input});
  ASSERT_EQ(first.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  absl::StatusOr<std::vector<MatrixOutput>> first_out = first.get();
  ASSERT_OK(first_out);
  ASSERT_OK(second);
  EXPECT_OK((*first_out)[0].status);
  EXPECT_OK((*second)[0].status);

  ASSERT_TRUE(steady_->Progress(3, absl::Seconds(30)));
  absl::StatusOr<v1::ServerInfo> after = fleet_.Info(0);
  ASSERT_OK(after);
  EXPECT_EQ(Membership(*after), Membership(*before));
  // Rank 0 refused the three coordinator calls, rank 1 the peer compute (each counted once).
  EXPECT_EQ(fleet_.NotAMember(0), refused0 + 3);
  EXPECT_EQ(fleet_.NotAMember(1), refused1 + 1);
  steady_->Stop();
  EXPECT_THAT(steady_->errors(), IsEmpty());
}

TEST_F(FleetMtlsTest, ARogueRankOneChangesNeitherTheGenerationNorTheMembership) {
  absl::StatusOr<v1::ServerInfo> before = fleet_.Info(0);
  ASSERT_OK(before);
  const std::string expected = Membership(*before);
  for (const std::string cert : {"", "rank2"}) {
    SCOPED_TRACE(cert.empty() ? "a rogue rank 1 without a fleet certificate"
                              : "a rogue rank 1 with rank 2's certificate");
    const int64_t steps = steady_->steps();
    fleet_.StartRogue(cert);
    const absl::Time deadline = absl::Now() + kWatch;
    int samples = 0;
    while (absl::Now() < deadline) {
      absl::StatusOr<v1::ServerInfo> info = fleet_.Info(0);
      ASSERT_OK(info);
      ASSERT_EQ(Membership(*info), expected) << "after " << samples << " samples";
      ++samples;
      absl::SleepFor(absl::Milliseconds(200));
    }
    EXPECT_GE(samples, 30);
    // The rogue ran all along (it serves lone clients alone), refused as rank 1 each time it tried.
    ASSERT_TRUE(fleet_.rogue()->Running()) << fleet_.rogue()->Stderr();
    absl::StatusOr<v1::ServerInfo> rogue = fleet_.Info(kFleet);
    ASSERT_OK(rogue);
    EXPECT_FALSE(rogue->ready());
    if (!cert.empty()) {
      EXPECT_THAT(fleet_.rogue()->Stderr(),
                  HasSubstr("the caller claims fleet rank 1 (\"orthoserve-rank-1\") but its certificate names rank 2"));
    }
    fleet_.StopRogue();
    EXPECT_GE(steady_->steps(), steps + 10) << "the group barely stepped while the rogue ran";
  }
  absl::StatusOr<v1::ServerInfo> after = fleet_.Info(0);
  ASSERT_OK(after);
  EXPECT_EQ(Membership(*after), expected);
  steady_->Stop();
  EXPECT_THAT(steady_->errors(), IsEmpty());
}

}  // namespace
}  // namespace orthoserve
