// Implementation of tests/unit/engine/reference_ns.h.
#include "tests/unit/engine/reference_ns.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace orthoserve::testing {
namespace {

std::vector<RefTriple> Table(CoefficientType type, bool* repeat_last) {
  *repeat_last = false;
  switch (type) {
    case CoefficientType::kSimple:
      return {{3.4445, -4.7750, 2.0315}};
    case CoefficientType::kQuintic:
      return {{4.0848, -6.8946, 2.9270},
              {3.9505, -6.3029, 2.6377},
              {3.7418, -5.5913, 2.3037},
              {2.8769, -3.1427, 1.2046},
              {2.8366, -3.0525, 1.2012}};
    case CoefficientType::kPolarExpress:
      *repeat_last = true;
      return {{8.2051, -22.9019, 16.4607}, {4.0664, -2.8612, 0.5184}, {3.9096, -2.8234, 0.5250},
              {3.2856, -2.4153, 0.4853},   {2.2779, -1.6198, 0.3985}, {1.8726, -1.2307, 0.3585},
              {1.8564, -1.2132, 0.3568},   {1.8750, -1.2500, 0.3750}};
    case CoefficientType::kAol:
      return {
          {4.0098, -7.0585, 2.4635}, {3.4585, -5.5479, 2.5959}, {2.7573, -3.2939, 1.4254}, {2.7215, -3.0494, 1.3169}};
    case CoefficientType::kCans:
      *repeat_last = true;
      return {{8.4703, -25.1081, 18.6293},
              {4.1828, -3.1087, 0.5806},
              {3.9619, -2.9541, 0.5630},
              {3.2866, -2.4647, 0.5074},
              {2.2737, -1.6447, 0.4162}};
    case CoefficientType::kDeepseekV4: {
      *repeat_last = true;
      std::vector<RefTriple> t(8, RefTriple{3.4445, -4.7750, 2.0315});
      t.push_back({2.0, -1.5, 0.5});
      t.push_back({2.0, -1.5, 0.5});
      return t;
    }
    case CoefficientType::kCubic5:
      return {{3.3656576, -3.3420992, 0},
              {2.5744352, -1.4957376, 0},
              {2.5368962, -1.4312570, 0},
              {2.4418906, -1.2764040, 0},
              {2.2230472, -0.9630650, 0}};
    case CoefficientType::kCustom:
      return {};
  }
  return {};
}

// C = A·B for row-major n×k and k×m matrices, naive loop in double.
std::vector<double> MatMul(const std::vector<double>& a, const std::vector<double>& b, int64_t n, int64_t k,
                           int64_t m) {
  std::vector<double> c(static_cast<size_t>(n * m), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < m; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) s += a[i * k + p] * b[p * m + j];
      c[i * m + j] = s;
    }
  }
  return c;
}

// fp32 rounding then bf16 rounding: an fp32-accumulated output rounded to bf16.
double Medium(double v) { return RefBf16(static_cast<float>(v)); }

}  // namespace

std::vector<RefTriple> RefSchedule(CoefficientType type, int steps, const std::vector<RefTriple>& custom) {
  bool repeat_last = false;
  std::vector<RefTriple> list = type == CoefficientType::kCustom ? custom : Table(type, &repeat_last);
  std::vector<RefTriple> out;
  for (int i = 0; i < steps; ++i) {
    const size_t n = list.size();
    const size_t k = static_cast<size_t>(i) < n ? static_cast<size_t>(i) : (repeat_last ? n - 1 : i % n);
    out.push_back(list[k]);
  }
  return out;
}

double RefScale(int64_t rows, int64_t cols, ScaleMode mode, double extra) {
  const double out = static_cast<double>(rows), in = static_cast<double>(cols);
  switch (mode) {
    case ScaleMode::kSpectral:
      return std::sqrt(std::max(out, in)) * extra;
    case ScaleMode::kShapeScaling:
      return std::sqrt(std::max(1.0, out / in)) * extra;
    case ScaleMode::kUnitRmsNorm:
      return std::sqrt(out / in) * extra;
    case ScaleMode::kNone:
      return extra;
  }
  return extra;
}

double RefBf16(double value) {
  const float f = static_cast<float>(value);
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  const uint32_t lower = bits & 0xffffu;
  uint32_t upper = bits & 0xffff0000u;
  const uint32_t lsb = (bits >> 16) & 1u;
  if (lower > 0x8000u || (lower == 0x8000u && lsb == 1u)) upper += 0x10000u;
  float r;
  std::memcpy(&r, &upper, sizeof(r));
  return r;
}

std::vector<double> ReferenceNs(const std::vector<double>& g, int64_t rows, int64_t cols, const RefArgs& args) {
  const int64_t m = args.transpose ? cols : rows;
  const int64_t n = args.transpose ? rows : cols;
  std::vector<double> x = args.transpose ? TransposeOf(g, rows, cols) : g;

  if (args.bf16_normalization) {
    for (double& v : x) v = RefBf16(static_cast<float>(v));
  }
  double sum = 0;
  for (double v : x) sum += v * v;
  const double norm = std::sqrt(sum);
  double divisor = args.eps_add ? norm + args.eps : std::max(norm, args.eps);
  if (args.bf16_normalization) {
    const double norm_b = RefBf16(static_cast<float>(norm));
    const double eps_b = RefBf16(static_cast<float>(args.eps));
    divisor = args.eps_add ? RefBf16(static_cast<float>(norm_b + eps_b)) : std::max(norm_b, eps_b);
  }
  for (double& v : x) {
    if (!args.medium) {
      v = divisor == 0 ? v : v / divisor;
    } else {
      const float d = static_cast<float>(divisor);
      v = RefBf16(d == 0 ? static_cast<float>(v) : static_cast<float>(v) / d);
    }
  }

  for (const RefTriple& t : args.schedule) {
    std::vector<double> a = MatMul(x, TransposeOf(x, m, n), m, n, m);
    if (args.medium) {
      for (double& v : a) v = Medium(v);
    }
    std::vector<double> bx;
    if (t.c != 0) {
      std::vector<double> aa = MatMul(a, a, m, m, m);
      std::vector<double> b(a.size());
      for (size_t i = 0; i < b.size(); ++i) {
        b[i] = t.b * a[i] + t.c * aa[i];
        if (args.medium) b[i] = Medium(b[i]);
      }
      bx = MatMul(b, x, m, m, n);
    } else {
      bx = MatMul(a, x, m, m, n);
      for (double& v : bx) v *= t.b;
    }
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = t.a * x[i] + bx[i];
      if (args.medium) x[i] = Medium(x[i]);
    }
  }

  std::vector<double> out = args.transpose ? TransposeOf(x, m, n) : x;
  for (double& v : out) v *= args.scale;
  return out;
}

double RelativeError(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

std::vector<double> RandomMatrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<double> m(static_cast<size_t>(rows * cols));
  for (double& v : m) v = dist(gen);
  return m;
}

std::vector<double> TransposeOf(const std::vector<double>& m, int64_t rows, int64_t cols) {
  std::vector<double> t(m.size());
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) t[j * rows + i] = m[i * cols + j];
  }
  return t;
}

RefArgs RefArgsFor(const NsOptions& o, int64_t rows, int64_t cols) {
  RefArgs args;
  std::vector<RefTriple> custom;
  for (const CoefficientTriple& t : o.custom_coefficients) custom.push_back({t.a, t.b, t.c});
  args.schedule = RefSchedule(o.coefficients, o.steps, custom);
  args.medium = o.precision == Precision::kMedium;
  args.eps = o.eps;
  args.eps_add = o.eps_mode == EpsMode::kAdd;
  args.bf16_normalization = o.normalization == Normalization::kBf16;
  args.transpose = o.transpose == TransposeMode::kOn || (o.transpose == TransposeMode::kAuto && rows > cols);
  args.scale = RefScale(rows, cols, o.scale_mode, o.extra_scale);
  return args;
}

}  // namespace orthoserve::testing
