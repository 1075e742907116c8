// How the public gRPC port treats connections: keepalive both ways, how often clients may ping,
// idle and aged connections, and streams per connection — the gRPC server channel arguments
// behind the --grpc-* flags, each with a default that is safe for a shared cluster.
#pragma once

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
};

// INVALID_ARGUMENT naming the flag for a value out of range.
absl::Status ValidateConnectionOptions(const ConnectionOptions& options);

// Sets `options` on `builder` as gRPC channel arguments.
void ApplyConnectionOptions(const ConnectionOptions& options, grpc::ServerBuilder& builder);

}  // namespace orthoserve
