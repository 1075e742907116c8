// Client-supplied text in error messages and logs, bounded: a name, job, group or run id is
// echoed whole up to a few hundred bytes and shortened beyond, so that no message grows with
// what a client sent (a status message travels in gRPC's trailing metadata, whose size is
// limited; an over-long one turns the caller's INVALID_ARGUMENT into a transport error).
#pragma once

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace orthoserve {

// Longest client text a message repeats whole.
inline constexpr size_t kMessageTextBytes = 200;

// `text` when it has at most `max` bytes; otherwise its first bytes (cut at a UTF-8 character
// boundary) and "...(N bytes)", together at most max + 24 bytes.
std::string BoundedText(absl::string_view text, size_t max = kMessageTextBytes);

// "matrix INDEX (\"NAME\")" with NAME bounded: how every message names a matrix.
std::string MatrixLabel(int index, absl::string_view name);

}  // namespace orthoserve
