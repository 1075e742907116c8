// Implementation of server/collective/nccl/nccl_collective.h.
#include "server/collective/nccl/nccl_collective.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "server/collective/collective_args.h"
#include "server/collective/nccl/ordered_sum.h"

namespace orthoserve {
namespace {

using collective_internal::BrokenStatus;

absl::Status CudaError(cudaError_t e, absl::string_view call) {
  if (e == cudaSuccess) return absl::OkStatus();
  std::string message = absl::StrCat(call, ": ", cudaGetErrorName(e), ": ", cudaGetErrorString(e));
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || e == cudaErrorInvalidDevice) {
    return absl::FailedPreconditionError(message);
  }
  if (e == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::UnavailableError(message);
}

// ncclInProgress is success for the calls of a non-blocking communicator.
bool NcclOk(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

absl::Status NcclError(ncclResult_t r, absl::string_view call, ncclComm_t comm) {
  if (NcclOk(r)) return absl::OkStatus();
  const char* last = ncclGetLastError(comm);
  std::string message = absl::StrCat(call, ": ", ncclGetErrorString(r), (last && *last) ? ": " : "", last ? last : "");
  if (r == ncclInvalidArgument || r == ncclInvalidUsage) return absl::InvalidArgumentError(message);
  return absl::UnavailableError(message);
}

// A device allocation that grows on demand.
class DeviceBuffer {
 public:
  ~DeviceBuffer() {
    if (data_ != nullptr) cudaFree(data_);
  }
  absl::StatusOr<char*> Get(size_t bytes) {
    if (bytes <= size_) return data_;
    if (data_ != nullptr) cudaFree(data_);
    data_ = nullptr;
    size_ = 0;
    void* p = nullptr;
    RETURN_IF_ERROR(CudaError(cudaMalloc(&p, bytes), "cudaMalloc"));
    data_ = static_cast<char*>(p);
    size_ = bytes;
    return data_;
  }

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace

class NcclCollective::Impl {
 public:
  Impl(int rank, int world, int device) : rank_(rank), world_(world), device_(device) {}
  ~Impl() {
    cudaSetDevice(device_);
    if (comm_ != nullptr) Close();
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  absl::Status Init(const Options& options);

  int rank() const { return rank_; }
  int world() const { return world_; }

  absl::Status AllToAllv(const void* send, absl::Span<const size_t> send_bytes, void* recv,
                         absl::Span<const size_t> recv_bytes, absl::Duration timeout);
  absl::Status AllGatherv(const void* send, size_t send_bytes, void* recv, absl::Span<const size_t> recv_bytes,
                          absl::Duration timeout);
  template <typename T>
  absl::Status AllReduceSum(absl::Span<T> values, absl::Duration timeout);
  absl::Status Broadcast(void* data, size_t bytes, int root, absl::Duration timeout);
  absl::Status Barrier(absl::Duration timeout);
  void RequestAbort(absl::string_view reason) ABSL_LOCKS_EXCLUDED(abort_mu_) {
    absl::MutexLock lock(&abort_mu_);
    if (abort_.ok()) abort_ = absl::UnavailableError(absl::StrCat("nccl collective aborted: ", reason));
    abort_requested_.store(true);
  }
  absl::Status AbortRequested() const ABSL_LOCKS_EXCLUDED(abort_mu_) {
    if (!abort_requested_.load()) return absl::OkStatus();
    absl::MutexLock lock(&abort_mu_);
    return abort_;
  }

  // Runs `op` (which enqueues on the stream) under the broken-state check and the watchdog;
  // any error breaks the collective.
  template <typename Op>
  absl::Status Guarded(const char* name, absl::Duration timeout, Op op) {
    if (!broken_.ok()) return BrokenStatus("nccl", broken_);
    absl::Status status = AbortRequested();
    if (status.ok()) status = CudaError(cudaSetDevice(device_), "cudaSetDevice");
    if (status.ok()) status = op(absl::Now() + timeout);
    if (!status.ok()) {
      status = Annotate(status, name);
      Break(status);
    }
    return status;
  }

 private:
  // True for device memory of this rank's GPU; false for host memory; INVALID_ARGUMENT for
  // memory of another device.
  absl::StatusOr<bool> IsOwnDevicePointer(const void* p) const;
  // Waits for the stream under the watchdog: NCCL async errors and the deadline.
  absl::Status Wait(absl::Time deadline);
  // Waits until the last NCCL call of this non-blocking communicator has been enqueued on the
  // stream (ncclCommGetAsyncError no longer ncclInProgress); only then may other work be put on
  // the stream behind it.
  absl::Status WaitEnqueued(absl::Time deadline);
  // Marks the collective broken and aborts the communicator.
  void Break(const absl::Status& status);
  // Ends a healthy communicator: ncclCommFinalize flushes what was issued (a peer's last receive
  // may still depend on it), then ncclCommDestroy; aborts instead if that does not finish in
  // kCloseTimeout.
  void Close();
  // Runs `enqueue` (ncclSend/ncclRecv calls) between ncclGroupStart and ncclGroupEnd. The group
  // is ended even when an enqueue fails, so no half-built group stays open on this thread.
  template <typename Enqueue>
  absl::Status Grouped(Enqueue enqueue) {
    RETURN_IF_ERROR(NcclError(ncclGroupStart(), "ncclGroupStart", comm_));
    const absl::Status enqueued = enqueue();
    const ncclResult_t ended = ncclGroupEnd();
    RETURN_IF_ERROR(enqueued);
    return NcclError(ended, "ncclGroupEnd", comm_);
  }
  static constexpr absl::Duration kCloseTimeout = absl::Seconds(10);
  absl::Status Copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
  // What AllToAllv and AllGatherv do once their arguments are checked: sends peer p
  // send_bytes[p] bytes at send + send_offsets[p] (send_total bytes in all), receives
  // recv_bytes[p] bytes from p at their offset in `recv`, and copies this rank's own segment;
  // host buffers are staged through device memory. Waits for it until `deadline`.
  absl::Status ExchangeSegments(const void* send, size_t send_total, absl::Span<const size_t> send_offsets,
                                absl::Span<const size_t> send_bytes, void* recv, absl::Span<const size_t> recv_bytes,
                                absl::Time deadline);

  const int rank_, world_, device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  DeviceBuffer send_stage_, recv_stage_;
  absl::Status broken_;
  // Abort() from another thread; the watchdog loops (Wait, WaitEnqueued) poll it.
  std::atomic<bool> abort_requested_{false};
  mutable absl::Mutex abort_mu_;
  absl::Status abort_ ABSL_GUARDED_BY(abort_mu_);
};

absl::Status NcclCollective::Impl::Init(const Options& options) {
  const absl::Time deadline = absl::Now() + options.init_timeout;
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "no usable CUDA device for NCCL: cudaGetDeviceCount: ", cudaGetErrorName(e), " (", count, " devices)"));
  }
  if (device_ >= count) {
    return absl::InvalidArgumentError(absl::StrCat("device ", device_, " out of range: ", count, " CUDA device(s)"));
  }
  RETURN_IF_ERROR(CudaError(cudaSetDevice(device_), "cudaSetDevice"));
  RETURN_IF_ERROR(CudaError(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"));

  ncclUniqueId id;
  if (options.store != nullptr) {
    if (rank_ == 0) {
      RETURN_IF_ERROR(NcclError(ncclGetUniqueId(&id), "ncclGetUniqueId", nullptr));
      RETURN_IF_ERROR(options.store->Set(
          options.id_key, absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(&id), sizeof(id)))));
    } else {
      ASSIGN_OR_RETURN(std::string hex, options.store->Get(options.id_key, options.init_timeout));
      const std::string bytes = absl::HexStringToBytes(hex);
      if (hex.size() != 2 * sizeof(id) || bytes.size() != sizeof(id)) {
        return absl::InvalidArgumentError(absl::StrCat("store key \"", options.id_key, "\" holds ", hex.size(),
                                                       " characters, not a hex NCCL unique id of ", 2 * sizeof(id)));
      }
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
  } else {
    const char* comm_id = std::getenv("NCCL_COMM_ID");
    if (world_ > 1 && (comm_id == nullptr || *comm_id == '\0')) {
      return absl::InvalidArgumentError(
          "NcclCollective with world > 1 needs a Store for the unique id, or NCCL_COMM_ID=<host:port> set on every "
          "rank");
    }
    RETURN_IF_ERROR(NcclError(ncclGetUniqueId(&id), "ncclGetUniqueId", nullptr));
  }

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&comm_, world_, id, rank_, &config);
  if (!NcclOk(r)) {
    absl::Status status = NcclError(r, "ncclCommInitRankConfig", comm_);
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    return absl::UnavailableError(status.message());
  }
  while (true) {
    ncclResult_t state = ncclSuccess;
    RETURN_IF_ERROR(NcclError(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError", comm_));
    if (state == ncclSuccess) break;
    if (state != ncclInProgress) {
      absl::Status status = NcclError(state, "ncclCommInitRankConfig", comm_);
      ncclCommAbort(comm_);
      comm_ = nullptr;
      return absl::UnavailableError(status.message());
    }
    if (absl::Now() > deadline) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
      return absl::DeadlineExceededError(absl::StrCat("ncclCommInitRankConfig: rank ", rank_, " of ", world_,
                                                      " did not finish within ",
                                                      absl::FormatDuration(options.init_timeout)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> NcclCollective::Impl::IsOwnDevicePointer(const void* p) const {
  if (p == nullptr) return false;
  cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) return false;
  if (attr.device != device_) {
    return absl::InvalidArgumentError(
        absl::StrCat("buffer is memory of CUDA device ", attr.device, ", not of this rank's device ", device_));
  }
  return true;
}

void NcclCollective::Impl::Close() {
  bool flushed = NcclOk(ncclCommFinalize(comm_));
  const absl::Time deadline = absl::Now() + kCloseTimeout;
  while (flushed) {
    ncclResult_t state = ncclSuccess;
    if (!NcclOk(ncclCommGetAsyncError(comm_, &state)) || !NcclOk(state)) flushed = false;
    if (state == ncclSuccess || !flushed) break;
    if (absl::Now() > deadline) flushed = false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (flushed) {
    ncclCommDestroy(comm_);
  } else {
    ncclCommAbort(comm_);
  }
  comm_ = nullptr;
}

void NcclCollective::Impl::Break(const absl::Status& status) {
  broken_ = status;
  if (comm_ != nullptr) {
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
}

absl::Status NcclCollective::Impl::Wait(absl::Time deadline) {
  auto sleep = std::chrono::microseconds(2);
  while (true) {
    RETURN_IF_ERROR(AbortRequested());
    ncclResult_t state = ncclSuccess;
    RETURN_IF_ERROR(NcclError(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError", comm_));
    if (state != ncclSuccess && state != ncclInProgress) {
      return absl::UnavailableError(NcclError(state, "NCCL asynchronous error", comm_).message());
    }
    if (state == ncclSuccess) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return absl::OkStatus();
      if (q != cudaErrorNotReady) return CudaError(q, "cudaStreamQuery");
      // cudaErrorNotReady is also recorded as this thread's last error; clear it, or the next
      // kernel launch checked with cudaGetLastError (ours or the backend's) would report it.
      cudaGetLastError();
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("rank ", rank_, " of ", world_, ": the operation did not complete before its deadline"));
    }
    std::this_thread::sleep_for(sleep);
    if (sleep < std::chrono::microseconds(500)) sleep *= 2;
  }
}

absl::Status NcclCollective::Impl::WaitEnqueued(absl::Time deadline) {
  auto sleep = std::chrono::microseconds(2);
  while (true) {
    RETURN_IF_ERROR(AbortRequested());
    ncclResult_t state = ncclSuccess;
    RETURN_IF_ERROR(NcclError(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError", comm_));
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) {
      return absl::UnavailableError(NcclError(state, "NCCL asynchronous error", comm_).message());
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("rank ", rank_, " of ", world_, ": NCCL did not enqueue the operation before its deadline"));
    }
    std::this_thread::sleep_for(sleep);
    if (sleep < std::chrono::microseconds(500)) sleep *= 2;
  }
}

absl::Status NcclCollective::Impl::Copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0 || dst == src) return absl::OkStatus();
  return CudaError(cudaMemcpyAsync(dst, src, bytes, kind, stream_), "cudaMemcpyAsync");
}

absl::Status NcclCollective::Impl::ExchangeSegments(const void* send, size_t send_total,
                                                    absl::Span<const size_t> send_offsets,
                                                    absl::Span<const size_t> send_bytes, void* recv,
                                                    absl::Span<const size_t> recv_bytes, absl::Time deadline) {
  const std::vector<size_t> roff = collective_internal::SegmentOffsets(recv_bytes);
  ASSIGN_OR_RETURN(const bool send_dev, IsOwnDevicePointer(send));
  ASSIGN_OR_RETURN(const bool recv_dev, IsOwnDevicePointer(recv));
  const char* dsend = static_cast<const char*>(send);
  char* drecv = static_cast<char*>(recv);
  // Host buffers are staged through this rank's device buffers: up once, down once.
  if (!send_dev) {
    ASSIGN_OR_RETURN(char* stage, send_stage_.Get(send_total));
    RETURN_IF_ERROR(Copy(stage, send, send_total, cudaMemcpyHostToDevice));
    dsend = stage;
  }
  if (!recv_dev) {
    ASSIGN_OR_RETURN(drecv, recv_stage_.Get(roff[world_]));
  }
  // This rank's own segment is a device copy (a no-op when it is already in place).
  RETURN_IF_ERROR(Copy(drecv + roff[rank_], dsend + send_offsets[rank_], send_bytes[rank_], cudaMemcpyDeviceToDevice));
  RETURN_IF_ERROR(Grouped([&]() -> absl::Status {
    for (int p = 0; p < world_; ++p) {
      if (p == rank_) continue;
      if (send_bytes[p] > 0) {
        RETURN_IF_ERROR(NcclError(ncclSend(dsend + send_offsets[p], send_bytes[p], ncclUint8, p, comm_, stream_),
                                  "ncclSend", comm_));
      }
      if (recv_bytes[p] > 0) {
        RETURN_IF_ERROR(
            NcclError(ncclRecv(drecv + roff[p], recv_bytes[p], ncclUint8, p, comm_, stream_), "ncclRecv", comm_));
      }
    }
    return absl::OkStatus();
  }));
  RETURN_IF_ERROR(Wait(deadline));
  if (!recv_dev) {
    RETURN_IF_ERROR(Copy(recv, drecv, roff[world_], cudaMemcpyDeviceToHost));
    RETURN_IF_ERROR(Wait(deadline));
  }
  return absl::OkStatus();
}

absl::Status NcclCollective::Impl::AllToAllv(const void* send, absl::Span<const size_t> send_bytes, void* recv,
                                             absl::Span<const size_t> recv_bytes, absl::Duration timeout) {
  return Guarded("AllToAllv", timeout, [&](absl::Time deadline) -> absl::Status {
    RETURN_IF_ERROR(collective_internal::CheckAllToAllvArgs(rank_, world_, send_bytes, recv_bytes));
    const std::vector<size_t> soff = collective_internal::SegmentOffsets(send_bytes);
    return ExchangeSegments(send, soff[world_], soff, send_bytes, recv, recv_bytes, deadline);
  });
}

absl::Status NcclCollective::Impl::AllGatherv(const void* send, size_t send_bytes, void* recv,
                                              absl::Span<const size_t> recv_bytes, absl::Duration timeout) {
  return Guarded("AllGatherv", timeout, [&](absl::Time deadline) -> absl::Status {
    RETURN_IF_ERROR(collective_internal::CheckAllGathervArgs(rank_, world_, send_bytes, recv_bytes));
    // Every peer gets the same segment: the whole send buffer.
    const std::vector<size_t> offsets(static_cast<size_t>(world_), 0);
    const std::vector<size_t> sizes(static_cast<size_t>(world_), send_bytes);
    return ExchangeSegments(send, send_bytes, offsets, sizes, recv, recv_bytes, deadline);
  });
}

template <typename T>
absl::Status NcclCollective::Impl::AllReduceSum(absl::Span<T> values, absl::Duration timeout) {
  return Guarded("AllReduceSum", timeout, [&](absl::Time deadline) -> absl::Status {
    const size_t count = values.size();
    if (count == 0) return absl::OkStatus();
    const size_t bytes = count * sizeof(T);
    ASSIGN_OR_RETURN(const bool dev, IsOwnDevicePointer(values.data()));
    T* dvalues = values.data();
    if (!dev) {
      ASSIGN_OR_RETURN(char* stage, send_stage_.Get(bytes));
      dvalues = reinterpret_cast<T*>(stage);
      RETURN_IF_ERROR(Copy(dvalues, values.data(), bytes, cudaMemcpyHostToDevice));
    }
    ASSIGN_OR_RETURN(char* gathered, recv_stage_.Get(bytes * world_));
    const ncclDataType_t type = sizeof(T) == sizeof(double) ? ncclDouble : ncclFloat;
    RETURN_IF_ERROR(NcclError(ncclAllGather(dvalues, gathered, count, type, comm_, stream_), "ncclAllGather", comm_));
    RETURN_IF_ERROR(WaitEnqueued(deadline));
    RETURN_IF_ERROR(
        CudaError(nccl_internal::OrderedSum(reinterpret_cast<const T*>(gathered), world_, count, dvalues, stream_),
                  "OrderedSum"));
    RETURN_IF_ERROR(Wait(deadline));
    if (!dev) {
      RETURN_IF_ERROR(Copy(values.data(), dvalues, bytes, cudaMemcpyDeviceToHost));
      RETURN_IF_ERROR(Wait(deadline));
    }
    return absl::OkStatus();
  });
}

absl::Status NcclCollective::Impl::Broadcast(void* data, size_t bytes, int root, absl::Duration timeout) {
  return Guarded("Broadcast", timeout, [&](absl::Time deadline) -> absl::Status {
    RETURN_IF_ERROR(collective_internal::CheckRoot(root, world_));
    if (bytes == 0) return absl::OkStatus();
    ASSIGN_OR_RETURN(const bool dev, IsOwnDevicePointer(data));
    char* d = static_cast<char*>(data);
    if (!dev) {
      ASSIGN_OR_RETURN(d, send_stage_.Get(bytes));
      if (rank_ == root) RETURN_IF_ERROR(Copy(d, data, bytes, cudaMemcpyHostToDevice));
    }
    RETURN_IF_ERROR(NcclError(ncclBroadcast(d, d, bytes, ncclUint8, root, comm_, stream_), "ncclBroadcast", comm_));
    RETURN_IF_ERROR(Wait(deadline));
    if (!dev && rank_ != root) {
      RETURN_IF_ERROR(Copy(data, d, bytes, cudaMemcpyDeviceToHost));
      RETURN_IF_ERROR(Wait(deadline));
    }
    return absl::OkStatus();
  });
}

absl::Status NcclCollective::Impl::Barrier(absl::Duration timeout) {
  return Guarded("Barrier", timeout, [&](absl::Time deadline) -> absl::Status {
    ASSIGN_OR_RETURN(char* scratch, send_stage_.Get(sizeof(float)));
    RETURN_IF_ERROR(CudaError(cudaMemsetAsync(scratch, 0, sizeof(float), stream_), "cudaMemsetAsync"));
    RETURN_IF_ERROR(
        NcclError(ncclAllReduce(scratch, scratch, 1, ncclFloat, ncclSum, comm_, stream_), "ncclAllReduce", comm_));
    return Wait(deadline);
  });
}

NcclCollective::NcclCollective(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NcclCollective::~NcclCollective() = default;

absl::StatusOr<std::unique_ptr<NcclCollective>> NcclCollective::Create(const Options& options) {
  if (options.world < 1 || options.rank < 0 || options.rank >= options.world) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " / world ", options.world, ": need world >= 1 and 0 <= rank < world"));
  }
  if (options.device < 0) return absl::InvalidArgumentError(absl::StrCat("device ", options.device, " < 0"));
  auto impl = std::make_unique<Impl>(options.rank, options.world, options.device);
  RETURN_IF_ERROR(impl->Init(options));
  return std::unique_ptr<NcclCollective>(new NcclCollective(std::move(impl)));
}

int NcclCollective::rank() const { return impl_->rank(); }
int NcclCollective::world() const { return impl_->world(); }

absl::Status NcclCollective::AllToAllv(const void* send, absl::Span<const size_t> send_bytes, void* recv,
                                       absl::Span<const size_t> recv_bytes, absl::Duration timeout) {
  return impl_->AllToAllv(send, send_bytes, recv, recv_bytes, timeout);
}
absl::Status NcclCollective::AllGatherv(const void* send, size_t send_bytes, void* recv,
                                        absl::Span<const size_t> recv_bytes, absl::Duration timeout) {
  return impl_->AllGatherv(send, send_bytes, recv, recv_bytes, timeout);
}
absl::Status NcclCollective::AllReduceSum(absl::Span<float> values, absl::Duration timeout) {
  return impl_->AllReduceSum(values, timeout);
}
absl::Status NcclCollective::AllReduceSum(absl::Span<double> values, absl::Duration timeout) {
  return impl_->AllReduceSum(values, timeout);
}
absl::Status NcclCollective::Broadcast(void* data, size_t bytes, int root, absl::Duration timeout) {
  return impl_->Broadcast(data, bytes, root, timeout);
}
absl::Status NcclCollective::Barrier(absl::Duration timeout) { return impl_->Barrier(timeout); }
void NcclCollective::Abort(absl::string_view reason) { impl_->RequestAbort(reason); }

}  // namespace orthoserve
