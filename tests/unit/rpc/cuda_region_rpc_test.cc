// CUDA IPC regions at the RPC layer, without CUDA: the SharedMemory service on a real gRPC server
// (127.0.0.1:0, a token file of two tenants) over a registry holding memory that says it is a
// GPU's (a fake: host bytes with a device UUID, as the handover socket stages an opened handle),
// and the ingress of slices (region_slices.h) — Region.cuda_device in RegisterRegion and
// ListRegions, the regions gauge by memory, slices of such a region leased as device memory, and
// another tenant refused. The real opener and the compute on device memory are tests/gpu's
// (cuda_ipc_emulation_gpu_test); the real server on a cpu backend refusing handles is
// shm_service_test's.
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "orthoserve/v1/orthogonalizer.grpc.pb.h"
#include "server/rpc/region_slices.h"
#include "server/rpc/shared_memory_service.h"
#include "server/rpc/spec_codec.h"
#include "server/shm/region_registry.h"
#include "tests/unit/rpc/rpc_test_util.h"
#include "tests/util/status_matchers.h"

namespace orthoserve::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kUuid[] = "GPU-e0e1e2e3-e4e5-e6e7-e8e9-eaebecedee00";

class FakeGpuMemory final : public RegionMemory {
 public:
  explicit FakeGpuMemory(int64_t size) : bytes_(static_cast<size_t>(size)) {}
  char* data() const override { return const_cast<char*>(bytes_.data()); }
  int64_t size() const override { return static_cast<int64_t>(bytes_.size()); }
  std::string cuda_device() const override { return kUuid; }

 private:
  std::vector<char> bytes_;
};

// The gauge value of `family`{memory=`memory`} in `metrics`, or -1.
double Gauge(const Metrics& metrics, const std::string& family, const std::string& memory) {
  for (const prometheus::MetricFamily& f : metrics.Collect()) {
    if (f.name != family) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      for (const prometheus::ClientMetric::Label& l : m.label) {
        if (l.name == "memory" && l.value == memory) return m.gauge.value;
      }
    }
  }
  return -1;
}

class CudaRegionRpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/orthoserve-cuda-rpc-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    tokens_ = dir_ + "/tokens";
    std::ofstream(tokens_) << "secret-a alice\nsecret-m mallory\n";
    auto auth = TokenAuth::FromFile(tokens_);
    ASSERT_OK(auth.status());
    auth_ = *std::move(auth);
    Metrics::Options mo;
    mo.process_metrics = false;
    auto metrics = Metrics::Create(mo);
    ASSERT_OK(metrics.status());
    metrics_ = *std::move(metrics);
    service_ = std::make_unique<SharedMemoryService>(&registry_, auth_.get(), metrics_.get(), absl::Seconds(5),
                                                     /*max_name_bytes=*/1024);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::SharedMemory::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    server_->Shutdown();
    unlink(tokens_.c_str());
    rmdir(dir_.c_str());
  }

  static std::unique_ptr<grpc::ClientContext> Context(const std::string& token) {
    auto context = std::make_unique<grpc::ClientContext>();
    context->AddMetadata("authorization", "Bearer " + token);
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return context;
  }

  // Stages fake GPU memory of `size` bytes (as the socket does for an opened handle) and
  // registers it through the service as `token`'s tenant.
  v1::Region Register(const std::string& token, int64_t size) {
    absl::StatusOr<std::string> ticket = registry_.Stage(std::make_unique<FakeGpuMemory>(size), PeerIdentity{getpid()},
                                                            ++lifelines_);
    EXPECT_OK(ticket.status());
    v1::RegisterRegionRequest request;
    request.set_ticket(ticket.value_or(""));
    request.set_name("gpu momenta");
    v1::Region region;
    grpc::Status status = stub_->RegisterRegion(Context(token).get(), request, &region);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return region;
  }

  std::string dir_;
  std::string tokens_;
  RegionRegistry registry_{RegionRegistry::Options{}};
  uint64_t lifelines_ = 0;  // The last lifeline id staged under (no socket here: ids only).
  std::unique_ptr<TokenAuth> auth_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<SharedMemoryService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::SharedMemory::Stub> stub_;
};

TEST_F(CudaRegionRpcTest, ACudaRegionIsListedWithItsDeviceAndCountedAsCudaMemory) {
  const v1::Region region = Register("secret-a", 1 << 20);
  EXPECT_EQ(region.cuda_device(), kUuid);
  EXPECT_EQ(region.size(), 1 << 20);
  EXPECT_EQ(region.region_id().size(), 32u);
  v1::ListRegionsResponse alice, mallory;
  ASSERT_TRUE(stub_->ListRegions(Context("secret-a").get(), v1::ListRegionsRequest(), &alice).ok());
  ASSERT_TRUE(stub_->ListRegions(Context("secret-m").get(), v1::ListRegionsRequest(), &mallory).ok());
  ASSERT_EQ(alice.regions_size(), 1);
  EXPECT_EQ(alice.regions(0).cuda_device(), kUuid);
  EXPECT_EQ(mallory.regions_size(), 0);
  EXPECT_EQ(Gauge(*metrics_, "orthoserve_shm_regions", "cuda"), 1);
  EXPECT_EQ(Gauge(*metrics_, "orthoserve_shm_region_bytes", "cuda"), 1 << 20);
  EXPECT_EQ(Gauge(*metrics_, "orthoserve_shm_regions", "host"), 0);

  v1::UnregisterRegionRequest request;
  request.set_region_id(region.region_id());
  v1::UnregisterRegionResponse response;
  EXPECT_EQ(stub_->UnregisterRegion(Context("secret-m").get(), request, &response).error_code(),
            grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(stub_->UnregisterRegion(Context("secret-a").get(), request, &response).ok());
  EXPECT_EQ(Gauge(*metrics_, "orthoserve_shm_regions", "cuda"), 0);
  EXPECT_EQ(Gauge(*metrics_, "orthoserve_shm_region_bytes", "cuda"), 0);
}

TEST_F(CudaRegionRpcTest, SlicesOfACudaRegionAreLeasedAsDeviceMemoryOfTheirTenantOnly) {
  const v1::Region region = Register("secret-a", 1 << 16);
  v1::MatrixSpec spec = Spec("w", {16, 32}, DType::kF32, NsOptions{});
  const int64_t bytes = 16 * 32 * 4;
  spec.mutable_input_region()->set_region_id(region.region_id());
  spec.mutable_input_region()->set_offset(0);
  spec.mutable_input_region()->set_size(bytes);
  spec.mutable_result_region()->set_region_id(region.region_id());
  spec.mutable_result_region()->set_offset(4096);
  spec.mutable_result_region()->set_size(bytes);
  absl::StatusOr<ParsedSpec> parsed = ParseMatrixSpec(spec, 0, SpecLimits{}, /*whole_if_unset=*/true);
  ASSERT_OK(parsed.status());

  absl::StatusOr<MatrixMemory> memory = LeaseRegions(&registry_, "alice", "", 0, spec, *parsed, metrics_.get());
  ASSERT_OK(memory.status());
  EXPECT_EQ(memory->input_space, MemorySpace::kDevice);
  EXPECT_EQ(memory->result_space, MemorySpace::kDevice);
  EXPECT_EQ(memory->result - memory->input, 4096);
  ASSERT_EQ(registry_.List("alice").size(), 1u);
  EXPECT_EQ(registry_.List("alice")[0].users, 2);  // Both slices are leased.

  EXPECT_THAT(LeaseRegions(&registry_, "mallory", "", 0, spec, *parsed, nullptr).status(),
              orthoserve::testing::StatusIs(absl::StatusCode::kNotFound, HasSubstr("input_region")));
  v1::MatrixSpec outside = spec;
  outside.mutable_result_region()->set_offset((1 << 16) - 8);
  EXPECT_THAT(LeaseRegions(&registry_, "alice", "", 0, outside, *parsed, nullptr).status(),
              orthoserve::testing::StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("result_region")));
  memory->owner.reset();
  EXPECT_EQ(registry_.List("alice")[0].users, 0);
}

}  // namespace
}  // namespace orthoserve::testing
