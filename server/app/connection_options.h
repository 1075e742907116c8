// How the public gRPC port treats connections: keepalive both ways, how often clients may ping,
// idle and aged connections, streams per connection and the memory gRPC may hold — the gRPC
// server channel arguments and resource quota behind the --grpc-* flags, each with a default that
// is safe for a shared cluster.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/server_builder.h"

namespace orthoserve {

struct ConnectionOptions {
  // The server pings each client connection after this long without activity, and closes it
  // when the ping is not answered within keepalive_timeout: a client that vanished (its node
  // lost, its process stopped) gives back its streams and bytes.
  absl::Duration keepalive_time = absl::Seconds(30);
  absl::Duration keepalive_timeout = absl::Seconds(10);
  // Clients may ping this often, with calls in flight or without (their keepalive: how a trainer
  // notices a stopped server rank within seconds). A client that pings more often than this
  // twice without data in between gets GOAWAY ("too_many_pings"). gRPC's own default is 5 min.
  absl::Duration min_client_ping_interval = absl::Seconds(1);
  // A connection with no call for this long is closed (clients reconnect on their next call);
  // zero: never.
  absl::Duration max_connection_idle = absl::Hours(1);
  // A connection this old is asked to go away (GOAWAY; the client reconnects, to another rank of
  // the Service when there is one), and its calls in flight get max_connection_age_grace to
  // finish; zero: never (the default: trainers keep one channel, and spreading them is the
  // client's routing).
  absl::Duration max_connection_age = absl::ZeroDuration();
  absl::Duration max_connection_age_grace = absl::Minutes(5);
  // Concurrent calls one connection may carry (the server-wide and per-tenant stream limits
  // apply on top); 0: gRPC's default (no limit).
  int max_streams_per_connection = 256;
  // The memory gRPC may hold for the public port (a grpc::ResourceQuota): received messages not
  // yet consumed, transport and flow-control buffers of every connection. Near it gRPC closes
  // idle connections (and, with bdp_probe, shrinks its HTTP/2 windows) and, at the limit,
  // cancels calls with RESOURCE_EXHAUSTED ("Buffers full").
  // 0: DefaultMemoryQuota (the server sets it).
  int64_t memory_quota_bytes = 0;
  // Whether gRPC sizes each connection's HTTP/2 windows from its measured bandwidth-delay product
  // (BDP probing). Off (the default): every stream starts with a fixed 64 KiB window, so a call
  // the server has not read yet (waiting for a unary slot or room) holds at most 64 KiB of its
  // request in gRPC's buffers; a call being read still gets a window for the whole message it
  // reads (gRPC announces what a pending read needs), so streams lose no throughput
  // (bench/service/windows.sh, bench/results/windows.md). On: new streams start with a window of
  // 4 MiB or twice the estimated BDP, which gRPC buffers for every waiting call, unbounded by the
  // admission limits.
  bool bdp_probe = false;
};

// The default memory quota, the bound on what gRPC holds that docs/operations.md ("Memory bound")
// states: what admission lets calls hold (every admitted unary request is read in place, in
// gRPC's buffers), `max_inflight_bytes`; plus an HTTP/2 window of 8 MiB for each of `unary_calls`
// (the unary calls that may hold a slot or wait for one, whose requests gRPC may receive before
// they are admitted); plus 64 MiB for the transports. A backstop that does not cut calls the
// limits let in, not a tighter limit.
int64_t DefaultMemoryQuota(int64_t max_inflight_bytes, int64_t unary_calls);

// INVALID_ARGUMENT naming the flag for a value out of range.
absl::Status ValidateConnectionOptions(const ConnectionOptions& options);

// Sets `options` on `builder` as gRPC channel arguments and its resource quota (when
// memory_quota_bytes > 0).
void ApplyConnectionOptions(const ConnectionOptions& options, grpc::ServerBuilder& builder);

}  // namespace orthoserve
