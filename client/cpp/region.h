// Shared-memory regions of the C++ client (docs/shared_memory.md): memory that a client on the
// server's host shares with one server rank, so that matrices are read and results written in
// place instead of travelling through the socket.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<Region> region, client->CreateRegion(64 << 20, {.name = "momenta"}));
//   std::memcpy(region->data(), momentum, bytes);                 // the input, at offset 0
//   input.input_region = region->Slice(0, bytes);                 // instead of input.data / bytes
//   input.result_region = region->Slice(result_offset, bytes);    // the result is written there
//   ASSIGN_OR_RETURN(auto outputs, client->Step({}, {&input, 1}));  // goes to region->address() only
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/cpp/handover.h"
#include "client/cpp/matrix.h"
#include "grpcpp/channel.h"

namespace orthoserve::client {

// How Client::CreateRegion makes a region.
struct RegionOptions {
  std::string name;     // The region's label in the server's listings (not unique; may be empty).
  std::string address;  // The server rank to register on; empty: Client::address(). One of the client's.
  // The server's handover socket as this process sees it; empty: the server's ServerInfo.shm_socket
  // (give it when the client sees the socket under another path, e.g. another mount in a sidecar).
  std::string socket_path;
  absl::Duration handover_timeout = absl::Seconds(10);  // Bounds each operation on the socket.
};

// A registered region: a memfd of `size()` bytes (MFD_CLOEXEC | MFD_ALLOW_SEALING, sealed with
// F_SEAL_SHRINK | F_SEAL_SEAL so nobody can truncate it under a running step), mapped here
// read-write (data()), handed over on the server's Unix socket and registered through
// SharedMemory.RegisterRegion with the client's channel and bearer token, so it belongs to the
// client's tenant on the one server rank address(). A MatrixInput names slices of it
// (Slice) for its input and its result; such a call goes to address() only, never to another of
// the client's addresses.
//
// The connection the memfd was handed over on stays open as the region's lifeline (handover.h)
// until Unregister or the destructor: if this process dies first, the kernel closes it and the
// server drops the region on its own.
//
// The caller writes inputs into data() before a call and reads results after it returns; it must
// not write a slice the server reads, or read a result slice, while a call that names it runs.
//
// Thread-safety: data(), size(), id(), address(), name() and Slice() may be called from any
// thread; Unregister and the destructor must not run concurrently with other calls on the
// object (or with calls in flight that name its slices, which the server then fails with
// NOT_FOUND or waits for).
class Region {
 public:
  // The server rank a region is registered on and how to call it.
  struct Connection {
    std::string address;                         // As the client names it.
    std::shared_ptr<grpc::Channel> channel;      // The client's channel to `address`.
    std::string bearer_token;                    // Sent as "authorization: Bearer <token>" when set.
    absl::Duration timeout = absl::Seconds(90);  // Deadline of RegisterRegion and UnregisterRegion.
  };

  // Creates, seals, maps, hands over (handover.h) and registers a region of `size` bytes. Usually
  // called through Client::CreateRegion. INVALID_ARGUMENT for size <= 0; RESOURCE_EXHAUSTED when
  // the memory cannot be had here; INTERNAL for another failing system call (naming it);
  // HandOverMemfd's errors (UNAVAILABLE when the socket cannot be reached; the server's code, e.g.
  // OUT_OF_RANGE over --shm-max-region-bytes or PERMISSION_DENIED for a uid it does not accept);
  // RegisterRegion's status (FAILED_PRECONDITION when the server takes no regions,
  // RESOURCE_EXHAUSTED over --shm-max-regions-per-tenant, UNAUTHENTICATED, ...). Nothing is
  // left behind on failure.
  static absl::StatusOr<std::unique_ptr<Region>> Create(int64_t size, const std::string& name,
                                                        const std::string& socket_path, Connection connection,
                                                        absl::Duration handover_timeout = absl::Seconds(10));

  // Unregisters the region if it still is (waiting, up to the connection's timeout, for the
  // server's steps that use it; a failure is logged, not returned), closes its lifeline, then
  // unmaps it and closes the memfd. Pointers into data() are invalid afterwards.
  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  // The mapping: size() bytes, page-aligned, zero at creation.
  char* data() const { return data_; }
  int64_t size() const { return size_; }
  // The id the server chose (32 hex digits); kept after Unregister, when the server no longer
  // knows it.
  const std::string& id() const { return id_; }
  const std::string& address() const { return connection_.address; }
  const std::string& name() const { return name_; }
  bool registered() const { return registered_; }

  // Bytes [offset, offset + size) of this region, for MatrixInput::input_region / result_region.
  // Not checked here: the server answers a slice outside the region with OUT_OF_RANGE and a
  // misaligned one with INVALID_ARGUMENT (see RegionSlice).
  RegionSlice Slice(int64_t offset, int64_t size) const;

  // Removes the region from the server at once (calls that name it from then on fail with
  // NOT_FOUND), answering once no step uses it any more; the memory stays mapped here until the
  // Region is destroyed. OK when it was already unregistered. The RPC's status otherwise
  // (NOT_FOUND when the server no longer has it, DEADLINE_EXCEEDED when steps still used it at the
  // deadline: it is unregistered all the same); the region counts as unregistered either way, and
  // its lifeline is closed after the call (so a region whose unregister failed is dropped by the
  // server all the same).
  absl::Status Unregister();

 private:
  Region(int fd, char* data, int64_t size, std::string name, Connection connection, Lifeline lifeline);

  const int fd_;
  char* const data_;
  const int64_t size_;
  const std::string name_;
  const Connection connection_;
  Lifeline lifeline_;
  std::string id_;
  bool registered_ = false;
};

}  // namespace orthoserve::client
