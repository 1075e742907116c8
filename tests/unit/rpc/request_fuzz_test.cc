// Randomized robustness tests of request parsing and validation (docs/operations.md): thousands of
// mutated specs through ParseMatrixSpec, and hundreds of random message sequences through a live
// in-process server. Nothing may crash; every failure must carry one of the documented codes;
// every accepted spec must be self-consistent; the server must go on serving. Deterministic
// (fixed seeds) and bounded in count.
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/fleet/wire/plan_codec.h"
#include "server/rpc/spec_codec.h"
#include "tests/unit/rpc/rpc_test_util.h"

namespace orthoserve::testing {
namespace {

int64_t RandomDim(std::mt19937& rng) {
  switch (rng() % 6) {
    case 0: return -static_cast<int64_t>(rng() % 5);
    case 1: return 0;
    case 2: return int64_t{1} << (rng() % 63);
    case 3: return std::numeric_limits<int64_t>::max() - (rng() % 3);
    default: return 1 + rng() % 40;
  }
}

// A valid small spec with 0 to 3 random fields replaced by hostile values.
v1::MatrixSpec RandomSpec(std::mt19937& rng, bool utf8_names = true) {
  v1::MatrixSpec spec;
  spec.set_name("m" + std::to_string(rng() % 100));
  spec.add_shape(1 + rng() % 24);
  spec.add_shape(1 + rng() % 24);
  if (rng() % 4 == 0) spec.add_shape(1 + rng() % 3);
  spec.set_dtype(static_cast<v1::DType>(1 + rng() % 3));
  for (int mutation = 0, n = static_cast<int>(rng() % 4); mutation < n; ++mutation) {
    v1::NsOptions* o = spec.mutable_options();
    switch (rng() % 16) {
      case 0: spec.set_name(utf8_names ? "" : std::string("\xff\x00weird", 7)); break;
      case 1: {
        spec.clear_shape();
        for (int d = 0, dims = static_cast<int>(rng() % 5); d < dims; ++d) spec.add_shape(RandomDim(rng));
        break;
      }
      case 2: spec.set_dtype(static_cast<v1::DType>(static_cast<int>(rng() % 7) - 1)); break;
      case 3: spec.set_result_dtype(static_cast<v1::DType>(rng() % 6)); break;
      case 4: o->set_coefficients(static_cast<v1::Coefficients>(rng() % 11)); break;
      case 5: o->set_steps(static_cast<int32_t>(rng() % 220) - 10); break;
      case 6: o->set_precision(static_cast<v1::Precision>(rng() % 6)); break;
      case 7: o->set_eps(rng() % 2 ? -1.0 : std::numeric_limits<double>::quiet_NaN()); break;
      case 8: o->set_eps_mode(static_cast<v1::EpsMode>(rng() % 4)); break;
      case 9: o->set_transpose(static_cast<v1::Transpose>(rng() % 5)); break;
      case 10: o->set_scale_mode(static_cast<v1::ScaleMode>(rng() % 6)); break;
      case 11: o->set_extra_scale(rng() % 2 ? std::numeric_limits<double>::infinity() : 0.5); break;
      case 12:
        for (int i = 0, k = static_cast<int>(rng() % 4); i < k; ++i) o->add_split_qkv(RandomDim(rng) % 7);
        break;
      case 13: {
        v1::CoefficientTriple* t = o->add_custom_coefficients();
        t->set_a(1.5);
        t->set_b(rng() % 3 == 0 ? std::numeric_limits<double>::quiet_NaN() : -0.5);
        if (rng() % 2) o->set_coefficients(v1::COEFFICIENTS_CUSTOM);
        break;
      }
      case 14:
        spec.set_algorithm(static_cast<v1::Algorithm>(rng() % 9));
        spec.set_partition_dim(static_cast<int32_t>(rng() % 4) - 1);
        break;
      default: {
        v1::Block* b = spec.mutable_block();
        b->set_row_offset(RandomDim(rng) % 50);
        b->set_col_offset(RandomDim(rng) % 50);
        b->set_rows(RandomDim(rng) % 50);
        b->set_cols(RandomDim(rng) % 50);
        break;
      }
    }
  }
  return spec;
}

TEST(RequestFuzz, ParseMatrixSpecAcceptsOnlyConsistentSpecs) {
  std::mt19937 rng(20261129);
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    v1::MatrixSpec spec = RandomSpec(rng, /*utf8_names=*/false);
    absl::StatusOr<ParsedSpec> parsed = ParseMatrixSpec(spec, i, SpecLimits{}, /*whole_if_unset=*/rng() % 2);
    if (!parsed.ok()) {
      EXPECT_THAT(parsed.status().code(), ::testing::AnyOf(absl::StatusCode::kInvalidArgument,
                                                           absl::StatusCode::kResourceExhausted))
          << parsed.status();
      EXPECT_THAT(std::string(parsed.status().message()), ::testing::HasSubstr("matrix " + std::to_string(i)));
      continue;
    }
    ++accepted;
    const ParsedSpec& p = *parsed;
    EXPECT_GT(p.plan.view.rows, 0);
    EXPECT_GT(p.plan.view.cols, 0);
    EXPECT_LE(p.plan.view.numel(), int64_t{1} << 28);
    EXPECT_OK(CheckBlockInside(p.block, p.plan.view, "block"));
    EXPECT_EQ(p.block_bytes, p.block.numel() * static_cast<int64_t>(ElementSize(p.plan.dtype)));
    EXPECT_OK(ValidateNsOptions(p.plan.options, "options"));
    // A parsed spec survives the fleet's wire form (how ranks send it to each other) unchanged.
    absl::StatusOr<MatrixPlan> again = MatrixPlanFromProto(MatrixPlanToProto(p.plan), i);
    ASSERT_OK(again);
    EXPECT_EQ(FirstSpecDifference(p.plan, *again), "");
    EXPECT_TRUE(p.plan.view == again->view);
  }
  EXPECT_GT(accepted, 2000);  // The generator reaches the accepting paths too.
}

TEST(RequestFuzz, RandomStreamsNeverBreakTheServer) {
  ServerOptions options = TestServerOptions();
  options.service.chunk_bytes = 4096;
  auto server = Server::Create(options);
  ASSERT_OK(server);
  auto stub = StubFor(**server);
  std::mt19937 rng(7);
  for (int i = 0; i < 250; ++i) {
    std::vector<v1::StreamRequest> messages;
    const int n = static_cast<int>(rng() % 6);
    for (int m = 0; m < n; ++m) {
      v1::StreamRequest r;
      switch (rng() % 4) {
        case 0: *r.mutable_header() = HeaderMessage(static_cast<int>(rng() % 4), rng() % 3, rng() % 3).header(); break;
        case 1: {
          *r.mutable_spec() = RandomSpec(rng);
          break;
        }
        case 2:
          r.mutable_chunk()->set_index(static_cast<int>(rng() % 3) - 1);
          r.mutable_chunk()->set_data(std::string(rng() % 200, static_cast<char>(rng() % 4)));
          break;
        default: r.mutable_end(); break;
      }
      messages.push_back(r);
    }
    StreamOutcome out = RunStream(*stub, messages);
    EXPECT_THAT(out.status.error_code(),
                ::testing::AnyOf(grpc::StatusCode::OK, grpc::StatusCode::INVALID_ARGUMENT,
                                 grpc::StatusCode::RESOURCE_EXHAUSTED, grpc::StatusCode::ABORTED))
        << out.status.error_message();
  }
  // Still serving.
  std::vector<v1::StreamRequest> good = {HeaderMessage(1)};
  AppendMatrix(good, 0, Spec("w", {4, 4}, DType::kF32, NsOptions()), Bytes(RandomMatrix(4, 4, 1), DType::kF32));
  good.push_back(EndMessage());
  EXPECT_TRUE(RunStream(*stub, good).status.ok());
}

}  // namespace
}  // namespace orthoserve::testing
