// Receives one matrix block's bytes, chunk after chunk, into its final buffer (one copy, no
// zero fill) and looks for NaN and Inf — and, for a group step, digests them (block_digest.h) —
// while the bytes are still in the cache: the server's only pass over an input before compute
// (docs/architecture.md); a lone client's block read in place from a shared-memory region may
// leave that check to the computation (TakeUnscanned). Not thread-safe; one per matrix.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/strings/string_view.h"
#include "common/dtype.h"
#include "common/block_digest.h"

namespace orthoserve {

class BlockReceiver {
 public:
  BlockReceiver() = default;
  // Receives `size` bytes of `dtype` elements into `dst` (not owned; `size` bytes long), and
  // digests them when `digest`.
  BlockReceiver(DType dtype, char* dst, int64_t size, bool digest = false)
      : dtype_(dtype), dst_(dst), size_(size), digest_(digest ? std::make_unique<StreamDigest>() : nullptr) {}

  // Copies `bytes` after those received so far. Requires received() + bytes.size() <= size().
  void Append(absl::string_view bytes);

  // Takes the whole block where it already is (`data`, size() bytes: a shared-memory region, read
  // in place) instead of copying it to the destination: scans it for NaN and Inf (and digests
  // it) in one pass. Requires received() == 0.
  void TakeInPlace(const char* data);

  // Takes the whole block where it is and this process cannot read it (a CUDA IPC region, in
  // device memory): `first_non_finite` is the verdict of a scan made there (-1: all finite).
  // Nothing is digested. Requires received() == 0.
  void TakeScanned(int64_t first_non_finite);

  // Takes the whole block where it is (a shared-memory region) without looking at it: the
  // computation checks it instead (Backend::FailsNonFiniteInput), in the pass it makes anyway,
  // and scan_deferred() tells whoever reads its verdict to look for the element when it failed.
  // first_non_finite() stays -1. Nothing is digested. Requires received() == 0.
  void TakeUnscanned();

  int64_t size() const { return size_; }
  int64_t received() const { return received_; }
  bool complete() const { return received_ == size_; }
  // The index of the first NaN or Inf among the whole elements received so far, or -1.
  int64_t first_non_finite() const { return first_non_finite_; }
  // The block was taken by TakeUnscanned: first_non_finite() says nothing.
  bool scan_deferred() const { return scan_deferred_; }
  // The StreamDigest of the bytes received so far; 0 when not digesting.
  uint64_t digest() const { return digest_ == nullptr ? 0 : digest_->Value(); }

 private:
  DType dtype_ = DType::kF32;
  char* dst_ = nullptr;
  int64_t size_ = 0;
  int64_t received_ = 0;
  int64_t scanned_ = 0;  // Elements looked at.
  int64_t first_non_finite_ = -1;
  bool scan_deferred_ = false;
  std::unique_ptr<StreamDigest> digest_;  // Null: not digesting.
};

}  // namespace orthoserve
