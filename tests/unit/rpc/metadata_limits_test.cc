// The metadata limits of the public service end to end in process on 127.0.0.1:0: names, dims,
// matrices per step and world per group are refused at the first offending field with
// INVALID_ARGUMENT naming the field and its flag (and counted as integrity refusals), on the
// stream and the unary path; messages about a huge name stay small; every spec's metadata is
// admitted like its bytes; GetServerInfo lists the limits.
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/rpc/rpc_test_util.h"
#include "tests/util/http_get.h"

namespace orthoserve::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// Longest status message a test accepts for a refusal that names client text.
constexpr size_t kSmallMessage = 1024;

class MetadataLimitsTest : public ::testing::Test {
 protected:
  void Start(ServerOptions options = TestServerOptions()) {
    options.metrics_address = "127.0.0.1:0";
    auto server = Server::Create(options);
    ASSERT_OK(server);
    server_ = std::move(*server);
    stub_ = StubFor(*server_);
  }
  void SetUp() override { Start(); }

  grpc::Status Unary(const v1::OrthogonalizeRequest& request) {
    grpc::ClientContext context;
    v1::OrthogonalizeResponse response;
    return stub_->Orthogonalize(&context, request, &response);
  }

  // Sample `series` of a scrape now (-1, with a failure, when absent).
  double Scraped(const std::string& series) {
    const std::string response = HttpExchange(server_->metrics_port(), "GET /metrics HTTP/1.1");
    for (absl::string_view line : absl::StrSplit(response, '\n')) {
      if (!absl::StartsWith(line, series + " ")) continue;
      double value = -1;
      if (absl::SimpleAtod(line.substr(series.size() + 1), &value)) return value;
    }
    ADD_FAILURE() << "no " << series << " in the scrape";
    return -1;
  }
  double LimitRefusals() { return Scraped("orthoserve_integrity_refusals_total{cause=\"limit\"}"); }
  // Waits (up to 10 s) until the calls before have returned what they held: a call's bytes are
  // released just after its client has the answer.
  void WaitUntilNothingHeld() {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (Scraped("orthoserve_inflight_bytes") != 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
    EXPECT_EQ(Scraped("orthoserve_inflight_bytes"), 0);
  }

  std::unique_ptr<Server> server_;
  std::unique_ptr<v1::Orthogonalizer::Stub> stub_;
};

const std::string& SmallData() {
  static const std::string data = Bytes(RandomMatrix(4, 6, 7), DType::kF32);
  return data;
}

v1::MatrixSpec SmallSpec(const std::string& name = "w") { return Spec(name, {4, 6}, DType::kF32, NsOptions()); }

// A lone stream of one good matrix, then `bad` as matrix 1 of 2.
std::vector<v1::StreamRequest> GoodThenBad(const v1::MatrixSpec& bad) {
  std::vector<v1::StreamRequest> m = {HeaderMessage(2)};
  AppendMatrix(m, 0, SmallSpec(), SmallData());
  AppendMatrix(m, 1, bad, SmallData());
  m.push_back(EndMessage());
  return m;
}

v1::MatrixSpec WithDims(int dims) {
  std::vector<int64_t> shape(static_cast<size_t>(dims), 1);
  shape[0] = 4;
  shape[1] = 6;
  return Spec("w", shape, DType::kF32, NsOptions());
}

// A spec over one of the default limits (as matrix 1, after a good one), and the refusal's message.
struct OverLimit {
  std::string name;
  v1::MatrixSpec spec;
  std::string message;
};
std::vector<OverLimit> OverLimitCases() {
  return {
      {"name", SmallSpec(std::string(1025, 'n')), "name has 1025 bytes; at most 1024 are accepted (--max-name-bytes)"},
      {"dims", WithDims(17), "matrix 1 (\"w\") shape has 17 dims; at most 16 are accepted (--max-shape-dims)"},
  };
}

TEST_F(MetadataLimitsTest, StreamRefusesASpecOverALimitAtThatSpec) {
  const std::vector<OverLimit> cases = OverLimitCases();
  for (const OverLimit& c : cases) {
    const double before = LimitRefusals();
    StreamOutcome out = RunStream(*stub_, GoodThenBad(c.spec));
    EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.name << ": " << out.status.error_message();
    EXPECT_THAT(out.status.error_message(), AllOf(HasSubstr("matrix 1 ("), HasSubstr(c.message))) << c.name;
    // A lone stream answers other bad specs in-band; one over a limit ends it (no summary).
    EXPECT_FALSE(out.summary) << c.name;
    EXPECT_EQ(LimitRefusals(), before + 1) << c.name;
  }
  // Exactly at the limits: served.
  StreamOutcome at = RunStream(*stub_, GoodThenBad(WithDims(16)));
  EXPECT_TRUE(at.status.ok()) << at.status.error_message();
  ASSERT_EQ(at.results.count(1), 1u);
  EXPECT_EQ(at.results[1].code(), 0) << at.results[1].message();
  at = RunStream(*stub_, GoodThenBad(SmallSpec(std::string(1024, 'n'))));
  EXPECT_TRUE(at.status.ok()) << at.status.error_message();
}

TEST_F(MetadataLimitsTest, StreamRefusesAHeaderOverALimit) {
  const std::string long_text(1025, 'j');
  struct Case {
    std::string name;
    v1::StreamRequest header;
    std::string message;
  };
  std::vector<Case> cases;
  cases.push_back({"world", HeaderMessage(1, 0, 16385, "job"),
                   "header world = 16385 is over the limit of 16384 trainer ranks (--max-group-world)"});
  cases.push_back({"num_matrices", HeaderMessage(4097),
                   "header num_matrices = 4097 is over the limit of 4096 (--max-matrices-per-step)"});
  cases.push_back({"job", HeaderMessage(1, 0, 2, long_text), "header job (\"jjj"});
  cases.push_back({"group", HeaderMessage(1, 0, 2, "job", 0, long_text), "header group (\"jjj"});
  cases.push_back({"run_id", HeaderMessage(1, 0, 2, "job", 0, "g", long_text), "header run_id (\"jjj"});
  for (const Case& c : cases) {
    const double before = LimitRefusals();
    std::vector<v1::StreamRequest> messages = {c.header};
    AppendMatrix(messages, 0, SmallSpec(), SmallData());
    StreamOutcome out = RunStream(*stub_, messages);
    EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.name << ": " << out.status.error_message();
    EXPECT_THAT(out.status.error_message(), HasSubstr(c.message)) << c.name;
    if (c.name == "job" || c.name == "group" || c.name == "run_id") {
      EXPECT_THAT(
          out.status.error_message(),
          AllOf(HasSubstr("has 1025 bytes; at most 1024 are accepted (--max-name-bytes)"), Not(HasSubstr(long_text))))
          << c.name;
    }
    EXPECT_EQ(LimitRefusals(), before + 1) << c.name;
  }
}

TEST_F(MetadataLimitsTest, ConfiguredLimitsAreTheOnesApplied) {
  ServerOptions options = TestServerOptions();
  options.service.max_name_bytes = 8;
  options.service.max_shape_dims = 3;
  options.service.max_group_world = 4;
  options.service.max_matrices_per_step = 2;
  Start(options);
  StreamOutcome out = RunStream(*stub_, GoodThenBad(WithDims(4)));
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(out.status.error_message(), HasSubstr("shape has 4 dims; at most 3 are accepted (--max-shape-dims)"));
  out = RunStream(*stub_, GoodThenBad(SmallSpec("ninechars")));
  EXPECT_THAT(out.status.error_message(), HasSubstr("name has 9 bytes; at most 8 are accepted (--max-name-bytes)"));
  out = RunStream(*stub_, {HeaderMessage(1, 0, 5, "job")});
  EXPECT_THAT(out.status.error_message(), HasSubstr("world = 5 is over the limit of 4 trainer ranks"));
  out = RunStream(*stub_, {HeaderMessage(3)});
  EXPECT_THAT(out.status.error_message(), HasSubstr("num_matrices = 3 is over the limit of 2"));
  out = RunStream(*stub_, {HeaderMessage(1, 0, 2, "ninechars")});
  EXPECT_THAT(out.status.error_message(), HasSubstr("header job (\"ninechars\") has 9 bytes; at most 8"));
  out = RunStream(*stub_, GoodThenBad(WithDims(3)));
  EXPECT_TRUE(out.status.ok()) << out.status.error_message();
}

TEST_F(MetadataLimitsTest, UnaryRefusesAMatrixOverALimit) {
  const std::vector<OverLimit> cases = OverLimitCases();
  for (const OverLimit& c : cases) {
    const double before = LimitRefusals();
    v1::OrthogonalizeRequest request;
    v1::Matrix* good = request.add_matrices();
    *good->mutable_spec() = SmallSpec();
    good->set_data(SmallData());
    v1::Matrix* bad = request.add_matrices();
    *bad->mutable_spec() = c.spec;
    bad->set_data(SmallData());
    grpc::Status status = Unary(request);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.name << ": " << status.error_message();
    EXPECT_THAT(status.error_message(), AllOf(HasSubstr("matrix 1 ("), HasSubstr(c.message))) << c.name;
    EXPECT_EQ(LimitRefusals(), before + 1) << c.name;
  }
}

TEST_F(MetadataLimitsTest, UnaryRefusesMoreMatricesThanTheLimit) {
  ServerOptions options = TestServerOptions();
  options.service.max_matrices_per_step = 3;
  Start(options);
  v1::OrthogonalizeRequest request;
  for (int i = 0; i < 4; ++i) {
    v1::Matrix* m = request.add_matrices();
    *m->mutable_spec() = SmallSpec("w" + std::to_string(i));
    m->set_data(SmallData());
  }
  const double before = LimitRefusals();
  grpc::Status status = Unary(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(),
              HasSubstr("the request holds 4 matrices; at most 3 are accepted per call (--max-matrices-per-step)"));
  EXPECT_EQ(LimitRefusals(), before + 1);
  request.mutable_matrices()->RemoveLast();
  EXPECT_TRUE(Unary(request).ok());
}

TEST_F(MetadataLimitsTest, ARefusalAboutA64KiBNameFitsInASmallMessage) {
  const std::string huge(64 << 10, 'x');
  // Over --max-name-bytes, on both paths, in a header field too: the client sees the server's
  // INVALID_ARGUMENT (not a RESOURCE_EXHAUSTED of its own for oversized trailing metadata).
  StreamOutcome out = RunStream(*stub_, GoodThenBad(SmallSpec(huge)));
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << out.status.error_message();
  EXPECT_LT(out.status.error_message().size(), kSmallMessage);
  EXPECT_THAT(out.status.error_message(), HasSubstr("(65536 bytes)"));
  out = RunStream(*stub_, {HeaderMessage(1, 0, 2, huge)});
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << out.status.error_message();
  EXPECT_LT(out.status.error_message().size(), kSmallMessage);
  v1::OrthogonalizeRequest request;
  v1::Matrix* m = request.add_matrices();
  *m->mutable_spec() = SmallSpec(huge);
  m->set_data(SmallData());
  grpc::Status status = Unary(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_LT(status.error_message().size(), kSmallMessage);

  // Within a raised limit, the other errors about such a matrix are bounded too: in-band on a
  // lone stream, and the status of a unary call or of a failed stream.
  ServerOptions options = TestServerOptions();
  options.service.max_name_bytes = 1 << 20;
  Start(options);
  v1::MatrixSpec bad_dtype = SmallSpec(huge);
  bad_dtype.set_dtype(static_cast<v1::DType>(42));
  out = RunStream(*stub_, GoodThenBad(bad_dtype));
  EXPECT_TRUE(out.status.ok()) << out.status.error_message();
  ASSERT_EQ(out.results.count(1), 1u);
  EXPECT_EQ(out.results[1].code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(out.results[1].message(), HasSubstr("dtype = 42"));
  EXPECT_LT(out.results[1].message().size(), kSmallMessage);
  m->set_data(SmallData().substr(1));
  status = Unary(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("the step ended after 95 of its 96 bytes"));
  EXPECT_LT(status.error_message().size(), kSmallMessage);
  std::vector<v1::StreamRequest> short_data = {HeaderMessage(1)};
  AppendMatrix(short_data, 0, SmallSpec(huge), SmallData().substr(0, 50));
  short_data.push_back(EndMessage());
  out = RunStream(*stub_, short_data);
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(out.status.error_message(), HasSubstr("the step ended after 50 of its 96 bytes"));
  EXPECT_LT(out.status.error_message().size(), kSmallMessage);
}

// 200 one-element matrices hold 1.6 KB of data, but over 400 KB of metadata (their structures'
// overhead): a tenant allowed 256 KiB in flight is refused part way, naming the matrix.
TEST_F(MetadataLimitsTest, MetadataIsAdmittedLikeData) {
  ServerOptions options = TestServerOptions();
  options.service.admission.max_tenant_inflight_bytes = 256 << 10;
  Start(options);
  constexpr int kMatrices = 200;
  const std::string one = Bytes({0.5f}, DType::kF32);
  std::vector<v1::StreamRequest> messages = {HeaderMessage(kMatrices)};
  for (int i = 0; i < kMatrices; ++i) {
    AppendMatrix(messages, i, Spec("m" + std::to_string(i), {1, 1}, DType::kF32, NsOptions()), one);
  }
  messages.push_back(EndMessage());
  StreamOutcome out = RunStream(*stub_, messages);
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << out.status.error_message();
  EXPECT_THAT(out.status.error_message(), AllOf(HasSubstr("--max-tenant-inflight-bytes"), HasSubstr("(\"m")));
  EXPECT_LT(out.results.size(), static_cast<size_t>(kMatrices));
  WaitUntilNothingHeld();

  v1::OrthogonalizeRequest request;
  for (int i = 0; i < kMatrices; ++i) {
    v1::Matrix* m = request.add_matrices();
    *m->mutable_spec() = Spec("m" + std::to_string(i), {1, 1}, DType::kF32, NsOptions());
    m->set_data(one);
  }
  grpc::Status status = Unary(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  WaitUntilNothingHeld();
  // Half as many fit.
  request.mutable_matrices()->DeleteSubrange(kMatrices / 2, kMatrices / 2);
  status = Unary(request);
  EXPECT_TRUE(status.ok()) << status.error_message();
  WaitUntilNothingHeld();
  messages = {HeaderMessage(kMatrices / 2)};
  for (int i = 0; i < kMatrices / 2; ++i) {
    AppendMatrix(messages, i, Spec("m" + std::to_string(i), {1, 1}, DType::kF32, NsOptions()), one);
  }
  messages.push_back(EndMessage());
  out = RunStream(*stub_, messages);
  EXPECT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_EQ(out.results.size(), static_cast<size_t>(kMatrices / 2));
}

TEST_F(MetadataLimitsTest, GetServerInfoListsTheLimits) {
  ServerOptions options = TestServerOptions();
  options.service.max_name_bytes = 300;
  options.service.max_shape_dims = 5;
  options.service.max_matrices_per_step = 77;
  options.service.max_group_world = 64;
  options.service.max_tenant_pending_steps = 9;
  for (const ServerOptions& o : {TestServerOptions(), options}) {
    Start(o);
    grpc::ClientContext context;
    v1::ServerInfo info;
    ASSERT_TRUE(stub_->GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok());
    EXPECT_EQ(info.limits().max_name_bytes(), o.service.max_name_bytes);
    EXPECT_EQ(info.limits().max_shape_dims(), o.service.max_shape_dims);
    EXPECT_EQ(info.limits().max_matrices_per_step(), o.service.max_matrices_per_step);
    EXPECT_EQ(info.limits().max_group_world(), o.service.max_group_world);
    EXPECT_EQ(info.limits().max_tenant_pending_steps(), o.service.max_tenant_pending_steps);
  }
  // The defaults, as documented.
  const ServiceOptions defaults;
  EXPECT_EQ(defaults.max_name_bytes, 1024);
  EXPECT_EQ(defaults.max_shape_dims, 16);
  EXPECT_EQ(defaults.max_matrices_per_step, 4096);
  EXPECT_EQ(defaults.max_group_world, 16384);
  EXPECT_EQ(defaults.max_tenant_pending_steps, 256);
}

}  // namespace
}  // namespace orthoserve::testing
