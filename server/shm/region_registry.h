// The registry of shared-memory regions (docs/shared_memory.md): memfds (and CUDA IPC handles,
// opened) handed over on the socket wait here under a one-time ticket until a tenant claims
// them; a claimed region belongs to that tenant under a server-chosen random id, and every use of
// it holds a lease, so that unregistering waits for the steps using it. No gRPC; thread-safe.
//
// Every region is staged through a lifeline: the handover connection, which its client keeps
// open for as long as it holds the region (handover_socket.h). When a lifeline ends (the process
// died, or let go), DropLifeline drops the region staged or registered through it as an
// unregister would, without waiting: so a client that died does not keep its regions (or its
// tenant's --shm-max-regions-per-tenant) until the server restarts.
//
// Isolation: every lookup is keyed by (tenant, id). Another tenant's id, a guessed id and an id
// whose owner unregistered it all give the same NOT_FOUND, so answers say nothing about regions
// that are not the caller's.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/shared_span.h"
#include "server/shm/call_fences.h"
#include "server/shm/region_memory.h"

namespace orthoserve {

// The process that handed a descriptor over (SO_PEERCRED).
struct PeerIdentity {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

// A registered region as its owner sees it.
struct RegionInfo {
  std::string id;           // 32 hex digits, chosen by the server.
  std::string name;         // The owner's label (RegisterRegion's name); not unique.
  int64_t size = 0;         // Bytes mapped.
  PeerIdentity peer;        // Who handed the memory over.
  int64_t users = 0;        // Leases held now (steps using it).
  std::string cuda_device;  // Empty: host memory (a memfd); else the GPU's UUID (a CUDA IPC region).
};

// One use of a slice of a region: the memory stays mapped, and UnregisterRegion waits, until
// the lease is destroyed (or moved from); a lease taken for a call (Use's `call`) holds that call
// unfenced until then too (call_fences.h). Movable, not copyable; may be released on any thread.
class RegionLease {
 public:
  RegionLease() = default;
  RegionLease(RegionLease&& other) noexcept;
  RegionLease& operator=(RegionLease&& other) noexcept;
  ~RegionLease();

  char* data() const { return data_; }  // Start of the slice; null for an empty lease.
  int64_t size() const { return size_; }
  // The slice is GPU memory (a CUDA IPC region) that only the backend may touch, not host code.
  bool on_device() const { return on_device_; }
  // The slice as every process on this host names it (its memory's id and its offset there), for
  // the overlap checks of a step (common/shared_span.h).
  const SharedSpan& span() const { return span_; }
  // Ends the use now (as the destructor would).
  void Release();

 private:
  friend class RegionRegistry;
  struct Entry;
  RegionLease(std::shared_ptr<Entry> entry, char* data, int64_t size, bool on_device, SharedSpan span,
              CallFences::Hold call)
      : entry_(std::move(entry)), data_(data), size_(size), on_device_(on_device), span_(span), call_(std::move(call)) {}

  std::shared_ptr<Entry> entry_;
  char* data_ = nullptr;
  int64_t size_ = 0;
  bool on_device_ = false;
  SharedSpan span_;
  CallFences::Hold call_;  // Released after the entry: the call holds nothing once the use ended.
};

class RegionRegistry {
 public:
  struct Options {
    int max_regions_per_tenant = 64;                               // Registered regions of one tenant.
    int64_t max_region_bytes = int64_t{64} << 30;                  // Largest memfd or CUDA IPC region accepted.
    int max_pending = 64;                                          // Staged regions waiting for RegisterRegion.
    absl::Duration ticket_timeout = absl::Seconds(10);             // How long a staged region waits.
    int max_name_bytes = 1024;                                     // Bytes of a region's label.
    std::function<absl::Time()> now = [] { return absl::Now(); };  // The clock (tests inject one).
    CallFences::Options fences;                                    // Fenced call ids (call_fences.h).
  };

  explicit RegionRegistry(Options options) : options_(std::move(options)), fences_(options_.fences) {}
  RegionRegistry(const RegionRegistry&) = delete;
  RegionRegistry& operator=(const RegionRegistry&) = delete;

  const Options& options() const { return options_; }

  // Holds `region` (handed over by `peer` on the connection `lifeline`, an id the caller never
  // reuses) under a fresh ticket, which it returns; the ticket is good for one Claim within
  // options().ticket_timeout. RESOURCE_EXHAUSTED when options().max_pending regions wait already;
  // INVALID_ARGUMENT when `lifeline` holds a region already (one region per lifeline). The region
  // is dropped (unmapped or closed) on error.
  absl::StatusOr<std::string> Stage(std::unique_ptr<RegionMemory> region, PeerIdentity peer, uint64_t lifeline)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Makes the memory staged under `ticket` a region of `tenant`, labelled `name`, under a fresh
  // id. NOT_FOUND for an unknown, used or expired ticket; INVALID_ARGUMENT for a name longer
  // than options().max_name_bytes; RESOURCE_EXHAUSTED when the tenant has
  // options().max_regions_per_tenant regions (the ticket stays good until it expires).
  absl::StatusOr<RegionInfo> Claim(absl::string_view tenant, absl::string_view ticket, absl::string_view name)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The regions of `tenant`, ordered by id; nothing of any other tenant.
  std::vector<RegionInfo> List(absl::string_view tenant) const ABSL_LOCKS_EXCLUDED(mu_);

  // A lease on bytes [offset, offset + size) of region `id` of `tenant`, for the call `call` of
  // `tenant` (its client's call id; empty: a call without one, which cannot be fenced).
  // FAILED_PRECONDITION when that call was fenced (FenceCall); NOT_FOUND when the tenant has no
  // region `id`; OUT_OF_RANGE when the slice is not inside the region (checked without overflow:
  // offset and size are each compared with what is left).
  absl::StatusOr<RegionLease> Use(absl::string_view tenant, absl::string_view id, int64_t offset, int64_t size,
                                  absl::string_view call = {}) const ABSL_LOCKS_EXCLUDED(mu_);

  // Fences call `call` of `tenant`: no lease can be taken for it any more, and the answer comes
  // once none is held (CallFences::Fence: OK, DEADLINE_EXCEEDED at `deadline`, INVALID_ARGUMENT
  // for an empty id). From an OK on, the server reads and writes none of the call's slices.
  absl::Status FenceCall(absl::string_view tenant, absl::string_view call, absl::Time deadline) const {
    return fences_.Fence(tenant, call, deadline);
  }
  const CallFences& fences() const { return fences_; }

  // Removes region `id` of `tenant` at once (new uses are NOT_FOUND), then waits until no lease
  // on it is held, or until `deadline`; when it returns OK the memory has been unmapped (or the
  // CUDA IPC handle closed). NOT_FOUND as for Use; DEADLINE_EXCEEDED when leases are still held at
  // the deadline (the region is gone from the registry all the same, and its memory is unmapped
  // when the last lease goes).
  absl::Status Unregister(absl::string_view tenant, absl::string_view id, absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);

  // What DropLifeline dropped: the region, staged (unclaimed) or registered, or nothing.
  enum class Dropped { kNothing, kStaged, kRegistered };

  // Lifeline `lifeline` ended (its owner died or let go): drops the region staged or registered
  // through it, as Unregister does but without waiting — new uses are NOT_FOUND at once, steps in
  // flight keep their leases, and the memory is unmapped (or the handle closed) when the last
  // lease goes. kNothing when the region was unregistered or its ticket expired already, or the
  // lifeline is unknown: ending a lifeline after an unregister is a no-op.
  Dropped DropLifeline(uint64_t lifeline) ABSL_LOCKS_EXCLUDED(mu_);

  // Whether a region staged or registered through `lifeline` is still here (not unregistered, not
  // expired, not dropped): the socket lets go of lifelines that hold nothing any more.
  bool Holds(uint64_t lifeline) const ABSL_LOCKS_EXCLUDED(mu_);

  // Drops staged regions whose ticket expired; returns how many. Stage and Claim prune too; the
  // socket listener calls this periodically so that an unclaimed memfd or CUDA IPC mapping does
  // not outlive its ticket by more than that period.
  int PruneExpired() ABSL_LOCKS_EXCLUDED(mu_);

  // Registered regions of all tenants and their bytes, by memory.
  struct Totals {
    int64_t host_regions = 0;
    int64_t host_bytes = 0;
    int64_t cuda_regions = 0;
    int64_t cuda_bytes = 0;
  };
  Totals totals() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t regions() const ABSL_LOCKS_EXCLUDED(mu_);  // Registered regions, all tenants.
  int64_t bytes() const ABSL_LOCKS_EXCLUDED(mu_);    // Their bytes.
  int pending() const ABSL_LOCKS_EXCLUDED(mu_);      // Staged regions.

 private:
  struct Staged {
    std::shared_ptr<RegionLease::Entry> entry;
    absl::Time expires;
  };
  using TenantRegions = absl::flat_hash_map<std::string, std::shared_ptr<RegionLease::Entry>>;  // id -> region
  // Where the region of a lifeline is: staged under `ticket`, or (claimed) region `id` of `tenant`.
  struct Held {
    std::string ticket;
    bool claimed = false;
    std::string tenant;
    std::string id;
  };

  int PruneExpiredLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes region `id` of `tenant` (counted out of totals_, its lifeline forgotten) and returns
  // it; null when there is none.
  std::shared_ptr<RegionLease::Entry> RemoveLocked(absl::string_view tenant, absl::string_view id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds (sign +1) or removes (-1) a claimed region in totals_.
  void Count(const RegionLease::Entry& entry, int sign) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static RegionInfo InfoOf(const std::string& id, const RegionLease::Entry& entry);

  const Options options_;
  mutable CallFences fences_;  // Thread-safe on its own; mutable: leases are taken by the const Use.
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Staged> staged_ ABSL_GUARDED_BY(mu_);  // ticket -> memory
  absl::flat_hash_map<std::string, TenantRegions> tenants_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Held> lifelines_ ABSL_GUARDED_BY(mu_);  // lifeline -> its region
  Totals totals_ ABSL_GUARDED_BY(mu_);
};

}  // namespace orthoserve
