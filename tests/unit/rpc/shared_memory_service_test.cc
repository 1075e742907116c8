// The SharedMemory service end to end in process: a Server on 127.0.0.1:0 with a token file of
// two tenants, memfds handed over on its real socket, and the register / list / unregister
// calls — regions off by default, tenant isolation, the socket's clean-up and the metrics.
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/rpc/shm_server_fixture.h"

namespace orthoserve::testing {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kSize = kFixtureMemfdBytes;
using SharedMemoryServiceTest = ShmServerTest;

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
  EXPECT_THAT(metrics, HasSubstr("orthoserve_shm_regions{memory=\"host\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("orthoserve_shm_region_bytes{memory=\"host\"} 1048576"));
  EXPECT_THAT(metrics, HasSubstr("orthoserve_shm_regions{memory=\"cuda\"} 0"));
  EXPECT_THAT(metrics, HasSubstr("orthoserve_shm_handovers_total{outcome=\"staged\"} 1"));

  ASSERT_TRUE(Unregister("secret-a", region.region_id()).ok());
  EXPECT_EQ(Unregister("secret-a", region.region_id()).error_code(), grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(List("secret-a", &alice).ok());
  EXPECT_EQ(alice.regions_size(), 0);
  EXPECT_THAT(Scrape(), HasSubstr("orthoserve_shm_regions{memory=\"host\"} 0"));
}

// A server on the cpu backend computes in host memory: it takes no CUDA IPC handle, says so, and
// advertises no device for them.
TEST_F(SharedMemoryServiceTest, ACpuServerRefusesCudaIpcHandlesWithFailedPrecondition) {
  StartServer(/*regions=*/true);
  v1::ServerInfo info;
  ASSERT_TRUE(StubFor(*server_)->GetServerInfo(Context("secret-a").get(), v1::GetServerInfoRequest(), &info).ok());
  EXPECT_EQ(info.shm_cuda_device(), "");
  const std::string line = "CUDA_IPC GPU-00000000-0000-0000-0000-000000000000 0 1024 " + std::string(128, 'a') + "\n";
  EXPECT_THAT(HandOverLine(socket_, line),
              ::testing::StartsWith("ERR FAILED_PRECONDITION this server does not open CUDA IPC handles"));
  EXPECT_THAT(Scrape(), HasSubstr("orthoserve_shm_handovers_total{outcome=\"refused_cuda_ipc\"} 1"));
  v1::ListRegionsResponse list;
  ASSERT_TRUE(List("secret-a", &list).ok());
  EXPECT_EQ(list.regions_size(), 0);
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
