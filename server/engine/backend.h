// Backend: one compute device (a CPU thread pool or one GPU) that runs Newton–Schulz.
//
// Contract. A backend implements docs/numerics.md §2 steps 1–4 for fully resolved tasks: transpose as
// told, normalize in fp32 with eps in its mode, run the given schedule at the given precision,
// transpose back, multiply by `scale`, and write the result in the output dtype. Everything
// above that — defaults, coefficient tables, split_qkv, N-d views, which shape the scale comes
// from — is resolved by engine/newton_schulz.h, so every backend computes the same function.
//
// Products (A = X·Xᵀ, A·A, B·X) at each precision:
//  - kHighest: fp32 operands and accumulation.
//  - kHigh: as kHighest on CPU; TF32 tensor cores allowed on GPU.
//  - Normalization::kBf16 (with kMedium only; torch.optim.Muon's order): the input is rounded
//    to bf16 first; its Σx² (of the rounded values) gives ‖X‖, rounded to fp32 then bf16; eps
//    is rounded to bf16; the divisor is max(‖X‖, eps) (bf16(‖X‖ + eps) in kAdd); each quotient
//    is computed in fp32 and rounded to bf16.
//  - kMedium: X is rounded to bf16 after normalization. A = bf16(X·Xᵀ);
//    B = bf16(b·A + c·(A·A)); X = bf16(a·X + B·X), each product accumulated in fp32 and its
//    fused output rounded once (Emerging-Optimizers' addmm form). When c = 0 the step is
//    X = bf16(a·X + b·(A·X)) and A·A is skipped. The result is widened to fp32 before scaling.
// Symmetric products may compute one triangle and mirror it; the results must not depend on the
// batch a task arrives in, nor on which other tasks share it.
//
// Memory: task pointers are owned by the caller, valid for the duration of the call, and live in
// host memory or, when a task's `space` is kDevice, in the backend's device memory (memory(),
// whose space() is then kDevice: the task is computed where it is, with no host copy); `in` and
// `out` of one task must not overlap. Thread-safety: Run and RunSharded may be called
// concurrently from several threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "common/ns_options.h"
#include "common/shape.h"
#include "server/engine/ipc_memory.h"
#include "server/engine/memory.h"

namespace orthoserve {

// Per-matrix parameters, fully resolved (no defaults left).
struct NsKernelArgs {
  std::vector<CoefficientTriple> schedule;  // One (a, b, c) per step; may be empty (steps = 0).
  Precision precision = Precision::kMedium;
  double eps = 1e-7;
  EpsMode eps_mode = EpsMode::kMax;
  Normalization normalization = Normalization::kFp32;  // kBf16 only with kMedium.
  bool transpose = false;  // Work on Xᵀ (rows × cols input becomes cols × rows).
  double scale = 1.0;      // Final multiplier: scale factor × extra scale.
};

// One matrix: out = scale · NS(in).
struct NsTask {
  Matrix2d shape;            // rows × cols of `in` and `out`.
  DType in_dtype = DType::kF32;
  const void* in = nullptr;  // rows·cols elements, row-major.
  DType out_dtype = DType::kF32;
  void* out = nullptr;       // rows·cols elements, row-major.
  const NsKernelArgs* args = nullptr;
  MemorySpace space = MemorySpace::kHost;  // Where `in` and `out` live.
};

// One participant's part of a matrix sharded along `partition_dim` (TP_DISTRIBUTED).
struct NsShard {
  Matrix2d shape;  // This shard's rows × cols in the matrix's own orientation.
  DType in_dtype = DType::kF32;
  const void* in = nullptr;
  DType out_dtype = DType::kF32;
  void* out = nullptr;
  MemorySpace space = MemorySpace::kHost;  // Where `in` and `out` live.
};

// Sums values element-wise over every participant of a sharded NS. On success every
// participant holds bit-identical sums. Errors (a failed or timed-out collective) abort the
// task. Called with host memory, or, when ReducesDeviceMemory() is true, possibly with device
// memory of the backend's GPU (the values complete when it is called, the sums in place when it
// returns): a GPU backend then reduces its Gram matrices where it computed them.
class SumReducer {
 public:
  virtual ~SumReducer() = default;
  virtual absl::Status AllReduceSum(absl::Span<float> values) = 0;
  virtual absl::Status AllReduceSum(absl::Span<double> values) = 0;
  virtual bool ReducesDeviceMemory() const { return false; }
};

// A matrix sharded along one dim over several participants, each holding `shards` (blocks that
// are contiguous slices along `partition_dim` spanning the other dim whole). NS runs with the
// sharded dim as the long one: partition_dim 0 works on Gᵀ, 1 on G (args.transpose is
// ignored). The Frobenius norm comes from an all-reduced sum of squares; each step the Gram
// Σ XᵢXᵢᵀ is all-reduced and only the local shards are updated. In kMedium each shard's Gram is
// rounded to bf16 before it enters the sum and the sum is rounded to bf16 after it, as trainers
// do. A participant with no shards still joins every reduction (with zeros).
struct NsShardedTask {
  std::vector<NsShard> shards;
  int partition_dim = 0;         // 0 or 1.
  int64_t gram_size = 0;         // Side of the Gram: cols for partition_dim 0, rows for 1.
  const NsKernelArgs* args = nullptr;
};

// Copies a backend has made between host and device memory, and within device memory, since it
// was created, by direction (bytes, and calls of the copy API). Backends that compute in host
// memory (cpu) make none.
struct CopyCounts {
  int64_t h2d_bytes = 0;
  int64_t h2d_calls = 0;
  int64_t d2h_bytes = 0;
  int64_t d2h_calls = 0;
  int64_t d2d_bytes = 0;
  int64_t d2d_calls = 0;
};

// Static facts about a backend, for GetServerInfo and metrics.
struct BackendInfo {
  std::string name;         // "cpu" or "cuda".
  std::string device;       // For example "OpenBLAS, 2 threads" or "NVIDIA H200 (device 0)".
  int64_t memory_budget_bytes = 0;  // 0 when the backend has no budget of its own.
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual BackendInfo Info() const = 0;

  // Runs every task and returns one status per task, in order. A task's error does not stop
  // the others. Codes: INVALID_ARGUMENT (a task that cannot be run: null pointers, empty
  // shape), RESOURCE_EXHAUSTED (over the backend's memory budget), INTERNAL (a library or
  // device failure, with its message).
  virtual std::vector<absl::Status> Run(absl::Span<const NsTask> tasks) = 0;

  // Runs one sharded task; `reducer` connects the participants. Errors as Run, plus whatever
  // the reducer returns.
  virtual absl::Status RunSharded(const NsShardedTask& task, SumReducer& reducer) = 0;

  // Whether Run fails every task whose input holds a NaN or Inf, and RunSharded every task whose
  // shards (on any participant) do, with INVALID_ARGUMENT before writing the task's `out`, at no
  // cost to finite inputs: a caller that has not looked at an input may then leave the check to
  // the backend (server/step does, for a lone client's input read in place from a shared-memory
  // region) and look for the element only when the task failed. False by default: such a
  // backend computes whatever NaN and Inf give.
  virtual bool FailsNonFiniteInput() const { return false; }

  // Bytes of device memory tasks use now (free blocks a pool keeps cached are not counted), for
  // the orthoserve_device_memory_bytes{kind="used"} gauge. Backends without device memory of
  // their own (cpu) keep the default, 0. Thread-safe.
  virtual int64_t DeviceMemoryInUseBytes() const { return 0; }

  // Host-device copies so far, for orthoserve_device_copy_bytes_total and
  // orthoserve_device_copies_total. Backends without device memory keep the default (none).
  // Thread-safe.
  virtual CopyCounts Copies() const { return {}; }

  // The memory this backend computes in (memory.h): host memory unless the backend has a device
  // of its own (cuda), whose copies then count in Copies().
  virtual Memory& memory() { return host_memory_; }

  // Opens other processes' GPU memory from CUDA IPC handles on this backend's device, for
  // shared-memory regions (ipc_memory.h); null when the backend computes in host memory (cpu),
  // which then takes no such regions. Owned by the backend; valid for its lifetime.
  virtual IpcOpener* ipc_opener() { return nullptr; }

 private:
  HostMemory host_memory_;
};

}  // namespace orthoserve
