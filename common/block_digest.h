// Digests of a trainer rank's blocks (ReadyReport::digest): a retry of a group step is answered
// from kept inputs only when its blocks' digest equals the kept original's (Coordinator,
// "Replays"). XXH3-64 (Debian's libxxhash): fast enough to run on every 32 KiB piece while it is
// still in the cache as BlockReceiver copies it, so a digest costs no pass of its own. It guards
// against a client that changed its inputs between attempts, not against an adversary (another
// tenant cannot reach a step of this one at all).
#pragma once

#include <cstdint>
#include <memory>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "common/shape.h"

namespace orthoserve {

// The digest of a byte stream fed in pieces; the same bytes give the same digest however they
// are cut. Not thread-safe.
class StreamDigest {
 public:
  StreamDigest();
  ~StreamDigest();
  StreamDigest(StreamDigest&&) noexcept;
  StreamDigest& operator=(StreamDigest&&) noexcept;

  void Update(absl::string_view bytes);
  // The digest of every byte so far.
  uint64_t Value() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// One matrix of a trainer rank's step as its digest sees it.
struct DigestedBlock {
  Block block;
  DType dtype = DType::kF32;
  uint64_t bytes = 0;  // StreamDigest of the block's bytes.
};

// The digest of a trainer rank's blocks, in order: each block's place, dtype and bytes.
uint64_t StepDigest(absl::Span<const DigestedBlock> blocks);

}  // namespace orthoserve
