// `orthoctl orthogonalize` against a running `orthoserve`: every coefficient set × precision ×
// scale mode, the other options, every wire dtype with float32 and float16 .npy inputs, shapes
// from 1×1 to 4096×4096, split_qkv and N-d inputs. Each result is compared bit-exactly with the
// in-process engine (same CPU backend, 1 BLAS thread) and, up to 130×130, with the independent
// float64 / bf16-emulating reference within the precision's tolerance.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/binaries/expectations.h"
#include "tests/integration/binaries/server_fixture.h"
#include "tests/unit/engine/reference_ns.h"

namespace orthoserve::testing {
namespace {

using client::NpyArray;

struct Named {
  const char* name;
  int value;
};

constexpr Named kCoefficientSets[] = {
    {"simple", static_cast<int>(CoefficientType::kSimple)},
    {"quintic", static_cast<int>(CoefficientType::kQuintic)},
    {"polar_express", static_cast<int>(CoefficientType::kPolarExpress)},
    {"aol", static_cast<int>(CoefficientType::kAol)},
    {"cans", static_cast<int>(CoefficientType::kCans)},
    {"deepseekv4", static_cast<int>(CoefficientType::kDeepseekV4)},
    {"cubic5", static_cast<int>(CoefficientType::kCubic5)},
    {"custom", static_cast<int>(CoefficientType::kCustom)},
};
constexpr Named kPrecisions[] = {{"highest", static_cast<int>(Precision::kHighest)},
                                 {"high", static_cast<int>(Precision::kHigh)},
                                 {"medium", static_cast<int>(Precision::kMedium)}};
constexpr Named kScaleModes[] = {{"spectral", static_cast<int>(ScaleMode::kSpectral)},
                                 {"shape_scaling", static_cast<int>(ScaleMode::kShapeScaling)},
                                 {"unit_rms_norm", static_cast<int>(ScaleMode::kUnitRmsNorm)},
                                 {"none", static_cast<int>(ScaleMode::kNone)}};

// Exactly representable custom triples, so the flag text and the options agree to the bit.
constexpr char kCustomFlag[] = "3.5,-4.5,1.75;2.5,-2,0.5";
const std::vector<CoefficientTriple> kCustomTriples = {{3.5, -4.5, 1.75}, {2.5, -2.0, 0.5}};

const char* WireName(DType d) { return d == DType::kF32 ? "fp32" : d == DType::kBF16 ? "bf16" : "fp16"; }

class OrthogonalizeTest : public BinariesTest {
 protected:
  // Runs orthoctl on `in` with `flags` (plus --wire-dtype when `wire` is set) and expects the
  // output to be the engine's bytes exactly and, when `check_reference`, within the reference's
  // tolerance.
  // Returns the relative Frobenius error against the reference (-1 when not checked or failed).
  double ExpectMatches(const std::string& tag, const NpyArray& in, const NsOptions& options,
                       std::vector<std::string> flags, std::optional<DType> wire = std::nullopt,
                       bool check_reference = true) {
    SCOPED_TRACE(tag);
    if (wire.has_value()) {
      flags.push_back("--wire-dtype");
      flags.push_back(WireName(*wire));
    }
    std::optional<NpyArray> out = OrthogonalizeViaBinary(tag, in, flags);
    if (!out.has_value()) return -1;  // Failure already reported.
    EXPECT_EQ(out->shape, in.shape);
    EXPECT_EQ(out->dtype, in.dtype);
    absl::StatusOr<NpyArray> engine = EngineExpected(in, options, wire);
    EXPECT_TRUE(engine.ok()) << engine.status();
    if (!engine.ok() || out->shape != in.shape || out->dtype != in.dtype) return -1;
    EXPECT_EQ(out->data.size(), engine->data.size());
    if (out->data.size() != engine->data.size()) return -1;
    if (out->data != engine->data) {
      const std::vector<double> got = ValuesOf(*out), want = ValuesOf(*engine);
      size_t differ = 0;
      double max_diff = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        if (got[i] != want[i]) ++differ;
        max_diff = std::max(max_diff, std::abs(got[i] - want[i]));
      }
      ADD_FAILURE() << differ << " of " << got.size() << " elements differ from the in-process engine, max |diff| "
                    << max_diff;
    }
    if (!check_reference) return -1;
    const double error = RelativeError(ValuesOf(*out), ReferenceExpected(in, options, wire));
    EXPECT_LE(error, ReferenceTolerance(options, in.dtype, wire));
    return error;
  }
};

TEST_F(OrthogonalizeTest, EveryCoefficientSetPrecisionAndScaleMode) {
  const NpyArray in = RandomArray(DType::kF32, {24, 40}, 11);
  int cases = 0;
  double worst_fp32 = 0, worst_medium = 0;  // Largest errors against the reference, for the log.
  const absl::Time start = absl::Now();
  for (const Named& coefficients : kCoefficientSets) {
    for (const Named& precision : kPrecisions) {
      for (const Named& scale : kScaleModes) {
        NsOptions o;
        o.coefficients = static_cast<CoefficientType>(coefficients.value);
        o.precision = static_cast<Precision>(precision.value);
        o.scale_mode = static_cast<ScaleMode>(scale.value);
        std::vector<std::string> flags = {"--coefficients", coefficients.name, "--precision",
                                          precision.name,   "--scale-mode",    scale.name};
        if (o.coefficients == CoefficientType::kCustom) {
          o.custom_coefficients = kCustomTriples;
          flags.push_back("--custom-coefficients");
          flags.push_back(kCustomFlag);
        }
        const double error =
            ExpectMatches(absl::StrCat(coefficients.name, "_", precision.name, "_", scale.name), in, o, flags);
        double& worst = o.precision == Precision::kMedium ? worst_medium : worst_fp32;
        worst = std::max(worst, error);
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, 96);
  std::cerr << cases << " orthoctl runs in " << absl::FormatDuration(absl::Now() - start)
            << "; largest relative error against the reference: highest/high " << worst_fp32 << ", medium "
            << worst_medium << "\n";
}

TEST_F(OrthogonalizeTest, StepsEpsTransposeAndExtraScale) {
  const NpyArray tall = RandomArray(DType::kF32, {40, 24}, 12);
  struct Case {
    std::string tag;
    std::vector<std::string> flags;
    NsOptions options;
  };
  std::vector<Case> cases;
  auto add = [&](std::string tag, std::vector<std::string> flags, auto edit) {
    NsOptions o;
    o.precision = Precision::kHighest;
    edit(o);
    flags.push_back("--precision");
    flags.push_back("highest");
    cases.push_back({std::move(tag), std::move(flags), o});
  };
  add("defaults", {}, [](NsOptions&) {});
  add("steps0", {"--steps", "0"}, [](NsOptions& o) { o.steps = 0; });
  add("steps7", {"--steps", "7"}, [](NsOptions& o) { o.steps = 7; });
  add("polar30", {"--coefficients", "polar_express", "--steps", "30"}, [](NsOptions& o) {
    o.coefficients = CoefficientType::kPolarExpress;
    o.steps = 30;
  });
  add("eps_add", {"--eps-mode", "add", "--eps", "0.5"}, [](NsOptions& o) {
    o.eps_mode = EpsMode::kAdd;
    o.eps = 0.5;
  });
  add("eps0", {"--eps", "0"}, [](NsOptions& o) { o.eps = 0; });
  add("transpose_on", {"--transpose", "on"}, [](NsOptions& o) { o.transpose = TransposeMode::kOn; });
  add("transpose_off", {"--transpose", "off"}, [](NsOptions& o) { o.transpose = TransposeMode::kOff; });
  add("extra_scale", {"--extra-scale", "0.375", "--scale-mode", "unit_rms_norm"}, [](NsOptions& o) {
    o.extra_scale = 0.375;
    o.scale_mode = ScaleMode::kUnitRmsNorm;
  });
  for (const Case& c : cases) ExpectMatches(c.tag, tall, c.options, c.flags);
  // MEDIUM with eps add and transpose off, for the bf16 path on a tall matrix worked untransposed.
  NsOptions medium;
  medium.eps_mode = EpsMode::kAdd;
  medium.transpose = TransposeMode::kOff;
  ExpectMatches("medium_add_off", tall, medium, {"--eps-mode", "add", "--transpose", "off"});
}

TEST_F(OrthogonalizeTest, EveryWireDtypeWithFloat32AndFloat16Inputs) {
  for (DType npy : {DType::kF32, DType::kF16}) {
    const NpyArray in = RandomArray(npy, {40, 24}, 13);
    for (std::optional<DType> wire : {std::optional<DType>(), std::optional<DType>(DType::kF32),
                                      std::optional<DType>(DType::kBF16), std::optional<DType>(DType::kF16)}) {
      for (const char* precision : {"highest", "medium"}) {
        NsOptions o;
        o.precision = std::string(precision) == "highest" ? Precision::kHighest : Precision::kMedium;
        ExpectMatches(
            absl::StrCat("npy_", DTypeName(npy), "_wire_", wire ? WireName(*wire) : "default", "_", precision), in, o,
            {"--precision", precision}, wire);
      }
    }
  }
}

// A bfloat16 .npy ('<V2', ml_dtypes) read with --bf16 travels as bf16 and is written back as '<V2'.
TEST_F(OrthogonalizeTest, Bfloat16NpyWithBf16Flag) {
  const NpyArray in = RandomArray(DType::kBF16, {24, 40}, 15);
  for (const char* precision : {"highest", "medium"}) {
    NsOptions o;
    o.precision = std::string(precision) == "highest" ? Precision::kHighest : Precision::kMedium;
    ExpectMatches(absl::StrCat("npy_bf16_", precision), in, o, {"--bf16", "--precision", precision});
    ExpectMatches(absl::StrCat("npy_bf16_wire_fp32_", precision), in, o, {"--bf16", "--precision", precision},
                  DType::kF32);
  }
}

// Chunking is invisible: tiny DataChunks give the same bytes as the default 4 MiB ones.
TEST_F(OrthogonalizeTest, ChunkSizeDoesNotChangeTheResult) {
  const NpyArray in = RandomArray(DType::kF32, {64, 96}, 16);
  for (const char* chunk : {"7", "100", "4096"}) {
    ExpectMatches(absl::StrCat("chunk_", chunk), in, NsOptions{}, {"--chunk-bytes", chunk});
  }
}

// The wire dtype must matter: a float32 input sent as bf16 is rounded before the server computes
// and its result comes back in bf16 precision (so it differs from the fp32 wire's answer).
TEST_F(OrthogonalizeTest, Bf16WireRoundsInputAndResult) {
  const NpyArray in = RandomArray(DType::kF32, {24, 40}, 14);
  std::optional<NpyArray> fp32 = OrthogonalizeViaBinary("wire_fp32", in, {"--precision", "highest"});
  std::optional<NpyArray> bf16 =
      OrthogonalizeViaBinary("wire_bf16", in, {"--precision", "highest", "--wire-dtype", "bf16"});
  ASSERT_TRUE(fp32.has_value() && bf16.has_value());
  ASSERT_EQ(bf16->dtype, DType::kF32);
  const std::vector<double> b = ValuesOf(*bf16);
  for (double v : b) ASSERT_EQ(v, RefBf16(v)) << "not a bf16 value widened to float32";
  EXPECT_GT(RelativeError(b, ValuesOf(*fp32)), 1e-4);
}

TEST_F(OrthogonalizeTest, SmallTallWideAndSquareShapesAgainstTheReference) {
  const std::vector<std::vector<int64_t>> shapes = {{1, 1},  {1, 7},   {7, 1},    {2, 2},   {3, 50},
                                                    {50, 3}, {64, 64}, {17, 130}, {130, 17}};
  uint32_t seed = 20;
  for (const std::vector<int64_t>& shape : shapes) {
    const NpyArray in = RandomArray(DType::kF32, shape, ++seed);
    for (const char* precision : {"highest", "medium"}) {
      NsOptions o;
      o.precision = std::string(precision) == "highest" ? Precision::kHighest : Precision::kMedium;
      ExpectMatches(absl::StrCat(shape[0], "x", shape[1], "_", precision), in, o, {"--precision", precision});
    }
  }
}

TEST_F(OrthogonalizeTest, SplitQkvAndNdInputs) {
  {
    // 3 query groups of q + k + v = 4 + 2 + 2 rows.
    const NpyArray qkv = RandomArray(DType::kF32, {24, 20}, 30);
    for (const char* precision : {"highest", "medium"}) {
      NsOptions o;
      o.precision = std::string(precision) == "highest" ? Precision::kHighest : Precision::kMedium;
      o.split_qkv = {4, 2, 2};
      ExpectMatches(absl::StrCat("qkv_", precision), qkv, o, {"--split-qkv", "4,2,2", "--precision", precision});
    }
    // Split results differ from the unsplit matrix's.
    std::optional<NpyArray> split = OrthogonalizeViaBinary("qkv_split", qkv, {"--split-qkv", "4,2,2"});
    std::optional<NpyArray> whole = OrthogonalizeViaBinary("qkv_whole", qkv, {});
    ASSERT_TRUE(split.has_value() && whole.has_value());
    EXPECT_GT(RelativeError(ValuesOf(*split), ValuesOf(*whole)), 1e-2);
  }
  NsOptions highest;
  highest.precision = Precision::kHighest;
  ExpectMatches("nd_6x4x3_f32", RandomArray(DType::kF32, {6, 4, 3}, 31), highest, {"--precision", "highest"});
  ExpectMatches("nd_4x3x2x2_f16", RandomArray(DType::kF16, {4, 3, 2, 2}, 32), highest, {"--precision", "highest"});
  ExpectMatches("nd_4x3x2x2_f16_medium", RandomArray(DType::kF16, {4, 3, 2, 2}, 33), NsOptions{}, {});
  ExpectMatches("nd_6x4x3_f32_bf16_wire", RandomArray(DType::kF32, {6, 4, 3}, 34), NsOptions{}, {}, DType::kBF16);
}

// Large matrices against the in-process engine only (the reference's O(n³) loops are too slow).
// The engine runs in a second thread while the server computes.
TEST_F(OrthogonalizeTest, LargeMatricesMatchTheEngineBitExactly) {
  struct Large {
    std::vector<int64_t> shape;
    int steps;
  };
  for (const Large& large : {Large{{1024, 1024}, 5}, Large{{2048, 512}, 2}, Large{{4096, 4096}, 1}}) {
    const std::string tag = absl::StrCat("large_", large.shape[0], "x", large.shape[1]);
    SCOPED_TRACE(tag);
    const NpyArray in = RandomArray(DType::kF32, large.shape, 40);
    NsOptions o;
    o.steps = large.steps;
    absl::StatusOr<NpyArray> engine = absl::UnknownError("not run");
    const absl::Time start = absl::Now();
    std::thread expected([&] { engine = EngineExpected(in, o); });
    std::optional<NpyArray> out = OrthogonalizeViaBinary(tag, in, {"--steps", std::to_string(large.steps)});
    const absl::Duration binary = absl::Now() - start;
    expected.join();
    std::cerr << tag << " steps " << large.steps << ": orthoctl " << absl::FormatDuration(binary) << ", with engine "
              << absl::FormatDuration(absl::Now() - start) << "\n";
    ASSERT_TRUE(engine.ok()) << engine.status();
    ASSERT_TRUE(out.has_value());
    ASSERT_EQ(out->shape, in.shape);
    EXPECT_TRUE(out->data == engine->data) << "result differs from the in-process engine";
  }
}

}  // namespace
}  // namespace orthoserve::testing
