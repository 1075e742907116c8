// Coefficient schedules, scale factors and option validation of common/ns_options.h.
#include "common/ns_options.h"

#include <cmath>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using ::orthoserve::testing::StatusIs;
using ::testing::HasSubstr;

NsOptions With(CoefficientType type, int steps) {
  NsOptions o;
  o.coefficients = type;
  o.steps = steps;
  return o;
}

TEST(Schedule, QuinticCyclesPastFive) {
  auto s = CoefficientSchedule(With(CoefficientType::kQuintic, 7));
  ASSERT_EQ(s.size(), 7u);
  EXPECT_EQ(s[0], (CoefficientTriple{4.0848, -6.8946, 2.9270}));
  EXPECT_EQ(s[4], (CoefficientTriple{2.8366, -3.0525, 1.2012}));
  EXPECT_EQ(s[5], s[0]);
  EXPECT_EQ(s[6], s[1]);
}

TEST(Schedule, PolarExpressRepeatsLast) {
  auto s = CoefficientSchedule(With(CoefficientType::kPolarExpress, 10));
  EXPECT_EQ(s[0], (CoefficientTriple{8.2051, -22.9019, 16.4607}));
  EXPECT_EQ(s[7], (CoefficientTriple{1.8750, -1.2500, 0.3750}));
  EXPECT_EQ(s[9], s[7]);
  auto shorter = CoefficientSchedule(With(CoefficientType::kPolarExpress, 3));
  EXPECT_EQ(shorter.size(), 3u);
}

TEST(Schedule, CansRepeatsLastAndAolCycles) {
  auto cans = CoefficientSchedule(With(CoefficientType::kCans, 7));
  EXPECT_EQ(cans[6], (CoefficientTriple{2.2737, -1.6447, 0.4162}));
  auto aol = CoefficientSchedule(With(CoefficientType::kAol, 5));
  EXPECT_EQ(aol[4], (CoefficientTriple{4.0098, -7.0585, 2.4635}));
}

TEST(Schedule, DeepseekV4) {
  auto s = CoefficientSchedule(With(CoefficientType::kDeepseekV4, 12));
  for (int i = 0; i < 8; ++i) EXPECT_EQ(s[i], (CoefficientTriple{3.4445, -4.7750, 2.0315}));
  for (int i = 8; i < 12; ++i) EXPECT_EQ(s[i], (CoefficientTriple{2.0, -1.5, 0.5}));
}

TEST(Schedule, SimpleCustomAndCubic5) {
  auto simple = CoefficientSchedule(With(CoefficientType::kSimple, 3));
  EXPECT_EQ(simple[2], (CoefficientTriple{3.4445, -4.7750, 2.0315}));
  NsOptions custom = With(CoefficientType::kCustom, 5);
  custom.custom_coefficients = {{1, 2, 3}, {4, 5, 6}};
  auto c = CoefficientSchedule(custom);
  EXPECT_EQ(c[4], (CoefficientTriple{1, 2, 3}));
  EXPECT_EQ(c[3], (CoefficientTriple{4, 5, 6}));
  auto cubic = CoefficientSchedule(With(CoefficientType::kCubic5, 5));
  EXPECT_EQ(cubic[0], (CoefficientTriple{3.3656576, -3.3420992, 0}));
  EXPECT_EQ(cubic[4], (CoefficientTriple{2.2230472, -0.9630650, 0}));
  EXPECT_TRUE(CoefficientSchedule(With(CoefficientType::kQuintic, 0)).empty());
}

TEST(Validate, Steps) {
  EXPECT_OK(ValidateNsOptions(With(CoefficientType::kQuintic, 0), "m"));
  EXPECT_OK(ValidateNsOptions(With(CoefficientType::kQuintic, 100), "m"));
  EXPECT_THAT(ValidateNsOptions(With(CoefficientType::kQuintic, 101), "matrix \"w\" options"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("matrix \"w\" options: steps = 101")));
  EXPECT_THAT(ValidateNsOptions(With(CoefficientType::kQuintic, -1), "m"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("0 to 100")));
  EXPECT_THAT(ValidateNsOptions(With(CoefficientType::kCubic5, 4), "m"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cubic5 needs steps = 5")));
}

TEST(Validate, CustomCoefficients) {
  EXPECT_THAT(ValidateNsOptions(With(CoefficientType::kCustom, 5), "m"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("non-empty custom_coefficients")));
  NsOptions o = With(CoefficientType::kCustom, 5);
  o.custom_coefficients = {{1, std::numeric_limits<double>::quiet_NaN(), 0}};
  EXPECT_THAT(ValidateNsOptions(o, "m"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not finite")));
  NsOptions q;
  q.custom_coefficients = {{1, 2, 3}};
  EXPECT_THAT(ValidateNsOptions(q, "m"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("set coefficients to custom")));
}

TEST(Validate, EpsScaleAndSplitQkv) {
  NsOptions o;
  o.eps = -1;
  EXPECT_THAT(ValidateNsOptions(o, "m"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("eps")));
  o = NsOptions();
  o.extra_scale = std::numeric_limits<double>::infinity();
  EXPECT_THAT(ValidateNsOptions(o, "m"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("extra_scale")));
  o = NsOptions();
  o.split_qkv = {4, 2};
  EXPECT_THAT(ValidateNsOptions(o, "m"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("exactly three")));
  o.split_qkv = {4, 0, 2};
  EXPECT_THAT(ValidateNsOptions(o, "m"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("positive")));
  o.split_qkv = {4, 2, 2};
  EXPECT_OK(ValidateNsOptions(o, "m"));
  EXPECT_OK(ValidateNsOptionsForShape(o, Matrix2d{16, 5}, "m"));
  EXPECT_THAT(ValidateNsOptionsForShape(o, Matrix2d{12, 5}, "m"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("divisible by q+k+v = 8")));
}

TEST(Scale, Modes) {
  EXPECT_DOUBLE_EQ(ScaleFactor(16, 4, ScaleMode::kSpectral, 1), 4.0);
  EXPECT_DOUBLE_EQ(ScaleFactor(4, 16, ScaleMode::kSpectral, 2), 8.0);
  EXPECT_DOUBLE_EQ(ScaleFactor(16, 4, ScaleMode::kShapeScaling, 1), 2.0);
  EXPECT_DOUBLE_EQ(ScaleFactor(4, 16, ScaleMode::kShapeScaling, 1), 1.0);
  EXPECT_DOUBLE_EQ(ScaleFactor(4, 16, ScaleMode::kUnitRmsNorm, 1), 0.5);
  EXPECT_DOUBLE_EQ(ScaleFactor(4, 16, ScaleMode::kNone, 3), 3.0);
}

TEST(Names, RoundTripAndErrors) {
  for (auto t : {CoefficientType::kSimple, CoefficientType::kQuintic, CoefficientType::kPolarExpress,
                 CoefficientType::kAol, CoefficientType::kCans, CoefficientType::kDeepseekV4, CoefficientType::kCubic5,
                 CoefficientType::kCustom}) {
    CoefficientType back;
    ASSERT_OK(ParseCoefficientType(CoefficientTypeName(t), &back));
    EXPECT_EQ(back, t);
  }
  Precision p;
  EXPECT_THAT(ParsePrecision("low", &p), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("highest, high, medium")));
  auto triples = ParseCustomCoefficients("1,2,3; 4,5,6");
  ASSERT_OK(triples);
  EXPECT_EQ(triples->size(), 2u);
  EXPECT_THAT(ParseCustomCoefficients("1,2"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("a,b,c")));
}

TEST(Flops, SkipsAASquareWhenCIsZero) {
  NsOptions quintic = With(CoefficientType::kQuintic, 1);
  NsOptions cubic = With(CoefficientType::kCubic5, 5);
  // 8x32 wide: m = 8, n = 32.
  EXPECT_DOUBLE_EQ(NsFlops(8, 32, quintic), 2.0 * 8 * 8 * 32 * 2 + 2.0 * 8 * 8 * 8);
  EXPECT_DOUBLE_EQ(NsFlops(32, 8, cubic), 5 * (2.0 * 8 * 8 * 32 * 2));
}

}  // namespace
}  // namespace orthoserve
