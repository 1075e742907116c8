// Implementation of server/rpc/region_slices.h.
#include "server/rpc/region_slices.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/message_text.h"
#include "common/status.h"

namespace orthoserve {
namespace {

// The leases a matrix's MatrixMemory holds.
struct Leases {
  RegionLease input;
  RegionLease result;
};

absl::StatusOr<RegionLease> Lease(const RegionRegistry& registry, absl::string_view tenant, absl::string_view call_id,
                                  const std::string& what, const char* field, const v1::RegionSlice& slice,
                                  int64_t expected, DType dtype) {
  if (slice.size() != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", field, ".size = ", slice.size(), "; it must be ", expected, " bytes"));
  }
  absl::StatusOr<RegionLease> lease = registry.Use(tenant, slice.region_id(), slice.offset(), slice.size(), call_id);
  if (!lease.ok()) return Annotate(lease.status(), absl::StrCat(what, " ", field));
  // The engine reads and writes elements through typed pointers: a misaligned element is undefined
  // behaviour (vectorized code may assume the alignment; on a GPU a misaligned load is a sticky
  // error of the whole context), so it is refused (a memfd's mapping starts on a page, a CUDA IPC
  // region on a multiple of 256 bytes).
  const int64_t element = static_cast<int64_t>(ElementSize(dtype));
  if (slice.offset() % element != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", field, ".offset = ", slice.offset(),
                                                   "; it must be a multiple of the element size (", element,
                                                   " bytes for ", DTypeName(dtype), ")"));
  }
  return lease;
}

}  // namespace

int64_t ResultBytes(const ParsedSpec& parsed) {
  return parsed.block.numel() * static_cast<int64_t>(ElementSize(parsed.plan.result_dtype));
}

absl::StatusOr<MatrixMemory> LeaseRegions(const RegionRegistry* registry, absl::string_view tenant,
                                          absl::string_view call_id, int index, const v1::MatrixSpec& spec,
                                          const ParsedSpec& parsed, Metrics* metrics) {
  const std::string what = MatrixLabel(index, spec.name());
  if (registry == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " names a shared-memory region, but regions are off on this server (start it with --shm-socket)"));
  }
  if (spec.has_input_region() && spec.has_result_region() &&
      spec.input_region().region_id() == spec.result_region().region_id()) {
    // Both are checked against the region below; here only whether they overlap, without
    // forming a sum that could overflow: [a, a + n) and [b, b + m) overlap iff a < b + m and b < a + n,
    // i.e. a - b < m and b - a < n, where a - b cannot overflow for a, b >= 0.
    const int64_t a = spec.input_region().offset(), n = spec.input_region().size();
    const int64_t b = spec.result_region().offset(), m = spec.result_region().size();
    if (a >= 0 && b >= 0 && n > 0 && m > 0 && a - b < m && b - a < n) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " result_region overlaps its input_region (results are not computed in place)"));
    }
  }
  auto leases = std::make_shared<Leases>();
  MatrixMemory memory;
  if (spec.has_input_region()) {
    ASSIGN_OR_RETURN(leases->input, Lease(*registry, tenant, call_id, what, "input_region", spec.input_region(),
                                          parsed.block_bytes, parsed.plan.dtype));
    memory.input = leases->input.data();
    memory.input_span = leases->input.span();
    memory.input_space = leases->input.on_device() ? MemorySpace::kDevice : MemorySpace::kHost;
  }
  if (spec.has_result_region()) {
    ASSIGN_OR_RETURN(leases->result, Lease(*registry, tenant, call_id, what, "result_region", spec.result_region(),
                                           ResultBytes(parsed), parsed.plan.result_dtype));
    memory.result = leases->result.data();
    memory.result_span = leases->result.span();
    memory.result_space = leases->result.on_device() ? MemorySpace::kDevice : MemorySpace::kHost;
  }
  memory.owner = std::move(leases);
  if (metrics != nullptr) {
    if (memory.input != nullptr) metrics->ShmMatrix("input");
    if (memory.result != nullptr) metrics->ShmMatrix("result");
  }
  return memory;
}

}  // namespace orthoserve
