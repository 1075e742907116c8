// Implementation of server/step/block_receiver.h.
#include "server/step/block_receiver.h"

#include <algorithm>
#include <cstring>

namespace orthoserve {
namespace {

// Bytes copied and then scanned at a time: small enough to be scanned from the L1/L2 cache.
constexpr size_t kPiece = 32 << 10;

}  // namespace

void BlockReceiver::Append(absl::string_view bytes) {
  const int64_t elem = static_cast<int64_t>(ElementSize(dtype_));
  for (size_t offset = 0; offset < bytes.size(); offset += kPiece) {
    const size_t n = std::min(kPiece, bytes.size() - offset);
    std::memcpy(dst_ + received_, bytes.data() + offset, n);
    if (digest_ != nullptr) digest_->Update(absl::string_view(dst_ + received_, n));
    received_ += static_cast<int64_t>(n);
    if (first_non_finite_ >= 0) continue;
    const int64_t whole = received_ / elem;
    const int64_t bad = FindNonFinite(dtype_, dst_ + scanned_ * elem, static_cast<size_t>(whole - scanned_));
    if (bad >= 0) first_non_finite_ = scanned_ + bad;
    scanned_ = whole;
  }
}

void BlockReceiver::TakeInPlace(const char* data) {
  const int64_t elem = static_cast<int64_t>(ElementSize(dtype_));
  const int64_t whole = size_ / elem;
  if (digest_ != nullptr) digest_->Update(absl::string_view(data, static_cast<size_t>(size_)));
  first_non_finite_ = FindNonFinite(dtype_, data, static_cast<size_t>(whole));
  received_ = size_;
  scanned_ = whole;
}

void BlockReceiver::TakeUnscanned() {
  TakeScanned(-1);
  scan_deferred_ = true;
}

void BlockReceiver::TakeScanned(int64_t first_non_finite) {
  first_non_finite_ = first_non_finite;
  received_ = size_;
  scanned_ = size_ / static_cast<int64_t>(ElementSize(dtype_));
}

}  // namespace orthoserve
