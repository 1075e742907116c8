// Unguessable identifiers for shared-memory regions and registration tickets: 128 bits from the
// kernel's random source, written as 32 lowercase hex digits.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace orthoserve {

// Characters of an id made by RandomId128.
inline constexpr size_t kRandomIdChars = 32;

// 128 random bits from getrandom(2), as 32 hex digits. INTERNAL if the kernel gives none
// (never silently weaker randomness). Thread-safe.
absl::StatusOr<std::string> RandomId128();

}  // namespace orthoserve
