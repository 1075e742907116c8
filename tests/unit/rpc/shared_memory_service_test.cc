// The SharedMemory service end to end in process: a Server on 127.0.0.1:0 with a token file of
// two tenants, memfds handed over on its real socket, and the register / list / unregister
// calls — regions off by default, tenant isolation, the socket's clean-up and the metrics.
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "orthoserve/v1/orthogonalizer.grpc.pb.h"
#include "server/app/server.h"
#include "tests/unit/rpc/rpc_test_util.h"
#include "tests/unit/shm/memfd_util.h"
#include "tests/util/http_get.h"

namespace orthoserve::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr int64_t kSize = 1 << 20;

class SharedMemoryServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/orthoserve-shm-rpc-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    tokens_ = dir_ + "/tokens";
    std::ofstream(tokens_) << "secret-a alice\nsecret-m mallory\n";
    socket_ = dir_ + "/shm.sock";
  }
  void TearDown() override {
    server_.reset();
    unlink(tokens_.c_str());
    unlink(socket_.c_str());
    rmdir(dir_.c_str());
  }

  void StartServer(bool regions) {
    ServerOptions o = TestServerOptions();
    o.metrics_address = "127.0.0.1:0";
    o.token_file = tokens_;
    if (regions) o.shm.socket = socket_;
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(o);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->port()), grpc::InsecureChannelCredentials());
    shm_ = v1::SharedMemory::NewStub(channel_);
  }

  // A context with `token` (none when empty) and a 10 s deadline.
  static std::unique_ptr<grpc::ClientContext> Context(const std::string& token) {
    auto context = std::make_unique<grpc::ClientContext>();
    if (!token.empty()) context->AddMetadata("authorization", "Bearer " + token);
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return context;
  }

  // Hands a fresh sealed memfd over; returns the ticket ("" and a test failure otherwise).
  std::string Ticket() {
    OwnedFd fd = MakeMemfd(kSize);
    const int fds[] = {fd.get()};
    const std::string answer = HandOver(socket_, fds, 1);
    EXPECT_THAT(answer, StartsWith("OK "));
    return answer.size() > 3 ? answer.substr(3) : "";
  }

  grpc::Status Register(const std::string& token, const std::string& ticket, v1::Region* region) {
    v1::RegisterRegionRequest request;
    request.set_ticket(ticket);
    request.set_name("momenta");
    return shm_->RegisterRegion(Context(token).get(), request, region);
  }
  grpc::Status List(const std::string& token, v1::ListRegionsResponse* response) {
    return shm_->ListRegions(Context(token).get(), v1::ListRegionsRequest(), response);
  }
  grpc::Status Unregister(const std::string& token, const std::string& id) {
    v1::UnregisterRegionRequest request;
    request.set_region_id(id);
    v1::UnregisterRegionResponse response;
    return shm_->UnregisterRegion(Context(token).get(), request, &response);
  }
  std::string Scrape() { return HttpExchange(server_->metrics_port(), "GET /metrics HTTP/1.1"); }

  std::string dir_;
  std::string tokens_;
  std::string socket_;
  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::SharedMemory::Stub> shm_;
};

TEST_F(SharedMemoryServiceTest, RegionsAreOffByDefaultAndEveryCallIsRefused) {
  StartServer(/*regions=*/false);
  v1::Region region;
  v1::ListRegionsResponse list;
  for (const grpc::Status& status : {Register("secret-a", "0123", &region), List("secret-a", &list),
                                     Unregister("secret-a", "0123"), List("", &list)}) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(status.error_message(), HasSubstr("--shm-socket"));
  }
  struct stat st;
  EXPECT_NE(lstat(socket_.c_str(), &st), 0);  // No socket was made.
  v1::ServerInfo info;
  ASSERT_TRUE(StubFor(*server_)->GetServerInfo(Context("secret-a").get(), v1::GetServerInfoRequest(), &info).ok());
  EXPECT_EQ(info.shm_socket(), "");
}

TEST_F(SharedMemoryServiceTest, ARegionBelongsToTheTenantThatRegisteredIt) {
  StartServer(/*regions=*/true);
  v1::ServerInfo info;
  ASSERT_TRUE(StubFor(*server_)->GetServerInfo(Context("secret-a").get(), v1::GetServerInfoRequest(), &info).ok());
  EXPECT_EQ(info.shm_socket(), socket_);

  const std::string ticket = Ticket();
  v1::Region region;
  EXPECT_EQ(Register("", ticket, &region).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  ASSERT_TRUE(Register("secret-a", ticket, &region).ok());
  EXPECT_EQ(region.region_id().size(), 32u);
  EXPECT_EQ(region.size(), kSize);
  EXPECT_EQ(region.name(), "momenta");
  EXPECT_EQ(region.peer_pid(), getpid());
  // The ticket was used: nobody can claim it again.
  v1::Region again;
  EXPECT_EQ(Register("secret-m", ticket, &again).error_code(), grpc::StatusCode::NOT_FOUND);

  v1::ListRegionsResponse alice, mallory;
  ASSERT_TRUE(List("secret-a", &alice).ok());
  ASSERT_TRUE(List("secret-m", &mallory).ok());
  ASSERT_EQ(alice.regions_size(), 1);
  EXPECT_EQ(alice.regions(0).region_id(), region.region_id());
  EXPECT_EQ(mallory.regions_size(), 0);
  EXPECT_EQ(Unregister("secret-m", region.region_id()).error_code(), grpc::StatusCode::NOT_FOUND);
  const std::string metrics = Scrape();
  EXPECT_THAT(metrics, HasSubstr("orthoserve_shm_regions 1"));
  EXPECT_THAT(metrics, HasSubstr("orthoserve_shm_region_bytes 1048576"));
  EXPECT_THAT(metrics, HasSubstr("orthoserve_shm_handovers_total{outcome=\"staged\"} 1"));

  ASSERT_TRUE(Unregister("secret-a", region.region_id()).ok());
  EXPECT_EQ(Unregister("secret-a", region.region_id()).error_code(), grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(List("secret-a", &alice).ok());
  EXPECT_EQ(alice.regions_size(), 0);
  EXPECT_THAT(Scrape(), HasSubstr("orthoserve_shm_regions 0"));
}

TEST_F(SharedMemoryServiceTest, TheSocketIsRemovedWhenTheServerStops) {
  StartServer(/*regions=*/true);
  struct stat st;
  ASSERT_EQ(lstat(socket_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  server_.reset();
  EXPECT_NE(lstat(socket_.c_str(), &st), 0);
}

}  // namespace
}  // namespace orthoserve::testing
