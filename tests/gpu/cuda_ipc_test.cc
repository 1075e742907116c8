// CUDA IPC regions on a real GPU (label gpu; skipped without a device): another process
// (cuda_ipc_exporter) allocates a matrix on device 0 and exports it; this one opens the handle
// with CudaBackend's IpcOpener, checks the device and the allocation's extent, opens it a second
// time (the driver's count), computes the matrix on the opened memory — device in, device out —
// and compares the result bit for bit with the same matrix computed from host memory. What the
// emulation cannot show: the real driver's handles, mappings and cuMemGetAddressRange.
#include <cuda_runtime.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/cuda/cuda_backend.h"
#include "server/engine/newton_schulz.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/util/status_matchers.h"

extern char** environ;

namespace orthoserve {
namespace {

using ::orthoserve::testing::StatusIs;
using ::testing::HasSubstr;

// The exporter process and what it printed.
struct Exporter {
  pid_t pid = -1;
  int to_child = -1;  // Its stdin: closing it makes it free the memory and exit.
  std::string uuid;
  std::string handle;  // 64 raw bytes.
};

Exporter Spawn(size_t bytes, size_t elements, unsigned seed) {
  Exporter e;
  int in[2], out[2];
  if (pipe(in) != 0 || pipe(out) != 0) return e;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_addclose(&actions, in[1]);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  const std::string b = std::to_string(bytes), n = std::to_string(elements), s = std::to_string(seed);
  char* argv[] = {const_cast<char*>(ORTHOSERVE_CUDA_IPC_EXPORTER), const_cast<char*>(b.c_str()),
                  const_cast<char*>(n.c_str()), const_cast<char*>(s.c_str()), nullptr};
  const int spawned = posix_spawn(&e.pid, ORTHOSERVE_CUDA_IPC_EXPORTER, &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  close(in[0]);
  close(out[1]);
  e.to_child = in[1];
  if (spawned != 0) {
    e.pid = -1;
    close(out[0]);
    return e;
  }
  std::string line;
  char c;
  pollfd p{out[0], POLLIN, 0};
  while (line.size() < 512 && poll(&p, 1, 60000) > 0 && read(out[0], &c, 1) == 1 && c != '\n') line.push_back(c);
  close(out[0]);
  const size_t space = line.find(' ');
  if (space == std::string::npos || line.size() - space - 1 != 128) return e;
  e.uuid = line.substr(0, space);
  e.handle = absl::HexStringToBytes(line.substr(space + 1));
  return e;
}

// Closes its stdin and waits for it; its exit status.
int Finish(Exporter& e) {
  if (e.to_child >= 0) close(e.to_child);
  e.to_child = -1;
  int status = -1;
  if (e.pid > 0 && waitpid(e.pid, &status, 0) == e.pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return -1;
}

std::vector<float> Values(size_t n, unsigned seed) {
  std::vector<float> v(n);
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(CudaIpcGpuTest, AnotherProcesssMemoryIsOpenedAndComputedWhereItIs) {
  SKIP_WITHOUT_GPU();
  const int64_t rows = 512, cols = 768;
  const size_t bytes = static_cast<size_t>(rows * cols) * sizeof(float);
  const size_t out_offset = (bytes + 255) / 256 * 256;
  const size_t allocation = 2 * out_offset;
  Exporter exporter = Spawn(allocation, static_cast<size_t>(rows * cols), 5);
  ASSERT_GT(exporter.pid, 0) << "could not start " << ORTHOSERVE_CUDA_IPC_EXPORTER;
  ASSERT_EQ(exporter.handle.size(), 64u) << "the exporter printed no handle";

  auto backend = CudaBackend::Create(CudaBackend::Options{});
  ASSERT_OK(backend.status());
  IpcOpener* opener = (*backend)->ipc_opener();
  ASSERT_NE(opener, nullptr);
  EXPECT_EQ(opener->device_uuid(), exporter.uuid);
  const IpcOpenRequest whole{exporter.handle, exporter.uuid, 0, static_cast<int64_t>(allocation)};
  absl::StatusOr<std::unique_ptr<ImportedDeviceMemory>> memory = opener->Open(whole);
  ASSERT_OK(memory.status());
  {
    absl::StatusOr<std::unique_ptr<ImportedDeviceMemory>> again =
        opener->Open(IpcOpenRequest{exporter.handle, exporter.uuid, 256, 1024});
    ASSERT_OK(again.status());
    EXPECT_EQ((*again)->data(), (*memory)->data() + 256);
  }
  // Still mapped after the second handle's close (the driver counts opens).
  std::vector<float> first(4);
  ASSERT_EQ(cudaMemcpy(first.data(), (*memory)->data(), sizeof(float) * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  const std::vector<float> values = Values(static_cast<size_t>(rows * cols), 5);
  EXPECT_EQ(std::memcmp(first.data(), values.data(), sizeof(float) * 4), 0);
  EXPECT_THAT(
      opener->Open(IpcOpenRequest{exporter.handle, exporter.uuid, 0, static_cast<int64_t>(allocation) + (64 << 20)}),
      StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("not inside")));

  NsOptions options;  // MEDIUM, the trainers' default.
  const Matrix2d shape{rows, cols};
  char* base = (*memory)->data();
  ASSERT_OK(OrthogonalizeOne(**backend, MatrixJob{"ipc", shape, shape, DType::kF32, base, DType::kF32,
                                                  base + out_offset, &options, 0, MemorySpace::kDevice}));
  std::vector<float> on_device(values.size()), from_host(values.size());
  ASSERT_EQ(cudaMemcpy(on_device.data(), base + out_offset, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_OK(OrthogonalizeOne(
      **backend, MatrixJob{"host", shape, shape, DType::kF32, values.data(), DType::kF32, from_host.data(), &options}));
  EXPECT_EQ(std::memcmp(on_device.data(), from_host.data(), bytes), 0);
  memory->reset();  // cudaIpcCloseMemHandle, before the exporter frees.
  EXPECT_EQ(Finish(exporter), 0);
}

}  // namespace
}  // namespace orthoserve
