// collective_bench: bandwidth of a Collective the way nccl-tests reports it — time per call,
// algorithm bandwidth (bytes / time) and bus bandwidth (algbw × the op's traffic factor), with
// a check of every result. Ranks are threads over loopback GlooCollectives in one process.
//
//   collective_bench --world=4 --min_bytes=1024 --max_bytes=67108864 --iters=20
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "server/collective/collective.h"
#include "tests/util/rank_threads.h"

ABSL_FLAG(int, world, 2, "Number of ranks (threads, one GlooCollective each).");
ABSL_FLAG(int64_t, min_bytes, 1024, "Smallest message size in bytes.");
ABSL_FLAG(int64_t, max_bytes, 64 << 20, "Largest message size in bytes.");
ABSL_FLAG(int, factor, 4, "Size multiplier between rows.");
ABSL_FLAG(int, warmup, 3, "Untimed calls per size.");
ABSL_FLAG(int, iters, 10, "Timed calls per size.");
ABSL_FLAG(std::string, ops, "alltoallv,allgatherv,allreduce,broadcast", "Comma-separated operations to run.");

namespace orthoserve {
namespace {

using ::orthoserve::testing::RunRanks;

constexpr absl::Duration kTimeout = absl::Seconds(120);

// busbw = algbw × this factor, as nccl-tests defines it (the fraction of the data each rank's
// link carries relative to an ideal algorithm). nccl-tests' size is: alltoall, the bytes each
// rank sends in all; allgather, the bytes each rank receives in all; allreduce and broadcast,
// the buffer's bytes. The same sizes are used here.
double BusFactor(const std::string& op, int world) {
  const double n = world;
  if (op == "allreduce") return 2.0 * (n - 1) / n;
  if (op == "broadcast") return 1.0;
  return (n - 1) / n;  // alltoallv, allgatherv
}

// Buffers of one rank, reused across calls of a size.
struct RankBuffers {
  std::vector<uint8_t> send, recv;
  std::vector<float> values;
};

absl::Status RunOp(const std::string& op, Collective& c, RankBuffers& b, size_t size, bool check, int64_t* wrong) {
  const int world = c.world();
  const int rank = c.rank();
  const size_t per_peer = size / world;
  if (op == "alltoallv") {
    std::vector<size_t> counts(world, per_peer);
    b.send.resize(per_peer * world);
    b.recv.resize(per_peer * world);
    for (int p = 0; p < world; ++p) std::fill_n(b.send.data() + p * per_peer, per_peer, uint8_t(rank * 16 + p));
    absl::Status s = c.AllToAllv(b.send.data(), counts, b.recv.data(), counts, kTimeout);
    if (check) {
      for (int p = 0; p < world; ++p) {
        for (size_t i = 0; i < per_peer; ++i) *wrong += b.recv[p * per_peer + i] != uint8_t(p * 16 + rank);
      }
    }
    return s;
  }
  if (op == "allgatherv") {
    std::vector<size_t> counts(world, per_peer);
    b.send.assign(per_peer, uint8_t(rank + 1));
    b.recv.resize(per_peer * world);
    absl::Status s = c.AllGatherv(b.send.data(), per_peer, b.recv.data(), counts, kTimeout);
    if (check) {
      for (int p = 0; p < world; ++p) {
        for (size_t i = 0; i < per_peer; ++i) *wrong += b.recv[p * per_peer + i] != uint8_t(p + 1);
      }
    }
    return s;
  }
  if (op == "allreduce") {
    b.values.assign(size / sizeof(float), static_cast<float>(rank + 1));
    absl::Status s = c.AllReduceSum(absl::MakeSpan(b.values), kTimeout);
    if (check) {
      const float expected = world * (world + 1) / 2.0f;
      for (float v : b.values) *wrong += v != expected;
    }
    return s;
  }
  if (op == "broadcast") {
    b.send.assign(size, rank == 0 ? uint8_t(0x5a) : uint8_t(0));
    absl::Status s = c.Broadcast(b.send.data(), size, 0, kTimeout);
    if (check) {
      for (uint8_t v : b.send) *wrong += v != 0x5a;
    }
    return s;
  }
  return absl::InvalidArgumentError("unknown op " + op);
}

int Main() {
  const int world = absl::GetFlag(FLAGS_world);
  absl::StatusOr<std::vector<std::unique_ptr<Collective>>> group = testing::MakeGlooGroup(world, absl::Seconds(30));
  if (!group.ok()) {
    std::fprintf(stderr, "could not form the group: %s\n", group.status().ToString().c_str());
    return 1;
  }
  std::printf("# collective_bench: %s, world %d (ranks are threads in one process, loopback TCP)\n",
              (*group)[0]->name().c_str(), world);
  std::printf("# %-10s %12s %12s %10s %10s %8s\n", "op", "size(B)", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
  int failures = 0;
  const std::vector<std::string> ops = absl::StrSplit(absl::GetFlag(FLAGS_ops), ',');
  for (const std::string& op : ops) {
    for (int64_t size = absl::GetFlag(FLAGS_min_bytes); size <= absl::GetFlag(FLAGS_max_bytes);
         size *= absl::GetFlag(FLAGS_factor)) {
      // Sizes divisible by world (and by sizeof(float) for allreduce), as nccl-tests rounds.
      const size_t unit = world * sizeof(float);
      const size_t bytes = std::max<size_t>(unit, static_cast<size_t>(size) / unit * unit);
      std::vector<RankBuffers> buffers(world);
      std::vector<absl::Duration> took(world);
      std::vector<int64_t> wrong(world, 0);
      std::vector<absl::Status> status(world);
      RunRanks(world, [&](int rank) {
        Collective& c = *(*group)[rank];
        for (int i = 0; i < absl::GetFlag(FLAGS_warmup) && status[rank].ok(); ++i) {
          status[rank] = RunOp(op, c, buffers[rank], bytes, false, &wrong[rank]);
        }
        if (status[rank].ok()) status[rank] = c.Barrier(kTimeout);
        const absl::Time start = absl::Now();
        const int iters = absl::GetFlag(FLAGS_iters);
        for (int i = 0; i < iters && status[rank].ok(); ++i) {
          status[rank] = RunOp(op, c, buffers[rank], bytes, i == iters - 1, &wrong[rank]);
        }
        took[rank] = (absl::Now() - start) / iters;
      });
      for (const absl::Status& s : status) {
        if (!s.ok()) {
          std::fprintf(stderr, "%s failed: %s\n", op.c_str(), s.ToString().c_str());
          return 1;
        }
      }
      // The slowest rank's mean time per call: the collective is done when its last rank is.
      const absl::Duration t = *std::max_element(took.begin(), took.end());
      const double seconds = absl::ToDoubleSeconds(t);
      const double algbw = bytes / seconds / 1e9;
      int64_t total_wrong = 0;
      for (int64_t w : wrong) total_wrong += w;
      failures += total_wrong != 0;
      std::printf("  %-10s %12zu %12.1f %10.3f %10.3f %8lld\n", op.c_str(), bytes, seconds * 1e6, algbw,
                  algbw * BusFactor(op, world), static_cast<long long>(total_wrong));
    }
  }
  return failures == 0 ? 0 : 2;
}

}  // namespace
}  // namespace orthoserve

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return orthoserve::Main();
}
