// Plain values that cross the etcd client's API: key-value pairs, watch events, leases and
// election leadership. No protobuf here, so the fleet can hold them without etcd's headers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace orthoserve::etcd {

// One key as etcd stores it (mvccpb.KeyValue).
struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;  // Revision of the key's last creation.
  int64_t mod_revision = 0;     // Revision of the key's last modification.
  int64_t version = 0;          // Modifications since creation (1 right after creation).
  int64_t lease = 0;            // Lease the key is attached to (0: none).
};

// The keys of a range read and the store revision it was read at. Watching from
// `revision + 1` sees every change after this read (list-then-watch).
struct RangeResult {
  std::vector<KeyValue> kvs;  // In key order.
  int64_t revision = 0;       // The store's revision when the read was served.
};

// The outcome of a compare-and-swap transaction.
struct TxnResult {
  bool succeeded = false;           // Whether the comparison held and the write was applied.
  int64_t revision = 0;             // The store's revision after the transaction.
  std::optional<KeyValue> current;  // On failure: the key as it is now (absent: no such key).
};

// One change seen by a Watcher.
struct WatchEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  std::string key;
  std::string value;            // Empty for kDelete.
  int64_t mod_revision = 0;     // The revision of this change (of the deletion for kDelete).
  int64_t create_revision = 0;  // For kPut: the key's creation revision.
  int64_t lease = 0;            // For kPut: the key's lease.
};

// A granted lease.
struct Lease {
  int64_t id = 0;
  int64_t ttl_seconds = 0;  // The TTL etcd chose (it may raise a too small request).
};

// Leadership of an election won by Campaign (v3electionpb.LeaderKey). `revision` is the create
// revision of the leader's key: it grows with every new leader, so it is the fencing term
// (a write guarded by "the key's create revision == revision" fails once leadership moved on).
struct LeaderKey {
  std::string name;      // The election's name.
  std::string key;       // The leader's key in etcd ("name/<lease id in hex>").
  int64_t revision = 0;  // The create revision of `key`: the leadership term.
  int64_t lease = 0;     // The lease that holds the leadership.
};

}  // namespace orthoserve::etcd
