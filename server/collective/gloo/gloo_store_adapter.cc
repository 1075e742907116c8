// GlooStoreAdapter: our Store behind Gloo's throwing store interface.
#include "server/collective/gloo/gloo_store_adapter.h"

#include "server/collective/gloo/gloo_status.h"

namespace orthoserve::gloo_internal {

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  absl::Status status = store_->Set(key, absl::string_view(data.data(), data.size()));
  if (!status.ok()) throw StoreError(std::move(status));
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  absl::StatusOr<std::string> value = store_->Get(key, timeout_);
  if (!value.ok()) throw StoreError(std::move(value).status());
  return std::vector<char>(value->begin(), value->end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) { wait(keys, absl::ToChronoMilliseconds(timeout_)); }

void GlooStoreAdapter::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  absl::Status status = store_->Wait(keys, absl::FromChrono(timeout));
  if (!status.ok()) throw StoreError(std::move(status));
}

}  // namespace orthoserve::gloo_internal
