// Bearer-token authentication: a token file maps tokens to tenants; a tenant sees and joins
// only its own groups (the tenant is part of every group key).
#pragma once

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "grpcpp/server_context.h"

namespace orthoserve {

class TokenAuth {
 public:
  // No file: every caller is tenant "default".
  TokenAuth() = default;

  // Reads lines "TOKEN TENANT" ('#' starts a comment, blank lines skipped). INVALID_ARGUMENT
  // naming the file and line for a malformed line or a duplicate token; NOT_FOUND if the file
  // cannot be read.
  static absl::StatusOr<TokenAuth> FromFile(const std::string& path);

  bool required() const { return !tenants_.empty(); }
  // The tenants the file names (each once, in no particular order); none without a file.
  std::vector<std::string> tenants() const;

  // The caller's tenant from its "authorization: Bearer TOKEN" metadata. UNAUTHENTICATED when a
  // token is required and missing or unknown.
  absl::StatusOr<std::string> Authenticate(const grpc::ServerContextBase& context) const;

 private:
  absl::flat_hash_map<std::string, std::string> tenants_;  // token -> tenant
};

}  // namespace orthoserve
