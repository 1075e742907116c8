// AssignOwners: largest first to the least-loaded fleet rank, deterministic, AUTO only.
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/unit/distributed/batch_harness.h"

namespace orthoserve::testing {
namespace {

MatrixSpec Auto(std::vector<int64_t> shape, Algorithm algorithm = Algorithm::kAuto) {
  MatrixSpec spec;
  spec.name = absl::StrCat("m", shape[0], "x", shape[1]);
  spec.shape = std::move(shape);
  spec.algorithm = algorithm;
  return spec;
}

std::vector<int> Owners(const BatchPlan& plan) {
  std::vector<int> owners;
  for (const MatrixPlan& m : plan.matrices) owners.push_back(m.owner);
  return owners;
}

TEST(AssignOwnersTest, EqualMatricesSplitEvenly) {
  std::vector<MatrixSpec> specs(16, Auto({64, 64}));
  const BatchPlan plan = MakePlan(1, 2, specs);
  std::vector<int> count(2, 0);
  for (int owner : Owners(plan)) {
    ASSERT_GE(owner, 0);
    ASSERT_LT(owner, 2);
    ++count[owner];
  }
  EXPECT_EQ(count[0], 8);
  EXPECT_EQ(count[1], 8);
  // Ties go to the lowest rank, in plan order: alternating.
  EXPECT_EQ(Owners(plan), (std::vector<int>{0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1}));
}

TEST(AssignOwnersTest, OneHugeMatrixGetsARankOfItsOwn) {
  // The 256x256 matrix costs more than all the small ones together.
  std::vector<MatrixSpec> specs = {Auto({16, 16}), Auto({256, 256}), Auto({16, 16}), Auto({32, 16}), Auto({16, 32})};
  const BatchPlan plan = MakePlan(1, 2, specs);
  EXPECT_EQ(Owners(plan), (std::vector<int>{1, 0, 1, 1, 1}));
  // Three ranks: the huge one alone, the small ones balanced over the other two, largest first.
  const BatchPlan three = MakePlan(1, 3, specs);
  const std::vector<int> owners = Owners(three);
  EXPECT_EQ(owners[1], 0);
  for (size_t i : {0, 2, 3, 4}) EXPECT_NE(owners[i], 0) << i;
  EXPECT_NE(owners[3], owners[4]);  // The two 32x16 matrices (equal cost) go to different ranks.
}

TEST(AssignOwnersTest, LeavesOtherAlgorithmsUnownedAndIsDeterministic) {
  std::vector<MatrixSpec> specs = {Auto({8, 8}), Auto({8, 8}, Algorithm::kRowSharded),
                                   Auto({8, 8}, Algorithm::kGathered), Auto({24, 8})};
  BatchPlan plan = MakePlan(1, 4, specs);
  EXPECT_EQ(plan.matrices[1].owner, -1);
  EXPECT_EQ(plan.matrices[2].owner, -1);
  EXPECT_EQ(plan.matrices[3].owner, 0);  // Largest first.
  EXPECT_EQ(plan.matrices[0].owner, 1);
  const std::vector<int> before = Owners(plan);
  plan.matrices[0].owner = 3;
  AssignOwners(plan);
  EXPECT_EQ(Owners(plan), before);
}

TEST(AssignOwnersTest, StepsZeroStillSpreads) {
  // With steps = 0 NS costs no products; matrices still spread over the ranks.
  std::vector<MatrixSpec> specs(4, Auto({8, 8}));
  for (MatrixSpec& s : specs) s.options.steps = 0;
  const BatchPlan plan = MakePlan(1, 4, specs);
  EXPECT_EQ(Owners(plan), (std::vector<int>{0, 1, 2, 3}));
}

}  // namespace
}  // namespace orthoserve::testing
