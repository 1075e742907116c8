// PrefixStore: key scoping over another Store.
#include "server/collective/prefix_store.h"

#include "absl/strings/str_cat.h"

namespace orthoserve {

std::string PrefixStore::FullKey(absl::string_view key) const { return absl::StrCat(prefix_, "/", key); }

absl::Status PrefixStore::Set(absl::string_view key, absl::string_view value) {
  return base_->Set(FullKey(key), value);
}

absl::StatusOr<std::string> PrefixStore::Get(absl::string_view key, absl::Duration timeout) {
  return base_->Get(FullKey(key), timeout);
}

absl::StatusOr<int64_t> PrefixStore::Add(absl::string_view key, int64_t delta) {
  return base_->Add(FullKey(key), delta);
}

absl::Status PrefixStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const std::string& key : keys) full.push_back(FullKey(key));
  return base_->Wait(full, timeout);
}

}  // namespace orthoserve
