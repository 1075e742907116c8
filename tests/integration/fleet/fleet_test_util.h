// Helpers shared by the fleet integration tests: free loopback ports for a fleet, torch.chunk
// blocks of a matrix over trainer ranks, and seeded random matrices.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <random>
#include <vector>

#include "common/shape.h"

namespace orthoserve::testing {

inline bool PortFree(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool free = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return free;
}

// A base port P whose fleet ports (P + r, P + 50 + r, P + 100 + r for r < world) are all free
// now, searched from `first` at a point that differs between processes. 0 if none.
inline int FreeBasePort(int world, int first) {
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int base = first + static_cast<int>((getpid() * 7919 + attempt * 131) % 2500) * 10;
    bool ok = true;
    for (int r = 0; r < world && ok; ++r) ok = PortFree(base + r) && PortFree(base + 50 + r) && PortFree(base + 100 + r);
    if (ok) return base;
  }
  return 0;
}

// Trainer rank `rank` of `world`'s torch.chunk block of a `shape` matrix split along
// `partition_dim` (0: rows, 1: columns).
inline Block ChunkBlock(Matrix2d shape, int partition_dim, int rank, int world) {
  if (partition_dim == 0) {
    std::vector<int64_t> o = ChunkOffsets(shape.rows, world);
    return Block{o[rank], 0, o[rank + 1] - o[rank], shape.cols};
  }
  std::vector<int64_t> o = ChunkOffsets(shape.cols, world);
  return Block{0, o[rank], shape.rows, o[rank + 1] - o[rank]};
}

// A standard-normal matrix from `seed`.
inline std::vector<float> RandomMatrix(Matrix2d m, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  std::vector<float> out(static_cast<size_t>(m.numel()));
  for (float& x : out) x = dist(rng);
  return out;
}

}  // namespace orthoserve::testing
