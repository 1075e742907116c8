// What every call of the public service shares: its options, admission, authentication,
// metrics and the step layer's services. Owned by OrthogonalizerService; the calls
// (stream_call.h, unary_call.h) hold a reference and never outlive it (gRPC ends every call
// before the service is destroyed).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "common/buffer_pool.h"
#include "server/metrics/metrics.h"
#include "server/rpc/admission.h"
#include "server/rpc/auth.h"
#include "server/rpc/progress_watchdog.h"
#include "server/rpc/unary_gate.h"
#include "server/shm/region_registry.h"
#include "server/step/step.h"

namespace orthoserve {

// The largest --max-group-world a server accepts (the trainer ranks of one group step).
inline constexpr int kMaxGroupWorld = 1 << 16;

struct ServiceOptions {
  int64_t max_matrix_elements = int64_t{1} << 28;  // Per matrix (global shape).
  int64_t chunk_bytes = int64_t{4} << 20;          // Largest DataChunk accepted and sent.
  int64_t max_message_bytes = int64_t{64} << 20;   // gRPC message limit (reported in GetServerInfo).
  int max_matrices_per_step = 4096;                // num_matrices of one step or unary call.
  // Metadata bounds, checked at ingress before anything is allocated for the field
  // (INVALID_ARGUMENT naming the field and the flag beyond):
  int max_name_bytes = 1024;    // Bytes of a matrix name, and of the header's job, group and run_id.
  int max_shape_dims = 16;      // Dims of one MatrixSpec.shape.
  int max_group_world = 16384;  // StepHeader.world; at most kMaxGroupWorld.
  // Group steps of one tenant pending on the fleet at once (Fleet::Options, which enforces it;
  // 0: no limit). Here to be reported in GetServerInfo.
  int max_tenant_pending_steps = 256;
  // Serve group steps (world > 1) whose header has no run_id, as the run "" (which never shares a
  // step with a run that has an id); false: refuse them with INVALID_ARGUMENT.
  bool allow_group_steps_without_run_id = false;
  absl::Duration rendezvous_timeout = absl::Seconds(60);  // Reported in GetServerInfo.
  // A stream waiting on its client (for its next message, or for it to read) that moves fewer
  // than stream_min_progress_bytes in this long is ended (ProgressWatchdog): nothing at all, or a
  // trickle; <= 0: never.
  absl::Duration stream_progress_timeout = absl::Seconds(60);
  int64_t stream_min_progress_bytes = int64_t{16} << 10;
  Admission::Options admission;
  // Unary call slots and their waiter queue (unary_gate.h). max_concurrent <= 0:
  // DefaultMaxConcurrentUnary.
  UnaryGate::Options unary;
  // Reused stream buffers; max_idle_bytes is capped at admission.max_inflight_bytes.
  BufferPool::Options buffers;
  std::string version;
  std::string shm_socket;  // The shared-memory handover socket (--shm-socket), reported in GetServerInfo.
  std::string shm_cuda_device;  // The GPU whose CUDA IPC handles the socket takes (its UUID); empty: none.
};

// The bytes a unary call reserves before its body is read: room for the largest request and
// response (2 × max_message_bytes), or the whole in-flight budget, server's or tenant's, when that
// is smaller.
inline int64_t UnaryReservationBytes(const ServiceOptions& o) {
  return std::min({2 * o.max_message_bytes, o.admission.max_inflight_bytes, o.admission.max_tenant_inflight_bytes});
}

// The default --max-concurrent-unary: as many calls as the server's in-flight budget holds
// reservations for (at least 1), so that unary calls holding slots never wait on each other's
// bytes.
inline int DefaultMaxConcurrentUnary(const ServiceOptions& o) {
  const int64_t calls = o.admission.max_inflight_bytes / std::max<int64_t>(UnaryReservationBytes(o), 1);
  return static_cast<int>(std::clamp<int64_t>(calls, 1, 1 << 20));
}

inline UnaryGate::Options UnaryGateOptions(const ServiceOptions& o) {
  UnaryGate::Options u = o.unary;
  if (u.max_concurrent <= 0) u.max_concurrent = DefaultMaxConcurrentUnary(o);
  return u;
}

struct ServiceState {
  ServiceState(const ServiceOptions& options, const StepServices& steps, const TokenAuth* auth,
               std::shared_ptr<BufferPool> buffers)
      : options(options),
        steps(steps),
        metrics(steps.metrics),
        auth(auth),
        admission(options.admission, steps.metrics),
        unary_gate(UnaryGateOptions(options), steps.metrics),
        buffers(std::move(buffers)),
        watchdog(options.stream_progress_timeout) {}

  const ServiceOptions options;
  const StepServices steps;  // Without `method`, which each call sets.
  Metrics* const metrics;
  const TokenAuth* const auth;
  Admission admission;
  UnaryGate unary_gate;
  const std::shared_ptr<BufferPool> buffers;  // steps.buffers points into it.
  ProgressWatchdog watchdog;
  std::atomic<bool> draining{false};
  std::atomic<int> inflight{0};  // Calls in progress.
  // Shared-memory regions (not owned; outlives the service), or null when they are off.
  RegionRegistry* regions = nullptr;
};

}  // namespace orthoserve
