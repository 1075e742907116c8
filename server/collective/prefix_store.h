// PrefixStore: a view of another Store whose keys are scoped under "<prefix>/", so several fleet
// generations or subsystems can share one store without their keys colliding.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "server/collective/store.h"

namespace orthoserve {

// Forwards every call to `base` with "<prefix>/" put in front of each key; error messages are
// the base store's (they name the full key). Does not own `base`, which must outlive it.
// Thread-safe when `base` is.
class PrefixStore final : public Store {
 public:
  PrefixStore(Store* base, std::string prefix) : base_(base), prefix_(std::move(prefix)) {}

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;

  // The key `key` has in the base store.
  std::string FullKey(absl::string_view key) const;

 private:
  Store* const base_;
  const std::string prefix_;
};

}  // namespace orthoserve
