// Implementation of client/cpp/region.h.
#include "client/cpp/region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/cpp/handover.h"
#include "client/cpp/retry.h"
#include "common/logging.h"
#include "grpcpp/client_context.h"
#include "orthoserve/v1/orthogonalizer.grpc.pb.h"

namespace orthoserve::client {
namespace {

// The memory a region is made of, released on the error paths of Create.
struct Memory {
  int fd = -1;
  char* data = nullptr;
  int64_t size = 0;
  ~Memory() {
    if (data != nullptr) munmap(data, static_cast<size_t>(size));
    if (fd >= 0) close(fd);
  }
};

absl::Status SystemError(const char* call, int error) {
  const std::string text = absl::StrCat("creating a shared-memory region: ", call, ": ", std::strerror(error));
  if (error == ENOMEM || error == ENOSPC || error == EMFILE || error == ENFILE || error == EFBIG) {
    return absl::ResourceExhaustedError(text);
  }
  return absl::InternalError(text);
}

void PrepareContext(grpc::ClientContext* context, const Region::Connection& connection) {
  if (connection.timeout != absl::InfiniteDuration()) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + connection.timeout));
  }
  if (!connection.bearer_token.empty()) context->AddMetadata("authorization", "Bearer " + connection.bearer_token);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Region>> Region::Create(int64_t size, const std::string& name,
                                                       const std::string& socket_path, Connection connection,
                                                       absl::Duration handover_timeout) {
  if (size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("a shared-memory region needs at least one byte, not ", size));
  }
  if (connection.channel == nullptr) return absl::InvalidArgumentError("a region needs a channel to its server");
  Memory memory;
  memory.size = size;
  const std::string memfd_name = absl::StrCat("orthoserve-", name.empty() ? "region" : name.substr(0, 200));
  memory.fd = memfd_create(memfd_name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (memory.fd < 0) return SystemError("memfd_create", errno);
  if (ftruncate(memory.fd, static_cast<off_t>(size)) != 0) return SystemError("ftruncate", errno);
  // Nobody (this process, the server, anyone the descriptor reaches) can shrink it, which would
  // turn the server's access to the lost pages into SIGBUS; F_SEAL_SEAL keeps the seals as they are.
  if (fcntl(memory.fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) != 0) return SystemError("fcntl(F_ADD_SEALS)", errno);
  void* data = mmap(nullptr, static_cast<size_t>(size), PROT_READ | PROT_WRITE, MAP_SHARED, memory.fd, 0);
  if (data == MAP_FAILED) return SystemError("mmap", errno);
  memory.data = static_cast<char*>(data);

  absl::StatusOr<HandedOver> handed_over = HandOverMemfd(socket_path, memory.fd, handover_timeout);
  if (!handed_over.ok()) return handed_over.status();
  grpc::ClientContext context;
  PrepareContext(&context, connection);
  v1::RegisterRegionRequest request;
  request.set_ticket(handed_over->ticket);
  request.set_name(name);
  v1::Region registered;
  const grpc::Status status =
      v1::SharedMemory::NewStub(connection.channel)->RegisterRegion(&context, request, &registered);
  if (absl::Status s = FromCallStatus(status, context.GetServerTrailingMetadata()); !s.ok()) {
    return AnnotateKeepingMarks(s, absl::StrCat("registering a shared-memory region on ", connection.address));
  }
  std::unique_ptr<Region> region(
      new Region(memory.fd, memory.data, size, name, std::move(connection), std::move(handed_over->lifeline)));
  memory.fd = -1;  // The region owns them now.
  memory.data = nullptr;
  region->id_ = registered.region_id();
  region->registered_ = true;
  if (registered.size() != size) {
    // The server maps the size it saw at the handover, and the memfd cannot shrink: a different
    // size is a server that does not keep the protocol. Nothing else of it would be safe to use.
    const absl::Status unregister = region->Unregister();
    return absl::InternalError(absl::StrCat(
        "server protocol error: the region was registered with ", registered.size(), " bytes, but its memfd has ", size,
        unregister.ok() ? "" : absl::StrCat(" (and unregistering it failed: ", unregister.message(), ")")));
  }
  return region;
}

Region::Region(int fd, char* data, int64_t size, std::string name, Connection connection, Lifeline lifeline)
    : fd_(fd),
      data_(data),
      size_(size),
      name_(std::move(name)),
      connection_(std::move(connection)),
      lifeline_(std::move(lifeline)) {}

Region::~Region() {
  if (registered_) {
    const absl::Status status = Unregister();
    if (!status.ok()) {
      LOG_WARNING("client") << "unregistering shared-memory region " << id_ << " on " << address() << ": " << status;
    }
  }
  lifeline_.Close();
  munmap(data_, static_cast<size_t>(size_));
  close(fd_);
}

RegionSlice Region::Slice(int64_t offset, int64_t size) const { return RegionSlice{id_, address(), offset, size}; }

absl::Status Region::Unregister() {
  if (!registered_) return absl::OkStatus();
  registered_ = false;
  grpc::ClientContext context;
  PrepareContext(&context, connection_);
  v1::UnregisterRegionRequest request;
  request.set_region_id(id_);
  v1::UnregisterRegionResponse response;
  const grpc::Status status =
      v1::SharedMemory::NewStub(connection_.channel)->UnregisterRegion(&context, request, &response);
  lifeline_.Close();  // After the answer: closed first, the server could drop the region before it.
  return AnnotateKeepingMarks(FromCallStatus(status, context.GetServerTrailingMetadata()),
                              absl::StrCat("unregistering shared-memory region ", id_, " on ", address()));
}

}  // namespace orthoserve::client
