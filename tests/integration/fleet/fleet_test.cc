// A real 3-rank CPU fleet on loopback (deploy/local/fleet.sh) serving a W = 4 trainer group
// (four client streams) and a lone W = 1 client at the same time for 20 steps of a mixed
// batch, every result checked against the engine's answer computed here; then a trainer
// process killed mid-step: the other three get ABORTED within the rendezvous timeout and the
// next step succeeds.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "client/cpp/group_client.h"
#include "common/shape.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/cpu/cpu_backend.h"
#include "server/engine/newton_schulz.h"
#include "tests/integration/fleet/fleet_test_util.h"
#include "tests/util/status_matchers.h"

extern char** environ;

namespace orthoserve {
namespace {

using client::GroupClient;
using client::MatrixInput;
using client::MatrixOutput;
using ::testing::HasSubstr;

constexpr int kFleet = 3;
constexpr int kWorld = 4;
constexpr int kSteps = 20;
constexpr absl::Duration kRendezvous = absl::Seconds(6);

std::string BuildDir() {
  const char* dir = std::getenv("ORTHOSERVE_BUILD_DIR");
  return dir != nullptr ? dir : "build";
}

int Shell(const std::string& command) { return std::system(command.c_str()); }

// One matrix of the mixed batch, with how its blocks are laid out over the W trainer ranks.
struct Case {
  std::string name;
  Matrix2d shape;
  v1::Algorithm algorithm;
  int partition_dim;  // Row chunks (0) or column chunks (1) over the trainers.
};

const std::vector<Case>& MixedBatch() {
  static const std::vector<Case> cases = {
      {"auto_rows", {24, 16}, v1::ALGORITHM_AUTO, 0},
      {"auto_cols", {12, 40}, v1::ALGORITHM_AUTO, 1},
      {"row_sharded", {30, 20}, v1::ALGORITHM_ROW_SHARDED, 0},
      {"gathered", {18, 18}, v1::ALGORITHM_GATHERED, 1},
      {"tp_duplicated", {16, 36}, v1::ALGORITHM_TP_DUPLICATED, 1},
      {"tp_distributed", {48, 12}, v1::ALGORITHM_TP_DISTRIBUTED, 0},
      {"tp_blockwise", {32, 24}, v1::ALGORITHM_TP_BLOCKWISE, 0},
      {"small", {3, 5}, v1::ALGORITHM_AUTO, 0},  // Fewer rows than trainers: empty blocks.
  };
  return cases;
}

Block BlockOf(const Case& c, int rank, int world) { return testing::ChunkBlock(c.shape, c.partition_dim, rank, world); }

std::vector<float> Random(Matrix2d m, uint32_t seed) { return testing::RandomMatrix(m, seed); }

NsOptions Highest() {
  NsOptions o;
  o.precision = Precision::kHighest;
  return o;
}

double RelativeError(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

class FleetTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    base_port_ = testing::FreeBasePort(kFleet, 20000);
    dir_ = ::testing::TempDir() + "/fleet-" + std::to_string(getpid());
    std::string cmd = absl::StrCat(ORTHOSERVE_FLEET_SCRIPT, " start --world ", kFleet, " --base-port ", base_port_,
                                   " --dir ", dir_, " --bin ", BuildDir(), "/bin -- --rendezvous-timeout ",
                                   absl::ToInt64Seconds(kRendezvous), "s --metrics-address ''");
    started_ = Shell(cmd) == 0;
  }
  static void TearDownTestSuite() {
    Shell(absl::StrCat(ORTHOSERVE_FLEET_SCRIPT, " stop --dir ", dir_));
  }

  void SetUp() override {
    ASSERT_TRUE(started_) << "the fleet did not start; see " << dir_;
    backend_ = *CpuBackend::Create(CpuBackend::Options{});
  }

  std::string Address(int rank) const { return absl::StrCat("127.0.0.1:", base_port_ + rank); }

  std::unique_ptr<GroupClient> Group() {
    GroupClient::Options options;
    options.client.address = Address(0);
    options.client.timeout = absl::Seconds(60);
    auto group = GroupClient::Create(options);
    EXPECT_OK(group);
    return group.ok() ? std::move(*group) : nullptr;
  }

  // The engine's whole-matrix answer for `full`.
  std::vector<float> Whole(const std::vector<float>& full, Matrix2d shape, const NsOptions& options,
                           int transpose_forced = -1) {
    NsOptions o = options;
    if (transpose_forced >= 0) o.transpose = transpose_forced ? TransposeMode::kOn : TransposeMode::kOff;
    std::vector<float> out(full.size());
    MatrixJob job{"ref", shape, shape, DType::kF32, full.data(), DType::kF32, out.data(), &o};
    EXPECT_OK(OrthogonalizeOne(*backend_, job));
    return out;
  }

  static int base_port_;
  static std::string dir_;
  static bool started_;
  std::unique_ptr<CpuBackend> backend_;
};

int FleetTest::base_port_ = 0;
std::string FleetTest::dir_;
bool FleetTest::started_ = false;

TEST_F(FleetTest, GroupOfFourAndLoneClientTogetherForTwentySteps) {
  auto group = Group();
  ASSERT_NE(group, nullptr);
  ASSERT_EQ(group->fleet_world(), kFleet);
  const NsOptions options = Highest();
  const std::vector<Case>& batch = MixedBatch();

  for (int step = 0; step < kSteps; ++step) {
    // Full matrices of this step, known to the test; each trainer sends its blocks.
    std::vector<std::vector<float>> full;
    for (size_t i = 0; i < batch.size(); ++i) full.push_back(Random(batch[i].shape, 1000 * step + i));
    std::vector<std::future<absl::StatusOr<std::vector<MatrixOutput>>>> ranks;
    std::vector<std::vector<std::vector<float>>> sent(kWorld);
    for (int r = 0; r < kWorld; ++r) {
      for (size_t i = 0; i < batch.size(); ++i) {
        Block b = BlockOf(batch[i], r, kWorld);
        std::vector<float> part(static_cast<size_t>(b.numel()));
        CopyBlockOut(full[i].data(), batch[i].shape.cols, b, sizeof(float), part.data());
        sent[r].push_back(std::move(part));
      }
    }
    for (int r = 0; r < kWorld; ++r) {
      ranks.push_back(std::async(std::launch::async, [&, r] {
        std::vector<MatrixInput> inputs;
        for (size_t i = 0; i < batch.size(); ++i) {
          MatrixInput in;
          in.name = batch[i].name;
          in.shape = {batch[i].shape.rows, batch[i].shape.cols};
          in.options = options;
          in.algorithm = batch[i].algorithm;
          in.partition_dim = batch[i].partition_dim;
          in.block = BlockOf(batch[i], r, kWorld);
          in.data = sent[r][i].data();
          in.bytes = sent[r][i].size() * sizeof(float);
          inputs.push_back(in);
        }
        return group->Step("integration", "tp", step, r, kWorld, inputs);
      }));
    }
    // The lone client talks to rank 1 at the same time.
    auto lone = std::async(std::launch::async, [&] {
      client::ClientOptions o;
      o.address = Address(1);
      auto c = client::Client::Create(o);
      std::vector<float> m = Random({40, 28}, 77 + step);
      MatrixInput in;
      in.name = "lone";
      in.shape = {40, 28};
      in.options = options;
      in.data = m.data();
      in.bytes = m.size() * sizeof(float);
      auto out = (*c)->Step(client::StepOptions{}, {in});
      EXPECT_TRUE(out.ok()) << out.status();
      if (out.ok()) {
        EXPECT_OK((*out)[0].status);
        std::vector<float> expected = Whole(m, {40, 28}, options);
        EXPECT_EQ(0, std::memcmp((*out)[0].data.data(), expected.data(), expected.size() * sizeof(float)))
            << "lone client, step " << step;
      }
    });

    std::vector<std::vector<float>> expected_whole;
    for (size_t i = 0; i < batch.size(); ++i) {
      const Case& c = batch[i];
      if (c.algorithm == v1::ALGORITHM_TP_DISTRIBUTED) {
        expected_whole.push_back(Whole(full[i], c.shape, options, /*transpose_forced=*/c.partition_dim == 0));
      } else {
        expected_whole.push_back(Whole(full[i], c.shape, options));
      }
    }
    for (int r = 0; r < kWorld; ++r) {
      absl::StatusOr<std::vector<MatrixOutput>> out = ranks[r].get();
      ASSERT_OK(out);
      ASSERT_EQ(out->size(), batch.size());
      for (size_t i = 0; i < batch.size(); ++i) {
        const Case& c = batch[i];
        const MatrixOutput& o = (*out)[i];
        ASSERT_OK(o.status);
        Block b = BlockOf(c, r, kWorld);
        ASSERT_EQ(o.data.size(), static_cast<size_t>(b.numel()) * sizeof(float)) << c.name;
        const float* got = reinterpret_cast<const float*>(o.data.data());
        std::vector<float> expected(static_cast<size_t>(b.numel()));
        if (c.algorithm == v1::ALGORITHM_TP_BLOCKWISE) {
          // Each block alone, scaled by its own shape.
          MatrixJob job{"blk", {b.rows, b.cols}, {b.rows, b.cols}, DType::kF32, sent[r][i].data(),
                        DType::kF32, expected.data(), &options};
          if (b.numel() > 0) ASSERT_OK(OrthogonalizeOne(*backend_, job));
        } else {
          CopyBlockOut(expected_whole[i].data(), c.shape.cols, b, sizeof(float), expected.data());
        }
        if (c.algorithm == v1::ALGORITHM_TP_DISTRIBUTED) {
          // Sharded Grams are summed in another order: equal within HIGHEST's tolerance.
          if (b.numel() > 0) {
            EXPECT_LT(RelativeError(got, expected.data(), expected.size()), 1e-5) << c.name;
          }
        } else {
          EXPECT_EQ(0, std::memcmp(got, expected.data(), o.data.size()))
              << c.name << " step " << step << " rank " << r;
        }
      }
    }
    lone.get();
  }
}

TEST_F(FleetTest, KilledTrainerAbortsTheOthersAndTheNextStepSucceeds) {
  auto group = Group();
  ASSERT_NE(group, nullptr);
  const Case c{"w", {16, 12}, v1::ALGORITHM_AUTO, 0};
  const NsOptions options = Highest();
  const int64_t step = 1000;
  std::vector<float> full = Random(c.shape, 5);

  auto send = [&](int r, int64_t s) {
    Block b = BlockOf(c, r, kWorld);
    std::vector<float> part(static_cast<size_t>(b.numel()));
    CopyBlockOut(full.data(), c.shape.cols, b, sizeof(float), part.data());
    MatrixInput in;
    in.name = c.name;
    in.shape = {c.shape.rows, c.shape.cols};
    in.options = options;
    in.block = b;
    in.data = part.data();
    in.bytes = part.size() * sizeof(float);
    return group->Step("killjob", "g", s, r, kWorld, {in});
  };

  // Trainer rank 3 is a real process that sends half its step and is then killed.
  const int killed_rank = 3;
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
  const std::string server = Address(group->FleetRankFor(killed_rank, kWorld));
  const std::string step_text = std::to_string(step);
  const std::string rank_text = std::to_string(killed_rank);
  const std::string world_text = std::to_string(kWorld);
  std::vector<std::string> args = {ORTHOSERVE_TRAINER_BIN, server, "killjob", step_text, rank_text, world_text, "4", "12"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t trainer = 0;
  ASSERT_EQ(posix_spawn(&trainer, argv[0], &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  close(pipe_fds[1]);
  char buffer[16] = {};
  ASSERT_GT(read(pipe_fds[0], buffer, sizeof(buffer)), 0);  // "sent": it is mid-step.
  close(pipe_fds[0]);

  std::vector<std::future<absl::StatusOr<std::vector<MatrixOutput>>>> others;
  for (int r = 0; r < kWorld; ++r) {
    if (r != killed_rank) others.push_back(std::async(std::launch::async, [&, r] { return send(r, step); }));
  }
  absl::SleepFor(absl::Milliseconds(500));  // The others have arrived and wait for rank 3.
  const absl::Time killed = absl::Now();
  ASSERT_EQ(kill(trainer, SIGKILL), 0);
  waitpid(trainer, nullptr, 0);
  for (auto& f : others) {
    absl::StatusOr<std::vector<MatrixOutput>> out = f.get();
    EXPECT_THAT(out, testing::StatusIs(absl::StatusCode::kAborted, HasSubstr("trainer rank")));
  }
  EXPECT_LE(absl::Now() - killed, kRendezvous + absl::Seconds(2));

  // The next step with all four ranks succeeds.
  std::vector<std::future<absl::StatusOr<std::vector<MatrixOutput>>>> next;
  for (int r = 0; r < kWorld; ++r) next.push_back(std::async(std::launch::async, [&, r] { return send(r, step + 1); }));
  std::vector<float> expected = Whole(full, c.shape, options);
  for (int r = 0; r < kWorld; ++r) {
    absl::StatusOr<std::vector<MatrixOutput>> out = next[r].get();
    ASSERT_OK(out);
    ASSERT_OK((*out)[0].status);
    Block b = BlockOf(c, r, kWorld);
    std::vector<float> part(static_cast<size_t>(b.numel()));
    CopyBlockOut(expected.data(), c.shape.cols, b, sizeof(float), part.data());
    EXPECT_EQ(0, std::memcmp((*out)[0].data.data(), part.data(), part.size() * sizeof(float))) << "rank " << r;
  }
}

}  // namespace
}  // namespace orthoserve
