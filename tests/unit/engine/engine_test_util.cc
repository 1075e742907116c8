// Implementation of tests/unit/engine/engine_test_util.h.
#include "tests/unit/engine/engine_test_util.h"

#include <cstring>
#include <map>
#include <mutex>

#include "server/engine/cpu/cpu_backend.h"
#include "server/engine/newton_schulz.h"

namespace orthoserve::testing {

std::vector<char> Pack(const std::vector<double>& values, DType dtype) {
  std::vector<float> f(values.begin(), values.end());
  std::vector<char> bytes(values.size() * ElementSize(dtype));
  ConvertFromF32(dtype, f.data(), f.size(), bytes.data());
  return bytes;
}

std::vector<double> Unpack(const std::vector<char>& bytes, DType dtype) {
  std::vector<float> f(bytes.size() / ElementSize(dtype));
  ConvertToF32(dtype, bytes.data(), f.size(), f.data());
  return std::vector<double>(f.begin(), f.end());
}

std::vector<double> AsSeen(const std::vector<double>& values, DType dtype) {
  return Unpack(Pack(values, dtype), dtype);
}

NsRun RunNs(Backend& backend, const std::vector<double>& g, int64_t rows, int64_t cols, const NsOptions& options,
            DType in_dtype, DType out_dtype) {
  std::vector<char> in = Pack(g, in_dtype);
  NsRun run;
  run.bytes.assign(static_cast<size_t>(rows * cols) * ElementSize(out_dtype), 0);
  MatrixJob job;
  job.name = "g";
  job.shape = {rows, cols};
  job.scale_shape = {rows, cols};
  job.in_dtype = in_dtype;
  job.in = in.data();
  job.out_dtype = out_dtype;
  job.out = run.bytes.data();
  job.options = &options;
  run.status = OrthogonalizeOne(backend, job);
  run.values = Unpack(run.bytes, out_dtype);
  return run;
}

std::vector<double> Reference(const std::vector<double>& g, int64_t rows, int64_t cols, const NsOptions& options,
                              DType in_dtype) {
  return ReferenceNs(AsSeen(g, in_dtype), rows, cols, RefArgsFor(options, rows, cols));
}

Backend& CpuBackendWithThreads(int threads) {
  static std::mutex mu;
  static auto* backends = new std::map<int, std::unique_ptr<CpuBackend>>();
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = (*backends)[threads];
  if (slot == nullptr) {
    CpuBackend::Options options;
    options.threads = threads;
    slot = std::move(CpuBackend::Create(options)).value();
  }
  return *slot;
}

}  // namespace orthoserve::testing
