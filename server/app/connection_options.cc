// Implementation of server/app/connection_options.h.
#include "server/app/connection_options.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "grpc/grpc.h"
#include "grpcpp/resource_quota.h"

namespace orthoserve {
namespace {

// A duration as gRPC's int milliseconds (saturated; zero stays zero).
int Millis(absl::Duration d) {
  return static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 0, std::numeric_limits<int>::max()));
}

absl::Status Positive(absl::Duration d, const char* flag) {
  if (d > absl::ZeroDuration()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(flag, " must be positive, got ", absl::FormatDuration(d)));
}

absl::Status NotNegative(absl::Duration d, const char* flag) {
  if (d >= absl::ZeroDuration()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(flag, " must be >= 0 (0: never), got ", absl::FormatDuration(d)));
}

// Below this a quota would cancel ordinary calls: one connection's buffers alone take megabytes.
constexpr int64_t kMinMemoryQuota = int64_t{16} << 20;

}  // namespace

int64_t DefaultMemoryQuota(int64_t max_inflight_bytes, int64_t unary_calls) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  return max_inflight_bytes + unary_calls * 8 * kMiB + 64 * kMiB;
}

absl::Status ValidateConnectionOptions(const ConnectionOptions& o) {
  for (absl::Status s : {Positive(o.keepalive_time, "--grpc-keepalive-time"),
                         Positive(o.keepalive_timeout, "--grpc-keepalive-timeout"),
                         Positive(o.min_client_ping_interval, "--grpc-min-client-ping-interval"),
                         NotNegative(o.max_connection_idle, "--grpc-max-connection-idle"),
                         NotNegative(o.max_connection_age, "--grpc-max-connection-age"),
                         NotNegative(o.max_connection_age_grace, "--grpc-max-connection-age-grace")}) {
    if (!s.ok()) return s;
  }
  if (o.memory_quota_bytes != 0 && o.memory_quota_bytes < kMinMemoryQuota) {
    return absl::InvalidArgumentError(absl::StrCat("--grpc-memory-quota-bytes must be 0 (the default of "
                                                   "--max-inflight-bytes and the unary calls) or at least ",
                                                   kMinMemoryQuota, " (16 MiB), got ", o.memory_quota_bytes));
  }
  if (o.max_streams_per_connection < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--grpc-max-streams-per-connection must be >= 0 (0: no limit), got ",
                                                   o.max_streams_per_connection));
  }
  return absl::OkStatus();
}

void ApplyConnectionOptions(const ConnectionOptions& o, grpc::ServerBuilder& builder) {
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, Millis(o.keepalive_time));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Millis(o.keepalive_timeout));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, Millis(o.min_client_ping_interval));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 2);
  // The server's own pings need no data between them either.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  if (o.max_connection_idle > absl::ZeroDuration()) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, Millis(o.max_connection_idle));
  }
  if (o.max_connection_age > absl::ZeroDuration()) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, Millis(o.max_connection_age));
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, Millis(o.max_connection_age_grace));
  }
  if (o.max_streams_per_connection > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, o.max_streams_per_connection);
  }
  if (!o.bdp_probe) builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  if (o.memory_quota_bytes > 0) {
    grpc::ResourceQuota quota("orthoserve-public");
    quota.Resize(static_cast<size_t>(o.memory_quota_bytes));
    builder.SetResourceQuota(quota);
  }
}

}  // namespace orthoserve
