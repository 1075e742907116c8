// Bearer-token authentication: a token file maps tokens to tenants; a tenant sees and joins
// only its own groups (the tenant is part of every group key). The file is read again when it
// changes, so tokens rotate without a restart.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/server_context.h"

namespace orthoserve {

class TokenAuth {
 public:
  // No file: every caller is tenant "default".
  TokenAuth() = default;

  // Reads lines "TOKEN TENANT" ('#' starts a comment, blank lines skipped). INVALID_ARGUMENT
  // naming the file and line for a malformed line or a duplicate token, or for a file without
  // tokens; NOT_FOUND if the file cannot be read.
  //
  // With `reload_interval` > 0 the file is looked at again (its modification time, size and inode)
  // at most once per interval, on the first call that authenticates after it, and read again when
  // it changed: a token added works, and a removed one is refused, within the interval of the
  // change. Calls already admitted are not cut. A file that no longer reads, is malformed or holds
  // no tokens is not taken (a reload never turns authentication off): the tokens in force stay,
  // and a warning says why, once per change of the file.
  static absl::StatusOr<std::unique_ptr<TokenAuth>> FromFile(const std::string& path,
                                                             absl::Duration reload_interval = absl::ZeroDuration());

  bool required() const { return required_; }
  // The tenants the file names now (each once, in no particular order); none without a file.
  std::vector<std::string> tenants() const ABSL_LOCKS_EXCLUDED(mu_);

  // The caller's tenant from its "authorization: Bearer TOKEN" metadata. UNAUTHENTICATED when a
  // token is required and missing or unknown. Thread-safe.
  absl::StatusOr<std::string> Authenticate(const grpc::ServerContextBase& context) const ABSL_LOCKS_EXCLUDED(mu_);
  // The same from the metadata's value (null: no authorization metadata).
  absl::StatusOr<std::string> TenantOf(const absl::string_view* authorization) const ABSL_LOCKS_EXCLUDED(mu_);

  // Times the file was read again and taken (for tests and logs).
  int64_t reloads() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using Tokens = absl::flat_hash_map<std::string, std::string>;  // token -> tenant
  // What identifies a version of the file.
  struct Version {
    int64_t mtime_ns = 0;
    int64_t size = -1;
    ino_t inode = 0;
    bool operator==(const Version& o) const { return mtime_ns == o.mtime_ns && size == o.size && inode == o.inode; }
  };
  static absl::StatusOr<Tokens> Read(const std::string& path);
  static Version VersionOf(const std::string& path);
  // Reads the file again when its interval passed and it changed.
  void MaybeReload() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::string path_;
  bool required_ = false;
  absl::Duration reload_interval_ = absl::ZeroDuration();
  mutable absl::Mutex mu_;
  mutable std::shared_ptr<const Tokens> tokens_ ABSL_GUARDED_BY(mu_) = std::make_shared<const Tokens>();
  mutable absl::Time checked_ ABSL_GUARDED_BY(mu_);
  mutable Version version_ ABSL_GUARDED_BY(mu_);
  mutable Version refused_ ABSL_GUARDED_BY(mu_);  // A version not taken (warned about once).
  mutable int64_t reloads_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace orthoserve
