// Names of the distributed algorithms (server/plan/matrix_plan.h): as used in requests, flags and messages.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/plan/matrix_plan.h"

namespace orthoserve {
namespace {

struct AlgorithmEntry {
  Algorithm value;
  absl::string_view name;
};

constexpr AlgorithmEntry kAlgorithms[] = {
    {Algorithm::kAuto, "auto"},
    {Algorithm::kRowSharded, "row_sharded"},
    {Algorithm::kGathered, "gathered"},
    {Algorithm::kTpDuplicated, "tp_duplicated"},
    {Algorithm::kTpDistributed, "tp_distributed"},
    {Algorithm::kTpBlockwise, "tp_blockwise"},
};

}  // namespace

absl::string_view AlgorithmName(Algorithm algorithm) {
  for (const AlgorithmEntry& e : kAlgorithms) {
    if (e.value == algorithm) return e.name;
  }
  return "unknown";
}

absl::Status ParseAlgorithm(absl::string_view text, Algorithm* algorithm) {
  std::vector<absl::string_view> names;
  for (const AlgorithmEntry& e : kAlgorithms) {
    if (e.name == text) {
      *algorithm = e.value;
      return absl::OkStatus();
    }
    names.push_back(e.name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("algorithm \"", text, "\" is not one of ", absl::StrJoin(names, ", ")));
}

}  // namespace orthoserve
