// EtcdClient: the unary part of etcd's gRPC v3 API that the fleet needs, with absl::Status
// results: reads and writes of keys (KV), compare-and-swap transactions, leases, and leader
// election (etcd's Election service). Long-lived streams have their own classes over the same
// endpoints: LeaseKeeper (lease_keeper.h) and Watcher (watcher.h).
//
// Contract: every call has a deadline (Options::call_timeout, or the one given) and fails over
// across the endpoints on UNAVAILABLE (endpoint_pool.h). Writes (Put, Delete, the Txn helpers)
// are not sent twice when they may have been applied: they fail over only from an endpoint
// that is unreachable or has no raft leader, and otherwise return UNAVAILABLE with "may or may
// not have been applied" (read the key to learn which). Errors are etcd's gRPC codes as an
// absl::Status, the message prefixed with the operation and the endpoint; UNAVAILABLE when no
// endpoint answers; INTERNAL for an answer no etcd sends (MalformedAnswer). Thread-safe: any
// number of threads may call at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/etcd/endpoint_pool.h"
#include "server/etcd/etcd_options.h"
#include "server/etcd/etcd_types.h"

namespace etcdserverpb {
class TxnRequest;
class TxnResponse;
}  // namespace etcdserverpb

namespace orthoserve::etcd {

// INTERNAL "<what>: etcd answered <answered>, ...": an answer that breaks the API's contract (a
// key other than the one asked for, a lease without an id, a leader key without a revision).
// Nothing of such an answer is used.
absl::Status MalformedAnswer(absl::string_view what, absl::string_view answered);

// The first key after every key that starts with `prefix` (etcd's range end for a prefix);
// "\0" (all keys) when `prefix` is empty or all 0xff bytes.
std::string PrefixRangeEnd(const std::string& prefix);

class EtcdClient {
 public:
  using Options = EtcdOptions;

  // Validates `options` and creates the channels; connects lazily (the first call dials).
  // INVALID_ARGUMENT naming the field for bad options or an unreadable TLS file.
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Create(const Options& options);

  // --- Keys (KV service) ---

  // The key, or nullopt when it does not exist.
  absl::StatusOr<std::optional<KeyValue>> Get(const std::string& key);
  // Every key that starts with `prefix`, in key order, and the revision of the read.
  absl::StatusOr<RangeResult> GetPrefix(const std::string& prefix);
  // Writes `key`, attached to `lease` when non-zero (NOT_FOUND when that lease does not exist).
  // Returns the store's revision after the write (the key's new mod revision).
  absl::StatusOr<int64_t> Put(const std::string& key, const std::string& value, int64_t lease = 0);
  // Deletes `key`; returns how many keys were deleted (0 or 1).
  absl::StatusOr<int64_t> Delete(const std::string& key);
  // Deletes every key that starts with `prefix`; returns how many were deleted.
  absl::StatusOr<int64_t> DeletePrefix(const std::string& prefix);

  // --- Compare-and-swap (Txn) ---

  // Writes `key` only if it does not exist. On failure `current` holds the existing key.
  absl::StatusOr<TxnResult> CreateIfAbsent(const std::string& key, const std::string& value, int64_t lease = 0);
  // Writes `key` only if its mod revision is `mod_revision` (0: only if it does not exist).
  // On failure `current` holds the key as it is (nullopt when absent).
  absl::StatusOr<TxnResult> PutIfModRevision(const std::string& key, const std::string& value, int64_t mod_revision,
                                             int64_t lease = 0);
  // Any transaction, for guards these helpers do not cover (e.g. fencing a write on a leader
  // key's create revision).
  absl::StatusOr<etcdserverpb::TxnResponse> Txn(const etcdserverpb::TxnRequest& request);

  // --- Leases (Lease service) ---

  // A new lease of `ttl` (rounded up to whole seconds, at least 1; etcd may raise it to its
  // minimum). Keep it alive with a LeaseKeeper.
  absl::StatusOr<Lease> GrantLease(absl::Duration ttl);
  // Revokes `lease_id`: its keys are deleted at once. NOT_FOUND when no such lease exists
  // (also when a retry on another endpoint finds it already revoked by the first attempt).
  absl::Status RevokeLease(int64_t lease_id);
  // The time `lease_id` has left (whole seconds, rounded down; 0 when under a second). NOT_FOUND
  // when etcd holds no such lease: it expired or was revoked (its keys are deleted, or are
  // being deleted).
  absl::StatusOr<absl::Duration> LeaseTimeToLive(int64_t lease_id);

  // --- Leader election (etcd's Election service, v3electionpb) ---

  // Blocks until this campaigner leads election `name` or `deadline` passes, with `value` as
  // the proclaimed value. Leadership lasts as long as `lease` lives (keep it alive with a
  // LeaseKeeper) and until Resign. Campaigning again with the same lease is idempotent.
  // DEADLINE_EXCEEDED when `deadline` passed first (etcd then withdraws the candidacy);
  // NOT_FOUND when the lease does not exist.
  absl::StatusOr<LeaderKey> Campaign(const std::string& name, int64_t lease, const std::string& value,
                                     absl::Time deadline);
  // The current leader's key and proclaimed value (its create_revision is the term).
  // NOT_FOUND when the election has no leader.
  absl::StatusOr<KeyValue> Leader(const std::string& name);
  // Replaces the leader's proclaimed value. FAILED_PRECONDITION when `leader` no longer leads.
  absl::Status Proclaim(const LeaderKey& leader, const std::string& value);
  // Gives up leadership (deletes the leader key); the next campaigner, if any, then leads.
  // OK when `leader` had already lost its leadership.
  absl::Status Resign(const LeaderKey& leader);

  // The endpoints and channels, for LeaseKeeper and Watcher.
  EndpointPool& pool() { return *pool_; }
  const Options& options() const { return pool_->options(); }

 private:
  explicit EtcdClient(std::unique_ptr<EndpointPool> pool) : pool_(std::move(pool)) {}

  absl::Time CallDeadline() const { return absl::Now() + pool_->options().call_timeout; }
  absl::StatusOr<TxnResult> GuardedPut(const std::string& key, const std::string& value, int64_t mod_revision,
                                       int64_t lease);

  std::unique_ptr<EndpointPool> pool_;
};

}  // namespace orthoserve::etcd
