// Implementation of common/shared_span.h.
#include "common/shared_span.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace orthoserve {

std::optional<std::pair<size_t, size_t>> FirstWriteOverlap(const std::vector<SpanUse>& uses) {
  // Sweep each memory's spans in the order they start, keeping the span that reaches furthest
  // among all those seen and among the written ones: a span overlaps an earlier one iff it starts
  // before that one's end, so the furthest of each kind is the only one to compare with. A pair
  // found this way is the overlap whose later span starts first; when several pairs overlap,
  // the one reported is the first by the uses' order among those the sweep meets first.
  std::vector<size_t> order;
  order.reserve(uses.size());
  for (size_t i = 0; i < uses.size(); ++i) {
    if (uses[i].span.memory.known() && uses[i].span.bytes > 0) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const SharedSpan& x = uses[a].span;
    const SharedSpan& y = uses[b].span;
    if (x.memory != y.memory) return x.memory < y.memory;
    if (x.offset != y.offset) return x.offset < y.offset;
    return a < b;
  });
  std::optional<size_t> furthest;          // Of the current memory's spans so far.
  std::optional<size_t> furthest_written;  // Of its written spans so far.
  auto end = [&](size_t i) { return uses[i].span.offset + uses[i].span.bytes; };
  for (size_t k = 0; k < order.size(); ++k) {
    const size_t i = order[k];
    if (k > 0 && uses[order[k - 1]].span.memory != uses[i].span.memory) {
      furthest.reset();
      furthest_written.reset();
    }
    const int64_t start = uses[i].span.offset;
    // A written span may overlap nothing; a read one no written span.
    const std::optional<size_t>& other = uses[i].writes ? furthest : furthest_written;
    if (other.has_value() && start < end(*other)) return std::make_pair(std::min(*other, i), std::max(*other, i));
    if (!furthest.has_value() || end(i) > end(*furthest)) furthest = i;
    if (uses[i].writes && (!furthest_written.has_value() || end(i) > end(*furthest_written))) furthest_written = i;
  }
  return std::nullopt;
}

std::string SpanUseText(const SpanUse& use) {
  return absl::StrCat("trainer rank ", use.who, "'s ", use.writes ? "result" : "input", " slice of matrix ",
                      use.matrix, " (bytes ", use.span.offset, "..", use.span.offset + use.span.bytes, " of its memory)");
}

}  // namespace orthoserve
