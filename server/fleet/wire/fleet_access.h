// Who may call the fleet port (the Fleet service on rank 0, every member's Peer service): with
// fleet TLS, only fleet members, each only as itself. The handshake has already required a
// certificate signed by the fleet CA; this checks which member names it carries
// (server/fleet/logic/fleet_identity.h):
//  - calls that speak for one rank (Join, Leave, ReadLog, Report, Abort) need a certificate that
//    names that rank;
//  - calls that speak for no rank (the rendezvous store, Peer compute) need one that names some
//    member.
// Each refusal is PERMISSION_DENIED saying which rank was claimed and which ranks the
// certificate names (or that it names no member), is logged (at most once every 10 s, with the
// count of those not logged: a rogue process retries its join for as long as it runs), and counts as
// orthoserve_integrity_refusals_total{cause="not_a_member"}. Without fleet TLS every call is let
// through, as the fleet port trusts anything that reaches it then. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/server_context.h"
#include "server/fleet/wire/fleet_tls.h"
#include "server/metrics/metrics.h"

namespace orthoserve {

class FleetAccess {
 public:
  // `tls` null: no checks (a plaintext fleet port). `metrics` may be null; not owned, outlives this.
  FleetAccess(std::shared_ptr<const FleetTls> tls, Metrics* metrics) : tls_(std::move(tls)), metrics_(metrics) {}

  bool enforcing() const { return tls_ != nullptr; }

  // OK when the call's peer certificate names fleet rank `rank`. `call` names the call in the
  // message ("Join").
  absl::Status RequireRank(const grpc::ServerContextBase& context, absl::string_view call, int rank) const;
  // OK when the call's peer certificate names at least one fleet member.
  absl::Status RequireMember(const grpc::ServerContextBase& context, absl::string_view call) const;

 private:
  CertificateNames NamesOf(const grpc::ServerContextBase& context) const;
  absl::Status Refuse(absl::string_view call, const std::string& why) const;

  const std::shared_ptr<const FleetTls> tls_;
  Metrics* const metrics_;
  mutable absl::Mutex log_mu_;
  mutable absl::Time last_logged_ ABSL_GUARDED_BY(log_mu_) = absl::InfinitePast();
  mutable int64_t unlogged_ ABSL_GUARDED_BY(log_mu_) = 0;  // Refusals since the last one logged.
};

}  // namespace orthoserve
