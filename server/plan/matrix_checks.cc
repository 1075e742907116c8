// Implementation of server/plan/matrix_checks.h.
#include "server/plan/matrix_checks.h"

#include "absl/strings/str_cat.h"
#include "common/message_text.h"
#include "common/status.h"

namespace orthoserve {
namespace {

bool ValidDType(DType dtype) { return static_cast<int>(dtype) >= 0 && static_cast<int>(dtype) <= 2; }

bool ValidAlgorithm(Algorithm algorithm) {
  return static_cast<int>(algorithm) >= static_cast<int>(Algorithm::kAuto) &&
         static_cast<int>(algorithm) <= static_cast<int>(Algorithm::kTpBlockwise);
}

}  // namespace

absl::Status ValidateNdLayout(const MatrixPlan& m, const std::string& what) {
  if (m.layout != NdLayout::kFlatten && m.layout != NdLayout::kBatch) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " nd_layout: ", static_cast<int>(m.layout), " is not a known layout"));
  }
  const int64_t batch_rows = BatchRows(m.shape, m.layout);
  if (batch_rows == 0) return absl::OkStatus();
  const std::string matrices = absl::StrCat(m.view.rows / batch_rows, " matrices of ", batch_rows, "x", m.view.cols,
                                            " (nd_layout batch of (", ListText(m.shape), "))");
  if (!m.options.split_qkv.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " nd_layout: split_qkv applies to one matrix, not to ", matrices));
  }
  if (m.algorithm == Algorithm::kTpDistributed || m.algorithm == Algorithm::kTpBlockwise) {
    return absl::InvalidArgumentError(absl::StrCat(what, " nd_layout: ", AlgorithmName(m.algorithm),
                                                   " orthogonalizes one matrix from its blocks, not ", matrices,
                                                   "; use auto, row_sharded, gathered or tp_duplicated"));
  }
  return absl::OkStatus();
}

absl::Status CheckMatrix(const MatrixPlan& m, const std::string& what) {
  if (!ValidAlgorithm(m.algorithm)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " algorithm: ", static_cast<int>(m.algorithm), " is not a known algorithm"));
  }
  if (!ValidDType(m.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " dtype: ", static_cast<int>(m.dtype), " is not a dtype"));
  }
  if (!ValidDType(m.result_dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " result_dtype: ", static_cast<int>(m.result_dtype), " is not a dtype"));
  }
  ASSIGN_OR_RETURN(Matrix2d view, ViewAs2d(m.shape, absl::StrCat(what, " shape"), m.layout));
  if (!(view == m.view)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " view: ", m.view.rows, "x", m.view.cols,
                                                   " is not the 2-D view ", view.rows, "x", view.cols, " of shape (",
                                                   ListText(m.shape), ")"));
  }
  RETURN_IF_ERROR(ValidateNsOptions(m.options, absl::StrCat(what, " options")));
  RETURN_IF_ERROR(ValidateNsOptionsForShape(m.options, view, absl::StrCat(what, " options")));
  RETURN_IF_ERROR(ValidateNdLayout(m, what));
  if (IsTpSharded(m.algorithm) && m.partition_dim != 0 && m.partition_dim != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " partition_dim: ", m.partition_dim, " must be 0 or 1 for ", AlgorithmName(m.algorithm)));
  }
  return absl::OkStatus();
}

}  // namespace orthoserve
