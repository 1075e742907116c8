// Implementation of server/shm/region_registry.h.
#include "server/shm/region_registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "server/shm/random_id.h"

namespace orthoserve {

// A region's memory and its users. Shared by the registry and every lease, so that the memory
// outlives the registry's entry while a step still uses it.
struct RegionLease::Entry {
  Entry(std::unique_ptr<RegionMemory> map, PeerIdentity peer, uint64_t lifeline)
      : map(std::move(map)),
        peer(peer),
        lifeline(lifeline),
        cuda_device(this->map->cuda_device()),
        memory(this->map->memory_id()) {}

  const std::unique_ptr<RegionMemory> map;
  const PeerIdentity peer;
  const uint64_t lifeline;  // The connection it was staged through.
  const std::string cuda_device;  // Empty: host memory.
  const MemoryId memory;          // Its memory, as every process on the host names it.
  std::string name;  // Set once, by Claim, before the entry is shared with any lease.
  mutable absl::Mutex mu;
  int64_t users ABSL_GUARDED_BY(mu) = 0;
};

RegionLease::RegionLease(RegionLease&& other) noexcept
    : entry_(std::move(other.entry_)),
      data_(other.data_),
      size_(other.size_),
      on_device_(other.on_device_),
      span_(other.span_),
      call_(std::move(other.call_)) {
  other.data_ = nullptr;
  other.size_ = 0;
  other.on_device_ = false;
  other.span_ = SharedSpan{};
}

RegionLease& RegionLease::operator=(RegionLease&& other) noexcept {
  if (this != &other) {
    Release();
    entry_ = std::move(other.entry_);
    data_ = other.data_;
    size_ = other.size_;
    on_device_ = other.on_device_;
    span_ = other.span_;
    call_ = std::move(other.call_);
    other.data_ = nullptr;
    other.size_ = 0;
    other.on_device_ = false;
    other.span_ = SharedSpan{};
  }
  return *this;
}

RegionLease::~RegionLease() { Release(); }

void RegionLease::Release() {
  if (entry_ == nullptr) return;
  {
    absl::MutexLock lock(&entry_->mu);
    --entry_->users;
  }
  entry_.reset();  // The last holder unmaps (or closes) the memory.
  data_ = nullptr;
  size_ = 0;
  on_device_ = false;
  span_ = SharedSpan{};
  call_.Release();  // Last: a fence of the call answers only once this use has ended.
}

absl::StatusOr<std::string> RegionRegistry::Stage(std::unique_ptr<RegionMemory> region, PeerIdentity peer,
                                                  uint64_t lifeline) {
  auto entry = std::make_shared<RegionLease::Entry>(std::move(region), peer, lifeline);
  absl::MutexLock lock(&mu_);
  PruneExpiredLocked();
  if (lifelines_.contains(lifeline)) {
    return absl::InvalidArgumentError(absl::StrCat("lifeline ", lifeline, " holds a region already"));
  }
  if (static_cast<int>(staged_.size()) >= options_.max_pending) {
    return absl::ResourceExhaustedError(absl::StrCat(
        options_.max_pending, " handed-over regions already wait for RegisterRegion (--shm-max-pending); retry later"));
  }
  std::string ticket;
  do {
    ASSIGN_OR_RETURN(ticket, RandomId128());
  } while (staged_.contains(ticket));
  staged_.emplace(ticket, Staged{std::move(entry), options_.now() + options_.ticket_timeout});
  lifelines_.emplace(lifeline, Held{ticket, false, "", ""});
  return ticket;
}

absl::StatusOr<RegionInfo> RegionRegistry::Claim(absl::string_view tenant, absl::string_view ticket,
                                                 absl::string_view name) {
  if (static_cast<int64_t>(name.size()) > options_.max_name_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("the region name has ", name.size(), " bytes; at most ",
                                                   options_.max_name_bytes, " are accepted (--max-name-bytes)"));
  }
  absl::MutexLock lock(&mu_);
  PruneExpiredLocked();
  auto staged = staged_.find(ticket);
  if (staged == staged_.end()) {
    return absl::NotFoundError("no handed-over memory waits under this ticket (unknown, already used, or expired)");
  }
  TenantRegions& regions = tenants_[tenant];
  if (static_cast<int>(regions.size()) >= options_.max_regions_per_tenant) {
    if (regions.empty()) tenants_.erase(tenants_.find(tenant));
    return absl::ResourceExhaustedError(absl::StrCat("the tenant has ", options_.max_regions_per_tenant,
                                                     " regions registered already (--shm-max-regions-per-tenant); "
                                                     "unregister one first"));
  }
  std::string id;
  do {
    ASSIGN_OR_RETURN(id, RandomId128());
  } while (regions.contains(id));
  std::shared_ptr<RegionLease::Entry> entry = std::move(staged->second.entry);
  staged_.erase(staged);
  entry->name = std::string(name);
  Count(*entry, +1);
  lifelines_[entry->lifeline] = Held{"", true, std::string(tenant), id};
  RegionInfo info = InfoOf(id, *entry);
  regions.emplace(std::move(id), std::move(entry));
  return info;
}

std::vector<RegionInfo> RegionRegistry::List(absl::string_view tenant) const {
  std::vector<RegionInfo> out;
  {
    absl::MutexLock lock(&mu_);
    auto it = tenants_.find(tenant);
    if (it == tenants_.end()) return out;
    for (const auto& [id, entry] : it->second) out.push_back(InfoOf(id, *entry));
  }
  std::sort(out.begin(), out.end(), [](const RegionInfo& a, const RegionInfo& b) { return a.id < b.id; });
  return out;
}

absl::StatusOr<RegionLease> RegionRegistry::Use(absl::string_view tenant, absl::string_view id, int64_t offset,
                                                int64_t size, absl::string_view call) const {
  // The call first: a fenced call's late message takes nothing, whatever it names.
  ASSIGN_OR_RETURN(CallFences::Hold hold, fences_.Take(tenant, call));
  std::shared_ptr<RegionLease::Entry> entry;
  {
    absl::MutexLock lock(&mu_);
    auto t = tenants_.find(tenant);
    if (t != tenants_.end()) {
      auto r = t->second.find(id);
      if (r != t->second.end()) entry = r->second;
    }
    if (entry == nullptr) return absl::NotFoundError("the tenant has no shared-memory region with this id");
    const int64_t region_size = entry->map->size();
    // offset + size is never formed: each is compared with what is left of the region.
    if (offset < 0 || size < 0 || offset > region_size || size > region_size - offset) {
      return absl::OutOfRangeError(
          absl::StrCat("bytes [", offset, ", +", size, ") are not inside the region of ", region_size, " bytes"));
    }
    // Counted while the region is still registered (under mu_): an Unregister that removes it
    // after this point sees the use and waits for it.
    absl::MutexLock use(&entry->mu);
    ++entry->users;
  }
  char* data = entry->map->data() + offset;
  const bool on_device = !entry->cuda_device.empty();
  const SharedSpan span{entry->memory, offset, size};
  return RegionLease(std::move(entry), data, size, on_device, span, std::move(hold));
}

absl::Status RegionRegistry::Unregister(absl::string_view tenant, absl::string_view id, absl::Time deadline) {
  std::shared_ptr<RegionLease::Entry> entry;
  {
    absl::MutexLock lock(&mu_);
    entry = RemoveLocked(tenant, id);
  }
  if (entry == nullptr) return absl::NotFoundError("the tenant has no shared-memory region with this id");
  RegionLease::Entry* const e = entry.get();
  {
    absl::MutexLock lock(&e->mu);
    auto idle = [e]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu) { return e->users == 0; };
    if (!e->mu.AwaitWithDeadline(absl::Condition(&idle), deadline)) {
      return absl::DeadlineExceededError(
          absl::StrCat("the region was unregistered, but ", e->users,
                       " step(s) still use it at the deadline; its memory is unmapped when they finish"));
    }
  }
  // No lease uses it any more, but the last one may still be letting go of the entry (Release
  // counts down, then drops its reference). Nothing else can take a reference now (the id is
  // gone), so wait for that moment too: this call then holds the last reference and unmaps (or
  // closes, for a CUDA IPC region) the memory itself before it returns. A client may free its GPU
  // allocation as soon as the unregister answered, and CUDA leaves a free before the importer's
  // cudaIpcCloseMemHandle undefined.
  while (entry.use_count() > 1 && absl::Now() < deadline) absl::SleepFor(absl::Microseconds(50));
  if (entry.use_count() > 1) {
    return absl::DeadlineExceededError(
        "the region was unregistered and no step uses it, but its memory was not let go of by the deadline; it is "
        "unmapped in a moment");
  }
  entry.reset();
  return absl::OkStatus();
}

std::shared_ptr<RegionLease::Entry> RegionRegistry::RemoveLocked(absl::string_view tenant, absl::string_view id) {
  auto t = tenants_.find(tenant);
  if (t == tenants_.end()) return nullptr;
  auto r = t->second.find(id);
  if (r == t->second.end()) return nullptr;
  std::shared_ptr<RegionLease::Entry> entry = std::move(r->second);
  t->second.erase(r);
  if (t->second.empty()) tenants_.erase(t);
  Count(*entry, -1);
  lifelines_.erase(entry->lifeline);
  return entry;
}

RegionRegistry::Dropped RegionRegistry::DropLifeline(uint64_t lifeline) {
  std::shared_ptr<RegionLease::Entry> entry;  // Let go of after mu_: the last holder unmaps.
  absl::MutexLock lock(&mu_);
  auto held = lifelines_.find(lifeline);
  if (held == lifelines_.end()) return Dropped::kNothing;
  if (!held->second.claimed) {
    auto staged = staged_.find(held->second.ticket);
    if (staged != staged_.end()) {
      entry = std::move(staged->second.entry);
      staged_.erase(staged);
    }
    lifelines_.erase(held);
    return entry == nullptr ? Dropped::kNothing : Dropped::kStaged;
  }
  const Held where = held->second;  // RemoveLocked erases `held`.
  entry = RemoveLocked(where.tenant, where.id);
  return entry == nullptr ? Dropped::kNothing : Dropped::kRegistered;
}

bool RegionRegistry::Holds(uint64_t lifeline) const {
  absl::MutexLock lock(&mu_);
  return lifelines_.contains(lifeline);
}

int RegionRegistry::PruneExpired() {
  absl::MutexLock lock(&mu_);
  return PruneExpiredLocked();
}

int RegionRegistry::PruneExpiredLocked() {
  const absl::Time now = options_.now();
  int pruned = 0;
  for (auto it = staged_.begin(); it != staged_.end();) {
    if (it->second.expires <= now) {
      lifelines_.erase(it->second.entry->lifeline);
      staged_.erase(it++);
      ++pruned;
    } else {
      ++it;
    }
  }
  return pruned;
}

RegionInfo RegionRegistry::InfoOf(const std::string& id, const RegionLease::Entry& entry) {
  RegionInfo info;
  info.id = id;
  info.name = entry.name;
  info.size = entry.map->size();
  info.peer = entry.peer;
  info.cuda_device = entry.cuda_device;
  absl::MutexLock lock(&entry.mu);
  info.users = entry.users;
  return info;
}

void RegionRegistry::Count(const RegionLease::Entry& entry, int sign) {
  const int64_t bytes = entry.map->size();
  if (entry.cuda_device.empty()) {
    totals_.host_regions += sign;
    totals_.host_bytes += sign * bytes;
  } else {
    totals_.cuda_regions += sign;
    totals_.cuda_bytes += sign * bytes;
  }
}

RegionRegistry::Totals RegionRegistry::totals() const {
  absl::MutexLock lock(&mu_);
  return totals_;
}

int64_t RegionRegistry::regions() const {
  absl::MutexLock lock(&mu_);
  return totals_.host_regions + totals_.cuda_regions;
}

int64_t RegionRegistry::bytes() const {
  absl::MutexLock lock(&mu_);
  return totals_.host_bytes + totals_.cuda_bytes;
}

int RegionRegistry::pending() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(staged_.size());
}

}  // namespace orthoserve
