// Implementation of server/rpc/auth.h.
#include "server/rpc/auth.h"

#include <fstream>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace orthoserve {

absl::StatusOr<TokenAuth> TokenAuth::FromFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("--token-file ", path, " cannot be read"));
  TokenAuth auth;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    absl::string_view text = absl::StripAsciiWhitespace(line);
    if (text.empty() || text[0] == '#') continue;
    std::vector<absl::string_view> parts = absl::StrSplit(text, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (parts.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("--token-file ", path, " line ", number, ": expected \"TOKEN TENANT\""));
    }
    if (!auth.tenants_.emplace(std::string(parts[0]), std::string(parts[1])).second) {
      return absl::InvalidArgumentError(absl::StrCat("--token-file ", path, " line ", number, ": duplicate token"));
    }
  }
  if (auth.tenants_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--token-file ", path, " holds no tokens"));
  }
  return auth;
}

std::vector<std::string> TokenAuth::tenants() const {
  absl::flat_hash_set<std::string> seen;
  std::vector<std::string> names;
  for (const auto& [token, tenant] : tenants_) {
    if (seen.insert(tenant).second) names.push_back(tenant);
  }
  return names;
}

absl::StatusOr<std::string> TokenAuth::Authenticate(const grpc::ServerContextBase& context) const {
  if (tenants_.empty()) return std::string("default");
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return absl::UnauthenticatedError("this server requires a bearer token (metadata \"authorization: Bearer TOKEN\")");
  }
  absl::string_view value(it->second.data(), it->second.size());
  if (!absl::ConsumePrefix(&value, "Bearer ")) {
    return absl::UnauthenticatedError("the authorization metadata must be \"Bearer TOKEN\"");
  }
  auto tenant = tenants_.find(std::string(absl::StripAsciiWhitespace(value)));
  if (tenant == tenants_.end()) return absl::UnauthenticatedError("the bearer token is not known to this server");
  return tenant->second;
}

}  // namespace orthoserve
