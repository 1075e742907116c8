// A fixture for the tests of shared-memory regions through a real Server: a Server on
// 127.0.0.1:0 with a token file of two tenants (alice: secret-a, mallory: secret-m), its handover
// socket in a temporary directory, stubs, and a client's region (a sealed memfd mapped here).
#pragma once

#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <deque>
#include <fstream>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "orthoserve/v1/orthogonalizer.grpc.pb.h"
#include "server/app/server.h"
#include "tests/unit/rpc/rpc_test_util.h"
#include "tests/unit/shm/memfd_util.h"
#include "tests/util/http_get.h"

namespace orthoserve::testing {

// A client's region: a sealed memfd of `size` bytes, mapped here, handed over and registered.
struct ClientRegion {
  OwnedFd fd;
  OwnedFd lifeline;  // The handover connection: the region is dropped when it closes.
  char* data = nullptr;
  int64_t size = 0;
  std::string id;
  ClientRegion() = default;
  ClientRegion(const ClientRegion&) = delete;
  ClientRegion& operator=(const ClientRegion&) = delete;
  ~ClientRegion() {
    if (data != nullptr) munmap(data, static_cast<size_t>(size));
  }
};

// Bytes of the memfds Ticket() hands over.
inline constexpr int64_t kFixtureMemfdBytes = 1 << 20;

class ShmServerTest : public ::testing::Test {
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
    OwnedFd fd = MakeMemfd(kFixtureMemfdBytes);
    const int fds[] = {fd.get()};
    const std::string answer = HandOver(socket_, fds, 1, &lifelines_.emplace_back());
    EXPECT_THAT(answer, ::testing::StartsWith("OK "));
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
  // Makes, maps, hands over and registers (as `token`'s tenant) a region of `size` bytes.
  std::unique_ptr<ClientRegion> NewRegion(const std::string& token, int64_t size) {
    auto r = std::make_unique<ClientRegion>();
    r->fd = MakeMemfd(size);
    r->size = size;
    void* p = mmap(nullptr, static_cast<size_t>(size), PROT_READ | PROT_WRITE, MAP_SHARED, r->fd.get(), 0);
    EXPECT_NE(p, MAP_FAILED);
    if (p != MAP_FAILED) r->data = static_cast<char*>(p);
    const int fds[] = {r->fd.get()};
    const std::string answer = HandOver(socket_, fds, 1, &r->lifeline);
    EXPECT_THAT(answer, ::testing::StartsWith("OK "));
    v1::Region region;
    EXPECT_TRUE(Register(token, answer.size() > 3 ? answer.substr(3) : "", &region).ok());
    r->id = region.region_id();
    return r;
  }

  std::string Scrape() { return HttpExchange(server_->metrics_port(), "GET /metrics HTTP/1.1"); }

  std::deque<OwnedFd> lifelines_;  // Of the tickets Ticket() handed out: open until the test ends.
  std::string dir_;
  std::string tokens_;
  std::string socket_;
  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::SharedMemory::Stub> shm_;
};

}  // namespace orthoserve::testing
