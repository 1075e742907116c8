// Status helpers: the RETURN_IF_ERROR / ASSIGN_OR_RETURN macros our abseil (20220623) lacks,
// and small constructors for the messages every layer writes.
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                                  \
  do {                                                         \
    ::absl::Status orthoserve_status_ = (expr);                \
    if (!orthoserve_status_.ok()) return orthoserve_status_;   \
  } while (false)

#define ORTHOSERVE_STATUS_CONCAT_INNER(a, b) a##b
#define ORTHOSERVE_STATUS_CONCAT(a, b) ORTHOSERVE_STATUS_CONCAT_INNER(a, b)

// `ASSIGN_OR_RETURN(lhs, expr)`: evaluates `expr` (an absl::StatusOr<T>); on error returns its
// status, otherwise moves the value into `lhs` (which may be a declaration: `auto x`).
#define ASSIGN_OR_RETURN(lhs, expr) \
  ORTHOSERVE_ASSIGN_OR_RETURN_IMPL(ORTHOSERVE_STATUS_CONCAT(orthoserve_statusor_, __LINE__), lhs, expr)

#define ORTHOSERVE_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                     \
  if (!tmp.ok()) return std::move(tmp).status();         \
  lhs = std::move(tmp).value()

namespace orthoserve {

// Returns `status` with `context` and ": " put in front of its message; OK stays OK.
inline absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

}  // namespace orthoserve
