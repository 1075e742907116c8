// Implementation of tests/gpu/gpu_test_util.h.
#include "tests/gpu/gpu_test_util.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <random>

#include "server/engine/newton_schulz.h"

namespace orthoserve::gpu_testing {
namespace {

using Mat = std::vector<double>;

double Bf16(double v) { return RoundToBf16(static_cast<float>(v)); }

// Row-major c (n × m) = a (n × k) · b (k × m).
Mat MatMul(const Mat& a, const Mat& b, int64_t n, int64_t k, int64_t m) {
  Mat c(static_cast<size_t>(n * m), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    double* ci = &c[i * m];
    for (int64_t p = 0; p < k; ++p) {
      const double aip = a[i * k + p];
      const double* bp = &b[p * m];
      for (int64_t j = 0; j < m; ++j) ci[j] += aip * bp[j];
    }
  }
  return c;
}

// x (m × n) times its transpose: dot products of rows.
Mat GramOf(const Mat& x, int64_t m, int64_t n) {
  Mat a(static_cast<size_t>(m * m), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = i; j < m; ++j) {
      double s = 0;
      for (int64_t p = 0; p < n; ++p) s += x[i * n + p] * x[j * n + p];
      a[i * m + j] = s;
      a[j * m + i] = s;
    }
  }
  return a;
}

Mat Transposed(const Mat& x, int64_t rows, int64_t cols) {
  Mat t(x.size());
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) t[j * rows + i] = x[i * cols + j];
  }
  return t;
}

}  // namespace

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

std::vector<double> RandomMatrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<double> m(static_cast<size_t>(rows * cols));
  for (double& v : m) v = dist(rng);
  return m;
}

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

double RelativeError(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  if (a.size() != b.size()) return INFINITY;
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

std::vector<double> ReferenceNs(const std::vector<double>& g, int64_t rows, int64_t cols, const NsKernelArgs& args,
                                bool medium) {
  const bool t = args.transpose;
  const int64_t m = t ? cols : rows, n = t ? rows : cols;
  Mat x = t ? Transposed(g, rows, cols) : g;
  const bool bf16_norm = args.normalization == Normalization::kBf16;  // torch.optim.Muon's order.
  if (bf16_norm) {
    for (double& v : x) v = Bf16(static_cast<float>(v));
  }
  double sumsq = 0;
  for (double v : x) sumsq += v * v;
  const double norm = std::sqrt(sumsq);
  double d = args.eps_mode == EpsMode::kAdd ? norm + args.eps : std::max(norm, args.eps);
  if (bf16_norm) {
    const double norm_b = Bf16(static_cast<float>(norm));
    const double eps_b = Bf16(static_cast<float>(args.eps));
    d = args.eps_mode == EpsMode::kAdd ? Bf16(static_cast<float>(norm_b + eps_b)) : std::max(norm_b, eps_b);
  }
  for (double& v : x) {
    v = medium ? Bf16(static_cast<float>(v) / static_cast<float>(d)) : v / d;
  }
  for (const CoefficientTriple& c : args.schedule) {
    Mat a = GramOf(x, m, n);
    if (medium) {
      for (double& v : a) v = Bf16(v);
    }
    Mat left;  // B, or A when c = 0.
    double alpha = 1.0;
    if (c.c != 0) {
      Mat aa = MatMul(a, a, m, m, m);
      left.resize(a.size());
      for (size_t i = 0; i < a.size(); ++i) {
        left[i] = c.b * a[i] + c.c * aa[i];
        if (medium) left[i] = Bf16(left[i]);
      }
    } else {
      left = a;
      alpha = c.b;
    }
    Mat bx = MatMul(left, x, m, m, n);
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = c.a * x[i] + alpha * bx[i];
      if (medium) x[i] = Bf16(x[i]);
    }
  }
  Mat out = t ? Transposed(x, m, n) : x;
  for (double& v : out) v *= args.scale;
  return out;
}

NsResult RunOne(Backend& backend, const std::vector<double>& g, int64_t rows, int64_t cols, const NsOptions& options,
                DType in_dtype, DType out_dtype) {
  std::vector<char> in = Pack(g, in_dtype);
  NsResult r;
  r.bytes.assign(static_cast<size_t>(rows * cols) * ElementSize(out_dtype), 0);
  MatrixJob job;
  job.name = "m";
  job.shape = Matrix2d{rows, cols};
  job.scale_shape = job.shape;
  job.in_dtype = in_dtype;
  job.in = in.data();
  job.out_dtype = out_dtype;
  job.out = r.bytes.data();
  job.options = &options;
  r.status = OrthogonalizeOne(backend, job);
  r.values = Unpack(r.bytes, out_dtype);
  return r;
}

std::vector<double> ReferenceFor(const std::vector<double>& g, int64_t rows, int64_t cols, const NsOptions& options,
                                 DType in_dtype) {
  const NsKernelArgs args = ResolveKernelArgs(options, Matrix2d{rows, cols}, Matrix2d{rows, cols});
  return ReferenceNs(AsSeen(g, in_dtype), rows, cols, args, options.precision == Precision::kMedium);
}

}  // namespace orthoserve::gpu_testing
