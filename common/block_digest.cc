// Implementation of common/block_digest.h.
#include "common/block_digest.h"

#include <vector>

#include "xxhash.h"

namespace orthoserve {

struct StreamDigest::State {
  State() : state(XXH3_createState()) {
    if (state == nullptr) throw std::bad_alloc();
    XXH3_64bits_reset(state);
  }
  ~State() { XXH3_freeState(state); }
  XXH3_state_t* state;
};

StreamDigest::StreamDigest() : state_(std::make_unique<State>()) {}
StreamDigest::~StreamDigest() = default;
StreamDigest::StreamDigest(StreamDigest&&) noexcept = default;
StreamDigest& StreamDigest::operator=(StreamDigest&&) noexcept = default;

void StreamDigest::Update(absl::string_view bytes) {
  if (!bytes.empty()) XXH3_64bits_update(state_->state, bytes.data(), bytes.size());
}

uint64_t StreamDigest::Value() const { return XXH3_64bits_digest(state_->state); }

uint64_t StepDigest(absl::Span<const DigestedBlock> blocks) {
  std::vector<uint64_t> words;
  words.reserve(1 + 6 * blocks.size());
  words.push_back(blocks.size());
  for (const DigestedBlock& b : blocks) {
    words.push_back(static_cast<uint64_t>(b.block.row_offset));
    words.push_back(static_cast<uint64_t>(b.block.col_offset));
    words.push_back(static_cast<uint64_t>(b.block.rows));
    words.push_back(static_cast<uint64_t>(b.block.cols));
    words.push_back(static_cast<uint64_t>(b.dtype));
    words.push_back(b.bytes);
  }
  return XXH3_64bits(words.data(), words.size() * sizeof(uint64_t));
}

}  // namespace orthoserve
