// Implementation of tests/integration/binaries/subprocess.h.
#include "tests/integration/binaries/subprocess.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

extern char** environ;

namespace orthoserve::testing {
namespace {

int DecodeWaitStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(const std::vector<std::string>& argv,
                                                              const std::string& log_prefix) {
  if (argv.empty()) return absl::InvalidArgumentError("empty argv");
  const std::string out_path = log_prefix + ".out";
  const std::string err_path = log_prefix + ".err";
  const int out_fd = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int err_fd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out_fd < 0 || err_fd < 0) {
    if (out_fd >= 0) close(out_fd);
    if (err_fd >= 0) close(err_fd);
    return absl::InternalError(absl::StrCat("cannot create ", log_prefix, ".out/.err: ", std::strerror(errno)));
  }
  // Everything exec needs is prepared before fork: the child only calls async-signal-safe functions.
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (!absl::StartsWith(*e, "ORTHOSERVE_")) env.push_back(*e);
  }
  env.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(out_fd);
    close(err_fd);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    const int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, 0);
    dup2(out_fd, 1);
    dup2(err_fd, 2);
    execve(args[0], args.data(), env.data());
    _exit(127);
  }
  close(out_fd);
  close(err_fd);
  return std::unique_ptr<Subprocess>(new Subprocess(pid, log_prefix));
}

Subprocess::~Subprocess() {
  if (Running()) {
    kill(pid_, SIGKILL);
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
}

bool Subprocess::Running() {
  if (reaped_) return false;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    reaped_ = true;
    exit_code_ = DecodeWaitStatus(status);
    return false;
  }
  return r == 0 || (r < 0 && errno == EINTR);
}

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (Running()) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("pid ", pid_, " still running after ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
  return exit_code_;
}

void Subprocess::Signal(int signal) {
  if (!reaped_) kill(pid_, signal);
}

std::string Subprocess::Stdout() const { return ReadFileOrEmpty(log_prefix_ + ".out"); }
std::string Subprocess::Stderr() const { return ReadFileOrEmpty(log_prefix_ + ".err"); }

ProcessResult RunProcess(const std::vector<std::string>& argv, const std::string& log_prefix, absl::Duration timeout) {
  ProcessResult result;
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Start(argv, log_prefix);
  if (!p.ok()) {
    result.err = std::string(p.status().message());
    return result;
  }
  absl::StatusOr<int> code = (*p)->Wait(timeout);
  result.exit_code = code.ok() ? *code : -1;
  if (!code.ok()) (*p)->Signal(SIGKILL);
  result.out = (*p)->Stdout();
  result.err = (*p)->Stderr();
  if (!code.ok()) result.err += absl::StrCat("\n[test] ", code.status().message());
  return result;
}

namespace {

// One free port from the kernel (bound to port 0, then closed).
absl::StatusOr<int> KernelFreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int e = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("bind/getsockname: ", std::strerror(e)));
  }
  close(fd);
  return static_cast<int>(ntohs(addr.sin_port));
}

}  // namespace

absl::StatusOr<int> PickFreePort() {
  // The kernel may hand the same port out again once it is closed (seen: an etcd member given
  // one port for its client and its peer URLs); this process never hands one out twice.
  static absl::Mutex mu(absl::kConstInit);
  static std::set<int>* given = new std::set<int>();
  for (int attempt = 0; attempt < 64; ++attempt) {
    absl::StatusOr<int> port = KernelFreePort();
    if (!port.ok()) return port.status();
    absl::MutexLock lock(&mu);
    if (given->insert(*port).second) return port;
  }
  return absl::InternalError("no free loopback port not handed out before, in 64 tries");
}

std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace orthoserve::testing
