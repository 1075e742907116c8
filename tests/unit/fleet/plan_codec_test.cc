// The fleet's own plan message (server/fleet/wire/plan_codec.h) and the codecs of ready reports and
// log entries built on it: every field round-trips bit-exactly, a corrupt message is refused
// naming the matrix, and decoding is structural only (a plan ValidatePlan rejects still decodes,
// and the batch then fails that matrix in-band).
#include "server/fleet/wire/plan_codec.h"

#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/fleet_change.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "server/distributed/local_batch.h"
#include "server/engine/cpu/cpu_backend.h"
#include "server/fleet/wire/fleet_codec.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using ::google::protobuf::TextFormat;
using ::google::protobuf::util::MessageDifferencer;
using ::orthoserve::testing::StatusIs;
using ::testing::HasSubstr;

// Every field of a MatrixPlan, placements and owner included (FirstSpecDifference skips some).
void ExpectSamePlan(const MatrixPlan& a, const MatrixPlan& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.shape, b.shape);
  EXPECT_EQ(a.layout, b.layout);
  EXPECT_EQ(a.view.rows, b.view.rows);
  EXPECT_EQ(a.view.cols, b.view.cols);
  EXPECT_EQ(a.dtype, b.dtype);
  EXPECT_EQ(a.result_dtype, b.result_dtype);
  EXPECT_TRUE(a.options == b.options) << a.name;
  EXPECT_EQ(a.options.custom_coefficients, b.options.custom_coefficients);
  EXPECT_EQ(a.options.split_qkv, b.options.split_qkv);
  EXPECT_EQ(a.algorithm, b.algorithm);
  EXPECT_EQ(a.partition_dim, b.partition_dim);
  EXPECT_EQ(a.owner, b.owner);
  ASSERT_EQ(a.blocks.size(), b.blocks.size());
  for (size_t i = 0; i < a.blocks.size(); ++i) {
    EXPECT_EQ(a.blocks[i].trainer_rank, b.blocks[i].trainer_rank);
    EXPECT_EQ(a.blocks[i].fleet_rank, b.blocks[i].fleet_rank);
    EXPECT_TRUE(a.blocks[i].block == b.blocks[i].block);
  }
}

MatrixPlan Plan(std::string name, std::vector<int64_t> shape, NdLayout layout = NdLayout::kFlatten) {
  MatrixPlan m;
  m.name = std::move(name);
  m.shape = std::move(shape);
  m.layout = layout;
  m.view = *ViewAs2d(m.shape, "shape", layout);
  return m;
}

// Plans that between them set every field to something other than its default: custom
// coefficients with non-round doubles, split_qkv, a batch layout, a result dtype other than the
// dtype, every algorithm, both partition dims.
std::vector<MatrixPlan> VariedPlans() {
  std::vector<MatrixPlan> plans;
  {
    MatrixPlan m = Plan("custom", {8, 6});
    m.dtype = DType::kBF16;
    m.result_dtype = DType::kF32;
    m.options.coefficients = CoefficientType::kCustom;
    m.options.custom_coefficients = {{3.4445, -4.775, 2.0315}, {0.1 + 0.2, -1e-300, 1.0 / 3.0}};
    m.options.steps = 7;
    m.options.precision = Precision::kHighest;
    m.options.eps = 1.0 / 7.0;
    m.options.eps_mode = EpsMode::kAdd;
    m.options.transpose = TransposeMode::kOn;
    m.options.scale_mode = ScaleMode::kUnitRmsNorm;
    m.options.extra_scale = 0.2 + 0.1;
    m.algorithm = Algorithm::kGathered;
    plans.push_back(m);
  }
  {
    MatrixPlan m = Plan("qkv", {24, 16});
    m.dtype = DType::kF16;
    m.result_dtype = DType::kBF16;
    m.options.split_qkv = {8, 4, 4};
    m.options.coefficients = CoefficientType::kPolarExpress;
    m.options.precision = Precision::kHigh;
    m.options.transpose = TransposeMode::kOff;
    m.options.scale_mode = ScaleMode::kNone;
    m.algorithm = Algorithm::kTpDistributed;
    m.partition_dim = 1;
    plans.push_back(m);
  }
  {
    MatrixPlan m = Plan("experts", {4, 3, 5, 6}, NdLayout::kBatch);
    m.options.coefficients = CoefficientType::kCubic5;
    m.options.scale_mode = ScaleMode::kShapeScaling;
    m.algorithm = Algorithm::kRowSharded;
    plans.push_back(m);
  }
  {
    MatrixPlan m = Plan("conv", {4, 3, 5});  // N-d, flattened.
    m.options.coefficients = CoefficientType::kSimple;
    m.algorithm = Algorithm::kTpDuplicated;
    m.partition_dim = 0;
    plans.push_back(m);
  }
  for (auto [name, coefficients, algorithm] : {std::tuple{"aol", CoefficientType::kAol, Algorithm::kTpBlockwise},
                                               std::tuple{"cans", CoefficientType::kCans, Algorithm::kAuto},
                                               std::tuple{"dsv4", CoefficientType::kDeepseekV4, Algorithm::kAuto},
                                               std::tuple{"quintic", CoefficientType::kQuintic, Algorithm::kAuto}}) {
    MatrixPlan m = Plan(name, {6, 10});
    m.options.coefficients = coefficients;
    m.algorithm = algorithm;
    m.partition_dim = 1;  // Not a TP mode: carried as it is all the same.
    plans.push_back(m);
  }
  return plans;
}

TEST(PlanCodecTest, EveryFieldOfEveryPlanRoundTrips) {
  const std::vector<MatrixPlan> plans = VariedPlans();
  for (size_t i = 0; i < plans.size(); ++i) {
    SCOPED_TRACE(plans[i].name);
    const fleet::v1::MatrixPlan proto = MatrixPlanToProto(plans[i]);
    absl::StatusOr<MatrixPlan> back = MatrixPlanFromProto(proto, static_cast<int>(i));
    ASSERT_OK(back);
    ExpectSamePlan(plans[i], *back);
    EXPECT_EQ(MatrixPlanToProto(*back).SerializeAsString(), proto.SerializeAsString());
  }
}

TEST(PlanCodecTest, EveryFieldIsWrittenExplicitly) {
  // Default options included: a receiver never relies on what an unset field means.
  MatrixPlan m = Plan("w", {4, 6});
  m.dtype = DType::kBF16;
  m.result_dtype = DType::kBF16;
  fleet::v1::MatrixPlan expected;
  ASSERT_TRUE(TextFormat::ParseFromString(R"pb(
                                            name: "w"
                                            shape: 4
                                            shape: 6
                                            nd_layout: ND_LAYOUT_FLATTEN
                                            dtype: DTYPE_BF16
                                            result_dtype: DTYPE_BF16
                                            options {
                                              coefficients: COEFFICIENTS_QUINTIC
                                              steps: 5
                                              precision: PRECISION_MEDIUM
                                              eps: 1e-7
                                              eps_mode: EPS_MODE_MAX
                                              transpose: TRANSPOSE_AUTO
                                              scale_mode: SCALE_MODE_SPECTRAL
                                              extra_scale: 1
                                            }
                                            algorithm: ALGORITHM_AUTO
                                            partition_dim: 0
                                          )pb",
                                          &expected));
  const fleet::v1::MatrixPlan proto = MatrixPlanToProto(m);
  std::string diff;
  MessageDifferencer differencer;
  differencer.ReportDifferencesToString(&diff);
  EXPECT_TRUE(differencer.Compare(expected, proto)) << diff;
  EXPECT_TRUE(proto.options().has_steps() && proto.options().has_eps() && proto.options().has_extra_scale());
}

TEST(PlanCodecTest, AnUnknownEnumValueIsRefusedNamingTheMatrixAndTheField) {
  const fleet::v1::MatrixPlan good = MatrixPlanToProto(Plan("w1", {4, 6}));
  struct Case {
    const char* field;  // The message after the matrix's name.
    void (*corrupt)(fleet::v1::MatrixPlan&);
  };
  const Case cases[] = {
      {" dtype = 42", [](fleet::v1::MatrixPlan& p) { p.set_dtype(static_cast<v1::DType>(42)); }},
      {" result_dtype = 9", [](fleet::v1::MatrixPlan& p) { p.set_result_dtype(static_cast<v1::DType>(9)); }},
      {" result_dtype is unspecified", [](fleet::v1::MatrixPlan& p) { p.set_result_dtype(v1::DTYPE_UNSPECIFIED); }},
      {": nd_layout = 7", [](fleet::v1::MatrixPlan& p) { p.set_nd_layout(static_cast<v1::NdLayout>(7)); }},
      {": algorithm = 77", [](fleet::v1::MatrixPlan& p) { p.set_algorithm(static_cast<v1::Algorithm>(77)); }},
      {" options: coefficients = 99",
       [](fleet::v1::MatrixPlan& p) { p.mutable_options()->set_coefficients(static_cast<v1::Coefficients>(99)); }},
      {" options: precision = 12",
       [](fleet::v1::MatrixPlan& p) { p.mutable_options()->set_precision(static_cast<v1::Precision>(12)); }},
      {" options: scale_mode = 31",
       [](fleet::v1::MatrixPlan& p) { p.mutable_options()->set_scale_mode(static_cast<v1::ScaleMode>(31)); }},
      {" shape [4] has 1 dims", [](fleet::v1::MatrixPlan& p) { p.mutable_shape()->RemoveLast(); }},
      {" shape [4, 0] has dim 1 = 0", [](fleet::v1::MatrixPlan& p) { p.set_shape(1, 0); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    fleet::v1::MatrixPlan bad = good;
    c.corrupt(bad);
    EXPECT_THAT(MatrixPlanFromProto(bad, 3),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(absl::StrCat("matrix 3 (\"w1\")", c.field))));
  }
  // In a report or a log entry, the whole message is refused, naming the matrix by its index.
  ReadyReport report;
  report.sent = SenderBlocks(SpecList{Plan("a", {2, 2}), Plan("b", {2, 2})}, {Block{0, 0, 2, 2}, Block{0, 0, 2, 2}});
  fleet::v1::ReadyReport report_proto = ReadyReportToProto(report);
  fleet::v1::SpecList list;
  ASSERT_TRUE(list.ParseFromString(report_proto.spec_list()));
  list.mutable_matrices(1)->set_dtype(static_cast<v1::DType>(42));
  report_proto.set_spec_list(list.SerializeAsString());
  EXPECT_THAT(ReadyReportFromProto(report_proto),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("matrix 1 (\"b\") dtype = 42")));
  LogEntry entry;
  entry.plan.matrices = *report.sent.specs;
  fleet::v1::LogEntry entry_proto = LogEntryToProto(entry);
  entry_proto.mutable_matrices(0)->mutable_plan()->mutable_options()->set_eps_mode(static_cast<v1::EpsMode>(5));
  EXPECT_THAT(LogEntryFromProto(entry_proto),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("matrix 0 (\"a\") options: eps_mode = 5")));
}

TEST(PlanCodecTest, AReadyReportRoundTripsBitExactly) {
  ReadyReport report;
  report.key = GroupKey{"tenant", "job", "group", 41, "run"};
  report.trainer_rank = 3;
  report.trainer_world = 4;
  report.fleet_rank = 1;
  report.submission = 0x123456789abcdefULL;
  report.attempt = 2;
  report.epoch = 0xfedcba9876543210ULL;
  report.incarnation = 77;
  const SpecList specs = VariedPlans();
  std::vector<Block> blocks;
  for (size_t i = 0; i < specs.size(); ++i) {
    // The sender's block; an empty one (a trainer rank whose chunk is empty) as well.
    const Matrix2d v = specs[i].view;
    blocks.push_back(i == 2 ? Block{v.rows, 0, 0, v.cols} : Block{v.rows / 2, 0, v.rows - v.rows / 2, v.cols});
  }
  report.sent = SenderBlocks(specs, blocks);
  const fleet::v1::ReadyReport proto = ReadyReportToProto(report);
  absl::StatusOr<ReadyReport> back = ReadyReportFromProto(proto);
  ASSERT_OK(back);
  EXPECT_TRUE(back->key == report.key);
  EXPECT_EQ(back->trainer_rank, 3);
  EXPECT_EQ(back->trainer_world, 4);
  EXPECT_EQ(back->fleet_rank, 1);
  EXPECT_EQ(back->submission, report.submission);
  EXPECT_EQ(back->attempt, 2);
  EXPECT_EQ(back->epoch, report.epoch);
  EXPECT_EQ(back->incarnation, 77u);
  ASSERT_EQ(back->sent.specs->size(), specs.size());
  ASSERT_EQ(back->sent.blocks.size(), blocks.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    ExpectSamePlan(specs[i], back->sent.spec(i));
    EXPECT_TRUE(back->sent.blocks[i] == blocks[i]) << i;
  }
  EXPECT_EQ(ReadyReportToProto(*back).SerializeAsString(), proto.SerializeAsString());
}

TEST(PlanCodecTest, ABatchEntryRoundTripsBitExactly) {
  LogEntry entry;
  entry.index = 12;
  entry.generation = 3;
  entry.key = GroupKey{"tenant", "job", "group", 9, "run"};
  entry.submissions = {5, 6};
  entry.cached = {false, true};
  entry.part_offset = 4;
  entry.more_parts = true;
  entry.plan.trainer_world = 2;
  entry.plan.fleet_world = 2;
  entry.plan.matrices = VariedPlans();
  for (MatrixPlan& m : entry.plan.matrices) {
    const int64_t half = m.view.rows / 2;
    m.blocks = {BlockPlacement{0, 1, Block{0, 0, half, m.view.cols}},
                BlockPlacement{1, 0, Block{half, 0, m.view.rows - half, m.view.cols}}};
    m.owner = m.algorithm == Algorithm::kAuto ? 1 : -1;
  }
  const fleet::v1::LogEntry proto = LogEntryToProto(entry);
  absl::StatusOr<LogEntry> back = LogEntryFromProto(proto);
  ASSERT_OK(back);
  EXPECT_EQ(back->index, 12);
  EXPECT_EQ(back->generation, 3);
  EXPECT_TRUE(back->key == entry.key);
  EXPECT_EQ(back->submissions, entry.submissions);
  EXPECT_EQ(back->cached, entry.cached);
  EXPECT_EQ(back->part_offset, 4);
  EXPECT_TRUE(back->more_parts);
  EXPECT_OK(back->status);
  EXPECT_EQ(back->plan.trainer_world, 2);
  EXPECT_EQ(back->plan.fleet_world, 2);
  ASSERT_EQ(back->plan.matrices.size(), entry.plan.matrices.size());
  for (size_t i = 0; i < entry.plan.matrices.size(); ++i) {
    ExpectSamePlan(entry.plan.matrices[i], back->plan.matrices[i]);
  }
  EXPECT_EQ(LogEntryToProto(*back).SerializeAsString(), proto.SerializeAsString());
}

TEST(PlanCodecTest, AFailureEntryKeepsItsFleetChangeMarkAcrossTheWire) {
  // The mark is a status payload in process and LogEntry.retryable on the wire; code, message and
  // failure reason travel beside it, and an unmarked failure stays final.
  LogEntry changed;
  changed.key.step = 3;
  changed.status = MarkFleetChange(absl::AbortedError("step 3: the membership changed while it waited"));
  changed.failure = kStepFailureTimeout;
  const fleet::v1::LogEntry changed_proto = LogEntryToProto(changed);
  EXPECT_TRUE(changed_proto.retryable());
  absl::StatusOr<LogEntry> changed_back = LogEntryFromProto(changed_proto);
  ASSERT_OK(changed_back);
  EXPECT_THAT(changed_back->status, StatusIs(absl::StatusCode::kAborted, "step 3: the membership changed while it waited"));
  EXPECT_TRUE(IsFleetChange(changed_back->status));
  EXPECT_EQ(changed_back->failure, kStepFailureTimeout);

  LogEntry final_failure = changed;
  final_failure.status = absl::AbortedError("step 3: trainer rank 1 failed");
  const fleet::v1::LogEntry final_proto = LogEntryToProto(final_failure);
  EXPECT_FALSE(final_proto.retryable());
  absl::StatusOr<LogEntry> final_back = LogEntryFromProto(final_proto);
  ASSERT_OK(final_back);
  EXPECT_THAT(final_back->status, StatusIs(absl::StatusCode::kAborted, "step 3: trainer rank 1 failed"));
  EXPECT_FALSE(IsFleetChange(final_back->status));
}

TEST(PlanCodecTest, DecodingLeavesValidationToValidatePlanWhichFailsTheMatrixInBand) {
  // steps = 1000 (0..100 allowed), a split_qkv that does not divide the rows, a TP partition_dim
  // of 2, a block outside the matrix: all decode, in a report and in an entry alike.
  MatrixPlan steps = Plan("steps", {4, 6});
  steps.options.steps = 1000;
  MatrixPlan qkv = Plan("qkv", {5, 6});
  qkv.options.split_qkv = {2, 2, 2};
  MatrixPlan tp = Plan("tp", {4, 6});
  tp.algorithm = Algorithm::kTpDuplicated;
  tp.partition_dim = 2;
  MatrixPlan fine = Plan("fine", {4, 6});
  ReadyReport report;
  {
    std::vector<Block> blocks;
    for (const MatrixPlan& m : {steps, qkv, tp, fine}) blocks.push_back(WholeBlock(m.view));
    blocks[3] = Block{2, 0, 9, 6};  // Past the last row.
    report.sent = SenderBlocks(SpecList{steps, qkv, tp, fine}, std::move(blocks));
  }
  absl::StatusOr<ReadyReport> decoded = ReadyReportFromProto(ReadyReportToProto(report));
  ASSERT_OK(decoded);
  EXPECT_EQ(decoded->sent.spec(0).options.steps, 1000);
  EXPECT_TRUE(decoded->sent.blocks[3] == report.sent.blocks[3]);

  LogEntry entry;
  entry.plan.trainer_world = 1;
  entry.plan.fleet_world = 1;
  entry.plan.matrices = {steps, qkv, tp, fine};
  for (MatrixPlan& m : entry.plan.matrices) m.blocks = {BlockPlacement{0, 0, WholeBlock(m.view)}};
  absl::StatusOr<LogEntry> back = LogEntryFromProto(LogEntryToProto(entry));
  ASSERT_OK(back);
  ASSERT_EQ(back->plan.matrices.size(), 4u);
  EXPECT_EQ(back->plan.matrices[0].options.steps, 1000);

  // The batch fails those matrices with INVALID_ARGUMENT, the same on every rank, and runs the rest.
  absl::StatusOr<std::unique_ptr<CpuBackend>> backend = CpuBackend::Create({});
  ASSERT_OK(backend);
  std::vector<std::vector<float>> in, out;
  std::vector<LocalMatrix> local;
  for (const MatrixPlan& m : back->plan.matrices) {
    in.emplace_back(static_cast<size_t>(m.view.numel()), 0.5f);
    in.back()[0] = 2.0f;
    out.emplace_back(static_cast<size_t>(m.view.numel()), 0.0f);
    MatrixPlan plan = m;
    plan.blocks.clear();
    local.push_back(LocalMatrix{plan, WholeBlock(m.view), in.back().data(), out.back().data()});
  }
  absl::StatusOr<BatchResult> result = RunLocalBatch(std::move(local), **backend);
  ASSERT_OK(result);
  ASSERT_EQ(result->matrices.size(), 4u);
  EXPECT_THAT(result->matrices[0], StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("steps")));
  EXPECT_THAT(result->matrices[1], StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("split_qkv")));
  EXPECT_THAT(result->matrices[2], StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("partition_dim")));
  EXPECT_OK(result->matrices[3]);
}

}  // namespace
}  // namespace orthoserve
