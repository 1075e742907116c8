// EngineFlops and EstimatedCost of server/plan/matrix_plan.h.
#include "server/plan/matrix_checks.h"
#include "server/plan/matrix_plan.h"

namespace orthoserve {

double EngineFlops(Matrix2d shape, const NsOptions& options, int64_t batch_rows) {
  if (batch_rows > 0) {
    return static_cast<double>(shape.rows / batch_rows) * NsFlops(batch_rows, shape.cols, options);
  }
  if (options.split_qkv.empty()) return NsFlops(shape.rows, shape.cols, options);
  const std::vector<int64_t>& split = options.split_qkv;
  const int64_t groups = shape.rows / (split[0] + split[1] + split[2]);
  double flops = 0;
  for (int64_t part : split) flops += NsFlops(groups * part, shape.cols, options);
  return flops;
}

double EstimatedCost(const MatrixPlan& m) {
  if (m.view.rows <= 0 || m.view.cols <= 0) return 0;
  if (!m.checked && !CheckMatrix(m, "").ok()) return 0;
  return 2.0 * static_cast<double>(m.view.numel()) + EngineFlops(m.view, m.options, BatchRowsOf(m));
}

}  // namespace orthoserve
