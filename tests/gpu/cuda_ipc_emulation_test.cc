// CUDA IPC regions on the CPU: the CUDA backend's own sources (its IpcOpener included) linked with
// the host emulation of the CUDA runtime, whose cudaIpcGetMemHandle / OpenMemHandle /
// CloseMemHandle and cuMemGetAddressRange stand in for the driver (tests/gpu/
// cuda_runtime_emulation.h: a "client process" allocates with cudaMalloc and exports a handle;
// the emulated device memory is host memory both sides share). Covered: the opener (open, a
// second open of one handle, close, an unknown or freed handle, another device, bounds of the
// allocation); the whole hand-over — CUDA_IPC line on the real handover socket, ticket, claim by
// a tenant, slices leased as device memory — into a lone step (server/step) computed by the
// emulated CudaBackend on the region itself: the result matches the CPU backend's and, bit for
// bit, the same backend's from host memory, with no host copy but the 8-byte NaN/Inf verdict;
// every algorithm on device memory; a NaN found on the device; bounds and another tenant
// refused; unregister waiting for a step and the handle closed with its last lease; the cpu
// backend refusing device memory (FAILED_PRECONDITION). Runs without a GPU.
#include <cuda_runtime.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/cpu/cpu_backend.h"
#include "server/engine/cuda/cuda_backend.h"
#include "server/fleet/logic/lone_compute.h"
#include "server/shm/handover_socket.h"
#include "server/shm/ipc_region.h"
#include "server/shm/region_registry.h"
#include "server/step/step.h"
#include "tests/gpu/cublaslt_emulation.h"
#include "tests/gpu/cuda_runtime_emulation.h"
#include "tests/unit/shm/memfd_util.h"
#include "tests/unit/step/fake_step_fleet.h"
#include "tests/unit/step/recording_sink.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using ::orthoserve::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// The emulation's UUIDs (cudaGetDeviceProperties): e0..ef with the last byte the ordinal.
constexpr char kDevice0[] = "GPU-e0e1e2e3-e4e5-e6e7-e8e9-eaebecedee00";
constexpr char kDevice1[] = "GPU-e0e1e2e3-e4e5-e6e7-e8e9-eaebecedee01";

std::vector<float> RandomFloats(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

double RelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

// A "client process's" allocation: cudaMalloc'd on `device` and exported.
struct ClientAllocation {
  char* data = nullptr;
  size_t bytes = 0;
  std::string handle;  // The 64 bytes of its cudaIpcMemHandle_t.
};

ClientAllocation Allocate(size_t bytes, int device = 0) {
  ClientAllocation a;
  EXPECT_EQ(cudaSetDevice(device), cudaSuccess);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
  cudaIpcMemHandle_t handle;
  EXPECT_EQ(cudaIpcGetMemHandle(&handle, p), cudaSuccess);
  EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
  a.data = static_cast<char*>(p);
  a.bytes = bytes;
  a.handle.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
  return a;
}

IpcOpenRequest Request(const ClientAllocation& a, int64_t offset, int64_t size, const std::string& uuid = kDevice0) {
  IpcOpenRequest r;
  r.handle = a.handle;
  r.device_uuid = uuid;
  r.offset = offset;
  r.size = size;
  return r;
}

class CudaIpcEmulationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    gpu_emulation::g = gpu_emulation::Emulation{};
    gpu_emulation::g.device_count = 2;  // The server runs on device 0; device 1 is another GPU.
    auto backend = CudaBackend::Create(CudaBackend::Options{});
    ASSERT_OK(backend.status());
    backend_ = *std::move(backend);
    auto cpu = CpuBackend::Create({});
    ASSERT_OK(cpu.status());
    cpu_ = *std::move(cpu);
    Metrics::Options mo;
    mo.process_metrics = false;
    metrics_ = *Metrics::Create(mo);
    buffers_ = BufferPool::Create({});
    char dir[] = "/tmp/orthoserve-ipc-emu-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    HandoverSocket::Options h;
    h.path = dir_ + "/shm.sock";
    h.open_cuda_ipc = CudaIpcOpenFunction(backend_->ipc_opener());
    auto socket = HandoverSocket::Start(h, &registry_);
    ASSERT_OK(socket.status());
    socket_ = *std::move(socket);
  }
  void TearDown() override {
    const std::string path = socket_ != nullptr ? socket_->path() : "";
    socket_.reset();
    unlink(path.c_str());
    rmdir(dir_.c_str());
  }

  // Hands [offset, +size) of `a` over on the socket as a CUDA_IPC line; the answer line.
  // The connection is kept (open until the test ends): it is the region's lifeline.
  std::string HandOver(const ClientAllocation& a, int64_t offset, int64_t size, const std::string& uuid = kDevice0) {
    return HandOverLine(socket_->path(), FormatCudaIpcMessage(CudaIpcHandover{uuid, offset, size, a.handle}), 0, 50,
                        &lifelines_.emplace_back());
  }
  // Hands it over and registers it for `tenant`; the region's id ("" and a failure otherwise).
  std::string Register(const std::string& tenant, const ClientAllocation& a, int64_t offset, int64_t size) {
    const std::string answer = HandOver(a, offset, size);
    EXPECT_THAT(answer, StartsWith("OK "));
    absl::StatusOr<RegionInfo> info = registry_.Claim(tenant, answer.size() > 3 ? answer.substr(3) : "", "gpu");
    EXPECT_OK(info.status());
    if (info.ok()) {
      EXPECT_EQ(info->cuda_device, kDevice0);
    }
    return info.ok() ? info->id : "";
  }
  // Leases input and result slices of region `id` as the RPC layer's ingress does
  // (server/rpc/region_slices.cc): MatrixMemory on the device.
  MatrixMemory Lease(const std::string& tenant, const std::string& id, int64_t in_offset, int64_t in_bytes,
                     int64_t out_offset, int64_t out_bytes) {
    struct Leases {
      RegionLease input, result;
    };
    auto leases = std::make_shared<Leases>();
    MatrixMemory m;
    if (in_bytes > 0) {
      absl::StatusOr<RegionLease> lease = registry_.Use(tenant, id, in_offset, in_bytes);
      EXPECT_OK(lease.status());
      if (lease.ok()) leases->input = *std::move(lease);
      EXPECT_TRUE(leases->input.on_device());
      m.input = leases->input.data();
      m.input_space = MemorySpace::kDevice;
    }
    if (out_bytes > 0) {
      absl::StatusOr<RegionLease> lease = registry_.Use(tenant, id, out_offset, out_bytes);
      EXPECT_OK(lease.status());
      if (lease.ok()) leases->result = *std::move(lease);
      m.result = leases->result.data();
      m.result_space = MemorySpace::kDevice;
    }
    m.owner = leases;
    return m;
  }

  StepServices Services(Backend* backend, StepFleet* fleet) {
    StepServices s;
    s.fleet = fleet;
    s.compute = &pool_;
    s.backend = backend;
    s.buffers = buffers_.get();
    s.metrics = metrics_.get();
    s.method = "CudaIpcEmulationTest";
    return s;
  }
  std::shared_ptr<Step> Open(Backend* backend, StepFleet* fleet, std::shared_ptr<StepSink> sink, int matrices,
                             bool all_or_nothing) {
    StepRequest r;
    r.tenant = "alice";
    r.num_matrices = matrices;
    r.all_or_nothing = all_or_nothing;
    absl::StatusOr<std::shared_ptr<Step>> step = OpenStep(Services(backend, fleet), r, std::move(sink));
    EXPECT_OK(step.status());
    return step.ok() ? *step : nullptr;
  }

  // `spec`'s result on `backend` from host memory (the bytes' path).
  static std::vector<float> FromHost(Backend& backend, const ParsedSpec& spec, const std::vector<float>& in) {
    std::vector<float> out(in.size());
    EXPECT_OK(ComputeLoneMatrix(spec.plan, spec.block, in.data(), out.data(), backend, nullptr, "").status);
    return out;
  }

  std::unique_ptr<CudaBackend> backend_;
  std::unique_ptr<Backend> cpu_;
  std::unique_ptr<Metrics> metrics_;
  std::shared_ptr<BufferPool> buffers_;
  FairPool pool_{2};
  std::deque<OwnedFd> lifelines_;
  std::string dir_;
  RegionRegistry registry_{RegionRegistry::Options{}};  // After backend_: its regions close first.
  std::unique_ptr<HandoverSocket> socket_;
};

TEST_F(CudaIpcEmulationTest, TheOpenerOpensClosesAndRefusesAsTheDriverWould) {
  IpcOpener* opener = backend_->ipc_opener();
  ASSERT_NE(opener, nullptr);
  EXPECT_EQ(opener->device_uuid(), kDevice0);
  const ClientAllocation a = Allocate(1 << 20);
  {
    absl::StatusOr<std::unique_ptr<ImportedDeviceMemory>> whole = opener->Open(Request(a, 0, 1 << 20));
    ASSERT_OK(whole.status());
    EXPECT_EQ((*whole)->data(), a.data);
    EXPECT_EQ((*whole)->size(), 1 << 20);
    EXPECT_EQ(gpu_emulation::OpenIpcHandles(), 1);
    // The same handle again (the driver counts the opens and gives the same mapping).
    absl::StatusOr<std::unique_ptr<ImportedDeviceMemory>> part = opener->Open(Request(a, 4096, 8192));
    ASSERT_OK(part.status());
    EXPECT_EQ((*part)->data(), a.data + 4096);
    EXPECT_EQ(gpu_emulation::OpenIpcHandles(), 2);
    whole->reset();
    EXPECT_EQ(gpu_emulation::OpenIpcHandles(), 1);  // Each close is one open's.
  }
  EXPECT_EQ(gpu_emulation::OpenIpcHandles(), 0);

  // Refused before anything is opened.
  EXPECT_THAT(
      opener->Open(Request(a, 0, 1024, kDevice1)),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("computes on device " + std::string(kDevice0))));
  IpcOpenRequest short_handle = Request(a, 0, 1024);
  short_handle.handle.pop_back();
  EXPECT_THAT(opener->Open(short_handle), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("64 bytes")));
  EXPECT_THAT(opener->Open(Request(a, 8, 1024)), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("256")));
  EXPECT_THAT(opener->Open(Request(a, -256, 1024)), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_THAT(opener->Open(Request(a, 0, 0)), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(">= 1")));
  // Opened, then refused and closed again: outside the allocation (no offset + size formed).
  const int64_t max = std::numeric_limits<int64_t>::max();
  for (const auto& [offset, size] : std::vector<std::pair<int64_t, int64_t>>{
           {0, (1 << 20) + 1}, {1 << 20, 1}, {(1 << 20) - 256, 512}, {max - 255, 1}, {256, max}}) {
    EXPECT_THAT(opener->Open(Request(a, offset, size)),
                StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("not inside the handle's allocation")))
        << offset << " " << size;
  }
  EXPECT_EQ(gpu_emulation::OpenIpcHandles(), 0);
  // Memory of device 1 under device 0's UUID: opened (peer access), found out, closed.
  const ClientAllocation other = Allocate(1 << 16, /*device=*/1);
  EXPECT_THAT(opener->Open(Request(other, 0, 1 << 16)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("device ordinal 1")));
  EXPECT_EQ(gpu_emulation::OpenIpcHandles(), 0);
  // Bytes that are no handle, and the handle of an allocation that was freed.
  IpcOpenRequest garbage = Request(a, 0, 1024);
  garbage.handle = std::string(64, '\x5a');
  EXPECT_THAT(opener->Open(garbage), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cannot be opened")));
  const ClientAllocation freed = Allocate(4096);
  ASSERT_EQ(cudaFree(freed.data), cudaSuccess);
  EXPECT_THAT(opener->Open(Request(freed, 0, 4096)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cudaIpcOpenMemHandle")));
  EXPECT_EQ(gpu_emulation::OpenIpcHandles(), 0);
  EXPECT_EQ(gpu_emulation::FreedWhileOpen(), 0);
  cudaFree(a.data);
  cudaFree(other.data);
}

TEST_F(CudaIpcEmulationTest, AHandleOfAnotherDeviceIsRefusedAtTheSocket) {
  const ClientAllocation mine = Allocate(1 << 16);
  const ClientAllocation other = Allocate(1 << 16, /*device=*/1);
  EXPECT_THAT(HandOver(mine, 0, 1 << 16, kDevice1), StartsWith("ERR FAILED_PRECONDITION the handle is of device"));
  EXPECT_THAT(HandOver(other, 0, 1 << 16, kDevice0),
              StartsWith("ERR FAILED_PRECONDITION the handle's memory is on device ordinal 1"));
  EXPECT_THAT(HandOver(mine, 0, (1 << 16) + 256), StartsWith("ERR OUT_OF_RANGE"));
  EXPECT_EQ(registry_.pending(), 0);
  EXPECT_EQ(gpu_emulation::OpenIpcHandles(), 0);
  cudaFree(mine.data);
  cudaFree(other.data);
}

// The whole path: hand-over, ticket, claim, slices leased on the device, a lone all-or-nothing
// step (a unary call's) computed on the region: the result is there, equal to the CPU backend's
// within MEDIUM's tolerance and to this backend's from host memory bit for bit, and nothing came
// to the host but the NaN/Inf scan's verdict.
TEST_F(CudaIpcEmulationTest, AStepReadsAndWritesADeviceRegionWhereItIs) {
  const int64_t rows = 48, cols = 80, bytes = rows * cols * 4;
  const ClientAllocation a = Allocate(1 << 20);
  const std::string id = Register("alice", a, 4096, 1 << 19);  // A region inside the allocation.
  ASSERT_FALSE(id.empty());
  const std::vector<float> in = RandomFloats(rows * cols, 7);
  char* region = a.data + 4096;
  std::memcpy(region + 256, in.data(), static_cast<size_t>(bytes));  // The client's kernels wrote it.
  std::memset(region + 65536, 0x5a, static_cast<size_t>(bytes));
  const ParsedSpec spec = TestSpec("w", rows, cols);
  const std::vector<float> from_host = FromHost(*backend_, spec, in);
  const std::vector<float> on_cpu = FromHost(*cpu_, spec, in);

  FakeStepFleet fleet(0, 1, backend_.get());
  auto sink = std::make_shared<RecordingSink>();
  std::shared_ptr<Step> step = Open(backend_.get(), &fleet, sink, 1, /*all_or_nothing=*/true);
  ASSERT_NE(step, nullptr);
  const CopyCounts before = backend_->Copies();
  ASSERT_TRUE(step->AddMatrixInMemory(spec, Lease("alice", id, 256, bytes, 65536, bytes)));
  step->End();
  ASSERT_TRUE(sink->WaitFinished());
  ASSERT_OK(sink->end().status);
  const CopyCounts after = backend_->Copies();
  auto results = sink->results();
  ASSERT_EQ(results.size(), 1u);
  ASSERT_OK(results[0].status);
  EXPECT_TRUE(results[0].data.empty());  // The result stays on the device: no view of it for host code.

  std::vector<float> got(static_cast<size_t>(rows * cols));
  std::memcpy(got.data(), region + 65536, static_cast<size_t>(bytes));
  EXPECT_EQ(std::memcmp(got.data(), from_host.data(), static_cast<size_t>(bytes)), 0);
  EXPECT_LT(RelativeError(got, on_cpu), 2e-2);
  EXPECT_EQ(after.h2d_calls - before.h2d_calls, 0);
  EXPECT_EQ(after.h2d_bytes - before.h2d_bytes, 0);
  EXPECT_EQ(after.d2h_calls - before.d2h_calls, 1);  // The scan's verdict,
  EXPECT_EQ(after.d2h_bytes - before.d2h_bytes, 8);  // 8 bytes.
  EXPECT_GT(after.d2d_calls - before.d2d_calls, 0);
  step.reset();
  EXPECT_EQ(registry_.List("alice")[0].users, 0);  // The leases went with the step.
  cudaFree(a.data);
}

// One side in the region, the other in host memory: the host side goes up (input) or comes
// down (result) once; the device side stays.
TEST_F(CudaIpcEmulationTest, MixedSidesStageOnlyTheHostSide) {
  const int64_t rows = 32, cols = 24, bytes = rows * cols * 4;
  const ClientAllocation a = Allocate(1 << 16);
  const std::string id = Register("alice", a, 0, 1 << 16);
  const std::vector<float> in = RandomFloats(rows * cols, 8);
  std::memcpy(a.data, in.data(), static_cast<size_t>(bytes));
  const ParsedSpec spec = TestSpec("m", rows, cols);
  const std::vector<float> expected = FromHost(*backend_, spec, in);
  const std::string expected_bytes(reinterpret_cast<const char*>(expected.data()), static_cast<size_t>(bytes));

  FakeStepFleet fleet(0, 1, backend_.get());
  auto sink = std::make_shared<RecordingSink>();
  std::shared_ptr<Step> step = Open(backend_.get(), &fleet, sink, 2, /*all_or_nothing=*/false);
  ASSERT_NE(step, nullptr);
  // 0: input in the region, result to the host; 1: input as data, result into the region.
  ASSERT_TRUE(step->AddMatrixInMemory(spec, Lease("alice", id, 0, bytes, 0, 0)));
  ParsedSpec second = spec;
  second.plan.name = "m2";
  ASSERT_TRUE(step->AddMatrixInMemory(second, Lease("alice", id, 0, 0, 8192, bytes)));
  ASSERT_TRUE(step->AddData(1, {absl::string_view(reinterpret_cast<const char*>(in.data()), bytes)}));
  step->End();
  ASSERT_TRUE(sink->WaitFinished());
  ASSERT_OK(sink->end().status);
  auto results = sink->results();
  ASSERT_OK(results[0].status);
  ASSERT_OK(results[1].status);
  EXPECT_EQ(results[0].data, expected_bytes);
  EXPECT_TRUE(results[1].data.empty());
  EXPECT_EQ(std::string(a.data + 8192, static_cast<size_t>(bytes)), expected_bytes);
  cudaFree(a.data);
}

// Every algorithm of a lone matrix on device memory gives the bits it gives from host memory,
// with no copy between host and device at all.
TEST_F(CudaIpcEmulationTest, EveryAlgorithmComputesOnDeviceMemoryWithTheHostPathsBits) {
  const int64_t rows = 40, cols = 56, bytes = rows * cols * 4;
  const ClientAllocation a = Allocate(1 << 16);
  const std::vector<float> in = RandomFloats(rows * cols, 9);
  std::memcpy(a.data, in.data(), static_cast<size_t>(bytes));
  for (Algorithm algorithm : {Algorithm::kAuto, Algorithm::kRowSharded, Algorithm::kGathered, Algorithm::kTpDuplicated,
                              Algorithm::kTpBlockwise, Algorithm::kTpDistributed}) {
    SCOPED_TRACE(AlgorithmName(algorithm));
    const ParsedSpec spec = TestSpec("w", rows, cols, Block{}, algorithm);
    const std::vector<float> from_host = FromHost(*backend_, spec, in);
    std::memset(a.data + 32768, 0, static_cast<size_t>(bytes));
    const CopyCounts before = backend_->Copies();
    const LoneComputation c = ComputeLoneMatrix(spec.plan, spec.block, a.data, a.data + 32768, *backend_, nullptr, "",
                                                MemorySpace::kDevice, MemorySpace::kDevice);
    ASSERT_OK(c.status);
    const CopyCounts after = backend_->Copies();
    EXPECT_EQ(std::memcmp(a.data + 32768, from_host.data(), static_cast<size_t>(bytes)), 0);
    EXPECT_EQ(after.h2d_calls, before.h2d_calls);
    EXPECT_EQ(after.d2h_calls, before.d2h_calls);
  }
  cudaFree(a.data);
}

TEST_F(CudaIpcEmulationTest, ANonFiniteValueIsFoundOnTheDevice) {
  const int64_t rows = 16, cols = 16, bytes = rows * cols * 2;
  const ClientAllocation a = Allocate(1 << 16);
  const std::string id = Register("alice", a, 0, 1 << 16);
  std::vector<float> in = RandomFloats(rows * cols, 10);
  in[77] = std::numeric_limits<float>::infinity();
  ParsedSpec spec = TestSpec("bad", rows, cols);
  spec.plan.dtype = DType::kBF16;
  spec.plan.result_dtype = DType::kBF16;
  spec.block_bytes = bytes;
  ConvertFromF32(DType::kBF16, in.data(), in.size(), a.data);
  FakeStepFleet fleet(0, 1, backend_.get());
  auto sink = std::make_shared<RecordingSink>();
  std::shared_ptr<Step> step = Open(backend_.get(), &fleet, sink, 1, /*all_or_nothing=*/false);
  ASSERT_NE(step, nullptr);
  ASSERT_TRUE(step->AddMatrixInMemory(spec, Lease("alice", id, 0, bytes, 4096, bytes)));
  step->End();
  ASSERT_TRUE(sink->WaitFinished());
  EXPECT_THAT(sink->results()[0].status,
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("non-finite value (NaN or Inf) at element 77")));
  cudaFree(a.data);
}

TEST_F(CudaIpcEmulationTest, SlicesOutsideTheRegionAndOtherTenantsAreRefused) {
  const ClientAllocation a = Allocate(1 << 16);
  const std::string id = Register("alice", a, 256, 4096);
  EXPECT_THAT(registry_.Use("alice", id, 4096 - 8, 16), StatusIs(absl::StatusCode::kOutOfRange, ::testing::_));
  EXPECT_THAT(registry_.Use("alice", id, -256, 16), StatusIs(absl::StatusCode::kOutOfRange, ::testing::_));
  EXPECT_THAT(registry_.Use("alice", id, 0, std::numeric_limits<int64_t>::max()),
              StatusIs(absl::StatusCode::kOutOfRange, ::testing::_));
  EXPECT_THAT(registry_.Use("mallory", id, 0, 16), StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  EXPECT_TRUE(registry_.List("mallory").empty());
  EXPECT_THAT(registry_.Unregister("mallory", id, absl::Now() + absl::Seconds(1)),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  EXPECT_EQ(gpu_emulation::OpenIpcHandles(), 1);
  ASSERT_OK(registry_.Unregister("alice", id, absl::Now() + absl::Seconds(1)));
  EXPECT_EQ(gpu_emulation::OpenIpcHandles(), 0);  // Closed with the region.
  EXPECT_THAT(registry_.Use("alice", id, 0, 16), StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  cudaFree(a.data);
}

// Unregister returns once the step that uses the region is done with it (its result is in the
// region), and the handle is closed then, with the last lease.
TEST_F(CudaIpcEmulationTest, UnregisterWaitsForTheStepAndTheHandleClosesWithItsLastLease) {
  const int64_t rows = 96, cols = 192, bytes = rows * cols * 4;
  const ClientAllocation a = Allocate(1 << 20);
  const std::string id = Register("alice", a, 0, 1 << 20);
  const std::vector<float> in = RandomFloats(rows * cols, 11);
  std::memcpy(a.data, in.data(), static_cast<size_t>(bytes));
  ParsedSpec spec = TestSpec("slow", rows, cols);
  spec.plan.options.steps = 24;  // Long enough to be caught in flight.
  spec.plan.options.precision = Precision::kHighest;
  const std::vector<float> expected = FromHost(*backend_, spec, in);

  FakeStepFleet fleet(0, 1, backend_.get());
  auto sink = std::make_shared<RecordingSink>();
  std::shared_ptr<Step> step = Open(backend_.get(), &fleet, sink, 1, /*all_or_nothing=*/true);
  ASSERT_NE(step, nullptr);
  ASSERT_TRUE(step->AddMatrixInMemory(spec, Lease("alice", id, 0, bytes, 524288, bytes)));
  step->End();  // Computing now, on a worker.
  ASSERT_OK(registry_.Unregister("alice", id, absl::Now() + absl::Seconds(60)));
  // Returned: the step let the region go, so its result is complete and the handle is closed.
  auto results = sink->results();
  ASSERT_EQ(results.size(), 1u);
  ASSERT_OK(results[0].status);
  EXPECT_EQ(std::memcmp(a.data + 524288, expected.data(), static_cast<size_t>(bytes)), 0);
  // The handle was closed before the unregister returned: the client may free its memory now.
  EXPECT_EQ(gpu_emulation::OpenIpcHandles(), 0);
  ASSERT_TRUE(sink->WaitFinished());
  step.reset();
  cudaFree(a.data);
}

// A backend that computes in host memory cannot take device memory: the step answers
// FAILED_PRECONDITION (in-band for a stream, for the whole call when all or nothing) and reads
// nothing; the engine path below it refuses too.
TEST_F(CudaIpcEmulationTest, TheCpuBackendRefusesDeviceMemoryWithFailedPrecondition) {
  EXPECT_EQ(cpu_->ipc_opener(), nullptr);
  const int64_t rows = 8, cols = 8, bytes = rows * cols * 4;
  const ClientAllocation a = Allocate(1 << 16);
  const std::string id = Register("alice", a, 0, 1 << 16);
  const ParsedSpec spec = TestSpec("w", rows, cols);
  FakeStepFleet fleet(0, 1, cpu_.get());
  for (bool all_or_nothing : {false, true}) {
    SCOPED_TRACE(all_or_nothing);
    auto sink = std::make_shared<RecordingSink>();
    std::shared_ptr<Step> step = Open(cpu_.get(), &fleet, sink, 1, all_or_nothing);
    ASSERT_NE(step, nullptr);
    const bool taken = step->AddMatrixInMemory(spec, Lease("alice", id, 0, bytes, 4096, bytes));
    EXPECT_EQ(taken, !all_or_nothing);
    step->End();
    ASSERT_TRUE(sink->WaitFinished());
    const absl::Status status = all_or_nothing ? sink->end().status : sink->results()[0].status;
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("cpu backend")));
  }
  std::vector<float> host_in(static_cast<size_t>(rows * cols), 1.0f);
  EXPECT_THAT(ComputeLoneMatrix(spec.plan, spec.block, host_in.data(), a.data, *cpu_, nullptr, "", MemorySpace::kHost,
                                MemorySpace::kDevice)
                  .status,
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("computes in host memory")));
  cudaFree(a.data);
}

}  // namespace
}  // namespace orthoserve
