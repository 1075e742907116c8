// Implementation of proto/convert/algorithm_proto.h.
#include "proto/convert/algorithm_proto.h"

#include "absl/strings/str_cat.h"

namespace orthoserve {

absl::StatusOr<Algorithm> AlgorithmFromProto(v1::Algorithm algorithm, const std::string& what) {
  switch (algorithm) {
    case v1::ALGORITHM_UNSPECIFIED:
    case v1::ALGORITHM_AUTO: return Algorithm::kAuto;
    case v1::ALGORITHM_ROW_SHARDED: return Algorithm::kRowSharded;
    case v1::ALGORITHM_GATHERED: return Algorithm::kGathered;
    case v1::ALGORITHM_TP_DUPLICATED: return Algorithm::kTpDuplicated;
    case v1::ALGORITHM_TP_DISTRIBUTED: return Algorithm::kTpDistributed;
    case v1::ALGORITHM_TP_BLOCKWISE: return Algorithm::kTpBlockwise;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": algorithm = ", static_cast<int>(algorithm), " is not a value this server knows"));
  }
}

v1::Algorithm AlgorithmToProto(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kAuto: return v1::ALGORITHM_AUTO;
    case Algorithm::kRowSharded: return v1::ALGORITHM_ROW_SHARDED;
    case Algorithm::kGathered: return v1::ALGORITHM_GATHERED;
    case Algorithm::kTpDuplicated: return v1::ALGORITHM_TP_DUPLICATED;
    case Algorithm::kTpDistributed: return v1::ALGORITHM_TP_DISTRIBUTED;
    case Algorithm::kTpBlockwise: return v1::ALGORITHM_TP_BLOCKWISE;
  }
  return v1::ALGORITHM_UNSPECIFIED;
}

}  // namespace orthoserve
