// Implementation of tests/integration/binaries/expectations.h.
#include "tests/integration/binaries/expectations.h"

#include <algorithm>
#include <memory>
#include <random>

#include "common/shape.h"
#include "server/engine/cpu/cpu_backend.h"
#include "server/engine/newton_schulz.h"
#include "tests/unit/engine/reference_ns.h"

namespace orthoserve::testing {
namespace {

// orthoctl's conversion between dtypes: widen to fp32, narrow to the target.
std::vector<char> Convert(DType from, DType to, const std::vector<char>& data) {
  if (from == to) return data;
  const size_t count = data.size() / ElementSize(from);
  std::vector<float> wide(count);
  ConvertToF32(from, data.data(), count, wide.data());
  std::vector<char> narrow(count * ElementSize(to));
  ConvertFromF32(to, wide.data(), count, narrow.data());
  return narrow;
}

Backend& OneThreadCpuBackend() {
  static Backend* backend = CpuBackend::Create(CpuBackend::Options{}).value().release();
  return *backend;
}

Matrix2d ViewOf(const std::vector<int64_t>& shape) {
  Matrix2d m{shape.empty() ? 0 : shape[0], 1};
  for (size_t i = 1; i < shape.size(); ++i) m.cols *= shape[i];
  return m;
}

}  // namespace

std::vector<double> ValuesOf(const client::NpyArray& array) {
  const size_t count = array.data.size() / ElementSize(array.dtype);
  std::vector<float> f(count);
  ConvertToF32(array.dtype, array.data.data(), count, f.data());
  return std::vector<double>(f.begin(), f.end());
}

client::NpyArray MakeArray(DType dtype, const std::vector<int64_t>& shape, const std::vector<double>& values) {
  client::NpyArray a;
  a.dtype = dtype;
  a.shape = shape;
  std::vector<float> f(values.begin(), values.end());
  a.data.resize(f.size() * ElementSize(dtype));
  ConvertFromF32(dtype, f.data(), f.size(), a.data.data());
  return a;
}

client::NpyArray RandomArray(DType dtype, const std::vector<int64_t>& shape, uint32_t seed) {
  const Matrix2d m = ViewOf(shape);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<double> values(static_cast<size_t>(m.numel()));
  for (double& v : values) v = normal(rng);
  return MakeArray(dtype, shape, values);
}

absl::StatusOr<client::NpyArray> EngineExpected(const client::NpyArray& in, const NsOptions& options,
                                                std::optional<DType> wire) {
  const DType w = wire.value_or(in.dtype);
  const std::vector<char> payload = Convert(in.dtype, w, in.data);
  const Matrix2d m = ViewOf(in.shape);
  std::vector<char> out(static_cast<size_t>(m.numel()) * ElementSize(w));
  MatrixJob job;
  job.name = "expected";
  job.shape = m;
  job.scale_shape = m;
  job.in_dtype = w;
  job.in = payload.data();
  job.out_dtype = w;
  job.out = out.data();
  job.options = &options;
  absl::Status status = OrthogonalizeOne(OneThreadCpuBackend(), job);
  if (!status.ok()) return status;
  client::NpyArray result;
  result.dtype = in.dtype;
  result.shape = in.shape;
  result.data = Convert(w, in.dtype, out);
  return result;
}

std::vector<double> ReferenceExpected(const client::NpyArray& in, const NsOptions& options, std::optional<DType> wire) {
  const DType w = wire.value_or(in.dtype);
  client::NpyArray seen = in;
  seen.data = Convert(in.dtype, w, in.data);
  seen.dtype = w;
  const std::vector<double> g = ValuesOf(seen);
  const Matrix2d m = ViewOf(in.shape);
  if (options.split_qkv.empty()) return ReferenceNs(g, m.rows, m.cols, RefArgsFor(options, m.rows, m.cols));
  // split_qkv: rows are groups of q+k+v; part p is rows [off_p, off_p + size_p) of every group,
  // gathered into its own matrix, orthogonalized and scaled alone, written back in place.
  const int64_t group = options.split_qkv[0] + options.split_qkv[1] + options.split_qkv[2];
  const int64_t groups = m.rows / group;
  std::vector<double> result(g.size());
  int64_t offset = 0;
  for (int64_t size : options.split_qkv) {
    const int64_t rows = groups * size;
    std::vector<double> part(static_cast<size_t>(rows * m.cols));
    for (int64_t gi = 0; gi < groups; ++gi) {
      for (int64_t i = 0; i < size; ++i) {
        std::copy_n(g.begin() + (gi * group + offset + i) * m.cols, m.cols, part.begin() + (gi * size + i) * m.cols);
      }
    }
    const std::vector<double> r = ReferenceNs(part, rows, m.cols, RefArgsFor(options, rows, m.cols));
    for (int64_t gi = 0; gi < groups; ++gi) {
      for (int64_t i = 0; i < size; ++i) {
        std::copy_n(r.begin() + (gi * size + i) * m.cols, m.cols, result.begin() + (gi * group + offset + i) * m.cols);
      }
    }
    offset += size;
  }
  return result;
}

double ReferenceTolerance(const NsOptions& options, DType npy_dtype, std::optional<DType> wire) {
  double tolerance = options.precision == Precision::kMedium ? 1e-2 : 1e-5;
  const DType w = wire.value_or(npy_dtype);
  if (w == DType::kBF16 || npy_dtype == DType::kBF16) {
    tolerance += 1.0 / 256;  // bf16: 8 significant bits.
  } else if (w == DType::kF16 || npy_dtype == DType::kF16) {
    tolerance += 1.0 / 1024;  // fp16: 11 significant bits.
  }
  return tolerance;
}

}  // namespace orthoserve::testing
