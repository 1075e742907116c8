// Implementation of server/shm/call_fences.h.
#include "server/shm/call_fences.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/message_text.h"

namespace orthoserve {

CallFences::Hold& CallFences::Hold::operator=(Hold&& other) noexcept {
  if (this != &other) {
    Release();
    state_ = std::move(other.state_);
    key_ = std::move(other.key_);
  }
  return *this;
}

CallFences::Hold::~Hold() { Release(); }

void CallFences::Hold::Release() {
  if (state_ == nullptr) return;
  ReleaseKey(*state_, key_);
  state_.reset();
  key_.clear();
}

CallFences::CallFences(Options options) : state_(std::make_shared<State>(std::move(options))) {}

std::string CallFences::Key(absl::string_view tenant, absl::string_view call) {
  return absl::StrCat(tenant.size(), ":", tenant, call);  // Length-prefixed: no two pairs share a key.
}

absl::StatusOr<CallFences::Hold> CallFences::Take(absl::string_view tenant, absl::string_view call) {
  if (call.empty()) return Hold();
  std::string key = Key(tenant, call);
  absl::MutexLock lock(&state_->mu);
  Record& record = state_->records[key];
  if (record.fenced) {
    return absl::FailedPreconditionError(absl::StrCat(
        "call ", BoundedText(std::string(call)),
        " was fenced (FenceCall): its client gave up on it, and none of its messages may use a region any more"));
  }
  ++record.holds;
  return Hold(state_, std::move(key));
}

void CallFences::ReleaseKey(State& state, const std::string& key) {
  absl::MutexLock lock(&state.mu);
  auto it = state.records.find(key);
  if (it == state.records.end() || --it->second.holds > 0) return;
  if (!it->second.fenced) {
    state.records.erase(it);  // Nobody waits for it, and nothing need be remembered.
    return;
  }
  it->second.idle_since = state.options.now();
  state.released.SignalAll();
}

absl::Status CallFences::Fence(absl::string_view tenant, absl::string_view call, absl::Time deadline) {
  if (call.empty()) return absl::InvalidArgumentError("FenceCall needs the call's id (call_id)");
  const std::string tenant_key(tenant);
  const std::string key = Key(tenant, call);
  State& s = *state_;
  absl::MutexLock lock(&s.mu);
  auto [it, inserted] = s.records.try_emplace(key);
  if (!it->second.fenced) {
    it->second.fenced = true;
    if (it->second.holds == 0) it->second.idle_since = s.options.now();
    s.fenced_order[tenant_key].push_back(key);
    ++s.fenced_count;
  }
  // Wait on the record by key: pruning (by other fences) never forgets a record with holds.
  auto holds = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    auto r = s.records.find(key);
    return r == s.records.end() ? int64_t{0} : r->second.holds;
  };
  while (holds() > 0) {
    if (s.released.WaitWithDeadline(&s.mu, deadline) && holds() > 0) {
      PruneLocked(s, tenant_key);
      return absl::DeadlineExceededError(absl::StrCat(
          "call ", BoundedText(std::string(call)), " still holds ", holds(),
          " region slice(s) at the deadline: the server is still computing or writing for it; fence it again"));
    }
  }
  PruneLocked(s, tenant_key);
  return absl::OkStatus();
}

void CallFences::PruneLocked(State& s, const std::string& tenant) {
  auto order = s.fenced_order.find(tenant);
  if (order == s.fenced_order.end()) return;
  std::deque<std::string>& keys = order->second;
  const absl::Time now = s.options.now();
  // Oldest fence first: past the retention, or beyond the bound, an idle record is forgotten; a
  // record with holds is kept (and counted) whatever its age.
  int64_t left = static_cast<int64_t>(keys.size());
  std::deque<std::string> kept;
  for (std::string& key : keys) {
    auto it = s.records.find(key);
    const bool forget = it == s.records.end() ||
                        (it->second.holds == 0 && (left > s.options.max_fenced_per_tenant ||
                                                   now - it->second.idle_since >= s.options.retention));
    if (forget) {
      if (it != s.records.end()) s.records.erase(it);
      --left;
      --s.fenced_count;
    } else {
      kept.push_back(std::move(key));
    }
  }
  if (kept.empty()) {
    s.fenced_order.erase(order);
  } else {
    keys.swap(kept);
  }
}

int64_t CallFences::holds(absl::string_view tenant, absl::string_view call) const {
  absl::MutexLock lock(&state_->mu);
  auto it = state_->records.find(Key(tenant, call));
  return it == state_->records.end() ? 0 : it->second.holds;
}

int64_t CallFences::fenced() const {
  absl::MutexLock lock(&state_->mu);
  return state_->fenced_count;
}

}  // namespace orthoserve
