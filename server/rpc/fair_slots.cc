// Implementation of server/rpc/fair_slots.h.
#include "server/rpc/fair_slots.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/message_text.h"
#include "common/retry_after.h"

namespace orthoserve {
namespace {

std::vector<std::string> SortedUnique(std::vector<std::string> names) {
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

// floor(x), forgiving the rounding of a quotient that is a whole number (8 * 1/3 * 3).
int FloorSlots(double x) { return static_cast<int>(std::floor(x + 1e-9)); }

}  // namespace

FairSlots::FairSlots(int limit, int cap, FairShares shares, std::vector<std::string> known, Names names)
    : limit_(limit),
      cap_(cap),
      shares_(std::move(shares)),
      known_(SortedUnique(std::move(known))),
      names_(std::move(names)) {}

absl::Status FairSlots::Acquire(const std::string& tenant, absl::Time now, Refusal* refused_by) {
  *refused_by = Refusal::kNone;
  if (held_ >= limit_) {
    refused_[tenant] = now;
    *refused_by = Refusal::kLimit;
    return MarkRetryAfter(absl::ResourceExhaustedError(absl::StrCat("the server is serving ", held_, " ",
                                                                    names_.what, ", its limit of ", limit_,
                                                                    " concurrent ", names_.what, " (",
                                                                    names_.limit_flag, "); retry later")),
                          kBusyRetryAfter);
  }
  const int mine = held(tenant);
  if (cap_ > 0 && mine >= cap_) {
    *refused_by = Refusal::kCap;
    return MarkRetryAfter(absl::ResourceExhaustedError(absl::StrCat(
                              "tenant \"", BoundedText(tenant), "\" has ", mine, " ", names_.what,
                              " open, its limit of ", cap_, " (", names_.cap_flag, "); close one or retry later")),
                          kBusyRetryAfter);
  }
  // Under its share a tenant leaves only the kept slots free; at or over it, every other reserve.
  const Reserve reserve = ReserveOf(tenant, now);
  const bool under_share = mine < reserve.share;
  if (held_ + 1 + (under_share ? reserve.idle_tenants : reserve.for_others) > limit_) {
    refused_[tenant] = now;
    *refused_by = Refusal::kFairShare;
    return MarkRetryAfter(
        absl::ResourceExhaustedError(absl::StrCat(
            "tenant \"", BoundedText(tenant), "\" has ", mine, " ", names_.what, " open and its fair share is ",
            reserve.share, " of the server's ", limit_, " (", names_.limit_flag,
            ", weighted by --tenant-shares); the ", limit_ - held_, " free are kept for ",
            under_share ? 0 : reserve.waiting_tenants, " other tenants waiting for their share and ",
            reserve.idle_tenants, " tenants of the token file with no ", names_.what, "; retry later")),
        kBusyRetryAfter);
  }
  ++held_;
  ++tenant_held_[tenant];
  return absl::OkStatus();
}

void FairSlots::Release(const std::string& tenant) {
  --held_;
  auto it = tenant_held_.find(tenant);
  if (it != tenant_held_.end() && --it->second <= 0) tenant_held_.erase(it);
}

int FairSlots::held(const std::string& tenant) const {
  const auto it = tenant_held_.find(tenant);
  return it == tenant_held_.end() ? 0 : it->second;
}

double FairSlots::Weight(const std::string& tenant) const {
  const auto it = shares_.find(tenant);
  return it == shares_.end() || !(it->second.weight > 0) ? 1.0 : it->second.weight;
}

FairSlots::Reserve FairSlots::ReserveOf(const std::string& tenant, absl::Time now) {
  for (auto it = refused_.begin(); it != refused_.end();) {
    auto next = std::next(it);
    if (now - it->second >= kFairShareMemory) refused_.erase(it);
    it = next;
  }
  // Tenants with traffic: the caller, holders of slots, and tenants refused lately.
  absl::flat_hash_set<std::string> traffic = {tenant};
  for (const auto& [name, count] : tenant_held_) traffic.insert(name);
  for (const auto& [name, when] : refused_) traffic.insert(name);
  double traffic_weight = 0;
  for (const std::string& name : traffic) traffic_weight += Weight(name);
  double all_weight = traffic_weight;
  for (const std::string& name : known_) {
    if (!traffic.contains(name)) all_weight += Weight(name);
  }
  Reserve r;
  // One slot kept for each known tenant without traffic whose part of the limit is a slot.
  for (const std::string& name : known_) {
    if (!traffic.contains(name) && FloorSlots(limit_ * Weight(name) / all_weight) >= 1) ++r.idle_tenants;
  }
  const int divided = limit_ - r.idle_tenants;
  const auto share_of = [&](const std::string& name) {
    int share = FloorSlots(divided * Weight(name) / traffic_weight);
    if (cap_ > 0) share = std::min(share, cap_);
    return share;
  };
  r.share = share_of(tenant);
  r.for_others = r.idle_tenants;
  for (const auto& [name, when] : refused_) {
    if (name == tenant) continue;
    const int need = share_of(name) - held(name);
    if (need > 0) {
      r.for_others += need;
      ++r.waiting_tenants;
    }
  }
  return r;
}

}  // namespace orthoserve
