// ValidateServerOptions (server/app/server.h): every option it checks, bad, gives its specific
// code and names the flag; which --listen addresses are loopback only, and shared memory without
// tokens refused beyond them (or warned of); and ResolveCollective picks the fleet's collective group.
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/app/listen_address.h"
#include "server/app/server.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using ::orthoserve::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

ServerOptions Fleet2(const std::string& backend) {
  ServerOptions o;
  o.world = 2;
  o.rank = 1;
  o.fleet_listen = "127.0.0.1:7001";
  o.coordinator = "127.0.0.1:7000";
  o.backend.kind = backend;
  return o;
}

TEST(ServerOptionsTest, DefaultsAreValid) {
  EXPECT_OK(ValidateServerOptions(ServerOptions{}));
  EXPECT_OK(ValidateServerOptions(Fleet2("cpu")));
}

struct BadCase {
  std::string name;
  std::function<void(ServerOptions&)> change;
  absl::StatusCode code;
  std::string names;  // Substring of the message: the flag.
};

TEST(ServerOptionsTest, EveryBadOptionHasItsCodeAndNamesTheFlag) {
  const std::vector<BadCase> cases = {
      {"empty listen", [](ServerOptions& o) { o.listen = ""; }, absl::StatusCode::kInvalidArgument, "--listen"},
      {"backend", [](ServerOptions& o) { o.backend.kind = "tpu"; }, absl::StatusCode::kInvalidArgument, "--backend"},
      {"blas threads", [](ServerOptions& o) { o.backend.cpu_threads = 0; }, absl::StatusCode::kInvalidArgument,
       "--blas-threads"},
      {"world", [](ServerOptions& o) { o.world = 0; }, absl::StatusCode::kInvalidArgument, "--world"},
      {"call rate below one per second",
       [](ServerOptions& o) { o.service.admission.max_tenant_calls_per_second = 0.5; },
       absl::StatusCode::kInvalidArgument, "--max-tenant-calls-per-second"},
      {"fleet batch window", [](ServerOptions& o) { o.batch_window = -1; }, absl::StatusCode::kInvalidArgument,
       "--fleet-batch-window"},
      {"fleet batch part time", [](ServerOptions& o) { o.batch_part_time = absl::Milliseconds(-1); },
       absl::StatusCode::kInvalidArgument, "--fleet-batch-part-time"},
      {"rank", [](ServerOptions& o) { o.rank = 2; }, absl::StatusCode::kInvalidArgument, "--rank"},
      {"fleet listen", [](ServerOptions& o) { o.fleet_listen = ""; }, absl::StatusCode::kInvalidArgument,
       "--fleet-listen"},
      {"coordinator", [](ServerOptions& o) { o.coordinator = ""; }, absl::StatusCode::kInvalidArgument,
       "--coordinator"},
      {"collective timeout", [](ServerOptions& o) { o.collective_timeout = absl::ZeroDuration(); },
       absl::StatusCode::kInvalidArgument, "--collective-timeout"},
      {"peer timeout", [](ServerOptions& o) { o.peer_timeout = absl::Seconds(-1); },
       absl::StatusCode::kInvalidArgument, "--fleet-peer-timeout"},
      {"min progress", [](ServerOptions& o) { o.service.stream_min_progress_bytes = -1; },
       absl::StatusCode::kInvalidArgument, "--stream-min-progress-bytes"},
      {"keepalive time", [](ServerOptions& o) { o.connections.keepalive_time = absl::ZeroDuration(); },
       absl::StatusCode::kInvalidArgument, "--grpc-keepalive-time"},
      {"keepalive timeout", [](ServerOptions& o) { o.connections.keepalive_timeout = absl::Seconds(-1); },
       absl::StatusCode::kInvalidArgument, "--grpc-keepalive-timeout"},
      {"client ping interval", [](ServerOptions& o) { o.connections.min_client_ping_interval = absl::ZeroDuration(); },
       absl::StatusCode::kInvalidArgument, "--grpc-min-client-ping-interval"},
      {"connection idle", [](ServerOptions& o) { o.connections.max_connection_idle = absl::Seconds(-1); },
       absl::StatusCode::kInvalidArgument, "--grpc-max-connection-idle"},
      {"connection age", [](ServerOptions& o) { o.connections.max_connection_age = absl::Seconds(-1); },
       absl::StatusCode::kInvalidArgument, "--grpc-max-connection-age"},
      {"connection age grace", [](ServerOptions& o) { o.connections.max_connection_age_grace = absl::Seconds(-1); },
       absl::StatusCode::kInvalidArgument, "--grpc-max-connection-age-grace"},
      {"streams per connection", [](ServerOptions& o) { o.connections.max_streams_per_connection = -1; },
       absl::StatusCode::kInvalidArgument, "--grpc-max-streams-per-connection"},
      {"memory quota", [](ServerOptions& o) { o.connections.memory_quota_bytes = 1 << 20; },
       absl::StatusCode::kInvalidArgument, "--grpc-memory-quota-bytes"},
      {"unary slots", [](ServerOptions& o) { o.service.unary.max_concurrent = -1; },
       absl::StatusCode::kInvalidArgument, "--max-concurrent-unary"},
      {"unary cap", [](ServerOptions& o) { o.service.unary.max_tenant_concurrent = -1; },
       absl::StatusCode::kInvalidArgument, "--max-tenant-concurrent-unary"},
      {"unary waiters", [](ServerOptions& o) { o.service.unary.max_waiters = -1; },
       absl::StatusCode::kInvalidArgument, "--max-unary-waiters"},
      {"quarantine after", [](ServerOptions& o) { o.quarantine_after = -1; },
       absl::StatusCode::kInvalidArgument, "--fleet-quarantine-after"},
      {"quarantine base", [](ServerOptions& o) { o.quarantine_base = absl::ZeroDuration(); },
       absl::StatusCode::kInvalidArgument, "--fleet-quarantine-base"},
      {"quarantine max below base", [](ServerOptions& o) { o.quarantine_max = absl::Seconds(1); },
       absl::StatusCode::kInvalidArgument, "--fleet-quarantine-max"},
      {"collective name", [](ServerOptions& o) { o.collective = "mpi"; }, absl::StatusCode::kInvalidArgument,
       "--collective \"mpi\" is not one of auto, gloo, nccl"},
      {"nccl on cpu", [](ServerOptions& o) { o.collective = "nccl"; }, absl::StatusCode::kInvalidArgument,
       "--collective nccl needs --backend cuda"},
      {"workers", [](ServerOptions& o) { o.workers = 0; }, absl::StatusCode::kInvalidArgument, "--workers"},
      {"chunk bytes", [](ServerOptions& o) { o.service.chunk_bytes = 100; }, absl::StatusCode::kInvalidArgument,
       "--chunk-bytes"},
      {"message bytes", [](ServerOptions& o) { o.service.max_message_bytes = 1; },
       absl::StatusCode::kInvalidArgument, "--max-message-bytes"},
      {"idle buffers", [](ServerOptions& o) { o.service.buffers.max_idle_bytes = -1; },
       absl::StatusCode::kInvalidArgument, "--stream-buffer-idle-bytes"},
      {"name bytes", [](ServerOptions& o) { o.service.max_name_bytes = 0; }, absl::StatusCode::kInvalidArgument,
       "--max-name-bytes = 0 must be >= 1"},
      {"shape dims", [](ServerOptions& o) { o.service.max_shape_dims = 1; }, absl::StatusCode::kInvalidArgument,
       "--max-shape-dims = 1 must be >= 2"},
      {"group world too large", [](ServerOptions& o) { o.service.max_group_world = 65537; },
       absl::StatusCode::kInvalidArgument, "--max-group-world = 65537 must be between 1 and 65536"},
      {"group world zero", [](ServerOptions& o) { o.service.max_group_world = 0; }, absl::StatusCode::kInvalidArgument,
       "--max-group-world = 0"},
      {"log entry bytes", [](ServerOptions& o) { o.fleet_max_log_entry_bytes = 0; }, absl::StatusCode::kInvalidArgument,
       "--fleet-max-log-entry-bytes = 0 must be between 1 and"},
      {"tenant pending steps", [](ServerOptions& o) { o.service.max_tenant_pending_steps = -1; },
       absl::StatusCode::kInvalidArgument, "--max-tenant-pending-steps = -1 must be >= 0"},
      {"fleet TLS files not all given", [](ServerOptions& o) { o.fleet_tls.cert_file = "/no/such/rank1.crt"; },
       absl::StatusCode::kInvalidArgument, "missing: --fleet-tls-key, --fleet-tls-ca"},
      {"fleet TLS file unreadable",
       [](ServerOptions& o) {
         o.fleet_tls.cert_file = "/no/such/rank1.crt";
         o.fleet_tls.key_file = "/no/such/rank1.key";
         o.fleet_tls.ca_file = "/no/such/ca.crt";
       },
       absl::StatusCode::kInvalidArgument, "--fleet-tls-cert /no/such/rank1.crt cannot be read"},
      {"fleet TLS without a fleet port",
       [](ServerOptions& o) {
         o.world = 1;
         o.rank = 0;
         o.fleet_listen = "";
         o.fleet_tls.cert_file = o.fleet_tls.key_file = o.fleet_tls.ca_file = "/no/such/file";
       },
       absl::StatusCode::kInvalidArgument, "need --fleet-listen"},
      {"fleet member name", [](ServerOptions& o) { o.fleet_tls.member_name = "orthoserve rank {rank}"; },
       absl::StatusCode::kInvalidArgument, "--fleet-tls-member-name"},
      {"handshakes", [](ServerOptions& o) {
         o.shm.socket = "/tmp/orthoserve-test.sock";
         o.shm.max_handshakes = 0;
       },
       absl::StatusCode::kInvalidArgument, "--shm-max-handshakes must be >= 1"},
      {"regions without tokens on a public port",
       [](ServerOptions& o) {
         o.shm.socket = "/tmp/orthoserve-test.sock";
         o.listen = "0.0.0.0:50051";
       },
       absl::StatusCode::kInvalidArgument, "--shm-allow-without-tokens"},
  };
  for (const BadCase& c : cases) {
    ServerOptions o = Fleet2("cpu");
    c.change(o);
    EXPECT_THAT(ValidateServerOptions(o), StatusIs(c.code, HasSubstr(c.names))) << c.name;
  }
}

TEST(ServerOptionsTest, LoopbackListenAddresses) {
  for (const char* local : {"127.0.0.1:50051", "127.0.0.1:0", "127.8.9.10:1", "[::1]:50051", "localhost:50051",
                            "LocalHost:1", "[::ffff:127.0.0.1]:50051", "unix:/run/orthoserve/grpc.sock",
                            "unix-abstract:orthoserve"}) {
    EXPECT_TRUE(IsLoopbackListenAddress(local)) << local;
  }
  for (const char* reachable : {"0.0.0.0:50051", "[::]:50051", ":50051", "10.0.0.5:50051", "128.0.0.1:50051",
                                "[::2]:50051", "[::ffff:10.0.0.1]:50051", "orthoserve.example.com:50051",
                                "localhost.example.com:50051", "ipv4:127.0.0.1:50051", "[::1:50051", ""}) {
    EXPECT_FALSE(IsLoopbackListenAddress(reachable)) << reachable;
  }
}

// --shm-socket without --token-file: every client that reaches the public port is tenant
// "default" and may use every region, so it is refused unless that port is loopback, or the
// operator opted in (and is warned).
TEST(ServerOptionsTest, RegionsWithoutTokensNeedALoopbackPortOrTheOptIn) {
  ServerOptions o;
  o.shm.socket = "/tmp/orthoserve-test.sock";
  for (const char* reachable : {"0.0.0.0:50051", "[::]:50051", "10.0.0.5:50051", "orthoserve:50051"}) {
    o.listen = reachable;
    EXPECT_THAT(ValidateServerOptions(o),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(absl::StrCat("--shm-socket without --token-file on --listen ", reachable)),
                               HasSubstr("give a --token-file, listen on loopback"),
                               HasSubstr("--shm-allow-without-tokens"))))
        << reachable;
  }
  o.listen = "0.0.0.0:50051";
  o.shm.allow_without_tokens = true;
  EXPECT_OK(ValidateServerOptions(o));
  EXPECT_THAT(ServerOptionsWarnings(o),
              ElementsAre(AllOf(HasSubstr("--shm-allow-without-tokens"), HasSubstr("--listen 0.0.0.0:50051"),
                                HasSubstr("every shared-memory region"))));
  // Loopback needs no opt-in, and nothing is warned of.
  o.shm.allow_without_tokens = false;
  for (const char* local : {"127.0.0.1:50051", "[::1]:50051", "localhost:50051"}) {
    SCOPED_TRACE(local);
    o.listen = local;
    EXPECT_OK(ValidateServerOptions(o));
    EXPECT_THAT(ServerOptionsWarnings(o), IsEmpty());
  }
  // Tokens: regions are the registering tenant's, on any port.
  char dir[] = "/tmp/orthoserve-options-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string tokens = std::string(dir) + "/tokens";
  std::ofstream(tokens) << "secret-token alice\n";
  o.listen = "0.0.0.0:50051";
  o.token_file = tokens;
  EXPECT_OK(ValidateServerOptions(o));
  EXPECT_THAT(ServerOptionsWarnings(o), IsEmpty());
  // Without --shm-socket there is nothing to refuse.
  ServerOptions no_regions;
  no_regions.listen = "0.0.0.0:50051";
  EXPECT_OK(ValidateServerOptions(no_regions));
  std::remove(tokens.c_str());
  rmdir(dir);
}

TEST(ServerOptionsTest, NcclNeedsACudaBuild) {
  ServerOptions o = Fleet2("cuda");
  o.collective = "nccl";
  if (ORTHOSERVE_WITH_CUDA) {
    EXPECT_OK(ValidateServerOptions(o));
  } else {
    EXPECT_THAT(ValidateServerOptions(o), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no NCCL")));
  }
}

TEST(ServerOptionsTest, ResolveCollective) {
  EXPECT_EQ(ResolveCollective(ServerOptions{}), "local") << "one rank needs no group";
  ServerOptions cuda_one;
  cuda_one.backend.kind = "cuda";
  EXPECT_EQ(ResolveCollective(cuda_one), "local");
  EXPECT_EQ(ResolveCollective(Fleet2("cpu")), "gloo");
  EXPECT_EQ(ResolveCollective(Fleet2("cuda")), ORTHOSERVE_WITH_CUDA ? "nccl" : "gloo");
  ServerOptions gloo_on_gpus = Fleet2("cuda");
  gloo_on_gpus.collective = "gloo";
  EXPECT_EQ(ResolveCollective(gloo_on_gpus), "gloo");
  ServerOptions nccl = Fleet2("cuda");
  nccl.collective = "nccl";
  EXPECT_EQ(ResolveCollective(nccl), "nccl");
}

}  // namespace
}  // namespace orthoserve
