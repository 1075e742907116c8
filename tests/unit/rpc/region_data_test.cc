// Matrices in shared-memory regions through a real Server (issue #28): a unary call whose input
// and/or result name a region's slice gives bit-identical results to the same call with bytes;
// another tenant cannot use a region; bad slices get their specific codes and the server goes
// on; a truncation attempt fails and changes nothing; unregister waits for a step in flight.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <limits>
#include <cstring>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/rpc/shm_server_fixture.h"

namespace orthoserve::testing {
namespace {

using ::testing::HasSubstr;

v1::RegionSlice Slice(const std::string& id, int64_t offset, int64_t size) {
  v1::RegionSlice s;
  s.set_region_id(id);
  s.set_offset(offset);
  s.set_size(size);
  return s;
}

class RegionDataTest : public ShmServerTest {
 protected:
  grpc::Status Call(const std::string& token, const v1::OrthogonalizeRequest& request,
                    v1::OrthogonalizeResponse* response) {
    return StubFor(*server_)->Orthogonalize(Context(token).get(), request, response);
  }
  // One matrix `spec` with `data` inline (may be empty).
  static v1::OrthogonalizeRequest One(const v1::MatrixSpec& spec, const std::string& data = "") {
    v1::OrthogonalizeRequest request;
    v1::Matrix* m = request.add_matrices();
    *m->mutable_spec() = spec;
    m->set_data(data);
    return request;
  }
};

// The same matrices, dtypes and options through bytes and through a region give the same bits.
TEST_F(RegionDataTest, ResultsThroughARegionAreBitIdenticalToResultsThroughBytes) {
  StartServer(/*regions=*/true);
  struct Case {
    int64_t rows, cols;
    DType in, out;
    Precision precision;
  };
  const Case cases[] = {{64, 96, DType::kF32, DType::kF32, Precision::kMedium},
                        {96, 64, DType::kBF16, DType::kBF16, Precision::kMedium},
                        {33, 17, DType::kF32, DType::kBF16, Precision::kHighest},
                        {48, 48, DType::kF16, DType::kF32, Precision::kHigh}};
  std::unique_ptr<ClientRegion> region = NewRegion("secret-a", 1 << 20);
  ASSERT_FALSE(region->id.empty());
  int n = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(n);
    NsOptions options;
    options.precision = c.precision;
    v1::MatrixSpec spec = Spec("w" + std::to_string(n), {c.rows, c.cols}, c.in, options);
    spec.set_result_dtype(DTypeToProto(c.out));
    const std::string input = Bytes(RandomMatrix(c.rows, c.cols, 100 + n), c.in);
    const int64_t out_bytes = c.rows * c.cols * static_cast<int64_t>(ElementSize(c.out));
    ++n;

    v1::OrthogonalizeResponse by_bytes;
    ASSERT_TRUE(Call("secret-a", One(spec, input), &by_bytes).ok());
    const std::string expected = by_bytes.results(0).data();
    ASSERT_EQ(static_cast<int64_t>(expected.size()), out_bytes);

    // Input and result in the region (at offsets that are not page-aligned).
    const int64_t in_off = 4096 + 8, out_off = 262144 + 24;
    std::memcpy(region->data + in_off, input.data(), input.size());
    std::memset(region->data + out_off, 0x5a, static_cast<size_t>(out_bytes));
    v1::MatrixSpec both = spec;
    *both.mutable_input_region() = Slice(region->id, in_off, static_cast<int64_t>(input.size()));
    *both.mutable_result_region() = Slice(region->id, out_off, out_bytes);
    v1::OrthogonalizeResponse in_region;
    grpc::Status status = Call("secret-a", One(both), &in_region);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_TRUE(in_region.results(0).data().empty());
    EXPECT_EQ(in_region.results(0).result_region().offset(), out_off);
    EXPECT_EQ(std::string(region->data + out_off, static_cast<size_t>(out_bytes)), expected);

    // Input in the region, result inline; and input inline, result in the region.
    v1::MatrixSpec input_only = spec;
    *input_only.mutable_input_region() = both.input_region();
    v1::OrthogonalizeResponse response;
    ASSERT_TRUE(Call("secret-a", One(input_only), &response).ok());
    EXPECT_EQ(response.results(0).data(), expected);
    v1::MatrixSpec result_only = spec;
    *result_only.mutable_result_region() = both.result_region();
    std::memset(region->data + out_off, 0, static_cast<size_t>(out_bytes));
    ASSERT_TRUE(Call("secret-a", One(result_only, input), &response).ok());
    EXPECT_EQ(std::string(region->data + out_off, static_cast<size_t>(out_bytes)), expected);
  }
  EXPECT_THAT(Scrape(), HasSubstr("orthoserve_shm_matrices_total{direction=\"input\"} 8"));
  EXPECT_THAT(Scrape(), HasSubstr("orthoserve_shm_matrices_total{direction=\"result\"} 8"));
}

TEST_F(RegionDataTest, AnotherTenantCannotUseARegionByIdByGuessingOrAfterItWasUnregistered) {
  StartServer(/*regions=*/true);
  std::unique_ptr<ClientRegion> region = NewRegion("secret-a", 1 << 16);
  const v1::MatrixSpec spec = Spec("w", {8, 8}, DType::kF32, NsOptions{});
  const std::string input = Bytes(RandomMatrix(8, 8, 1), DType::kF32);
  std::memcpy(region->data, input.data(), input.size());
  v1::MatrixSpec named = spec;
  *named.mutable_input_region() = Slice(region->id, 0, static_cast<int64_t>(input.size()));
  v1::OrthogonalizeResponse response;
  ASSERT_TRUE(Call("secret-a", One(named), &response).ok());

  grpc::Status status = Call("secret-m", One(named), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("input_region"));
  v1::MatrixSpec result_named = spec;
  *result_named.mutable_result_region() = Slice(region->id, 1024, static_cast<int64_t>(input.size()));
  EXPECT_EQ(Call("secret-m", One(result_named, input), &response).error_code(), grpc::StatusCode::NOT_FOUND);
  for (const char* guess : {"00000000000000000000000000000000", "ffffffffffffffffffffffffffffffff", "", "../x"}) {
    v1::MatrixSpec guessed = spec;
    *guessed.mutable_input_region() = Slice(guess, 0, static_cast<int64_t>(input.size()));
    EXPECT_EQ(Call("secret-a", One(guessed), &response).error_code(), grpc::StatusCode::NOT_FOUND) << guess;
    EXPECT_EQ(Call("secret-m", One(guessed), &response).error_code(), grpc::StatusCode::NOT_FOUND) << guess;
  }
  ASSERT_TRUE(Unregister("secret-a", region->id).ok());
  EXPECT_EQ(Call("secret-a", One(named), &response).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(RegionDataTest, BadSlicesAreRefusedWithTheirCodesAndTheServerGoesOn) {
  StartServer(/*regions=*/true);
  const int64_t size = 1 << 16;
  std::unique_ptr<ClientRegion> region = NewRegion("secret-a", size);
  const v1::MatrixSpec spec = Spec("w", {8, 8}, DType::kF32, NsOptions{});
  const std::string input = Bytes(RandomMatrix(8, 8, 2), DType::kF32);
  const int64_t bytes = static_cast<int64_t>(input.size());
  std::memcpy(region->data, input.data(), input.size());
  v1::OrthogonalizeResponse response;
  struct Bad {
    v1::RegionSlice in, out;
    grpc::StatusCode code;
    const char* text;
  };
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  const Bad bad[] = {
      {Slice(region->id, size - 8, bytes), {}, grpc::StatusCode::OUT_OF_RANGE, "not inside"},
      {Slice(region->id, -1, bytes), {}, grpc::StatusCode::OUT_OF_RANGE, "not inside"},
      {Slice(region->id, kMax, bytes), {}, grpc::StatusCode::OUT_OF_RANGE, "not inside"},
      {Slice(region->id, kMax - 8, bytes), {}, grpc::StatusCode::OUT_OF_RANGE, "not inside"},
      {{}, Slice(region->id, size, bytes), grpc::StatusCode::OUT_OF_RANGE, "not inside"},
      {Slice(region->id, 0, bytes - 1), {}, grpc::StatusCode::INVALID_ARGUMENT, "input_region.size"},
      {Slice(region->id, 0, kMax), {}, grpc::StatusCode::INVALID_ARGUMENT, "input_region.size"},
      {{}, Slice(region->id, 0, bytes + 4), grpc::StatusCode::INVALID_ARGUMENT, "result_region.size"},
      {Slice(region->id, 0, bytes), Slice(region->id, bytes - 4, bytes), grpc::StatusCode::INVALID_ARGUMENT,
       "overlaps"},
      {Slice(region->id, 64, bytes), Slice(region->id, 0, bytes), grpc::StatusCode::INVALID_ARGUMENT, "overlaps"},
      {Slice(region->id, 1, bytes), {}, grpc::StatusCode::INVALID_ARGUMENT, "multiple of the element size"},
      {{}, Slice(region->id, 1024 + 2, bytes), grpc::StatusCode::INVALID_ARGUMENT, "multiple of the element size"},
  };
  for (const Bad& b : bad) {
    v1::MatrixSpec s = spec;
    std::string data = input;
    if (!b.in.region_id().empty()) {
      *s.mutable_input_region() = b.in;
      data.clear();
    }
    if (!b.out.region_id().empty()) *s.mutable_result_region() = b.out;
    grpc::Status status = Call("secret-a", One(s, data), &response);
    EXPECT_EQ(status.error_code(), b.code) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(b.text));
  }
  // Data and an input region at once.
  v1::MatrixSpec both = spec;
  *both.mutable_input_region() = Slice(region->id, 0, bytes);
  grpc::Status status = Call("secret-a", One(both, input), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("one or the other"));
  // A non-finite value in the region is refused like one in bytes.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(region->data + 12, &nan, sizeof(nan));
  status = Call("secret-a", One(both), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("non-finite"));
  // The server goes on.
  std::memcpy(region->data, input.data(), input.size());
  status = Call("secret-a", One(both), &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST_F(RegionDataTest, WithRegionsOffAMatrixNamingOneIsRefused) {
  StartServer(/*regions=*/false);
  v1::MatrixSpec spec = Spec("w", {8, 8}, DType::kF32, NsOptions{});
  *spec.mutable_input_region() = Slice("00000000000000000000000000000000", 0, 256);
  v1::OrthogonalizeResponse response;
  grpc::Status status = Call("secret-a", One(spec), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("--shm-socket"));
}

TEST_F(RegionDataTest, TheClientCannotTruncateARegisteredRegionAndTheServerSurvivesTheAttempt) {
  StartServer(/*regions=*/true);
  const int64_t size = 1 << 16;
  std::unique_ptr<ClientRegion> region = NewRegion("secret-a", size);
  const v1::MatrixSpec spec = Spec("w", {16, 16}, DType::kF32, NsOptions{});
  const std::string input = Bytes(RandomMatrix(16, 16, 3), DType::kF32);
  std::memcpy(region->data + size - 1024, input.data(), input.size());  // The last kilobyte.
  EXPECT_EQ(ftruncate(region->fd.get(), 0), -1);
  EXPECT_EQ(errno, EPERM);
  EXPECT_EQ(ftruncate(region->fd.get(), size / 2), -1);
  EXPECT_EQ(fcntl(region->fd.get(), F_ADD_SEALS, 0), 0);  // Seals can be added, never removed:
  EXPECT_NE(fcntl(region->fd.get(), F_GET_SEALS) & F_SEAL_SHRINK, 0);
  v1::MatrixSpec named = spec;
  *named.mutable_input_region() = Slice(region->id, size - 1024, static_cast<int64_t>(input.size()));
  v1::OrthogonalizeResponse by_region, by_bytes;
  ASSERT_TRUE(Call("secret-a", One(named), &by_region).ok());
  ASSERT_TRUE(Call("secret-a", One(spec, input), &by_bytes).ok());
  EXPECT_EQ(by_region.results(0).data(), by_bytes.results(0).data());
}

TEST_F(RegionDataTest, UnregisterWaitsForTheStepUsingTheRegion) {
  StartServer(/*regions=*/true);
  // A matrix that takes a while to compute (100 HIGHEST steps of 256 × 512).
  NsOptions options;
  options.steps = 100;
  options.precision = Precision::kHighest;
  const v1::MatrixSpec spec = Spec("slow", {256, 512}, DType::kF32, options);
  const std::string input = Bytes(RandomMatrix(256, 512, 4), DType::kF32);
  const int64_t bytes = static_cast<int64_t>(input.size());
  std::unique_ptr<ClientRegion> region = NewRegion("secret-a", 2 * bytes);
  std::memcpy(region->data, input.data(), input.size());
  v1::OrthogonalizeResponse by_bytes;
  ASSERT_TRUE(Call("secret-a", One(spec, input), &by_bytes).ok());

  v1::MatrixSpec named = spec;
  *named.mutable_input_region() = Slice(region->id, 0, bytes);
  *named.mutable_result_region() = Slice(region->id, bytes, bytes);
  grpc::Status call_status;
  std::thread call([&] {
    v1::OrthogonalizeResponse response;
    call_status = Call("secret-a", One(named), &response);
  });
  // Wait (bounded) until the step holds the region.
  bool in_use = false;
  for (const absl::Time until = absl::Now() + absl::Seconds(10); !in_use && absl::Now() < until;) {
    v1::ListRegionsResponse list;
    ASSERT_TRUE(List("secret-a", &list).ok());
    in_use = list.regions_size() == 1 && list.regions(0).users() > 0;
    if (!in_use) absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_TRUE(in_use) << "the call never used the region";
  grpc::Status unregistered = Unregister("secret-a", region->id);
  // When the unregister returns, the step is done with the region: the result is all there.
  EXPECT_TRUE(unregistered.ok()) << unregistered.error_message();
  EXPECT_EQ(std::string(region->data + bytes, static_cast<size_t>(bytes)), by_bytes.results(0).data());
  call.join();
  EXPECT_TRUE(call_status.ok()) << call_status.error_message();
}

// A stream step mixes matrices in a region with matrices in chunks: the region's results come
// back as MatrixResults naming the slice (no chunks), bit-identical to the bytes' results; a bad
// slice is answered in-band and the step goes on.
TEST_F(RegionDataTest, AStreamStepReadsAndWritesRegionsInPlace) {
  StartServer(/*regions=*/true);
  std::unique_ptr<ClientRegion> region = NewRegion("secret-a", 1 << 20);
  const v1::MatrixSpec a = Spec("a", {64, 128}, DType::kF32, NsOptions{});
  const v1::MatrixSpec b = Spec("b", {32, 16}, DType::kBF16, NsOptions{});
  const std::string a_in = Bytes(RandomMatrix(64, 128, 5), DType::kF32);
  const std::string b_in = Bytes(RandomMatrix(32, 16, 6), DType::kBF16);
  v1::OrthogonalizeResponse a_ref, b_ref;
  ASSERT_TRUE(Call("secret-a", One(a, a_in), &a_ref).ok());
  ASSERT_TRUE(Call("secret-a", One(b, b_in), &b_ref).ok());
  const int64_t a_bytes = static_cast<int64_t>(a_in.size());
  std::memcpy(region->data, a_in.data(), a_in.size());

  v1::MatrixSpec a_region = a;
  *a_region.mutable_input_region() = Slice(region->id, 0, a_bytes);
  *a_region.mutable_result_region() = Slice(region->id, a_bytes, a_bytes);
  v1::MatrixSpec bad = a;
  bad.set_name("bad");
  *bad.mutable_input_region() = Slice(region->id, (1 << 20) - 8, a_bytes);
  std::vector<v1::StreamRequest> messages = {HeaderMessage(3)};
  AppendMatrix(messages, 0, a_region, "");
  AppendMatrix(messages, 1, bad, "");
  AppendMatrix(messages, 2, b, b_in);
  messages.push_back(EndMessage());
  auto context = Context("secret-a");
  auto stub = StubFor(*server_);
  StreamOutcome out = RunStream(*stub, messages, context.get());
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  ASSERT_EQ(out.results.size(), 3u);
  EXPECT_EQ(out.results[0].code(), 0);
  EXPECT_EQ(out.results[0].result_region().offset(), a_bytes);
  EXPECT_EQ(out.data.count(0) ? out.data[0].size() : 0u, 0u);  // No chunks for it.
  EXPECT_EQ(std::string(region->data + a_bytes, static_cast<size_t>(a_bytes)), a_ref.results(0).data());
  EXPECT_EQ(out.results[1].code(), static_cast<int>(grpc::StatusCode::OUT_OF_RANGE));
  EXPECT_THAT(out.results[1].message(), HasSubstr("input_region"));
  EXPECT_EQ(out.results[2].code(), 0);
  EXPECT_EQ(out.data[2], b_ref.results(0).data());
  EXPECT_EQ(out.step_summary.matrices_ok(), 2);
  EXPECT_EQ(out.step_summary.matrices_failed(), 1);
}

// Trainer rank `rank` of 2's half of `spec`'s rows (its block), with the slices `in` and `out`
// when they name a region.
v1::MatrixSpec HalfOf(v1::MatrixSpec spec, int rank, const v1::RegionSlice& in = {}, const v1::RegionSlice& out = {}) {
  const int64_t rows = spec.shape(0) / 2;
  spec.mutable_block()->set_row_offset(rank * rows);
  spec.mutable_block()->set_col_offset(0);
  spec.mutable_block()->set_rows(rows);
  spec.mutable_block()->set_cols(spec.shape(1));
  if (!in.region_id().empty()) *spec.mutable_input_region() = in;
  if (!out.region_id().empty()) *spec.mutable_result_region() = out;
  return spec;
}

// One trainer rank's stream of a group step of world 2 (job "job", group "g", run "run-a"):
// `specs[i]` with `data[i]` (empty for a block in a region), as `token`'s tenant.
StreamOutcome GroupRank(v1::Orthogonalizer::Stub& stub, grpc::ClientContext* context, int rank, int64_t step,
                        int attempt, const std::vector<v1::MatrixSpec>& specs, const std::vector<std::string>& data) {
  std::vector<v1::StreamRequest> messages = {HeaderMessage(static_cast<int>(specs.size()), rank, 2, "job", step)};
  messages[0].mutable_header()->set_attempt(attempt);
  for (size_t i = 0; i < specs.size(); ++i) AppendMatrix(messages, static_cast<int>(i), specs[i], data[i]);
  messages.push_back(EndMessage());
  return RunStream(stub, messages, context);
}

// A group step (W = 2 trainer ranks on this one-rank fleet) in which trainer rank 0 has matrix
// a's input and result in its region and matrix b's result only, while rank 1 sends bytes: each
// rank's results have the bits of the same step in bytes. A retry of rank 0, answered from the
// fleet's kept inputs after rank 0 reused its result slices, writes into the other slice it names
// and leaves the first attempt's alone; a retry naming none gets bytes.
TEST_F(RegionDataTest, AGroupStepReadsAndWritesRegionBlocksWithTheBitsOfBytes) {
  StartServer(/*regions=*/true);
  NsOptions options;
  options.precision = Precision::kHighest;
  const v1::MatrixSpec a = Spec("a", {16, 8}, DType::kF32, options);
  const v1::MatrixSpec b = Spec("b", {8, 12}, DType::kBF16, options);
  const std::string a_in = Bytes(RandomMatrix(16, 8, 11), DType::kF32);
  const std::string b_in = Bytes(RandomMatrix(8, 12, 12), DType::kBF16);
  const size_t a_half = a_in.size() / 2, b_half = b_in.size() / 2;
  auto half = [](const std::string& all, int rank) { return all.substr(rank * all.size() / 2, all.size() / 2); };
  auto stub = StubFor(*server_);
  auto bytes_step = [&](int rank, int64_t step) {
    auto context = Context("secret-a");
    return GroupRank(*stub, context.get(), rank, step, 0, {HalfOf(a, rank), HalfOf(b, rank)},
                     {half(a_in, rank), half(b_in, rank)});
  };
  // The reference: step 1 in bytes.
  auto ref1 = std::async(std::launch::async, [&] { return bytes_step(1, 1); });
  StreamOutcome ref0 = bytes_step(0, 1);
  StreamOutcome ref1_out = ref1.get();
  ASSERT_TRUE(ref0.status.ok()) << ref0.status.error_message();
  ASSERT_TRUE(ref1_out.status.ok()) << ref1_out.status.error_message();

  // Step 2 with rank 0's blocks in its region: a's input at 0, a's result after it, b's result after that.
  std::unique_ptr<ClientRegion> region = NewRegion("secret-a", 1 << 16);
  std::memcpy(region->data, a_in.data(), a_half);
  const int64_t a_bytes = static_cast<int64_t>(a_half), b_bytes = static_cast<int64_t>(b_half);
  const v1::RegionSlice a_input = Slice(region->id, 0, a_bytes), a_result = Slice(region->id, 4096, a_bytes);
  const v1::RegionSlice b_result = Slice(region->id, 8192, b_bytes);
  auto rank1 = std::async(std::launch::async, [&] { return bytes_step(1, 2); });
  auto context = Context("secret-a");
  StreamOutcome out0 = GroupRank(*stub, context.get(), 0, 2, 0,
                                 {HalfOf(a, 0, a_input, a_result), HalfOf(b, 0, {}, b_result)}, {"", half(b_in, 0)});
  StreamOutcome out1 = rank1.get();
  ASSERT_TRUE(out0.status.ok()) << out0.status.error_message();
  ASSERT_TRUE(out1.status.ok()) << out1.status.error_message();
  EXPECT_EQ(out0.results[0].result_region().offset(), 4096);
  EXPECT_EQ(out0.results[1].result_region().offset(), 8192);
  EXPECT_EQ(out0.data.count(0) ? out0.data[0].size() : 0u, 0u);  // No chunks for a result in a region.
  EXPECT_EQ(std::string(region->data + 4096, a_half), ref0.data[0]);
  EXPECT_EQ(std::string(region->data + 8192, b_half), ref0.data[1]);
  EXPECT_EQ(out1.data[0], ref1_out.data[0]);
  EXPECT_EQ(out1.data[1], ref1_out.data[1]);

  // Rank 0 lost its answer and retries after reusing its result slices: into another slice for a,
  // into bytes for b.
  std::memset(region->data + 4096, 0x5a, a_half);
  std::memset(region->data + 8192, 0x5a, b_half);
  auto retry_context = Context("secret-a");
  StreamOutcome retry = GroupRank(*stub, retry_context.get(), 0, 2, 1,
                                  {HalfOf(a, 0, a_input, Slice(region->id, 12288, a_bytes)), HalfOf(b, 0)},
                                  {"", half(b_in, 0)});
  ASSERT_TRUE(retry.status.ok()) << retry.status.error_message();
  EXPECT_EQ(std::string(region->data + 12288, a_half), ref0.data[0]);
  EXPECT_EQ(retry.data[1], ref0.data[1]);
  EXPECT_EQ(std::string(region->data + 4096, a_half), std::string(a_half, '\x5a'));  // The first attempt's: untouched.
  EXPECT_EQ(std::string(region->data + 8192, b_half), std::string(b_half, '\x5a'));
}

// In a group step a bad slice fails the step with its code, as it fails a unary call: a slice out
// of its region is OUT_OF_RANGE, another tenant's region NOT_FOUND.
TEST_F(RegionDataTest, AGroupStepNamingABadSliceFailsWithItsCode) {
  StartServer(/*regions=*/true);
  std::unique_ptr<ClientRegion> region = NewRegion("secret-a", 1 << 16);
  const v1::MatrixSpec spec = Spec("g", {8, 8}, DType::kF32, NsOptions{});
  auto stub = StubFor(*server_);
  struct Bad {
    const char* token;
    v1::RegionSlice in, out;
    grpc::StatusCode code;
  };
  const Bad bad[] = {
      {"secret-a", Slice(region->id, (1 << 16) - 64, 128), {}, grpc::StatusCode::OUT_OF_RANGE},
      {"secret-a", {}, Slice(region->id, std::numeric_limits<int64_t>::max(), 128), grpc::StatusCode::OUT_OF_RANGE},
      {"secret-m", Slice(region->id, 0, 128), {}, grpc::StatusCode::NOT_FOUND},
      {"secret-m", {}, Slice(region->id, 0, 128), grpc::StatusCode::NOT_FOUND},
  };
  int64_t step = 10;
  for (const Bad& b : bad) {
    auto context = Context(b.token);
    StreamOutcome out = GroupRank(*stub, context.get(), 0, ++step, 0, {HalfOf(spec, 0, b.in, b.out)},
                                  {b.in.region_id().empty() ? std::string(128, '\0') : ""});
    EXPECT_EQ(out.status.error_code(), b.code) << out.status.error_message();
    EXPECT_THAT(out.status.error_message(), HasSubstr(b.in.region_id().empty() ? "result_region" : "input_region"));
  }
}

}  // namespace
}  // namespace orthoserve::testing
