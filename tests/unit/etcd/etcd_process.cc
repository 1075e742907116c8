// Implementation of tests/unit/etcd/etcd_process.h.
#include "tests/unit/etcd/etcd_process.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "server/etcd/etcd_client.h"

namespace orthoserve::testing {

absl::StatusOr<std::string> EtcdBinary() {
  const char* env = getenv("ORTHOSERVE_ETCD_BINARY");
  const std::string path = env != nullptr && *env != '\0' ? env : "/usr/bin/etcd";
  if (access(path.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("etcd not found at ", path,
                     ": install Debian's etcd-server package (scripts/setup.sh does), or set "
                     "ORTHOSERVE_ETCD_BINARY"));
  }
  return path;
}

absl::StatusOr<std::unique_ptr<EtcdCluster>> EtcdCluster::Start(int members, const EtcdTlsFiles* tls) {
  absl::StatusOr<std::string> binary = EtcdBinary();
  if (!binary.ok()) return binary.status();
  std::unique_ptr<EtcdCluster> cluster(new EtcdCluster());
  cluster->binary_ = *binary;
  if (tls != nullptr) cluster->tls_ = *tls;
  std::string root_template = (std::filesystem::temp_directory_path() / "orthoserve-etcd-XXXXXX").string();
  if (mkdtemp(root_template.data()) == nullptr) return absl::InternalError("mkdtemp failed");
  cluster->root_ = root_template;
  std::vector<std::string> peers;
  for (int i = 0; i < members; ++i) {
    Member member;
    member.name = absl::StrCat("m", i);
    absl::StatusOr<int> client_port = PickFreePort();
    absl::StatusOr<int> peer_port = PickFreePort();
    if (!client_port.ok()) return client_port.status();
    if (!peer_port.ok()) return peer_port.status();
    member.client_port = *client_port;
    member.peer_port = *peer_port;
    member.data_dir = absl::StrCat(cluster->root_, "/", member.name, ".etcd");
    peers.push_back(absl::StrCat(member.name, "=http://127.0.0.1:", member.peer_port));
    cluster->members_.push_back(std::move(member));
  }
  cluster->initial_cluster_ = absl::StrJoin(peers, ",");
  for (int i = 0; i < members; ++i) {
    if (absl::Status s = cluster->Launch(i); !s.ok()) return s;
  }
  if (absl::Status s = cluster->WaitReady(cluster->endpoints(), absl::Seconds(20)); !s.ok()) {
    return s;
  }
  return cluster;
}

EtcdCluster::~EtcdCluster() {
  for (Member& member : members_) member.process.reset();  // SIGKILL by pid and reap.
  if (!root_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(root_, ignored);
  }
}

std::string EtcdCluster::endpoint(int i) const { return absl::StrCat("127.0.0.1:", members_[i].client_port); }

std::string EtcdCluster::endpoints() const {
  std::vector<std::string> all;
  all.reserve(members_.size());
  for (int i = 0; i < size(); ++i) all.push_back(endpoint(i));
  return absl::StrJoin(all, ",");
}

absl::Status EtcdCluster::Launch(int i) {
  Member& m = members_[i];
  const std::string client_url = absl::StrCat(tls_ ? "https" : "http", "://127.0.0.1:", m.client_port);
  const std::string peer_url = absl::StrCat("http://127.0.0.1:", m.peer_port);
  std::vector<std::string> argv = {
      binary_, "--name", m.name, "--data-dir", m.data_dir, "--listen-client-urls", client_url,
      "--advertise-client-urls", client_url, "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
      "--initial-cluster", initial_cluster_, "--initial-cluster-token", absl::StrCat("orthoserve-test-", getpid()),
      "--initial-cluster-state", "new",
      // Fast elections keep the tests short; etcd's lease minimum follows (about 1 s).
      "--heartbeat-interval", "50", "--election-timeout", "500", "--logger", "zap", "--log-outputs", "stderr",
      // A restarted member rejoins from its data directory; these flags are then ignored.
  };
  if (tls_) {
    for (const std::string& arg :
         {std::string("--cert-file"), tls_->server_cert_file, std::string("--key-file"), tls_->server_key_file,
          std::string("--trusted-ca-file"), tls_->ca_file, std::string("--client-cert-auth")}) {
      argv.push_back(arg);
    }
  }
  absl::StatusOr<std::unique_ptr<Subprocess>> process = Subprocess::Start(argv, absl::StrCat(root_, "/", m.name));
  if (!process.ok()) return process.status();
  m.process = std::move(*process);
  return absl::OkStatus();
}

absl::Status EtcdCluster::WaitReady(const std::string& endpoints, absl::Duration timeout) {
  etcd::EtcdOptions options;
  options.endpoints = endpoints;
  options.dial_timeout = absl::Milliseconds(200);
  options.call_timeout = absl::Seconds(1);
  if (tls_) {
    options.tls_ca_file = tls_->ca_file;
    options.tls_cert_file = tls_->client_cert_file;
    options.tls_key_file = tls_->client_key_file;
  }
  absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> client = etcd::EtcdClient::Create(options);
  if (!client.ok()) return client.status();
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status last;
  while (absl::Now() < deadline) {
    for (Member& m : members_) {
      if (m.process != nullptr && !m.process->Running()) {
        return absl::UnavailableError(
            absl::StrCat("etcd member ", m.name, " exited: ", m.process->Stderr().substr(0, 4000)));
      }
    }
    last = (*client)->Get("orthoserve-test-ready").status();
    if (last.ok()) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::UnavailableError(absl::StrCat("etcd at ", endpoints, " not ready within ", absl::FormatDuration(timeout),
                                             " (", last.ToString(), "); logs under ", root_));
}

void EtcdCluster::Kill(int i) { members_[i].process.reset(); }

void EtcdCluster::Signal(int i, int signal) {
  if (members_[i].process != nullptr) members_[i].process->Signal(signal);
}

absl::Status EtcdCluster::Restart(int i) {
  members_[i].process.reset();
  if (absl::Status s = Launch(i); !s.ok()) return s;
  return WaitReady(endpoint(i), absl::Seconds(20));
}

}  // namespace orthoserve::testing
