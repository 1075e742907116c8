// Real etcd members for the etcd client's tests: each on 127.0.0.1 with free ports and a
// temporary data directory, started from /usr/bin/etcd (Debian's etcd-server package; the
// ORTHOSERVE_ETCD_BINARY environment variable overrides the path) and killed by pid. They
// never use etcd's default ports, so a system etcd started by the package cannot collide.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/integration/binaries/subprocess.h"

namespace orthoserve::testing {

// The etcd binary, or FAILED_PRECONDITION naming the package to install.
absl::StatusOr<std::string> EtcdBinary();

// PEM files for a cluster that serves clients over mutual TLS (peers stay plaintext).
struct EtcdTlsFiles {
  std::string ca_file;           // Trusted by etcd for client certificates, and by the client.
  std::string server_cert_file;  // etcd's certificate (valid for 127.0.0.1).
  std::string server_key_file;
  std::string client_cert_file;  // The client certificate used to see that etcd is ready.
  std::string client_key_file;
};

// A single-member or multi-member etcd cluster on loopback. Not thread-safe.
class EtcdCluster {
 public:
  // Starts `members` members and waits until the cluster serves a read (20 s at most); with
  // `tls`, clients must connect with TLS and a client certificate signed by tls->ca_file.
  // FAILED_PRECONDITION when etcd is not installed; UNAVAILABLE when it did not come up (the
  // members' logs are named in the message).
  static absl::StatusOr<std::unique_ptr<EtcdCluster>> Start(int members = 1, const EtcdTlsFiles* tls = nullptr);

  // Kills every member (SIGKILL, by pid) and removes the data directories.
  ~EtcdCluster();

  // "127.0.0.1:port" of every member, comma-separated (EtcdOptions::endpoints).
  std::string endpoints() const;
  // The client endpoint of member `i`.
  std::string endpoint(int i) const;
  int size() const { return static_cast<int>(members_.size()); }

  // Kills member `i` (SIGKILL) and reaps it; its data stays.
  void Kill(int i);
  // Sends `signal` to member `i` (e.g. SIGSTOP / SIGCONT: a member that stops answering).
  void Signal(int i, int signal);
  // Starts member `i` again on its ports and data and waits until it serves a read.
  absl::Status Restart(int i);

 private:
  struct Member {
    std::string name;
    int client_port = 0;
    int peer_port = 0;
    std::string data_dir;
    std::unique_ptr<Subprocess> process;
  };

  EtcdCluster() = default;
  absl::Status Launch(int i);
  absl::Status WaitReady(const std::string& endpoints, absl::Duration timeout);

  std::optional<EtcdTlsFiles> tls_;
  std::string binary_;
  std::string root_;  // Temporary directory holding the data directories and logs.
  std::string initial_cluster_;
  std::vector<Member> members_;
};

}  // namespace orthoserve::testing
