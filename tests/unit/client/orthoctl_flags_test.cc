// orthoctl's flag parser, its NS option flags into NsOptions, and the connection flags.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "client/cpp/orthoctl/commands.h"
#include "client/cpp/orthoctl/connection_flags.h"
#include "client/cpp/orthoctl/flags.h"
#include "client/cpp/orthoctl/ns_flags.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/status_matchers.h"

namespace orthoserve::orthoctl {
namespace {

using ::orthoserve::testing::StatusIs;
using ::testing::HasSubstr;

absl::StatusOr<NsOptions> ParseNs(const std::vector<std::string>& args) {
  FlagSet flags("t", "t");
  NsFlagValues values;
  AddNsFlags(&flags, &values);
  absl::Status parsed = flags.Parse(args);
  if (!parsed.ok()) return parsed;
  return NsOptionsFromFlags(values);
}

TEST(FlagSet, ValuesBothSpellingsAndBooleans) {
  FlagSet flags("cmd", "summary");
  std::string s;
  int i = 0;
  double d = 0;
  bool b = false, c = true;
  flags.AddString("name", "N", "a name", &s);
  flags.AddInt("count", "N", "a count", &i);
  flags.AddDouble("ratio", "X", "a ratio", &d);
  flags.AddBool("json", "as JSON", &b);
  flags.AddBool("color", "colors", &c);
  ASSERT_OK(flags.Parse({"--name", "w1", "--count=7", "--ratio", "0.25", "--json", "--color=false"}));
  EXPECT_EQ(s, "w1");
  EXPECT_EQ(i, 7);
  EXPECT_EQ(d, 0.25);
  EXPECT_TRUE(b);
  EXPECT_FALSE(c);
  EXPECT_TRUE(flags.seen("count"));
  EXPECT_FALSE(flags.help_requested());
}

TEST(FlagSet, Errors) {
  auto parse = [](const std::vector<std::string>& args) {
    FlagSet flags("cmd", "summary");
    int i = 0;
    std::string s;
    flags.AddInt("count", "N", "a count", &i);
    flags.AddString("name", "N", "a name", &s);
    return flags.Parse(args);
  };
  EXPECT_THAT(parse({"--nope"}), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown flag --nope")));
  EXPECT_THAT(parse({"--count"}), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--count needs a value")));
  EXPECT_THAT(parse({"--count", "x"}), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("expects an integer")));
  EXPECT_THAT(parse({"stray"}), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unexpected argument")));
  EXPECT_THAT(parse({"--name", "a", "--name=b"}), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("twice")));
}

TEST(FlagSet, HelpAndUsageListEveryFlag) {
  FlagSet flags("orthoctl orthogonalize [flags]", "Orthogonalizes.");
  NsFlagValues ns;
  ConnectionFlagValues conn;
  AddNsFlags(&flags, &ns);
  AddConnectionFlags(&flags, &conn);
  AddRetryFlags(&flags, &conn);
  ASSERT_OK(flags.Parse({"--steps", "3", "--help", "--bogus"}));  // Stops at --help.
  EXPECT_TRUE(flags.help_requested());
  const std::string usage = flags.Usage();
  for (const char* name :
       {"--coefficients NAME", "--custom-coefficients", "--steps N", "--precision", "--eps X", "--eps-mode",
        "--normalization", "--transpose", "--scale-mode", "--extra-scale", "--split-qkv", "--wire-dtype", "--algorithm",
        "--server HOST:PORT", "--timeout", "--token-file", "--tls-ca", "--tls-cert", "--tls-key", "--no-retry",
        "--retry-deadline SECONDS", "--help"}) {
    EXPECT_THAT(usage, HasSubstr(name));
  }
}

TEST(NsFlags, NoFlagsGiveTheDefaults) {
  auto o = ParseNs({});
  ASSERT_OK(o);
  EXPECT_EQ(*o, NsOptions());
}

TEST(NsFlags, EveryOption) {
  auto o = ParseNs({"--coefficients", "polar_express", "--steps", "8", "--precision", "highest", "--eps", "1e-15",
                    "--eps-mode", "add", "--transpose", "off", "--scale-mode", "unit_rms_norm", "--extra-scale", "0.2",
                    "--split-qkv", "4,2,2"});
  ASSERT_OK(o);
  EXPECT_EQ(o->coefficients, CoefficientType::kPolarExpress);
  EXPECT_EQ(o->steps, 8);
  EXPECT_EQ(o->precision, Precision::kHighest);
  EXPECT_EQ(o->eps, 1e-15);
  EXPECT_EQ(o->eps_mode, EpsMode::kAdd);
  EXPECT_EQ(o->transpose, TransposeMode::kOff);
  EXPECT_EQ(o->scale_mode, ScaleMode::kUnitRmsNorm);
  EXPECT_EQ(o->extra_scale, 0.2);
  EXPECT_EQ(o->split_qkv, (std::vector<int64_t>{4, 2, 2}));
}

TEST(NsFlags, Normalization) {
  auto torch_order = ParseNs({"--normalization", "bf16"});
  ASSERT_OK(torch_order);
  EXPECT_EQ(torch_order->normalization, Normalization::kBf16);
  EXPECT_THAT(ParseNs({"--normalization", "bf16", "--precision", "highest"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("normalization bf16")));
  EXPECT_THAT(ParseNs({"--normalization", "fp16"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--normalization")));
}

TEST(NsFlags, CustomCoefficients) {
  auto implied = ParseNs({"--custom-coefficients", "3,-4,2; 2,-1.5,0.5"});
  ASSERT_OK(implied);
  EXPECT_EQ(implied->coefficients, CoefficientType::kCustom);
  ASSERT_EQ(implied->custom_coefficients.size(), 2u);
  EXPECT_EQ(implied->custom_coefficients[1], (CoefficientTriple{2, -1.5, 0.5}));
  auto explicit_custom = ParseNs({"--coefficients=custom", "--custom-coefficients=1,0,0"});
  ASSERT_OK(explicit_custom);
  EXPECT_EQ(explicit_custom->custom_coefficients.size(), 1u);
  EXPECT_THAT(ParseNs({"--coefficients", "quintic", "--custom-coefficients", "1,0,0"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs --coefficients custom")));
  EXPECT_THAT(ParseNs({"--custom-coefficients", "1,0"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--custom-coefficients")));
  EXPECT_THAT(ParseNs({"--coefficients", "custom"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("non-empty custom_coefficients")));
}

TEST(NsFlags, BadValuesNameTheFlag) {
  EXPECT_THAT(ParseNs({"--coefficients", "septic"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--coefficients")));
  EXPECT_THAT(ParseNs({"--precision", "low"}), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--precision")));
  EXPECT_THAT(ParseNs({"--eps-mode", "mul"}), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--eps-mode")));
  EXPECT_THAT(ParseNs({"--transpose", "yes"}), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--transpose")));
  EXPECT_THAT(ParseNs({"--scale-mode", "rms"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--scale-mode")));
  EXPECT_THAT(ParseNs({"--steps", "five"}), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--steps")));
  EXPECT_THAT(ParseNs({"--steps", "101"}), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("steps = 101")));
  EXPECT_THAT(ParseNs({"--eps", "nan"}), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--eps")));
  EXPECT_THAT(ParseNs({"--eps", "-1"}), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("eps = -1")));
  EXPECT_THAT(ParseNs({"--extra-scale", "inf"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--extra-scale")));
  EXPECT_THAT(ParseNs({"--split-qkv", "4,2"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("exactly three")));
  EXPECT_THAT(ParseNs({"--split-qkv", "4,x,2"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--split-qkv")));
  EXPECT_THAT(ParseNs({"--coefficients", "cubic5", "--steps", "4"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cubic5")));
}

TEST(NsFlags, WireDtypeAndAlgorithm) {
  NsFlagValues v;
  auto none = WireDTypeFromFlags(v);
  ASSERT_OK(none);
  EXPECT_FALSE(none->has_value());
  v.wire_dtype = "bf16";
  auto bf16 = WireDTypeFromFlags(v);
  ASSERT_OK(bf16);
  EXPECT_EQ(bf16->value(), DType::kBF16);
  v.wire_dtype = "fp64";
  EXPECT_THAT(WireDTypeFromFlags(v), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--wire-dtype")));

  auto unspecified = AlgorithmFromFlags(v);
  ASSERT_OK(unspecified);
  EXPECT_EQ(*unspecified, v1::ALGORITHM_UNSPECIFIED);
  v.algorithm = "tp_blockwise";
  auto blockwise = AlgorithmFromFlags(v);
  ASSERT_OK(blockwise);
  EXPECT_EQ(*blockwise, v1::ALGORITHM_TP_BLOCKWISE);
  v.algorithm = "unspecified";
  EXPECT_THAT(AlgorithmFromFlags(v), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("row_sharded")));
  v.algorithm = "ring";
  EXPECT_THAT(AlgorithmFromFlags(v), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"ring\"")));
}

TEST(ConnectionFlags, TokenFileAndTimeout) {
  const std::string path = ::testing::TempDir() + "/orthoctl_token";
  {
    std::ofstream out(path);
    out << "  s3cret\n";
  }
  ConnectionFlagValues v;
  v.server = "host:1";
  v.timeout_seconds = 2.5;
  v.token_file = path;
  auto o = ClientOptionsFromFlags(v);
  ASSERT_OK(o);
  EXPECT_EQ(o->address, "host:1");
  EXPECT_EQ(o->bearer_token, "s3cret");
  EXPECT_EQ(o->timeout, absl::Milliseconds(2500));
  {
    std::ofstream out(path);
    out << " \n";
  }
  EXPECT_THAT(ClientOptionsFromFlags(v), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty")));
  std::remove(path.c_str());
  EXPECT_THAT(ClientOptionsFromFlags(v), StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
  v.token_file.clear();
  v.timeout_seconds = 0;
  EXPECT_THAT(ClientOptionsFromFlags(v), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--timeout")));
}

TEST(ConnectionFlags, RetryFlags) {
  auto parse = [](const std::vector<std::string>& args) -> absl::StatusOr<client::ClientOptions> {
    FlagSet flags("t", "t");
    ConnectionFlagValues v;
    AddConnectionFlags(&flags, &v);
    AddRetryFlags(&flags, &v);
    absl::Status parsed = flags.Parse(args);
    if (!parsed.ok()) return parsed;
    return ClientOptionsFromFlags(v);
  };
  auto defaults = parse({});
  ASSERT_OK(defaults);
  EXPECT_TRUE(defaults->retry.enabled);
  EXPECT_EQ(defaults->retry.deadline, absl::Seconds(120));
  EXPECT_EQ(defaults->retry.initial_backoff, client::RetryOptions().initial_backoff);
  auto off = parse({"--no-retry"});
  ASSERT_OK(off);
  EXPECT_FALSE(off->retry.enabled);
  auto shorter = parse({"--retry-deadline", "7.5"});
  ASSERT_OK(shorter);
  EXPECT_TRUE(shorter->retry.enabled);
  EXPECT_EQ(shorter->retry.deadline, absl::Milliseconds(7500));
  EXPECT_THAT(parse({"--retry-deadline", "0"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--retry-deadline must be a positive")));
  EXPECT_THAT(parse({"--retry-deadline", "inf"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--retry-deadline must be a positive")));
  EXPECT_THAT(parse({"--retry-deadline", "soon"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--retry-deadline expects a number")));
}

TEST(Commands, RetryFlagsBelongToTheCallsThatRetry) {
  std::ostringstream out, err;
  for (auto run : {RunInfo, RunOrthogonalize, RunBench}) {
    std::ostringstream help;
    EXPECT_EQ(run({"--help"}, help, err), kExitOk);
    EXPECT_THAT(help.str(), HasSubstr("--no-retry"));
    EXPECT_THAT(help.str(), HasSubstr("--retry-deadline SECONDS"));
  }
  EXPECT_EQ(RunHealth({"--no-retry"}, out, err), kExitUsage);  // Health never retries.
  EXPECT_EQ(RunInfo({"--retry-deadline", "-1"}, out, err), kExitUsage);
  EXPECT_THAT(err.str(), HasSubstr("--retry-deadline"));
  EXPECT_THAT(MainUsage(), HasSubstr("--no-retry"));
}

TEST(Commands, BenchShmFlags) {
  std::ostringstream help, err;
  EXPECT_EQ(RunBench({"--help"}, help, err), kExitOk);
  EXPECT_THAT(help.str(), HasSubstr("--shm "));
  EXPECT_THAT(help.str(), HasSubstr("--shm-socket PATH"));
  EXPECT_THAT(MainUsage(), HasSubstr("--shm"));
  std::ostringstream out;
  EXPECT_EQ(RunBench({"--shm-socket", "/tmp/x.sock"}, out, err), kExitUsage);  // Only with --shm.
  EXPECT_THAT(err.str(), HasSubstr("--shm-socket goes with --shm"));
  // A server that cannot be reached fails the region's GetServerInfo: an RPC failure, nothing sent.
  std::ostringstream down_out, down_err;
  EXPECT_EQ(RunBench({"--shm", "--server", "127.0.0.1:1", "--timeout", "5", "--no-retry"}, down_out, down_err),
            kExitRpc);
  EXPECT_THAT(down_err.str(), HasSubstr("UNAVAILABLE: --shm: asking 127.0.0.1:1 for its shared-memory socket"));
}

TEST(Commands, ExitCodesWithoutAServer) {
  std::ostringstream out, err;
  EXPECT_EQ(RunInfo({"--bogus"}, out, err), kExitUsage);
  EXPECT_EQ(RunHealth({"--help"}, out, err), kExitOk);
  EXPECT_THAT(out.str(), HasSubstr("usage: orthoctl health"));
  EXPECT_EQ(RunOrthogonalize({"--in", "x.npy"}, out, err), kExitUsage);
  EXPECT_EQ(RunOrthogonalize({"--in", "/nonexistent/x.npy", "--out", "y.npy"}, out, err), kExitIo);
  EXPECT_EQ(RunOrthogonalize({"--in", "x.npy", "--out", "y.npy", "--precision", "low"}, out, err), kExitUsage);
  EXPECT_EQ(RunBench({"--shape", "0,4"}, out, err), kExitUsage);
  EXPECT_EQ(RunInfo({"--tls-cert", "c.pem"}, out, err), kExitUsage);  // Cert without key.
  EXPECT_THAT(err.str(), HasSubstr("certificate and its key"));
  std::ostringstream down_out, down_err;
  EXPECT_EQ(RunHealth({"--server", "127.0.0.1:1", "--timeout", "5"}, down_out, down_err), kExitRpc);
  EXPECT_THAT(down_err.str(), HasSubstr("UNAVAILABLE"));
}

}  // namespace
}  // namespace orthoserve::orthoctl
