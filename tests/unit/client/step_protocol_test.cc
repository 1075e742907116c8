// The request sequence of a step and the reassembly of responses (client/cpp/step_protocol.h),
// plus input checks and result mapping of client/cpp/matrix.h.
#include "client/cpp/step_protocol.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/matrix.h"
#include "client/cpp/run_id.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/client/input_util.h"
#include "tests/util/status_matchers.h"

namespace orthoserve::client {
namespace {

using ::orthoserve::testing::StatusIs;
using ::testing::HasSubstr;

using testing_util::F32Input;

TEST(CheckInput, WholeAndBlockInputs) {
  std::vector<float> data(12);
  auto whole = CheckInput(F32Input("w", {3, 4}, data));
  ASSERT_OK(whole);
  EXPECT_EQ(*whole, (Block{0, 0, 3, 4}));
  MatrixInput block = F32Input("b", {6, 4}, data);
  block.block = Block{3, 0, 3, 4};
  auto b = CheckInput(block);
  ASSERT_OK(b);
  EXPECT_EQ(*b, (Block{3, 0, 3, 4}));
  MatrixInput nd = F32Input("nd", {3, 2, 2}, data);  // Viewed as 3 x 4.
  EXPECT_OK(CheckInput(nd));
  MatrixInput empty = F32Input("e", {6, 4}, {});
  empty.block = Block{6, 0, 0, 4};
  empty.data = nullptr;
  EXPECT_OK(CheckInput(empty));
}

TEST(CheckInput, Errors) {
  std::vector<float> data(12);
  EXPECT_THAT(CheckInput(F32Input("w", {12}, data)), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"w\"")));
  MatrixInput wrong = F32Input("w", {3, 4}, data);
  wrong.bytes = 44;
  EXPECT_THAT(CheckInput(wrong),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("44 data bytes given, but block")));
  MatrixInput f16 = F32Input("h", {3, 4}, data);
  f16.dtype = DType::kF16;  // 48 bytes are twice what 12 fp16 values need.
  EXPECT_THAT(CheckInput(f16), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs 24")));
  MatrixInput outside = F32Input("o", {3, 4}, data);
  outside.block = Block{2, 0, 3, 4};
  EXPECT_THAT(CheckInput(outside), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"o\" block")));
  MatrixInput null_data = F32Input("n", {3, 4}, data);
  null_data.data = nullptr;
  EXPECT_THAT(CheckInput(null_data), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("null")));
}

TEST(ToSpec, CarriesEveryField) {
  std::vector<float> data(6);
  MatrixInput in = F32Input("q", {4, 3}, data);
  in.block = Block{2, 1, 2, 2};
  in.bytes = 16;
  in.result_dtype = DType::kBF16;
  in.algorithm = v1::ALGORITHM_TP_DISTRIBUTED;
  in.partition_dim = 1;
  in.options.steps = 7;
  in.options.precision = Precision::kHighest;
  v1::MatrixSpec spec = ToSpec(in);
  EXPECT_EQ(spec.name(), "q");
  EXPECT_THAT(spec.shape(), ::testing::ElementsAre(4, 3));
  EXPECT_EQ(spec.dtype(), v1::DTYPE_FP32);
  EXPECT_EQ(spec.result_dtype(), v1::DTYPE_BF16);
  EXPECT_EQ(spec.algorithm(), v1::ALGORITHM_TP_DISTRIBUTED);
  EXPECT_EQ(spec.partition_dim(), 1);
  EXPECT_EQ(spec.block().row_offset(), 2);
  EXPECT_EQ(spec.block().cols(), 2);
  EXPECT_EQ(spec.options().steps(), 7);
  EXPECT_EQ(spec.options().precision(), v1::PRECISION_HIGHEST);
  MatrixInput plain = F32Input("p", {2, 3}, data);
  v1::MatrixSpec p = ToSpec(plain);
  EXPECT_FALSE(p.has_block());
  EXPECT_EQ(p.result_dtype(), v1::DTYPE_UNSPECIFIED);
}

TEST(WriteStep, AGroupStepWithoutARunIdSendsTheProcessRunIdAndALoneOneNone) {
  std::vector<float> a(4);
  std::vector<MatrixInput> inputs = {F32Input("a", {2, 2}, a)};
  auto header_of = [&](const StepOptions& step) {
    v1::StepHeader header;
    EXPECT_OK(WriteStep(step, 0, inputs, 16, [&](const v1::StreamRequest& r) {
      if (r.has_header()) header = r.header();
      return true;
    }));
    return header;
  };
  const v1::StepHeader group = header_of(StepOptions{"job", "tp", 1, 0, 2, ""});
  EXPECT_EQ(group.run_id(), DefaultRunId());
  EXPECT_FALSE(group.run_id().empty());
  EXPECT_EQ(header_of(StepOptions{"job", "tp", 2, 1, 2, ""}).run_id(), group.run_id());  // One per process.
  EXPECT_EQ(header_of(StepOptions{}).run_id(), "");
}

TEST(WriteStep, HeaderSpecsChunksEnd) {
  std::vector<float> a(10), b(3);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i);
  std::vector<MatrixInput> inputs = {F32Input("a", {2, 5}, a), F32Input("b", {3, 1}, b)};
  StepOptions step{"job", "tp", 42, 1, 2, "run-7"};
  std::vector<v1::StreamRequest> sent;
  ASSERT_OK(WriteStep(step, 2, inputs, 16, [&](const v1::StreamRequest& r) {
    sent.push_back(r);
    return true;
  }));
  // header, spec a, 40 bytes in 16+16+8, spec b, 12 bytes in one chunk, end.
  ASSERT_EQ(sent.size(), 8u);
  ASSERT_TRUE(sent[0].has_header());
  EXPECT_EQ(sent[0].header().job(), "job");
  EXPECT_EQ(sent[0].header().group(), "tp");
  EXPECT_EQ(sent[0].header().step(), 42);
  EXPECT_EQ(sent[0].header().rank(), 1);
  EXPECT_EQ(sent[0].header().world(), 2);
  EXPECT_EQ(sent[0].header().num_matrices(), 2);
  EXPECT_EQ(sent[0].header().attempt(), 2);
  EXPECT_EQ(sent[0].header().run_id(), "run-7");
  ASSERT_TRUE(sent[1].has_spec());
  EXPECT_EQ(sent[1].spec().name(), "a");
  std::string joined;
  for (int i = 2; i <= 4; ++i) {
    ASSERT_TRUE(sent[i].has_chunk());
    EXPECT_EQ(sent[i].chunk().index(), 0);
    joined += sent[i].chunk().data();
  }
  EXPECT_EQ(sent[2].chunk().data().size(), 16u);
  EXPECT_EQ(sent[4].chunk().data().size(), 8u);
  EXPECT_EQ(joined, std::string(reinterpret_cast<const char*>(a.data()), 40));
  ASSERT_TRUE(sent[5].has_spec());
  EXPECT_EQ(sent[5].spec().name(), "b");
  ASSERT_TRUE(sent[6].has_chunk());
  EXPECT_EQ(sent[6].chunk().index(), 1);
  EXPECT_EQ(sent[6].chunk().data().size(), 12u);
  EXPECT_TRUE(sent[7].has_end());
}

TEST(WriteStep, EmptyBlockSendsSpecWithoutChunks) {
  MatrixInput empty;
  empty.name = "e";
  empty.shape = {4, 4};
  empty.block = Block{4, 0, 0, 4};
  std::vector<v1::StreamRequest> sent;
  ASSERT_OK(WriteStep(StepOptions{}, 0, {&empty, 1}, 16, [&](const v1::StreamRequest& r) {
    sent.push_back(r);
    return true;
  }));
  ASSERT_EQ(sent.size(), 3u);
  EXPECT_TRUE(sent[1].has_spec());
  EXPECT_TRUE(sent[2].has_end());
}

TEST(StepRequests, ChunksAreViewsOfTheInputAndOnlyTheEndIsLast) {
  std::vector<float> a(5);
  MatrixInput in = F32Input("a", {1, 5}, a);
  StepRequests requests(StepOptions{}, 0, {&in, 1}, 12);
  std::vector<std::string> kinds;
  while (std::optional<StepRequests::Request> r = requests.Next()) {
    if (r->message == nullptr) {
      EXPECT_EQ(r->chunk_index, 0);
      EXPECT_EQ(r->chunk_data.data(), reinterpret_cast<const char*>(a.data()) + 12 * (kinds.size() - 2));
      EXPECT_FALSE(r->last);
      kinds.push_back(absl::StrCat("chunk", r->chunk_data.size()));
    } else {
      EXPECT_EQ(r->last, r->message->has_end());
      kinds.push_back(r->message->has_header() ? "header" : r->message->has_spec() ? "spec" : "end");
    }
  }
  EXPECT_EQ(kinds, (std::vector<std::string>{"header", "spec", "chunk12", "chunk8", "end"}));
  EXPECT_FALSE(requests.Next().has_value());
}

TEST(WriteStep, StopsWhenTheStreamBreaks) {
  std::vector<float> a(100);
  MatrixInput in = F32Input("a", {10, 10}, a);
  int writes = 0;
  EXPECT_THAT(WriteStep(StepOptions{}, 0, {&in, 1}, 8, [&](const v1::StreamRequest&) { return ++writes < 3; }),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("closed")));
  EXPECT_EQ(writes, 3);
}

v1::StreamResponse Result(int index, const std::string& name, int64_t rows, int64_t cols, int code = 0) {
  v1::StreamResponse r;
  v1::MatrixResult* m = r.mutable_result();
  m->set_index(index);
  m->set_name(name);
  m->set_dtype(v1::DTYPE_FP32);
  m->add_shape(rows);
  m->add_shape(cols);
  m->set_code(code);
  if (code != 0) m->set_message("bad options for " + name);
  return r;
}

v1::StreamResponse Chunk(int index, const std::string& data) {
  v1::StreamResponse r;
  r.mutable_chunk()->set_index(index);
  r.mutable_chunk()->set_data(data);
  return r;
}

v1::StreamResponse Summary() {
  v1::StreamResponse r;
  r.mutable_summary()->set_matrices_ok(1);
  r.mutable_summary()->set_fleet_rank(3);
  return r;
}

TEST(StepResultAssembler, ReassemblesInterleavedResultsInAnyOrder) {
  StepResultAssembler assembler({"a", "b", "c"});
  std::vector<int> completed;
  auto add = [&](const v1::StreamResponse& r) {
    auto done = assembler.Add(r);
    ASSERT_OK(done);
    if (done->has_value()) completed.push_back(**done);
  };
  add(Result(1, "b", 2, 2));  // 16 bytes.
  add(Result(0, "a", 1, 2));  // 8 bytes.
  add(Chunk(1, std::string(10, 'b')));
  add(Chunk(0, std::string(8, 'a')));
  add(Result(2, "c", 2, 2, 3));  // An error completes at once.
  add(Chunk(1, std::string(6, 'B')));
  EXPECT_THAT(assembler.CheckComplete(), StatusIs(absl::StatusCode::kInternal, HasSubstr("StepSummary")));
  add(Summary());
  EXPECT_OK(assembler.CheckComplete());
  EXPECT_EQ(completed, (std::vector<int>{0, 2, 1}));
  EXPECT_EQ(assembler.summary()->fleet_rank(), 3);
  std::vector<MatrixOutput> out = assembler.TakeOutputs();
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(std::string(out[0].data.begin(), out[0].data.end()), std::string(8, 'a'));
  EXPECT_EQ(std::string(out[1].data.begin(), out[1].data.end()), std::string(10, 'b') + std::string(6, 'B'));
  EXPECT_EQ(out[1].block, (Block{0, 0, 2, 2}));  // All-zero block means the whole matrix.
  EXPECT_THAT(out[2].status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad options for c")));
  EXPECT_TRUE(out[2].data.empty());
}

// With result buffers, chunks land in the caller's buffer (the output is in place, without data
// of its own); a result whose size differs from the buffer's is a protocol error.
TEST(StepResultAssembler, ChunksGoIntoTheInputsResultBuffers) {
  std::vector<char> buffer(8, 0);
  std::vector<float> in(2, 1.0f);
  MatrixInput input;
  input.name = "a";
  input.shape = {1, 2};
  input.data = in.data();
  input.bytes = 8;
  input.result = buffer.data();
  input.result_bytes = buffer.size();
  std::vector<MatrixInput> inputs = {input};
  StepResultAssembler assembler(inputs);
  v1::StreamResponse result;
  result.mutable_result()->set_index(0);
  result.mutable_result()->set_name("a");
  result.mutable_result()->add_shape(1);
  result.mutable_result()->add_shape(2);
  result.mutable_result()->set_dtype(v1::DTYPE_FP32);
  ASSERT_OK(assembler.Add(result).status());
  const absl::string_view first("abcd"), second("efgh");
  ASSERT_OK(assembler.AddChunk(0, absl::MakeConstSpan(&first, 1)).status());
  absl::StatusOr<std::optional<int>> done = assembler.AddChunk(0, absl::MakeConstSpan(&second, 1));
  ASSERT_OK(done.status());
  EXPECT_EQ(*done, std::optional<int>(0));
  EXPECT_TRUE(assembler.output(0).in_place);
  EXPECT_TRUE(assembler.output(0).data.empty());
  EXPECT_EQ(std::string(buffer.begin(), buffer.end()), "abcdefgh");

  StepResultAssembler bf16(inputs);
  result.mutable_result()->set_dtype(v1::DTYPE_BF16);  // 4 bytes, for an 8-byte buffer.
  EXPECT_THAT(bf16.Add(result).status(),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("its result buffer holds 8")));
}

TEST(StepResultAssembler, EmptyBlockCompletesOnItsResult) {
  StepResultAssembler assembler({"a"});
  v1::StreamResponse r = Result(0, "a", 4, 4);
  r.mutable_result()->mutable_block()->set_row_offset(4);
  r.mutable_result()->mutable_block()->set_cols(4);  // rows 0: empty.
  auto done = assembler.Add(r);
  ASSERT_OK(done);
  EXPECT_EQ(done->value_or(-1), 0);
}

TEST(StepResultAssembler, ProtocolViolations) {
  {
    StepResultAssembler a({"a"});
    EXPECT_THAT(a.Add(Result(1, "a", 1, 1)), StatusIs(absl::StatusCode::kInternal, HasSubstr("index 1 outside")));
    EXPECT_THAT(a.Add(Result(0, "x", 1, 1)), StatusIs(absl::StatusCode::kInternal, HasSubstr("named \"x\"")));
    EXPECT_THAT(a.Add(Chunk(0, "abcd")), StatusIs(absl::StatusCode::kInternal, HasSubstr("no open result")));
    ASSERT_OK(a.Add(Result(0, "a", 1, 1)));
    EXPECT_THAT(a.Add(Result(0, "a", 1, 1)), StatusIs(absl::StatusCode::kInternal, HasSubstr("second result")));
    EXPECT_THAT(a.Add(Chunk(0, "abcde")), StatusIs(absl::StatusCode::kInternal, HasSubstr("more than the 4")));
    EXPECT_THAT(a.CheckComplete(), StatusIs(absl::StatusCode::kInternal, HasSubstr("at 0 of 4 bytes")));
    ASSERT_OK(a.Add(Chunk(0, "abcd")));
    EXPECT_THAT(a.Add(Chunk(0, "e")), StatusIs(absl::StatusCode::kInternal, HasSubstr("no open result")));
    EXPECT_THAT(a.CheckComplete(), StatusIs(absl::StatusCode::kInternal, HasSubstr("without a StepSummary")));
    ASSERT_OK(a.Add(Summary()));
    EXPECT_THAT(a.Add(Summary()), StatusIs(absl::StatusCode::kInternal, HasSubstr("followed the StepSummary")));
  }
  {
    StepResultAssembler a({"a", "b"});
    EXPECT_THAT(a.Add(v1::StreamResponse()), StatusIs(absl::StatusCode::kInternal, HasSubstr("empty")));
    v1::StreamResponse no_dtype = Result(0, "a", 1, 1);
    no_dtype.mutable_result()->set_dtype(v1::DTYPE_UNSPECIFIED);
    EXPECT_THAT(a.Add(no_dtype), StatusIs(absl::StatusCode::kInternal, HasSubstr("dtype")));
    v1::StreamResponse outside = Result(1, "b", 2, 2);
    outside.mutable_result()->mutable_block()->set_rows(3);
    outside.mutable_result()->mutable_block()->set_cols(2);
    EXPECT_THAT(a.Add(outside), StatusIs(absl::StatusCode::kInternal, HasSubstr("block")));
    ASSERT_OK(a.Add(Summary()));
    EXPECT_THAT(a.CheckComplete(), StatusIs(absl::StatusCode::kInternal, HasSubstr("without a result for matrix 0")));
  }
}

}  // namespace
}  // namespace orthoserve::client
