// Implementation of server/fleet/wire/spec_list_cache.h.
#include "server/fleet/wire/spec_list_cache.h"

#include <algorithm>
#include <memory>
#include <utility>

#include <xxhash.h>

#include "common/status.h"
#include "orthoserve/fleet/v1/fleet.pb.h"
#include "server/fleet/wire/plan_codec.h"

namespace orthoserve {

absl::StatusOr<SpecList> DecodeSpecList(const std::string& bytes) {
  fleet::v1::SpecList proto;
  if (!proto.ParseFromString(bytes)) return absl::InvalidArgumentError("the report's spec list does not parse");
  SpecList specs;
  specs.reserve(proto.matrices_size());
  for (int i = 0; i < proto.matrices_size(); ++i) {
    ASSIGN_OR_RETURN(MatrixPlan plan, MatrixPlanFromProto(proto.matrices(i), i));
    specs.push_back(std::move(plan));
  }
  return specs;
}

SpecListCache::Entry* SpecListCache::FindLocked(uint64_t hash, const std::string& bytes) {
  for (Entry& e : entries_) {
    if (e.hash == hash && e.bytes == bytes) return &e;
  }
  return nullptr;
}

absl::StatusOr<SharedSpecs> SpecListCache::Decode(const std::string& bytes) {
  const uint64_t hash = XXH3_64bits(bytes.data(), bytes.size());
  {
    absl::MutexLock lock(&mu_);
    if (Entry* e = FindLocked(hash, bytes)) {
      e->used = ++use_clock_;
      return e->specs;
    }
  }
  // Decoded outside the lock: two reports of a new list at once may both decode it (the second
  // keeps the first's).
  ASSIGN_OR_RETURN(SpecList decoded, DecodeSpecList(bytes));
  auto specs = std::make_shared<const SpecList>(std::move(decoded));
  absl::MutexLock lock(&mu_);
  ++decoded_;
  if (Entry* e = FindLocked(hash, bytes)) {
    e->used = ++use_clock_;
    return e->specs;
  }
  if (entries_.size() >= capacity_) {
    auto oldest = std::min_element(entries_.begin(), entries_.end(),
                                   [](const Entry& a, const Entry& b) { return a.used < b.used; });
    entries_.erase(oldest);
  }
  entries_.push_back(Entry{hash, bytes, specs, ++use_clock_});
  return specs;
}

}  // namespace orthoserve
