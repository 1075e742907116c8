// GlooStoreAdapter: presents our Store (store.h) as the gloo::rendezvous::Store that Gloo's
// connectFullMesh reads transport addresses from.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gloo/rendezvous/store.h"
#include "server/collective/store.h"

namespace orthoserve::gloo_internal {

// Gloo's store API reports failure by throwing: every method throws StoreError carrying our
// Store's status (callers catch it, see gloo_status.h). get() blocks up to `timeout` for the
// key; wait() without a timeout uses `timeout`. Does not own `store`, which must outlive it.
class GlooStoreAdapter final : public ::gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(::orthoserve::Store* store, absl::Duration timeout) : store_(store), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  ::orthoserve::Store* const store_;
  const absl::Duration timeout_;
};

}  // namespace orthoserve::gloo_internal
