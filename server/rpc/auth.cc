// Implementation of server/rpc/auth.h.
#include "server/rpc/auth.h"

#include <sys/stat.h>

#include <fstream>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/logging.h"

namespace orthoserve {

absl::StatusOr<TokenAuth::Tokens> TokenAuth::Read(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("--token-file ", path, " cannot be read"));
  Tokens tokens;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    absl::string_view text = absl::StripAsciiWhitespace(line);
    if (text.empty() || text[0] == '#') continue;
    std::vector<absl::string_view> parts = absl::StrSplit(text, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (parts.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("--token-file ", path, " line ", number, ": expected \"TOKEN TENANT\""));
    }
    if (!tokens.emplace(std::string(parts[0]), std::string(parts[1])).second) {
      return absl::InvalidArgumentError(absl::StrCat("--token-file ", path, " line ", number, ": duplicate token"));
    }
  }
  if (tokens.empty()) return absl::InvalidArgumentError(absl::StrCat("--token-file ", path, " holds no tokens"));
  return tokens;
}

TokenAuth::Version TokenAuth::VersionOf(const std::string& path) {
  struct stat st = {};
  if (stat(path.c_str(), &st) != 0) return Version{};
  return Version{static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec,
                 static_cast<int64_t>(st.st_size), st.st_ino};
}

absl::StatusOr<std::unique_ptr<TokenAuth>> TokenAuth::FromFile(const std::string& path, absl::Duration reload_interval) {
  auto auth = std::make_unique<TokenAuth>();
  const Version version = VersionOf(path);
  absl::StatusOr<Tokens> tokens = Read(path);
  if (!tokens.ok()) return tokens.status();
  auth->path_ = path;
  auth->required_ = true;
  auth->reload_interval_ = reload_interval;
  absl::MutexLock lock(&auth->mu_);
  auth->tokens_ = std::make_shared<const Tokens>(*std::move(tokens));
  auth->version_ = version;
  auth->checked_ = absl::Now();
  return auth;
}

void TokenAuth::MaybeReload() const {
  const absl::Time now = absl::Now();
  if (now - checked_ < reload_interval_) return;
  checked_ = now;
  const Version version = VersionOf(path_);
  if (version == version_ || version == refused_) return;
  absl::StatusOr<Tokens> tokens = Read(path_);
  if (!tokens.ok()) {
    refused_ = version;
    LOG_WARNING("rpc") << "the token file changed but is not taken (the " << tokens_->size()
                       << " tokens in force stay): " << tokens.status().message();
    return;
  }
  LOG_INFO("rpc") << "--token-file " << path_ << " read again: " << tokens->size() << " tokens (were "
                  << tokens_->size() << ")";
  tokens_ = std::make_shared<const Tokens>(*std::move(tokens));
  version_ = version;
  refused_ = Version{};
  ++reloads_;
}

std::vector<std::string> TokenAuth::tenants() const {
  std::shared_ptr<const Tokens> tokens;
  {
    absl::MutexLock lock(&mu_);
    tokens = tokens_;
  }
  absl::flat_hash_set<std::string> seen;
  std::vector<std::string> names;
  for (const auto& [token, tenant] : *tokens) {
    if (seen.insert(tenant).second) names.push_back(tenant);
  }
  return names;
}

int64_t TokenAuth::reloads() const {
  absl::MutexLock lock(&mu_);
  return reloads_;
}

absl::StatusOr<std::string> TokenAuth::Authenticate(const grpc::ServerContextBase& context) const {
  if (!required_) return std::string("default");
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return TenantOf(nullptr);
  const absl::string_view value(it->second.data(), it->second.size());
  return TenantOf(&value);
}

absl::StatusOr<std::string> TokenAuth::TenantOf(const absl::string_view* authorization) const {
  if (!required_) return std::string("default");
  if (authorization == nullptr) {
    return absl::UnauthenticatedError("this server requires a bearer token (metadata \"authorization: Bearer TOKEN\")");
  }
  absl::string_view value = *authorization;
  if (!absl::ConsumePrefix(&value, "Bearer ")) {
    return absl::UnauthenticatedError("the authorization metadata must be \"Bearer TOKEN\"");
  }
  std::shared_ptr<const Tokens> tokens;
  {
    absl::MutexLock lock(&mu_);
    if (reload_interval_ > absl::ZeroDuration()) MaybeReload();
    tokens = tokens_;
  }
  auto tenant = tokens->find(std::string(absl::StripAsciiWhitespace(value)));
  if (tenant == tokens->end()) return absl::UnauthenticatedError("the bearer token is not known to this server");
  return tenant->second;
}

}  // namespace orthoserve
