// Times the CPU backend's Newton–Schulz (quintic, 5 steps, fp32 in and out) on realistic
// shapes in HIGHEST and MEDIUM precision, through Backend::Run as the engine calls it.
//
//   cpu_ns_bench --benchmark_filter=. --threads=1   (BLAS threads per product; default 1)
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/ns_options.h"
#include "server/engine/cpu/cpu_backend.h"
#include "server/engine/newton_schulz.h"

namespace orthoserve {
namespace {

int g_threads = 1;

Backend& TheBackend() {
  static Backend* backend = [] {
    CpuBackend::Options o;
    o.threads = g_threads;
    return std::move(CpuBackend::Create(o)).value().release();
  }();
  return *backend;
}

void BM_NewtonSchulz(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  const Precision precision = state.range(2) == 0 ? Precision::kHighest : Precision::kMedium;
  std::vector<float> in(static_cast<size_t>(rows * cols)), out(in.size());
  std::mt19937 gen(1);
  std::normal_distribution<float> dist;
  for (float& v : in) v = dist(gen);
  NsOptions options;  // quintic, 5 steps, eps 1e-7, spectral scale.
  options.precision = precision;
  NsKernelArgs args = ResolveKernelArgs(options, {rows, cols}, {rows, cols});
  NsTask task{{rows, cols}, DType::kF32, in.data(), DType::kF32, out.data(), &args};
  for (auto _ : state) {
    absl::Status s = TheBackend().Run({task})[0];
    if (!s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      break;
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GFLOPS"] = benchmark::Counter(
      NsFlops(rows, cols, options), benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
  state.SetLabel(std::string(PrecisionName(precision)));
}

void Shapes(benchmark::internal::Benchmark* b) {
  for (int precision : {0, 1}) {
    for (auto [rows, cols] : std::vector<std::pair<int, int>>{{512, 512}, {1024, 1024}, {1024, 4096}, {2048, 2048}}) {
      b->Args({rows, cols, precision});
    }
  }
  b->ArgNames({"rows", "cols", "medium"})->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(BM_NewtonSchulz)->Apply(Shapes);

}  // namespace
}  // namespace orthoserve

int main(int argc, char** argv) {
  // Our own flag first: --threads=N (BLAS threads per product).
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0) {
      orthoserve::g_threads = std::atoi(argv[i] + 10);
    } else {
      rest.push_back(argv[i]);
    }
  }
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
