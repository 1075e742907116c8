// Implementation of server/shm/handover_socket.h.
#include "server/shm/handover_socket.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "server/shm/mapped_region.h"

namespace orthoserve {
namespace {

std::string Errno(absl::string_view what) { return absl::StrCat(what, ": ", std::strerror(errno)); }

absl::StatusOr<sockaddr_un> AddressOf(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat("--shm-socket must be an absolute path, not \"", path, "\""));
  }
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("--shm-socket \"", path, "\" is longer than the ",
                                                   sizeof(addr.sun_path) - 1, " bytes a socket path may have"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  return addr;
}

bool SameFile(const std::string& a, const std::string& b) {
  if (a == b) return true;
  struct stat sa, sb;
  return stat(a.c_str(), &sa) == 0 && stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

// Removes a stale socket at `addr`; refuses a live one or a file that is not a socket.
absl::Status ClearPath(const sockaddr_un& addr, const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::UnavailableError(Errno(absl::StrCat("--shm-socket: lstat ", path)));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("--shm-socket \"", path, "\" exists and is not a socket; choose another path"));
  }
  const int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (probe < 0) return absl::UnavailableError(Errno("socket"));
  const bool live = connect(probe, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
  close(probe);
  if (live) {
    return absl::FailedPreconditionError(
        absl::StrCat("--shm-socket \"", path, "\" is served by another process (a running server?)"));
  }
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return absl::UnavailableError(Errno(absl::StrCat("--shm-socket: removing the stale socket ", path)));
  }
  LOG_INFO("shm") << "removed the stale socket " << path;
  return absl::OkStatus();
}

void Answer(int conn, absl::string_view line) {
  std::string text = absl::StrCat(line, "\n");
  // One short write on a fresh socket, which its empty send buffer takes whole without blocking;
  // MSG_NOSIGNAL: a client gone is not a SIGPIPE.
  (void)send(conn, text.data(), text.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

void AnswerError(int conn, const absl::Status& status) {
  Answer(conn, absl::StrCat("ERR ", absl::StatusCodeToString(status.code()), " ", status.message()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<HandoverSocket>> HandoverSocket::Start(Options options, RegionRegistry* registry) {
  absl::StatusOr<sockaddr_un> addr = AddressOf(options.path);
  if (!addr.ok()) return addr.status();
  for (const std::string& reserved : options.reserved_paths) {
    if (!reserved.empty() && SameFile(options.path, reserved)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--shm-socket \"", options.path, "\" is a file the server uses itself (", reserved, ")"));
    }
  }
  if (options.peer_uids.empty()) options.peer_uids.push_back(geteuid());
  if (absl::Status cleared = ClearPath(*addr, options.path); !cleared.ok()) return cleared;
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return absl::UnavailableError(Errno("socket"));
  if (bind(fd, reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) != 0) {
    const std::string error = Errno(absl::StrCat("--shm-socket: bind ", options.path));
    close(fd);
    return absl::UnavailableError(error);
  }
  struct stat st;
  if (chmod(options.path.c_str(), options.mode) != 0 || lstat(options.path.c_str(), &st) != 0 || listen(fd, 64) != 0) {
    const std::string error = Errno(absl::StrCat("--shm-socket: ", options.path));
    unlink(options.path.c_str());
    close(fd);
    return absl::UnavailableError(error);
  }
  const int stop = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop < 0) {
    const std::string error = Errno("eventfd");
    unlink(options.path.c_str());
    close(fd);
    return absl::UnavailableError(error);
  }
  std::unique_ptr<HandoverSocket> socket(
      new HandoverSocket(std::move(options), registry, fd, stop, st.st_dev, st.st_ino));
  socket->thread_ = std::thread([s = socket.get()] { s->Serve(); });
  LOG_INFO("shm") << "accepting memfds" << (socket->options_.open_cuda_ipc ? " and CUDA IPC handles" : "") << " on "
                  << socket->path();
  return socket;
}

HandoverSocket::HandoverSocket(Options options, RegionRegistry* registry, int listen_fd, int stop_fd, dev_t dev,
                               ino_t ino)
    : options_(std::move(options)),
      registry_(registry),
      listen_fd_(listen_fd),
      stop_fd_(stop_fd),
      dev_(dev),
      ino_(ino) {}

HandoverSocket::~HandoverSocket() {
  const uint64_t one = 1;
  (void)write(stop_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  // The regions stay registered (the registry outlives the socket); only the connections go.
  handshakes_.clear();
  for (const Lifeline& l : lifelines_) close(l.fd);
  close(listen_fd_);
  close(stop_fd_);
  // Remove the socket file only if it is still the one this server made.
  struct stat st;
  if (lstat(options_.path.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_) unlink(options_.path.c_str());
}


void HandoverSocket::Serve() {
  absl::Time next_prune = absl::Now();
  std::vector<pollfd> fds;
  while (true) {
    fds.assign({{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}});
    // A lifeline's only event is its end (EOF, hang-up, error) or a byte the client should not send.
    for (const Lifeline& l : lifelines_) fds.push_back({l.fd, POLLIN | POLLRDHUP, 0});
    const size_t lifelines = lifelines_.size();
    for (const HandoverConnection& h : handshakes_) fds.push_back({h.fd(), POLLIN | POLLRDHUP, 0});
    const int ready = poll(fds.data(), fds.size(), PollTimeoutMs(absl::Now(), next_prune));
    if (ready < 0 && errno != EINTR) {
      LOG_ERROR("shm") << Errno("poll of the handover socket") << "; no more memfds are accepted";
      return;
    }
    if (fds[1].revents != 0) return;
    const absl::Time now = absl::Now();
    const bool prune = now >= next_prune;
    if (prune) {
      registry_->PruneExpired();
      next_prune = now + options_.prune_period;
    }
    if (ready > 0 || prune) EndLifelines(fds.data() + 2, prune);
    // Every handshake is looked at: those without an event may have passed their deadline.
    ServeHandshakes(fds.data() + 2 + lifelines, now);
    if (ready > 0 && (fds[0].revents & POLLIN) != 0) Accept(now);
  }
}

int HandoverSocket::PollTimeoutMs(absl::Time now, absl::Time next_prune) const {
  absl::Time until = next_prune;
  for (const HandoverConnection& h : handshakes_) until = std::min(until, h.deadline());
  // Rounded up, so that a deadline is never polled for early and spun on.
  const int64_t ms = absl::ToInt64Milliseconds(absl::Ceil(until - now, absl::Milliseconds(1)));
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 1 << 30));
}

void HandoverSocket::Accept(absl::Time now) {
  // At most a backlog's worth per wake-up, so that lifelines and handshakes are polled in between.
  for (int i = 0; i < 64; ++i) {
    const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (conn < 0) return;  // EAGAIN (none left, or the client went away), EMFILE, ...: the next poll tries again.
    ucred peer{};
    socklen_t len = sizeof(peer);
    if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0) {
      AnswerError(conn, absl::PermissionDeniedError("the peer's credentials cannot be read"));
      close(conn);
      Observe("refused_peer");
      continue;
    }
    if (std::find(options_.peer_uids.begin(), options_.peer_uids.end(), peer.uid) == options_.peer_uids.end()) {
      // Nothing of it is read: a descriptor it sent is closed with the connection, never mapped.
      LOG_WARNING("shm") << "refused memory from pid " << peer.pid << " uid " << peer.uid
                         << " (not in --shm-peer-uids)";
      AnswerError(conn, absl::PermissionDeniedError(
                            absl::StrCat("uid ", peer.uid, " may not hand memory over (--shm-peer-uids)")));
      close(conn);
      Observe("refused_peer");
      continue;
    }
    if (static_cast<int>(handshakes_.size()) >= options_.max_handshakes) {
      AnswerError(conn, absl::ResourceExhaustedError(absl::StrCat(
                            "the server is reading ", options_.max_handshakes,
                            " hand-overs already (--shm-max-handshakes); send the message at once after "
                            "connecting, and try again")));
      close(conn);
      Observe("exhausted");
      continue;
    }
    HandoverConnection connection(conn, PeerIdentity{peer.pid, peer.uid, peer.gid}, now + options_.message_timeout);
    // A client sends its message right after connecting: it is usually there already.
    if (!Advance(connection, /*readable=*/true, now)) handshakes_.push_back(std::move(connection));
  }
}

void HandoverSocket::ServeHandshakes(const pollfd* events, absl::Time now) {
  size_t kept = 0;
  const size_t count = handshakes_.size();
  for (size_t i = 0; i < count; ++i) {
    if (Advance(handshakes_[i], events[i].revents != 0, now)) continue;
    if (kept != i) handshakes_[kept] = std::move(handshakes_[i]);
    ++kept;
  }
  handshakes_.erase(handshakes_.begin() + static_cast<std::ptrdiff_t>(kept), handshakes_.end());
}

bool HandoverSocket::Advance(HandoverConnection& connection, bool readable, absl::Time now) {
  const HandoverConnection::Message message =
      readable ? connection.Read() : HandoverConnection::Message::kIncomplete;
  if (message == HandoverConnection::Message::kIncomplete) {
    if (now < connection.deadline()) return false;
    AnswerError(connection.fd(), absl::DeadlineExceededError(absl::StrCat(
                                     "no whole hand-over message within ", absl::FormatDuration(options_.message_timeout),
                                     " of connecting: send the memfd (or the CUDA_IPC line) at once")));
    Observe("timed_out");
    return true;  // Closed with `connection`.
  }
  const uint64_t lifeline = next_lifeline_++;
  const char* outcome = Handle(connection, message, lifeline);
  if (std::strcmp(outcome, "staged") == 0) lifelines_.push_back({connection.Release(), lifeline});
  Observe(outcome);
  return true;
}

void HandoverSocket::Observe(const char* outcome) const {
  if (options_.observe) options_.observe(outcome);
}

void HandoverSocket::EndLifelines(const pollfd* events, bool reap) {
  size_t kept = 0;
  const size_t count = lifelines_.size();
  for (size_t i = 0; i < count; ++i) {
    const Lifeline l = lifelines_[i];
    if (events[i].revents != 0) {
      // Ended, or the client broke the protocol by sending on it: either way it lets go.
      const RegionRegistry::Dropped dropped = registry_->DropLifeline(l.id);
      if (dropped != RegionRegistry::Dropped::kNothing) {
        LOG_INFO("shm") << "dropped a " << (dropped == RegionRegistry::Dropped::kStaged ? "staged" : "registered")
                        << " region: its owner's connection ended";
        if (options_.on_dropped) options_.on_dropped(dropped);
      }
      close(l.fd);
    } else if (reap && !registry_->Holds(l.id)) {
      close(l.fd);  // Unregistered, or its ticket expired: nothing left to drop.
    } else {
      lifelines_[kept++] = l;
    }
  }
  lifelines_.resize(kept);
}

const char* HandoverSocket::Handle(HandoverConnection& connection, HandoverConnection::Message message,
                                   uint64_t lifeline) {
  const int conn = connection.fd();
  if (static_cast<int>(lifelines_.size()) >= options_.max_lifelines) {
    AnswerError(conn, absl::ResourceExhaustedError(absl::StrCat(
                          "the server holds ", options_.max_lifelines,
                          " handover connections already, one per region (--shm-max-connections); unregister "
                          "regions (and close their connections) first")));
    return "exhausted";
  }
  if (message == HandoverConnection::Message::kCudaIpcLine) return HandleCudaIpc(connection, lifeline);
  if (message != HandoverConnection::Message::kMemfd) {
    AnswerError(conn, absl::InvalidArgumentError(
                          "send one message of at least one byte carrying exactly one memfd (SCM_RIGHTS), or one "
                          "CUDA_IPC line and no descriptor (docs/shared_memory.md)"));
    return "refused_message";
  }
  absl::StatusOr<std::unique_ptr<MappedRegion>> region =
      MappedRegion::Map(connection.TakeMemfd(), registry_->options().max_region_bytes);
  if (!region.ok()) {
    AnswerError(conn, region.status());
    return "refused_memfd";
  }
  absl::StatusOr<std::string> ticket = registry_->Stage(*std::move(region), connection.peer(), lifeline);
  if (!ticket.ok()) {
    AnswerError(conn, ticket.status());
    return "exhausted";
  }
  Answer(conn, absl::StrCat("OK ", *ticket));
  return "staged";
}

const char* HandoverSocket::HandleCudaIpc(HandoverConnection& connection, uint64_t lifeline) {
  const int conn = connection.fd();
  const std::string& text = connection.text();
  const PeerIdentity& peer = connection.peer();
  const size_t newline = text.find('\n');
  if (newline == std::string::npos || newline + 1 != text.size()) {
    AnswerError(conn,
                absl::InvalidArgumentError(absl::StrCat("a CUDA_IPC message is one line ending in a newline, at most ",
                                                        kMaxCudaIpcMessageBytes, " bytes, and nothing after it")));
    return "refused_message";
  }
  absl::StatusOr<CudaIpcHandover> handover = ParseCudaIpcMessage(text);
  if (!handover.ok()) {
    AnswerError(conn, handover.status());
    return "refused_message";
  }
  if (!options_.open_cuda_ipc) {
    AnswerError(conn, absl::FailedPreconditionError(
                          "this server does not open CUDA IPC handles: its backend computes in host memory "
                          "(--backend cpu); hand over a memfd, or use a server started with --backend cuda"));
    return "refused_cuda_ipc";
  }
  const int64_t max_bytes = registry_->options().max_region_bytes;
  if (handover->size > max_bytes) {
    AnswerError(conn, absl::OutOfRangeError(absl::StrCat("the region holds ", handover->size,
                                                         " bytes; a region may hold at most ", max_bytes,
                                                         " (--shm-max-region-bytes)")));
    return "refused_cuda_ipc";
  }
  absl::StatusOr<std::unique_ptr<RegionMemory>> memory = options_.open_cuda_ipc(*handover);
  if (!memory.ok()) {
    LOG_WARNING("shm") << "refused a CUDA IPC handle from pid " << peer.pid << ": " << memory.status();
    AnswerError(conn, memory.status());
    return "refused_cuda_ipc";
  }
  absl::StatusOr<std::string> ticket = registry_->Stage(*std::move(memory), peer, lifeline);
  if (!ticket.ok()) {
    AnswerError(conn, ticket.status());
    return "exhausted";
  }
  Answer(conn, absl::StrCat("OK ", *ticket));
  return "staged";
}

}  // namespace orthoserve
