// ExchangeStatuses (algorithms.h): the last collective step of a batch, after which every fleet
// rank reports the same status for every matrix — an owner's NS error reaches the ranks holding
// the matrix's blocks, and a rank whose local block was bad fails the matrix everywhere.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/status.h"
#include "server/distributed/algorithms.h"

namespace orthoserve::distributed_internal {
namespace {

// Per matrix and rank: the code of a primary failure on that rank (0: none) and its message's
// length in the second exchange.
struct StatusRecord {
  int32_t code = 0;
  uint32_t message_bytes = 0;
};

}  // namespace

absl::Status ExchangeStatuses(BatchContext& ctx) {
  const int world = ctx.world();
  if (world == 1) return absl::OkStatus();
  const size_t matrices = ctx.plan().matrices.size();
  if (matrices == 0) return absl::OkStatus();

  // Validation failures are identical everywhere and need no exchange.
  std::vector<StatusRecord> mine(matrices);
  std::string my_messages;
  for (size_t m = 0; m < matrices; ++m) {
    if (!ctx.Valid(static_cast<int>(m)) || ctx.failure(static_cast<int>(m)) != FailureKind::kPrimary) continue;
    const absl::Status& s = ctx.status(static_cast<int>(m));
    mine[m].code = static_cast<int32_t>(s.code());
    mine[m].message_bytes = static_cast<uint32_t>(s.message().size());
    my_messages.append(s.message().data(), s.message().size());
  }
  const size_t record_bytes = matrices * sizeof(StatusRecord);
  std::vector<StatusRecord> all(matrices * world);
  RETURN_IF_ERROR(ctx.Collect("status all-gatherv (codes)", [&] {
    return ctx.collective().AllGatherv(mine.data(), record_bytes, all.data(), std::vector<size_t>(world, record_bytes),
                                       ctx.timeout());
  }));

  std::vector<size_t> message_bytes(world, 0);
  size_t total = 0;
  for (int p = 0; p < world; ++p) {
    for (size_t m = 0; m < matrices; ++m) message_bytes[p] += all[p * matrices + m].message_bytes;
    total += message_bytes[p];
  }
  std::string messages(total, '\0');
  if (total > 0) {
    RETURN_IF_ERROR(ctx.Collect("status all-gatherv (messages)", [&] {
      return ctx.collective().AllGatherv(my_messages.data(), my_messages.size(), messages.data(), message_bytes,
                                         ctx.timeout());
    }));
  }

  // The first primary failure in rank order wins; a matrix with none keeps its local status.
  std::vector<size_t> offset(world, 0);
  for (int p = 1; p < world; ++p) offset[p] = offset[p - 1] + message_bytes[p - 1];
  std::vector<bool> decided(matrices, false);
  for (int p = 0; p < world; ++p) {
    size_t cursor = offset[p];
    for (size_t m = 0; m < matrices; ++m) {
      const StatusRecord& r = all[p * matrices + m];
      if (r.code != 0 && !decided[m]) {
        ctx.SetStatus(static_cast<int>(m),
                      absl::Status(static_cast<absl::StatusCode>(r.code), messages.substr(cursor, r.message_bytes)));
        decided[m] = true;
      }
      cursor += r.message_bytes;
    }
  }
  return absl::OkStatus();
}

}  // namespace orthoserve::distributed_internal
