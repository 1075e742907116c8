// CUDA IPC regions end to end on one GPU (bench/gpu/run.sh, docs/shared_memory.md): this process
// is the trainer. For each shape it allocates an fp32 input and a result on the server's GPU,
// exports the allocation (cudaIpcGetMemHandle), hands it over on the server's socket (a CUDA_IPC
// line), registers it (SharedMemory.RegisterRegion), and times a unary Orthogonalize whose input
// and result are slices of that region (the server computes on the memory where it is) beside
// the same call with the matrix as bytes, and beside the CUDA backend in this process on the same
// matrix, resident in device memory (no copies) and from host memory (uploaded and downloaded).
// It checks that the region's result is the bytes' result, bit for bit. Medians of --iters after
// --warmup, wall clock. Prints one CSV line per case:
//   ipc,shape,precision,region_ms,bytes_ms,inproc_device_ms,inproc_host_ms,identical
// Exits 1 on any failure, saying which.
#include <cuda_runtime.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/ns_options.h"
#include "grpcpp/create_channel.h"
#include "orthoserve/v1/orthogonalizer.grpc.pb.h"
#include "server/engine/cuda/cuda_backend.h"
#include "server/engine/newton_schulz.h"
#include "server/shm/cuda_ipc_message.h"

namespace orthoserve {
namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "ipc_bench: %s\n", what.c_str());
  std::exit(1);
}

#define IPC_CHECK(expr)                                                             \
  do {                                                                              \
    if (!(expr)) Fail(absl::StrCat(#expr, " failed at ", __FILE__, ":", __LINE__)); \
  } while (false)

#define CUDA_OK(expr)                                                                                        \
  do {                                                                                                       \
    const cudaError_t e = (expr);                                                                            \
    if (e != cudaSuccess) Fail(absl::StrCat(#expr, ": ", cudaGetErrorName(e), ": ", cudaGetErrorString(e))); \
  } while (false)

struct Flags {
  std::string server = "127.0.0.1:50051";
  std::string socket;
  std::vector<std::pair<int64_t, int64_t>> shapes = {{4096, 4096}};
  std::vector<std::string> precisions = {"medium"};
  int iters = 5;
  int warmup = 1;
};

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const std::string& name) -> std::string {
      const std::string prefix = "--" + name + "=";
      return arg.rfind(prefix, 0) == 0 ? arg.substr(prefix.size()) : std::string();
    };
    if (!value("server").empty()) {
      f.server = value("server");
    } else if (!value("socket").empty()) {
      f.socket = value("socket");
    } else if (!value("shapes").empty()) {
      f.shapes.clear();
      for (absl::string_view s : absl::StrSplit(value("shapes"), ',')) {
        std::vector<std::string> rc = absl::StrSplit(s, 'x');
        int64_t r = 0, c = 0;
        IPC_CHECK(rc.size() == 2 && absl::SimpleAtoi(rc[0], &r) && absl::SimpleAtoi(rc[1], &c) && r > 0 && c > 0);
        f.shapes.emplace_back(r, c);
      }
    } else if (!value("precisions").empty()) {
      f.precisions = absl::StrSplit(value("precisions"), ',');
    } else if (!value("iters").empty()) {
      IPC_CHECK(absl::SimpleAtoi(value("iters"), &f.iters) && f.iters > 0);
    } else if (!value("warmup").empty()) {
      IPC_CHECK(absl::SimpleAtoi(value("warmup"), &f.warmup) && f.warmup >= 0);
    } else {
      std::fprintf(stderr,
                   "usage: %s --socket=PATH [--server=HOST:PORT] [--shapes=RxC,...] [--precisions=medium,highest] "
                   "[--iters=N] [--warmup=N]\n",
                   argv[0]);
      std::exit(2);
    }
  }
  if (f.socket.empty()) Fail("--socket (the server's --shm-socket) is required");
  return f;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

template <typename F>
double TimeMs(const Flags& flags, F&& call) {
  std::vector<double> ms;
  for (int it = 0; it < flags.warmup + flags.iters; ++it) {
    const auto start = std::chrono::steady_clock::now();
    call();
    const double elapsed = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (it >= flags.warmup) ms.push_back(elapsed);
  }
  return Median(ms);
}

Precision PrecisionOf(const std::string& name) {
  if (name == "highest") return Precision::kHighest;
  if (name == "high") return Precision::kHigh;
  IPC_CHECK(name == "medium");
  return Precision::kMedium;
}

v1::Precision ProtoPrecision(Precision p) {
  return p == Precision::kHighest ? v1::PRECISION_HIGHEST
         : p == Precision::kHigh  ? v1::PRECISION_HIGH
                                  : v1::PRECISION_MEDIUM;
}

// The current device's UUID as the server prints it (ServerInfo.shm_cuda_device).
std::string DeviceUuid(int device) {
  cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, device));
  const auto* b = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
  char text[64];
  std::snprintf(text, sizeof(text), "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return text;
}

// Sends `line` on the Unix socket at `path` and returns the answer line. The connection is left
// open in `*lifeline`: the region's lifeline, closed by the caller after its unregister (the
// server drops the region when it closes).
std::string HandOver(const std::string& path, const std::string& line, int* lifeline) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  IPC_CHECK(fd >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  IPC_CHECK(path.size() < sizeof(addr.sun_path));
  std::memcpy(addr.sun_path, path.data(), path.size());
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) Fail("cannot connect to " + path);
  IPC_CHECK(send(fd, line.data(), line.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(line.size()));
  std::string answer;
  char buf[512];
  while (answer.find('\n') == std::string::npos) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    answer.append(buf, static_cast<size_t>(n));
  }
  *lifeline = fd;
  if (!answer.empty() && answer.back() == '\n') answer.pop_back();
  return answer;
}

v1::MatrixSpec SpecOf(int64_t rows, int64_t cols, Precision precision) {
  v1::MatrixSpec spec;
  spec.set_name("w");
  spec.add_shape(rows);
  spec.add_shape(cols);
  spec.set_dtype(v1::DTYPE_FP32);
  spec.mutable_options()->set_precision(ProtoPrecision(precision));
  return spec;
}

v1::RegionSlice Slice(const std::string& id, int64_t offset, int64_t size) {
  v1::RegionSlice s;
  s.set_region_id(id);
  s.set_offset(offset);
  s.set_size(size);
  return s;
}

void Call(v1::Orthogonalizer::Stub& stub, const v1::OrthogonalizeRequest& request,
          v1::OrthogonalizeResponse* response) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  const grpc::Status status = stub.Orthogonalize(&context, request, response);
  if (!status.ok()) Fail("Orthogonalize: " + status.error_message());
  if (response->results_size() != 1 || response->results(0).code() != 0) {
    Fail("Orthogonalize: the matrix failed: " + (response->results_size() > 0 ? response->results(0).message() : ""));
  }
}

int Main(int argc, char** argv) {
  const Flags flags = ParseFlags(argc, argv);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(1 << 30);
  args.SetMaxSendMessageSize(1 << 30);
  auto channel = grpc::CreateCustomChannel(flags.server, grpc::InsecureChannelCredentials(), args);
  auto stub = v1::Orthogonalizer::NewStub(channel);
  auto shm = v1::SharedMemory::NewStub(channel);
  v1::ServerInfo info;
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    const grpc::Status status = stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &info);
    if (!status.ok()) Fail("GetServerInfo: " + status.error_message());
  }
  if (info.shm_cuda_device().empty()) Fail("the server takes no CUDA IPC handles (needs --backend=cuda --shm-socket)");
  // The server's GPU, found among this process's devices by its UUID.
  int count = 0, device = -1;
  CUDA_OK(cudaGetDeviceCount(&count));
  for (int d = 0; d < count && device < 0; ++d) {
    if (DeviceUuid(d) == info.shm_cuda_device()) device = d;
  }
  if (device < 0) Fail("the server's GPU " + info.shm_cuda_device() + " is not visible to this process");
  CUDA_OK(cudaSetDevice(device));
  CudaBackend::Options options;
  options.device = device;
  options.memory_budget_bytes = int64_t{8} << 30;  // This process's own engine, beside the server's.
  auto backend = CudaBackend::Create(options);
  if (!backend.ok()) Fail("CudaBackend::Create: " + std::string(backend.status().message()));

  for (const auto& [rows, cols] : flags.shapes) {
    const int64_t bytes = rows * cols * static_cast<int64_t>(sizeof(float));
    const int64_t out_offset = (bytes + 255) / 256 * 256;
    std::vector<float> host(static_cast<size_t>(rows * cols));
    std::mt19937 rng(42);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& v : host) v = normal(rng);
    // One allocation: the input at 0, the result at out_offset. This process's writes are
    // complete (synchronized) before the server reads.
    void* base = nullptr;
    CUDA_OK(cudaMalloc(&base, static_cast<size_t>(2 * out_offset)));
    CUDA_OK(cudaMemcpy(base, host.data(), static_cast<size_t>(bytes), cudaMemcpyHostToDevice));
    CUDA_OK(cudaDeviceSynchronize());
    cudaIpcMemHandle_t handle;
    CUDA_OK(cudaIpcGetMemHandle(&handle, base));
    CudaIpcHandover h;
    h.device_uuid = info.shm_cuda_device();
    h.offset = 0;
    h.size = 2 * out_offset;
    h.handle.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
    int lifeline = -1;
    const std::string answer = HandOver(flags.socket, FormatCudaIpcMessage(h), &lifeline);
    if (answer.rfind("OK ", 0) != 0) Fail("the socket refused the handle: " + answer);
    v1::Region region;
    {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      v1::RegisterRegionRequest request;
      request.set_ticket(answer.substr(3));
      request.set_name("ipc_bench");
      const grpc::Status status = shm->RegisterRegion(&context, request, &region);
      if (!status.ok()) Fail("RegisterRegion: " + status.error_message());
    }
    IPC_CHECK(region.cuda_device() == info.shm_cuda_device());

    for (const std::string& precision_name : flags.precisions) {
      const Precision precision = PrecisionOf(precision_name);
      const v1::MatrixSpec spec = SpecOf(rows, cols, precision);
      v1::OrthogonalizeRequest in_region;
      v1::MatrixSpec* s = in_region.add_matrices()->mutable_spec();
      *s = spec;
      *s->mutable_input_region() = Slice(region.region_id(), 0, bytes);
      *s->mutable_result_region() = Slice(region.region_id(), out_offset, bytes);
      v1::OrthogonalizeRequest in_bytes;
      v1::Matrix* m = in_bytes.add_matrices();
      *m->mutable_spec() = spec;
      m->set_data(std::string(reinterpret_cast<const char*>(host.data()), static_cast<size_t>(bytes)));

      v1::OrthogonalizeResponse response;
      const double region_ms = TimeMs(flags, [&] { Call(*stub, in_region, &response); });
      IPC_CHECK(response.results(0).data().empty() && response.results(0).has_result_region());
      std::string via_region(static_cast<size_t>(bytes), '\0');
      CUDA_OK(cudaMemcpy(via_region.data(), static_cast<char*>(base) + out_offset, static_cast<size_t>(bytes),
                         cudaMemcpyDeviceToHost));
      const double bytes_ms = TimeMs(flags, [&] { Call(*stub, in_bytes, &response); });
      const bool identical = response.results(0).data() == via_region;

      // The same matrix in this process's engine: resident on the device, and from the host.
      NsOptions ns;
      ns.precision = precision;
      void* local = nullptr;
      CUDA_OK(cudaMalloc(&local, static_cast<size_t>(2 * out_offset)));
      CUDA_OK(cudaMemcpy(local, host.data(), static_cast<size_t>(bytes), cudaMemcpyHostToDevice));
      const Matrix2d shape{rows, cols};
      const MatrixJob device_job{"w",
                                 shape,
                                 shape,
                                 DType::kF32,
                                 local,
                                 DType::kF32,
                                 static_cast<char*>(local) + out_offset,
                                 &ns,
                                 0,
                                 MemorySpace::kDevice};
      const double inproc_device_ms = TimeMs(flags, [&] { IPC_CHECK(OrthogonalizeOne(**backend, device_job).ok()); });
      std::vector<float> out(host.size());
      const MatrixJob host_job{"w", shape, shape, DType::kF32, host.data(), DType::kF32, out.data(), &ns};
      const double inproc_host_ms = TimeMs(flags, [&] { IPC_CHECK(OrthogonalizeOne(**backend, host_job).ok()); });
      CUDA_OK(cudaFree(local));

      std::printf("ipc,%lldx%lld,%s,%.3f,%.3f,%.3f,%.3f,%s\n", static_cast<long long>(rows),
                  static_cast<long long>(cols), precision_name.c_str(), region_ms, bytes_ms, inproc_device_ms,
                  inproc_host_ms, identical ? "yes" : "NO");
      std::fflush(stdout);
      if (!identical) Fail("the region's result differs from the bytes' result");
    }
    {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
      v1::UnregisterRegionRequest request;
      request.set_region_id(region.region_id());
      v1::UnregisterRegionResponse response;
      const grpc::Status status = shm->UnregisterRegion(&context, request, &response);
      if (!status.ok()) Fail("UnregisterRegion: " + status.error_message());
    }
    close(lifeline);
    // Freed only once the server closed its mapping (the unregister answered): CUDA leaves a free
    // before the importer's close undefined.
    CUDA_OK(cudaFree(base));
  }
  return 0;
}

}  // namespace
}  // namespace orthoserve

int main(int argc, char** argv) { return orthoserve::Main(argc, argv); }
