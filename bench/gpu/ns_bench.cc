// GPU Newton–Schulz benchmark: for each shape and precision, the device-side NS loop of the CUDA
// backend (normalize + steps on a resident matrix, timed with CUDA events) with its symmetric
// strip products and, beside it, with every product a full GEMM; then the end-to-end
// CudaBackend::Run of a host matrix (upload, NS, download; wall clock), without and with CUDA
// graphs. Medians of --iters runs after --warmup. Prints one CSV line per case:
//   shape,precision,device_ms,device_tflops,device_full_gemm_ms,e2e_ms,e2e_graphs_ms
// With --group=N it then times N same-shape matrices (each shape, MEDIUM) as one Run call (one
// strided batch) against N calls of one, and prints
//   group,shape,count,one_call_ms,separate_calls_ms
// With --sets=FILE:NAME,... (sets of bench/gpu/model_sets.txt) it times each set, per precision,
// as one Run call on matrices resident in the backend's device memory (NsTask::space kDevice:
// NS only, what the PyTorch loop of torch_ns.py times) and from host memory (uploads and
// downloads included), and prints
//   set,name,precision,matrices,resident_ms,from_host_ms
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/ns_options.h"
#include "server/engine/cuda/context.h"
#include "server/engine/cuda/cuda_backend.h"
#include "server/engine/cuda/kernels.h"
#include "server/engine/cuda/ns_steps.h"
#include "server/engine/newton_schulz.h"

namespace orthoserve {
namespace {

#define BENCH_CHECK(expr)                                                                \
  do {                                                                                   \
    if (!(expr)) {                                                                       \
      std::fprintf(stderr, "ns_bench: %s failed at %s:%d\n", #expr, __FILE__, __LINE__); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (false)

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Flags {
  std::vector<std::pair<int64_t, int64_t>> shapes = {{1024, 1024}, {4096, 4096}, {4096, 11008}, {8192, 8192}};
  std::vector<std::string> precisions = {"medium", "highest"};
  int iters = 10;
  int warmup = 2;
  int steps = 5;
  bool e2e = true;
  int group = 0;
  std::string sets_file;          // --sets=FILE:NAME,NAME...
  std::vector<std::string> sets;  // Names of sets in sets_file.
};

// One model's matrices: (rows, cols) repeated.
struct MatrixSet {
  std::string name;
  std::vector<std::pair<int64_t, int64_t>> shapes;  // One entry per matrix.
};

// Reads `names` from a file of lines "NAME: RxC*N, ..." (# comments); exits on a malformed line
// or a name the file lacks.
std::vector<MatrixSet> ReadSets(const std::string& file, const std::vector<std::string>& names) {
  std::ifstream in(file);
  BENCH_CHECK(in.good());
  std::vector<MatrixSet> all;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> kv = absl::StrSplit(line, absl::MaxSplits(':', 1));
    BENCH_CHECK(kv.size() == 2);
    MatrixSet set{kv[0], {}};
    for (absl::string_view item : absl::StrSplit(kv[1], ',', absl::SkipWhitespace())) {
      std::vector<std::string> shape_count = absl::StrSplit(absl::StripAsciiWhitespace(item), '*');
      std::vector<std::string> rc = absl::StrSplit(shape_count[0], 'x');
      int64_t r = 0, c = 0, n = 0;
      BENCH_CHECK(shape_count.size() == 2 && rc.size() == 2 && absl::SimpleAtoi(rc[0], &r) &&
                  absl::SimpleAtoi(rc[1], &c) && absl::SimpleAtoi(shape_count[1], &n) && n > 0);
      for (int64_t i = 0; i < n; ++i) set.shapes.emplace_back(r, c);
    }
    all.push_back(std::move(set));
  }
  std::vector<MatrixSet> chosen;
  for (const std::string& name : names) {
    auto it = std::find_if(all.begin(), all.end(), [&](const MatrixSet& s) { return s.name == name; });
    if (it == all.end()) {
      std::fprintf(stderr, "ns_bench: no set \"%s\" in %s\n", name.c_str(), file.c_str());
      std::exit(2);
    }
    chosen.push_back(*it);
  }
  return chosen;
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](const std::string& name) -> std::string {
      const std::string prefix = "--" + name + "=";
      return arg.rfind(prefix, 0) == 0 ? arg.substr(prefix.size()) : std::string();
    };
    if (!value("shapes").empty()) {
      f.shapes.clear();
      for (absl::string_view s : absl::StrSplit(value("shapes"), ',')) {
        std::vector<std::string> rc = absl::StrSplit(s, 'x');
        int64_t r = 0, c = 0;
        BENCH_CHECK(rc.size() == 2 && absl::SimpleAtoi(rc[0], &r) && absl::SimpleAtoi(rc[1], &c));
        f.shapes.emplace_back(r, c);
      }
    } else if (!value("precisions").empty()) {
      f.precisions = absl::StrSplit(value("precisions"), ',');
    } else if (!value("iters").empty()) {
      BENCH_CHECK(absl::SimpleAtoi(value("iters"), &f.iters) && f.iters > 0);
    } else if (!value("warmup").empty()) {
      BENCH_CHECK(absl::SimpleAtoi(value("warmup"), &f.warmup) && f.warmup >= 0);
    } else if (!value("steps").empty()) {
      BENCH_CHECK(absl::SimpleAtoi(value("steps"), &f.steps) && f.steps >= 0);
    } else if (!value("group").empty()) {
      BENCH_CHECK(absl::SimpleAtoi(value("group"), &f.group) && f.group > 0);
    } else if (!value("sets").empty()) {
      const std::string v = value("sets");
      const size_t colon = v.rfind(':');
      BENCH_CHECK(colon != std::string::npos);
      f.sets_file = v.substr(0, colon);
      f.sets = absl::StrSplit(v.substr(colon + 1), ',');
    } else if (arg == "--no-e2e") {
      f.e2e = false;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--shapes=RxC,...] [--precisions=medium,highest,high] [--iters=N] [--warmup=N] "
                   "[--steps=N] [--no-e2e] [--group=N] [--sets=FILE:NAME,...]\n",
                   argv[0]);
      std::exit(2);
    }
  }
  return f;
}

// Device-only: normalize a resident fp32 matrix and run the steps, as the backend does, with the
// strip products from `symmetric_min_size` on (a huge value makes every product a full GEMM).
double DeviceMs(int64_t rows, int64_t cols, const NsOptions& options, const Flags& flags, int64_t symmetric_min_size) {
  const NsKernelArgs args = ResolveKernelArgs(options, Matrix2d{rows, cols}, Matrix2d{rows, cols});
  const cuda::GemmPrecision prec = cuda::ForPrecision(options.precision);
  const bool is_x = args.transpose;
  const int64_t m = is_x ? cols : rows, n = is_x ? rows : cols, numel = rows * cols;
  std::vector<float> host(static_cast<size_t>(numel));
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : host) v = normal(rng);
  const int64_t scratch_doubles = cuda::SumSquaresScratch(numel, 1) + 1;
  void *g = nullptr, *x0 = nullptr, *x1 = nullptr, *a = nullptr, *b = nullptr, *scratch = nullptr;
  BENCH_CHECK(cudaMalloc(&g, numel * sizeof(float)) == cudaSuccess);
  BENCH_CHECK(cudaMalloc(&x0, numel * prec.element_size()) == cudaSuccess);
  BENCH_CHECK(cudaMalloc(&x1, numel * prec.element_size()) == cudaSuccess);
  BENCH_CHECK(cudaMalloc(&a, m * m * prec.element_size()) == cudaSuccess);
  BENCH_CHECK(cudaMalloc(&b, m * m * prec.element_size()) == cudaSuccess);
  BENCH_CHECK(cudaMalloc(&scratch, scratch_doubles * sizeof(double)) == cudaSuccess);
  BENCH_CHECK(cudaMemcpy(g, host.data(), numel * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  auto ctx = cuda::Context::Create();
  BENCH_CHECK(ctx.ok());
  const cuda::BlasDevice dev = (*ctx)->Blas(prec, symmetric_min_size);
  cudaStream_t stream = dev.main.stream;
  cudaEvent_t start, stop;
  BENCH_CHECK(cudaEventCreate(&start) == cudaSuccess && cudaEventCreate(&stop) == cudaSuccess);
  double* sums = static_cast<double*>(scratch);
  double* sumsq = sums + scratch_doubles - 1;
  std::vector<double> ms;
  for (int it = 0; it < flags.warmup + flags.iters; ++it) {
    BENCH_CHECK(cudaEventRecord(start, stream) == cudaSuccess);
    const bool bf16_norm = args.normalization == Normalization::kBf16;
    BENCH_CHECK(cuda::SumSquares(DType::kF32, g, numel, 1, bf16_norm, sums, sumsq, stream) == cudaSuccess);
    BENCH_CHECK(cuda::Normalize(DType::kF32, g, numel, 1, sumsq, args.eps, args.eps_mode == EpsMode::kAdd, bf16_norm,
                                prec.dtype, x0, stream) == cudaSuccess);
    BENCH_CHECK(cuda::RunSchedule(dev, args.schedule, cuda::WorkMatrix{x0, is_x, m, n}, x1, a, b).ok());
    BENCH_CHECK(cudaEventRecord(stop, stream) == cudaSuccess);
    BENCH_CHECK(cudaEventSynchronize(stop) == cudaSuccess);
    float elapsed = 0;
    BENCH_CHECK(cudaEventElapsedTime(&elapsed, start, stop) == cudaSuccess);
    if (it >= flags.warmup) ms.push_back(elapsed);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  ctx->reset();
  for (void* p : {g, x0, x1, a, b, scratch}) cudaFree(p);
  return Median(ms);
}

// End to end through the backend: `count` host fp32 matrices in, host fp32 out, either in one
// Run call or in `count` calls of one.
double EndToEndMs(CudaBackend& backend, int64_t rows, int64_t cols, const NsOptions& options, const Flags& flags,
                  int count = 1, bool one_call = true) {
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> in(count), out(count);
  const NsKernelArgs args = ResolveKernelArgs(options, Matrix2d{rows, cols}, Matrix2d{rows, cols});
  std::vector<NsTask> tasks;
  for (int j = 0; j < count; ++j) {
    in[j].resize(static_cast<size_t>(rows * cols));
    out[j].resize(in[j].size());
    for (float& v : in[j]) v = normal(rng);
    tasks.push_back(NsTask{Matrix2d{rows, cols}, DType::kF32, in[j].data(), DType::kF32, out[j].data(), &args});
  }
  auto check = [](const std::vector<absl::Status>& statuses) {
    for (const absl::Status& s : statuses) {
      if (!s.ok()) {
        std::fprintf(stderr, "ns_bench: %s\n", s.ToString().c_str());
        std::exit(1);
      }
    }
  };
  std::vector<double> ms;
  for (int it = 0; it < flags.warmup + flags.iters; ++it) {
    const auto t0 = std::chrono::steady_clock::now();
    if (one_call) {
      check(backend.Run(tasks));
    } else {
      for (const NsTask& t : tasks) check(backend.Run(absl::MakeConstSpan(&t, 1)));
    }
    const auto t1 = std::chrono::steady_clock::now();
    if (it >= flags.warmup) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  return Median(ms);
}

// One model set as one Run call, every matrix fp32 in and out: resident in the backend's device
// memory (`resident`: NS alone), or from host memory (uploads and downloads included).
double SetMs(CudaBackend& backend, const MatrixSet& set, const NsOptions& options, const Flags& flags,
             bool resident) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Memory& memory = backend.memory();
  std::vector<std::vector<float>> host_in, host_out;
  std::vector<MemoryBuffer> device;
  std::vector<NsKernelArgs> args;
  args.reserve(set.shapes.size());
  std::vector<NsTask> tasks;
  for (const auto& [rows, cols] : set.shapes) {
    const size_t bytes = static_cast<size_t>(rows * cols) * sizeof(float);
    host_in.emplace_back(static_cast<size_t>(rows * cols));
    for (float& v : host_in.back()) v = normal(rng);
    host_out.emplace_back(host_in.back().size());
    args.push_back(ResolveKernelArgs(options, Matrix2d{rows, cols}, Matrix2d{rows, cols}));
    NsTask task{Matrix2d{rows, cols}, DType::kF32, host_in.back().data(), DType::kF32, host_out.back().data(),
                &args.back()};
    if (resident) {
      absl::StatusOr<MemoryBuffer> in = memory.Allocate(bytes, false, "bench");
      absl::StatusOr<MemoryBuffer> out = memory.Allocate(bytes, false, "bench");
      BENCH_CHECK(in.ok() && out.ok());
      BENCH_CHECK(memory.Copy(in->data(), MemorySpace::kDevice, host_in.back().data(), MemorySpace::kHost, bytes).ok());
      task.in = in->data();
      task.out = out->data();
      task.space = MemorySpace::kDevice;
      device.push_back(*std::move(in));
      device.push_back(*std::move(out));
    }
    tasks.push_back(task);
  }
  std::vector<double> ms;
  for (int it = 0; it < flags.warmup + flags.iters; ++it) {
    const auto t0 = std::chrono::steady_clock::now();
    for (const absl::Status& s : backend.Run(tasks)) {
      if (!s.ok()) {
        std::fprintf(stderr, "ns_bench: %s: %s\n", set.name.c_str(), s.ToString().c_str());
        std::exit(1);
      }
    }
    const auto t1 = std::chrono::steady_clock::now();
    if (it >= flags.warmup) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  return Median(ms);
}

int Main(int argc, char** argv) {
  const Flags flags = ParseFlags(argc, argv);
  auto backend = CudaBackend::Create(CudaBackend::Options{});
  CudaBackend::Options with_graphs;
  with_graphs.cuda_graphs = true;
  auto graphed = CudaBackend::Create(with_graphs);
  if (!backend.ok() || !graphed.ok()) {
    std::fprintf(stderr, "ns_bench: %s\n",
                 (backend.ok() ? graphed.status() : backend.status()).ToString().c_str());
    return 1;
  }
  std::fprintf(stderr, "ns_bench on %s\n", (*backend)->Info().device.c_str());
  std::printf("shape,precision,device_ms,device_tflops,device_full_gemm_ms,e2e_ms,e2e_graphs_ms\n");
  for (const auto& [rows, cols] : flags.shapes) {
    for (const std::string& p : flags.precisions) {
      NsOptions options;
      options.steps = flags.steps;
      BENCH_CHECK(ParsePrecision(p, &options.precision).ok());
      const double dev_ms = DeviceMs(rows, cols, options, flags, CudaBackend::Options{}.symmetric_min_size);
      const double tflops = NsFlops(rows, cols, options) / (dev_ms * 1e-3) / 1e12;
      const double full_ms = DeviceMs(rows, cols, options, flags, std::numeric_limits<int64_t>::max());
      const double e2e_ms = flags.e2e ? EndToEndMs(**backend, rows, cols, options, flags) : -1;
      const double graph_ms = flags.e2e ? EndToEndMs(**graphed, rows, cols, options, flags) : -1;
      std::printf("%lldx%lld,%s,%.3f,%.1f,%.3f,%.3f,%.3f\n", static_cast<long long>(rows),
                  static_cast<long long>(cols), p.c_str(), dev_ms, tflops, full_ms, e2e_ms, graph_ms);
      std::fflush(stdout);
    }
  }
  if (!flags.sets.empty()) {
    for (const MatrixSet& set : ReadSets(flags.sets_file, flags.sets)) {
      for (const std::string& p : flags.precisions) {
        NsOptions options;
        options.steps = flags.steps;
        BENCH_CHECK(ParsePrecision(p, &options.precision).ok());
        const double resident = SetMs(**backend, set, options, flags, true);
        const double from_host = SetMs(**backend, set, options, flags, false);
        std::printf("set,%s,%s,%zu,%.3f,%.3f\n", set.name.c_str(), p.c_str(), set.shapes.size(), resident, from_host);
        std::fflush(stdout);
      }
    }
  }
  if (flags.group > 0) {
    NsOptions options;
    options.steps = flags.steps;
    for (const auto& [rows, cols] : flags.shapes) {
      const double together = EndToEndMs(**backend, rows, cols, options, flags, flags.group, true);
      const double apart = EndToEndMs(**backend, rows, cols, options, flags, flags.group, false);
      std::printf("group,%lldx%lld,%d,%.3f,%.3f\n", static_cast<long long>(rows), static_cast<long long>(cols),
                  flags.group, together, apart);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace orthoserve

int main(int argc, char** argv) { return orthoserve::Main(argc, argv); }
