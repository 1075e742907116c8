// Admission control for the public API (docs/operations.md): concurrent streams and matrix bytes held
// in flight, per server and per tenant. Over a limit a request gets RESOURCE_EXHAUSTED before
// anything is allocated — never an out-of-memory kill. Thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "server/metrics/metrics.h"

namespace orthoserve {

class Admission {
 public:
  struct Options {
    int64_t max_inflight_bytes = int64_t{4} << 30;         // Whole server.
    int64_t max_tenant_inflight_bytes = int64_t{2} << 30;  // Per tenant.
    int max_concurrent_streams = 64;
    int max_tenant_concurrent_streams = 0;  // Per tenant; 0: only the server-wide limit.
  };

  // Holds admitted bytes (or a stream slot) until destroyed. Movable.
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& other) noexcept { *this = std::move(other); }
    Ticket& operator=(Ticket&& other) noexcept;
    ~Ticket() { Release(); }
    void Release();
    int64_t bytes() const { return bytes_; }

   private:
    friend class Admission;
    Admission* owner_ = nullptr;
    std::string tenant_;
    int64_t bytes_ = 0;
    bool stream_ = false;
  };

  Admission(const Options& options, Metrics* metrics) : options_(options), metrics_(metrics) {}

  // A stream slot of `tenant`. RESOURCE_EXHAUSTED naming the limit, the figure and the limit's
  // value (--max-concurrent-streams, or --max-tenant-concurrent-streams with the tenant's own count).
  absl::StatusOr<Ticket> AcquireStream(const std::string& tenant);
  // Adds `bytes` to `ticket` (which may already hold bytes of the same tenant). RESOURCE_EXHAUSTED
  // naming the limit (--max-inflight-bytes or --max-tenant-inflight-bytes) and `what`.
  absl::Status AddBytes(Ticket& ticket, const std::string& tenant, int64_t bytes, const std::string& what);

  int64_t inflight_bytes() const;

 private:
  void Return(const std::string& tenant, int64_t bytes, bool stream);
  // The most bytes any tenant holds (for the tenant gauge with labels off). Requires mu_.
  int64_t LargestTenantBytesLocked() const;

  const Options options_;
  Metrics* metrics_;  // Optional.
  mutable std::mutex mu_;
  int64_t bytes_ = 0;
  int streams_ = 0;
  absl::flat_hash_map<std::string, int64_t> tenant_bytes_;
  absl::flat_hash_map<std::string, int> tenant_streams_;
};

}  // namespace orthoserve
