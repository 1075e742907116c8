// The public service end to end in process on 127.0.0.1:0: unary and streaming calls of a lone
// client against the engine's own answer, and every kind of bad input with its code.
#include <atomic>
#include <fstream>
#include <limits>
#include <random>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/rpc/rpc_test_util.h"

namespace orthoserve::testing {
namespace {

using ::testing::HasSubstr;

class ServiceTest : public ::testing::Test {
 protected:
  void Start(ServerOptions options = TestServerOptions()) {
    auto server = Server::Create(options);
    ASSERT_OK(server);
    server_ = std::move(*server);
    stub_ = StubFor(*server_);
  }
  void SetUp() override { Start(); }

  grpc::Status Unary(const v1::OrthogonalizeRequest& request, v1::OrthogonalizeResponse* response) {
    grpc::ClientContext context;
    return stub_->Orthogonalize(&context, request, response);
  }

  std::unique_ptr<Server> server_;
  std::unique_ptr<v1::Orthogonalizer::Stub> stub_;
};

TEST_F(ServiceTest, UnaryMatchesEngineForEveryDtype) {
  NsOptions options;
  options.precision = Precision::kHighest;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    v1::OrthogonalizeRequest request;
    std::vector<std::string> inputs;
    const std::vector<std::vector<int64_t>> shapes = {{7, 5}, {4, 9}, {3, 2, 4}, {1, 1}};
    for (size_t i = 0; i < shapes.size(); ++i) {
      Matrix2d m = *ViewAs2d(shapes[i], "s");
      inputs.push_back(Bytes(RandomMatrix(m.rows, m.cols, 10 + i), dtype));
      v1::Matrix* matrix = request.add_matrices();
      *matrix->mutable_spec() = Spec("m" + std::to_string(i), shapes[i], dtype, options);
      matrix->set_data(inputs.back());
    }
    v1::OrthogonalizeResponse response;
    ASSERT_TRUE(Unary(request, &response).ok());
    ASSERT_EQ(response.results_size(), static_cast<int>(shapes.size()));
    for (size_t i = 0; i < shapes.size(); ++i) {
      Matrix2d m = *ViewAs2d(shapes[i], "s");
      const v1::MatrixResult& r = response.results(i);
      EXPECT_EQ(r.code(), 0);
      EXPECT_EQ(r.dtype(), DTypeToProto(dtype));
      EXPECT_THAT(r.shape(), ::testing::ElementsAreArray(shapes[i]));
      EXPECT_EQ(r.data(), Reference(inputs[i], m, dtype, dtype, options)) << DTypeName(dtype) << " matrix " << i;
    }
  }
}

// "Validated once, scanned once": one AUTO lone matrix runs ValidateNsOptions once on its way
// through the server (at the public ingress; cost, owners, ValidatePlan and the engine use the
// verdict), and its data is scanned for NaN and Inf once (while the step copies it), whether it
// comes in a unary call or a stream.
TEST_F(ServiceTest, OneLoneMatrixIsValidatedOnceAndScannedOnce) {
  const NsOptions options;  // AUTO, the defaults.
  const std::string input = Bytes(RandomMatrix(24, 40, 3), DType::kF32);
  {
    v1::OrthogonalizeRequest request;
    v1::Matrix* matrix = request.add_matrices();
    *matrix->mutable_spec() = Spec("w", {24, 40}, DType::kF32, options);
    matrix->set_data(input);
    v1::OrthogonalizeResponse response;
    const int64_t validations = NsOptionsValidations();
    const int64_t scanned = NonFiniteScannedElements();
    ASSERT_TRUE(Unary(request, &response).ok());
    ASSERT_EQ(response.results_size(), 1);
    EXPECT_EQ(response.results(0).code(), 0);
    EXPECT_EQ(NsOptionsValidations() - validations, 1) << "unary";
    EXPECT_EQ(NonFiniteScannedElements() - scanned, 24 * 40) << "unary";
  }
  {
    std::vector<v1::StreamRequest> messages = {HeaderMessage(1)};
    AppendMatrix(messages, 0, Spec("w", {24, 40}, DType::kF32, options), input);
    messages.push_back(EndMessage());
    const int64_t validations = NsOptionsValidations();
    const int64_t scanned = NonFiniteScannedElements();
    StreamOutcome out = RunStream(*stub_, messages);
    ASSERT_TRUE(out.status.ok()) << out.status.error_message();
    EXPECT_EQ(NsOptionsValidations() - validations, 1) << "stream";
    EXPECT_EQ(NonFiniteScannedElements() - scanned, 24 * 40) << "stream";
  }
}

TEST_F(ServiceTest, UnaryResultDtypeDiffersFromInput) {
  NsOptions options;
  v1::OrthogonalizeRequest request;
  std::string in = Bytes(RandomMatrix(6, 8, 3), DType::kBF16);
  v1::Matrix* matrix = request.add_matrices();
  *matrix->mutable_spec() = Spec("w", {6, 8}, DType::kBF16, options);
  matrix->mutable_spec()->set_result_dtype(v1::DTYPE_FP32);
  matrix->set_data(in);
  v1::OrthogonalizeResponse response;
  ASSERT_TRUE(Unary(request, &response).ok());
  EXPECT_EQ(response.results(0).dtype(), v1::DTYPE_FP32);
  EXPECT_EQ(response.results(0).data(), Reference(in, {6, 8}, DType::kBF16, DType::kF32, options));
}

TEST_F(ServiceTest, StreamPipelinesLoneMatricesInChunks) {
  NsOptions options;
  options.precision = Precision::kHighest;
  std::vector<v1::StreamRequest> messages = {HeaderMessage(4)};
  std::vector<std::string> inputs;
  const std::vector<std::vector<int64_t>> shapes = {{64, 48}, {16, 96}, {5, 3}, {33, 33}};
  for (size_t i = 0; i < shapes.size(); ++i) {
    Matrix2d m = *ViewAs2d(shapes[i], "s");
    inputs.push_back(Bytes(RandomMatrix(m.rows, m.cols, 100 + i), DType::kF32));
    AppendMatrix(messages, static_cast<int>(i), Spec("m" + std::to_string(i), shapes[i], DType::kF32, options),
                 inputs.back(), /*chunk=*/1000);
  }
  messages.push_back(EndMessage());
  StreamOutcome out = RunStream(*stub_, messages);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  ASSERT_TRUE(out.summary);
  EXPECT_EQ(out.step_summary.matrices_ok(), 4);
  for (size_t i = 0; i < shapes.size(); ++i) {
    Matrix2d m = *ViewAs2d(shapes[i], "s");
    EXPECT_EQ(out.results[i].code(), 0) << out.results[i].message();
    EXPECT_EQ(out.data[i], Reference(inputs[i], m, DType::kF32, DType::kF32, options)) << i;
  }
}

TEST_F(ServiceTest, StreamReportsBadMatrixInBandAndGoesOn) {
  NsOptions good;
  NsOptions bad;
  bad.steps = 101;
  std::vector<v1::StreamRequest> messages = {HeaderMessage(3)};
  std::string a = Bytes(RandomMatrix(4, 6, 1), DType::kF32);
  AppendMatrix(messages, 0, Spec("a", {4, 6}, DType::kF32, good), a);
  AppendMatrix(messages, 1, Spec("bad", {4, 6}, DType::kF32, bad), a);
  std::vector<float> nan = RandomMatrix(3, 3, 2);
  nan[4] = std::numeric_limits<float>::quiet_NaN();
  AppendMatrix(messages, 2, Spec("nan", {3, 3}, DType::kF32, good), Bytes(nan, DType::kF32));
  messages.push_back(EndMessage());
  StreamOutcome out = RunStream(*stub_, messages);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_EQ(out.results[0].code(), 0);
  EXPECT_EQ(out.results[1].code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(out.results[1].message(), HasSubstr("matrix 1 (\"bad\") options: steps = 101"));
  EXPECT_EQ(out.results[2].code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(out.results[2].message(), HasSubstr("non-finite"));
  EXPECT_EQ(out.step_summary.matrices_ok(), 1);
  EXPECT_EQ(out.step_summary.matrices_failed(), 2);
}

// A 4x6 matrix's bytes as a (2, 2, 6) batch of two 2x6 matrices.
void AsBatchOfTwo(v1::Matrix& m) {
  m.mutable_spec()->clear_shape();
  for (int64_t d : {2, 2, 6}) m.mutable_spec()->add_shape(d);
  m.mutable_spec()->set_nd_layout(v1::ND_LAYOUT_BATCH);
}

// Results echo NORMALIZATION_BF16 when it was asked for (clients refuse a bf16 answer without
// it: a server older than the option normalizes in fp32), and the two normalizations differ.
TEST_F(ServiceTest, Bf16NormalizationIsEchoedAndComputed) {
  const std::string in = Bytes(RandomMatrix(6, 10, 41), DType::kF32);
  std::string fp32_data;
  for (v1::Normalization normalization : {v1::NORMALIZATION_UNSPECIFIED, v1::NORMALIZATION_BF16}) {
    v1::MatrixSpec spec = Spec("w", {6, 10}, DType::kF32, NsOptions());
    spec.mutable_options()->set_normalization(normalization);
    std::vector<v1::StreamRequest> messages = {HeaderMessage(1)};
    AppendMatrix(messages, 0, spec, in);
    messages.push_back(EndMessage());
    StreamOutcome out = RunStream(*stub_, messages);
    ASSERT_TRUE(out.status.ok()) << out.status.error_message();
    ASSERT_EQ(out.results[0].code(), 0) << out.results[0].message();
    EXPECT_EQ(out.results[0].normalization(), normalization);
    v1::OrthogonalizeRequest request;
    *request.add_matrices()->mutable_spec() = spec;
    request.mutable_matrices(0)->set_data(in);
    v1::OrthogonalizeResponse response;
    grpc::Status status = Unary(request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(response.results(0).normalization(), normalization);
    EXPECT_EQ(response.results(0).data(), out.data[0]);
    if (normalization == v1::NORMALIZATION_UNSPECIFIED) {
      fp32_data = out.data[0];
    } else {
      EXPECT_NE(out.data[0], fp32_data);
    }
  }
}

TEST_F(ServiceTest, BatchLayoutOrthogonalizesEachMatrixFlattenTheWhole) {
  NsOptions options;
  options.precision = Precision::kHighest;
  const std::vector<int64_t> shape = {3, 8, 5};
  const std::string in = Bytes(RandomMatrix(24, 5, 31), DType::kF32);
  for (bool stream : {false, true}) {
    for (v1::NdLayout layout : {v1::ND_LAYOUT_UNSPECIFIED, v1::ND_LAYOUT_BATCH}) {
      v1::MatrixSpec spec = Spec("w", shape, DType::kF32, options);
      spec.set_nd_layout(layout);
      std::string got;
      v1::MatrixResult result;
      if (stream) {
        std::vector<v1::StreamRequest> messages = {HeaderMessage(1)};
        AppendMatrix(messages, 0, spec, in);
        messages.push_back(EndMessage());
        StreamOutcome out = RunStream(*stub_, messages);
        ASSERT_TRUE(out.status.ok()) << out.status.error_message();
        result = out.results[0];
        got = out.data[0];
      } else {
        v1::OrthogonalizeRequest request;
        *request.add_matrices()->mutable_spec() = spec;
        request.mutable_matrices(0)->set_data(in);
        v1::OrthogonalizeResponse response;
        grpc::Status status = Unary(request, &response);
        ASSERT_TRUE(status.ok()) << status.error_message();
        result = response.results(0);
        got = response.results(0).data();
      }
      ASSERT_EQ(result.code(), 0) << result.message();
      EXPECT_EQ(result.nd_layout(), layout == v1::ND_LAYOUT_BATCH ? v1::ND_LAYOUT_BATCH : v1::ND_LAYOUT_FLATTEN);
      if (layout == v1::ND_LAYOUT_BATCH) {
        // Three 8x5 matrices, each the engine's answer for it alone; the block is the stacked view.
        EXPECT_EQ(result.block().rows(), 24);
        EXPECT_EQ(result.block().cols(), 5);
        for (int b = 0; b < 3; ++b) {
          const size_t bytes = 8 * 5 * 4;
          EXPECT_EQ(got.substr(b * bytes, bytes),
                    Reference(in.substr(b * bytes, bytes), Matrix2d{8, 5}, DType::kF32, DType::kF32, options))
              << "stream " << stream << " matrix " << b;
        }
      } else {
        EXPECT_EQ(result.block().rows(), 3);
        EXPECT_EQ(got, Reference(in, Matrix2d{3, 40}, DType::kF32, DType::kF32, options)) << "stream " << stream;
      }
    }
  }
}

TEST_F(ServiceTest, ResultChunksFitTheDefaultReceiveLimitUnlessTheClientAsks) {
  ServerOptions options = TestServerOptions();
  options.service.chunk_bytes = int64_t{8} << 20;
  Start(options);
  NsOptions ns;
  ns.steps = 0;  // The transport is under test, not the arithmetic.
  const std::vector<int64_t> shape = {1536, 2048};  // 12 MiB of fp32.
  const std::string in = Bytes(RandomMatrix(1536, 2048, 5), DType::kF32);
  for (int64_t asked : {int64_t{0}, int64_t{1} << 20, int64_t{16} << 20}) {
    std::vector<v1::StreamRequest> messages = {HeaderMessage(1)};
    messages[0].mutable_header()->set_result_chunk_bytes(asked);
    AppendMatrix(messages, 0, Spec("w", shape, DType::kF32, ns), in, size_t{4} << 20);
    messages.push_back(EndMessage());
    StreamOutcome out = RunStream(*stub_, messages);
    ASSERT_TRUE(out.status.ok()) << out.status.error_message();
    ASSERT_EQ(out.data[0].size(), in.size());
    // Default: under 4 MiB with room for framing; asked: that, up to the server's chunk limit.
    const size_t expected = asked == 0 ? (size_t{4} << 20) - 1024 : std::min<size_t>(asked, size_t{8} << 20);
    EXPECT_EQ(out.largest_chunk, expected) << "asked " << asked;
  }
  std::vector<v1::StreamRequest> messages = {HeaderMessage(1)};
  messages[0].mutable_header()->set_result_chunk_bytes(-1);
  AppendMatrix(messages, 0, Spec("w", {4, 6}, DType::kF32, ns), Bytes(RandomMatrix(4, 6, 1), DType::kF32));
  StreamOutcome bad = RunStream(*stub_, messages);
  EXPECT_EQ(bad.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.status.error_message(), HasSubstr("result_chunk_bytes = -1 is negative"));
}

struct BadUnaryCase {
  std::string name;
  std::function<void(v1::Matrix&)> mutate;
  grpc::StatusCode code;
  std::string message;
};

TEST_F(ServiceTest, UnaryRejectsEachBadInputWithItsCode) {
  const std::vector<BadUnaryCase> cases = {
      {"zero dim", [](v1::Matrix& m) { m.mutable_spec()->set_shape(1, 0); }, grpc::StatusCode::INVALID_ARGUMENT,
       "matrix 0 (\"w\") shape [4, 0] has dim 1 = 0"},
      {"negative dim", [](v1::Matrix& m) { m.mutable_spec()->set_shape(0, -4); }, grpc::StatusCode::INVALID_ARGUMENT,
       "every dim must be positive"},
      {"one dim", [](v1::Matrix& m) { m.mutable_spec()->clear_shape(); m.mutable_spec()->add_shape(24); },
       grpc::StatusCode::INVALID_ARGUMENT, "at least 2"},
      {"wrong byte count", [](v1::Matrix& m) { m.mutable_data()->pop_back(); }, grpc::StatusCode::INVALID_ARGUMENT,
       "the step ended after 95 of its 96 bytes (block 4x6 of fp32)"},
      {"unknown dtype", [](v1::Matrix& m) { m.mutable_spec()->set_dtype(static_cast<v1::DType>(42)); },
       grpc::StatusCode::INVALID_ARGUMENT, "matrix 0 (\"w\") dtype = 42"},
      {"unspecified dtype", [](v1::Matrix& m) { m.mutable_spec()->set_dtype(v1::DTYPE_UNSPECIFIED); },
       grpc::StatusCode::INVALID_ARGUMENT, "dtype is unspecified"},
      {"unknown coefficients",
       [](v1::Matrix& m) { m.mutable_spec()->mutable_options()->set_coefficients(static_cast<v1::Coefficients>(99)); },
       grpc::StatusCode::INVALID_ARGUMENT, "coefficients = 99"},
      {"steps out of range", [](v1::Matrix& m) { m.mutable_spec()->mutable_options()->set_steps(101); },
       grpc::StatusCode::INVALID_ARGUMENT, "steps = 101"},
      {"custom without triples",
       [](v1::Matrix& m) { m.mutable_spec()->mutable_options()->set_coefficients(v1::COEFFICIENTS_CUSTOM); },
       grpc::StatusCode::INVALID_ARGUMENT, "non-empty custom_coefficients"},
      {"split_qkv not dividing",
       [](v1::Matrix& m) {
         for (int s : {1, 1, 1}) m.mutable_spec()->mutable_options()->add_split_qkv(s);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "divisible by q+k+v = 3"},
      {"non-finite value",
       [](v1::Matrix& m) {
         float inf = std::numeric_limits<float>::infinity();
         m.mutable_data()->replace(8, 4, reinterpret_cast<const char*>(&inf), 4);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "non-finite value (NaN or Inf) at element 2"},
      {"too many elements",
       [](v1::Matrix& m) {
         m.mutable_spec()->set_shape(0, int64_t{1} << 20);
         m.mutable_spec()->set_shape(1, int64_t{1} << 20);
       },
       grpc::StatusCode::RESOURCE_EXHAUSTED, "--max-matrix-elements"},
      {"partial block in unary",
       [](v1::Matrix& m) {
         v1::Block* b = m.mutable_spec()->mutable_block();
         b->set_rows(2);
         b->set_cols(6);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "a unary call carries whole matrices"},
      {"TP mode without partition dim",
       [](v1::Matrix& m) {
         m.mutable_spec()->set_algorithm(v1::ALGORITHM_TP_DISTRIBUTED);
         m.mutable_spec()->set_partition_dim(2);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "partition_dim = 2 must be 0 or 1"},
      {"unknown normalization",
       [](v1::Matrix& m) { m.mutable_spec()->mutable_options()->set_normalization(static_cast<v1::Normalization>(7)); },
       grpc::StatusCode::INVALID_ARGUMENT, "normalization = 7"},
      {"bf16 normalization without medium precision",
       [](v1::Matrix& m) {
         m.mutable_spec()->mutable_options()->set_normalization(v1::NORMALIZATION_BF16);
         m.mutable_spec()->mutable_options()->set_precision(v1::PRECISION_HIGHEST);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "normalization bf16 (torch.optim.Muon's order) needs precision medium"},
      {"unknown nd_layout", [](v1::Matrix& m) { m.mutable_spec()->set_nd_layout(static_cast<v1::NdLayout>(7)); },
       grpc::StatusCode::INVALID_ARGUMENT, "matrix 0 (\"w\"): nd_layout = 7"},
      {"batch with split_qkv",
       [](v1::Matrix& m) {
         AsBatchOfTwo(m);
         for (int s : {1, 2, 1}) m.mutable_spec()->mutable_options()->add_split_qkv(s);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "nd_layout: split_qkv applies to one matrix, not to 2 matrices of 2x6"},
      {"batch with TP_DISTRIBUTED",
       [](v1::Matrix& m) {
         AsBatchOfTwo(m);
         m.mutable_spec()->set_algorithm(v1::ALGORITHM_TP_DISTRIBUTED);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "tp_distributed orthogonalizes one matrix from its blocks"},
  };
  const std::string data = Bytes(RandomMatrix(4, 6, 7), DType::kF32);
  for (const BadUnaryCase& c : cases) {
    v1::OrthogonalizeRequest request;
    v1::Matrix* m = request.add_matrices();
    *m->mutable_spec() = Spec("w", {4, 6}, DType::kF32, NsOptions());
    m->set_data(data);
    c.mutate(*m);
    v1::OrthogonalizeResponse response;
    grpc::Status status = Unary(request, &response);
    EXPECT_EQ(status.error_code(), c.code) << c.name << ": " << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(c.message)) << c.name;
  }
  // The server goes on serving.
  v1::OrthogonalizeRequest request;
  v1::Matrix* m = request.add_matrices();
  *m->mutable_spec() = Spec("w", {4, 6}, DType::kF32, NsOptions());
  m->set_data(data);
  v1::OrthogonalizeResponse response;
  EXPECT_TRUE(Unary(request, &response).ok());
  v1::OrthogonalizeRequest empty;
  EXPECT_EQ(Unary(empty, &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(ServiceTest, StreamProtocolErrorsEndTheStream) {
  const std::string data = Bytes(RandomMatrix(4, 6, 7), DType::kF32);
  const v1::MatrixSpec spec = Spec("w", {4, 6}, DType::kF32, NsOptions());
  struct Case {
    std::string name;
    std::vector<v1::StreamRequest> messages;
    grpc::StatusCode code;
    std::string message;
  };
  std::vector<Case> cases;
  {
    std::vector<v1::StreamRequest> m;
    AppendMatrix(m, 0, spec, data);
    cases.push_back({"no header", m, grpc::StatusCode::INVALID_ARGUMENT, "first message of a stream must be a StepHeader"});
  }
  {
    std::vector<v1::StreamRequest> m = {HeaderMessage(1)};
    AppendMatrix(m, 0, spec, data + "xxxx");
    cases.push_back({"too many bytes", m, grpc::StatusCode::INVALID_ARGUMENT, "received more than its 96 bytes"});
  }
  {
    std::vector<v1::StreamRequest> m = {HeaderMessage(1)};
    AppendMatrix(m, 0, spec, data.substr(0, 50));
    m.push_back(EndMessage());
    cases.push_back({"too few bytes", m, grpc::StatusCode::INVALID_ARGUMENT, "the step ended after 50 of its 96 bytes"});
  }
  {
    std::vector<v1::StreamRequest> m = {HeaderMessage(2)};
    AppendMatrix(m, 0, spec, data);
    m.push_back(EndMessage());
    cases.push_back({"missing matrix", m, grpc::StatusCode::INVALID_ARGUMENT, "after 1 of the header's 2 matrices"});
  }
  {
    std::vector<v1::StreamRequest> m = {HeaderMessage(1)};
    AppendMatrix(m, 0, spec, data);
    AppendMatrix(m, 1, spec, data);
    cases.push_back({"extra matrix", m, grpc::StatusCode::INVALID_ARGUMENT, "more specs than the header's num_matrices"});
  }
  {
    std::vector<v1::StreamRequest> m = {HeaderMessage(1)};
    AppendMatrix(m, 3, spec, data);
    cases.push_back({"chunk index", m, grpc::StatusCode::INVALID_ARGUMENT, "a data chunk for matrix 3"});
  }
  cases.push_back({"rank out of range", {HeaderMessage(1, 2, 2, "job")}, grpc::StatusCode::INVALID_ARGUMENT,
                   "rank = 2 is out of range for world = 2"});
  cases.push_back({"negative world", {HeaderMessage(1, 0, -3)}, grpc::StatusCode::INVALID_ARGUMENT, "world = -3"});
  cases.push_back({"no matrices", {HeaderMessage(0)}, grpc::StatusCode::INVALID_ARGUMENT, "num_matrices = 0"});
  cases.push_back({"group without job", {HeaderMessage(1, 0, 2)}, grpc::StatusCode::INVALID_ARGUMENT, "job is empty"});
  for (const Case& c : cases) {
    StreamOutcome out = RunStream(*stub_, c.messages);
    EXPECT_EQ(out.status.error_code(), c.code) << c.name << ": " << out.status.error_message();
    EXPECT_THAT(out.status.error_message(), HasSubstr(c.message)) << c.name;
  }
}

TEST_F(ServiceTest, GetServerInfoDescribesTheServer) {
  grpc::ClientContext context;
  v1::ServerInfo info;
  ASSERT_TRUE(stub_->GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok());
  EXPECT_EQ(info.backend(), "cpu");
  EXPECT_EQ(info.fleet_world(), 1);
  ASSERT_EQ(info.members_size(), 1);
  EXPECT_EQ(info.members(0).address(), "127.0.0.1:" + std::to_string(server_->port()));
  EXPECT_TRUE(info.ready());
  EXPECT_THAT(info.coefficients(), ::testing::Contains("cubic5"));
  EXPECT_THAT(info.algorithms(), ::testing::Contains("tp_distributed"));
  EXPECT_THAT(info.nd_layouts(), ::testing::ElementsAre("flatten", "batch"));
  EXPECT_THAT(info.normalizations(), ::testing::ElementsAre("fp32", "bf16"));
  EXPECT_EQ(info.limits().chunk_bytes(), 4 << 20);
  EXPECT_FALSE(info.auth_required());
}

TEST_F(ServiceTest, InflightByteLimitGivesResourceExhausted) {
  ServerOptions options = TestServerOptions();
  // Room for one small matrix: its 512 bytes in and out, and its metadata (kMatrixOverheadBytes
  // and a little more), but not for the 2 KiB of a 16x16 one on top.
  options.service.admission.max_inflight_bytes = 4000;
  Start(options);
  v1::OrthogonalizeRequest request;
  v1::Matrix* m = request.add_matrices();
  *m->mutable_spec() = Spec("big", {16, 16}, DType::kF32, NsOptions());
  m->set_data(Bytes(RandomMatrix(16, 16, 1), DType::kF32));
  v1::OrthogonalizeResponse response;
  grpc::Status status = Unary(request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("--max-inflight-bytes"));

  // A budget far below 2 x --max-message-bytes still serves unary calls that fit it: the body's
  // reservation is capped at the budget.
  v1::OrthogonalizeRequest small;
  v1::Matrix* s = small.add_matrices();
  *s->mutable_spec() = Spec("small", {8, 8}, DType::kF32, NsOptions());
  s->set_data(Bytes(RandomMatrix(8, 8, 2), DType::kF32));  // 256 bytes in, 256 out.
  v1::OrthogonalizeResponse answer;
  const grpc::Status ok = Unary(small, &answer);
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(answer.results_size(), 1);
}

// The compute queue is fair between tenants: with one worker busy on tenant alice's many large
// matrices, tenant bob's small request is computed next, not after all of alice's (FIFO order
// would finish alice's call first). The order of completion is asserted, not a time.
TEST_F(ServiceTest, AnotherTenantsSmallRequestIsNotQueuedBehindAFlood) {
  const std::string path = ::testing::TempDir() + "/fair_tokens.txt";
  {
    std::ofstream out(path);
    out << "secret-a alice\nsecret-b bob\n";
  }
  ServerOptions options = TestServerOptions();
  options.token_file = path;
  options.workers = 1;
  Start(options);
  NsOptions ns;
  ns.precision = Precision::kHighest;
  v1::OrthogonalizeRequest flood;
  const std::string big = Bytes(RandomMatrix(256, 256, 3), DType::kF32);
  for (int i = 0; i < 24; ++i) {
    v1::Matrix* m = flood.add_matrices();
    *m->mutable_spec() = Spec("big" + std::to_string(i), {256, 256}, DType::kF32, ns);
    m->set_data(big);
  }
  v1::OrthogonalizeRequest small;
  *small.add_matrices()->mutable_spec() = Spec("small", {16, 16}, DType::kF32, ns);
  small.mutable_matrices(0)->set_data(Bytes(RandomMatrix(16, 16, 4), DType::kF32));

  std::atomic<int> finished{0};
  int flood_place = 0, small_place = 0;
  std::thread alice([&] {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer secret-a");
    v1::OrthogonalizeResponse response;
    EXPECT_TRUE(stub_->Orthogonalize(&context, flood, &response).ok());
    flood_place = ++finished;
  });
  // Wait until alice's matrices are queued (the server is computing her first ones).
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (server_->compute_queued() < 10 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(2));
  ASSERT_GE(server_->compute_queued(), 10u);
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer secret-b");
    v1::OrthogonalizeResponse response;
    EXPECT_TRUE(stub_->Orthogonalize(&context, small, &response).ok());
    small_place = ++finished;
  }
  alice.join();
  EXPECT_EQ(small_place, 1) << "bob's request waited behind alice's whole call";
  EXPECT_EQ(flood_place, 2);
}

TEST_F(ServiceTest, TokensMapToTenantsAndUnknownOnesAreRejected) {
  const std::string path = ::testing::TempDir() + "/tokens.txt";
  {
    std::ofstream out(path);
    out << "# token tenant\nsecret-a alice\nsecret-b bob\n";
  }
  ServerOptions options = TestServerOptions();
  options.token_file = path;
  Start(options);
  v1::OrthogonalizeRequest request;
  v1::Matrix* m = request.add_matrices();
  *m->mutable_spec() = Spec("w", {3, 3}, DType::kF32, NsOptions());
  m->set_data(Bytes(RandomMatrix(3, 3, 1), DType::kF32));
  v1::OrthogonalizeResponse response;
  {
    grpc::ClientContext context;
    EXPECT_EQ(stub_->Orthogonalize(&context, request, &response).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer wrong");
    EXPECT_EQ(stub_->Orthogonalize(&context, request, &response).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer secret-b");
    EXPECT_TRUE(stub_->Orthogonalize(&context, request, &response).ok());
  }
}

TEST_F(ServiceTest, ConcurrentClientsAllGetTheirOwnResults) {
  NsOptions options;
  std::vector<std::thread> clients;
  std::atomic<int> ok{0};
  for (int c = 0; c < 6; ++c) {
    clients.emplace_back([&, c] {
      std::string in = Bytes(RandomMatrix(20 + c, 12, 50 + c), DType::kF32);
      std::vector<v1::StreamRequest> messages = {HeaderMessage(1)};
      AppendMatrix(messages, 0, Spec("c", {20 + c, 12}, DType::kF32, options), in, 333);
      messages.push_back(EndMessage());
      StreamOutcome out = RunStream(*stub_, messages);
      if (out.status.ok() && out.data[0] == Reference(in, {20 + c, 12}, DType::kF32, DType::kF32, options)) ++ok;
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(ok.load(), 6);
}

}  // namespace
}  // namespace orthoserve::testing

namespace orthoserve::testing {
namespace {

// A bounded load test on loopback (docs/operations.md): 8 clients × 20 steps of mixed shapes and dtypes
// at once, every response checked against the engine; limited in count and by a deadline.
TEST(ServiceLoadTest, EveryResponseUnderConcurrentLoadIsCorrect) {
  ServerOptions options = TestServerOptions();
  options.service.chunk_bytes = 8192;
  auto server = Server::Create(options);
  ASSERT_OK(server);
  auto stub = StubFor(**server);
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  std::atomic<int> checked{0};
  std::atomic<int> wrong{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < 8; ++c) {
    clients.emplace_back([&, c] {
      std::mt19937 rng(100 + c);
      for (int step = 0; step < 20 && absl::Now() < deadline; ++step) {
        NsOptions ns;
        ns.precision = rng() % 2 ? Precision::kHighest : Precision::kMedium;
        const DType dtype = static_cast<DType>(rng() % 3);
        const int n = 1 + static_cast<int>(rng() % 3);
        std::vector<v1::StreamRequest> messages = {HeaderMessage(n)};
        std::vector<std::pair<Matrix2d, std::string>> inputs;
        for (int i = 0; i < n; ++i) {
          Matrix2d m{1 + static_cast<int64_t>(rng() % 48), 1 + static_cast<int64_t>(rng() % 48)};
          inputs.emplace_back(m, Bytes(RandomMatrix(m.rows, m.cols, rng()), dtype));
          AppendMatrix(messages, i, Spec("m", {m.rows, m.cols}, dtype, ns), inputs.back().second, 1000);
        }
        messages.push_back(EndMessage());
        StreamOutcome out = RunStream(*stub, messages);
        for (int i = 0; i < n; ++i) {
          const bool ok = out.status.ok() && out.results[i].code() == 0 &&
                          out.data[i] == Reference(inputs[i].second, inputs[i].first, dtype, dtype, ns);
          (ok ? checked : wrong)++;
        }
      }
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(checked.load(), 100);
}

}  // namespace
}  // namespace orthoserve::testing
