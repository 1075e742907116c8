#include "server/fleet/logic/ordered_log.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

namespace orthoserve {

int64_t OrderedLog::Append(LogEntry entry) {
  entry.index = end();
  entries_.push_back(std::make_shared<const LogEntry>(std::move(entry)));
  return entries_.back()->index;
}

std::vector<SharedLogEntry> OrderedLog::From(int64_t from) const {
  std::vector<SharedLogEntry> out;
  for (int64_t i = std::max(from, first_); i < end(); ++i) out.push_back(entries_[static_cast<size_t>(i - first_)]);
  return out;
}

void OrderedLog::DropBefore(int64_t index) {
  while (!entries_.empty() && first_ < index) {
    entries_.pop_front();
    ++first_;
  }
}

size_t LogEntryBytesBound(const LogEntry& entry) {
  constexpr size_t kVarint = 11;
  constexpr size_t kField = 6;
  constexpr size_t kBlock = kField + 4 * kVarint;
  size_t bytes = 16 * kVarint + 4 * kField + entry.key.tenant.size() + entry.key.job.size() + entry.key.group.size() +
                 entry.key.run.size() + std::string(entry.status.message()).size() + entry.failure.size() +
                 (entry.submissions.size() + entry.digests.size()) * kVarint + entry.cached.size() * 2;
  for (const MatrixPlan& m : entry.plan.matrices) {
    bytes += 2 * kField + 8 * kVarint + kField + m.name.size() + m.shape.size() * kVarint;
    // NsOptions: every field set, custom triples as 3 doubles each, split_qkv.
    bytes += kField + 12 * kVarint + m.options.custom_coefficients.size() * (kField + 3 * 9) +
             m.options.split_qkv.size() * kVarint;
    bytes += m.blocks.size() * (kField + 2 * kVarint + kBlock);
  }
  return bytes;
}

}  // namespace orthoserve
