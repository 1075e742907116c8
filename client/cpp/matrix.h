// The C++ client's view of one matrix: what a caller sends (MatrixInput), what comes back
// (MatrixOutput), the step header (StepOptions), and their translation to and from the wire.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"
#include "common/ns_options.h"
#include "common/shape.h"
#include "orthoserve/v1/orthogonalizer.pb.h"

namespace orthoserve::client {

// Bytes [offset, offset + size) of a shared-memory region registered on the server at `address`
// (client/cpp/region.h, docs/shared_memory.md), as a MatrixInput names it for its input or its
// result: the wire's v1::RegionSlice plus the address, since a call that names a region can only go
// to the server rank that holds it. Made by Region::Slice; the client does not check the bounds or
// the alignment (the server does: OUT_OF_RANGE for a slice outside its region, INVALID_ARGUMENT for
// a size that is not the block's or an offset that is not a multiple of the element size,
// NOT_FOUND for a region this tenant does not have, e.g. after Region::Unregister).
struct RegionSlice {
  std::string region_id;  // Region::id().
  std::string address;    // Region::address(): one of the client's addresses.
  int64_t offset = 0;
  int64_t size = 0;
};

// One matrix (or this rank's block of it) to orthogonalize. The caller owns `data`, which must
// stay valid and unchanged until the call that takes the input returns.
struct MatrixInput {
  std::string name;                                     // Unique within a call; names it in errors.
  std::vector<int64_t> shape;                           // Global shape, >= 2 dims, each > 0.
  NdLayout layout = NdLayout::kFlatten;                 // How an N-d shape is read as matrices.
  DType dtype = DType::kF32;                            // Dtype of `data`.
  std::optional<DType> result_dtype;                    // Dtype of the result; default `dtype`.
  NsOptions options;                                    // Newton–Schulz options (docs/numerics.md).
  v1::Algorithm algorithm = v1::ALGORITHM_UNSPECIFIED;  // Distributed algorithm; default AUTO.
  int partition_dim = 0;                                // TP modes: 0 (rows) or 1 (cols).
  std::optional<Block> block;                           // This rank's block; unset: whole matrix.
  const void* data = nullptr;                           // Block elements, row-major, `dtype`.
  size_t bytes = 0;                                     // Must be block.numel() · ElementSize(dtype).
  // Optional: where the result block goes, instead of a new MatrixOutput::data (no allocation,
  // one copy, straight from gRPC's buffers). Caller-owned, valid until the call returns; it must
  // hold exactly block.numel() · ElementSize(result dtype) bytes and overlap no input's `data` (a
  // retry sends the inputs again). Its contents are unspecified if the matrix fails. Null: the
  // result comes in MatrixOutput::data.
  void* result = nullptr;
  size_t result_bytes = 0;
  // Same-host clients (client/cpp/region.h): the block's bytes are in this slice of a registered
  // region instead of `data` (`data` must then be null and `bytes` 0), and the server reads them
  // where they are: nothing is sent. The slice must hold exactly the block's bytes and must not
  // be written while the call runs. In unary calls, lone steps and group steps (GroupClient::Step
  // then sends the step to the region's member).
  std::optional<RegionSlice> input_region;
  // The server writes the result block into this slice (exactly block.numel() · ElementSize(result
  // dtype) bytes, not overlapping `input_region`) instead of sending it back; not together with
  // `result`. The slice holds the result once the call returned it OK (MatrixOutput::result_region);
  // it is unspecified if the matrix fails. Do not read it while the call runs.
  std::optional<RegionSlice> result_region;
};

// The result of one matrix. On error `status` carries the server's code and message and `data`
// is empty.
struct MatrixOutput {
  int index = 0;  // Position in the call's input list.
  std::string name;
  absl::Status status;         // Per-matrix outcome (MatrixResult.code/message).
  DType dtype = DType::kF32;   // Dtype of `data` (meaningful when status is OK).
  std::vector<int64_t> shape;  // Global shape, as sent.
  NdLayout layout = NdLayout::kFlatten;  // As sent.
  // kBf16 when the server echoed NORMALIZATION_BF16 (MatrixResult.normalization).
  Normalization normalization = Normalization::kFp32;
  Block block;                 // The block `data` holds, in the 2-D view of shape and layout.
  std::vector<char> data;      // Block elements, row-major; empty when `in_place`.
  // The elements went to the input's `result` buffer or its `result_region` instead of `data`.
  bool in_place = false;
  // The slice the server wrote the result into (the input's result_region, which the server's
  // answer echoed), when the input named one and the matrix succeeded.
  std::optional<RegionSlice> result_region;
};

// The group fields of a stream step. A lone client keeps the defaults.
struct StepOptions {
  std::string job;    // Trainer job id; empty for a lone client.
  std::string group;  // Group name within the job; empty for a lone client.
  int64_t step = 0;   // Optimizer step number; every rank of a group sends the same one.
  int rank = 0;       // This trainer's rank in the group, 0 <= rank < world.
  int world = 1;      // Number of trainer ranks in the group.
  // Group steps (world > 1): the run's id, shared by every rank of the run (StepHeader.run_id);
  // empty: DefaultRunId() (client/cpp/run_id.h). Not sent for a lone client.
  std::string run_id;
};

// The block an input covers: its explicit block, or the whole 2-D view. INVALID_ARGUMENT (naming
// the matrix) for a bad shape, a block outside the matrix, or `bytes` that do not match the block,
// or null data for a non-empty block; for a `result` buffer whose size is not the result block's
// (or a size without a buffer); for an `input_region` given with data or bytes, a `result_region`
// given with a `result` buffer, or a region slice without a region id or address. (Client calls
// also check that result buffers overlap nothing, and that all the regions a call names are on one
// of its addresses.)
absl::StatusOr<Block> CheckInput(const MatrixInput& input);

// The wire form of a slice (without its address).
v1::RegionSlice RegionSliceToProto(const RegionSlice& slice);

// INTERNAL ("server protocol error") unless the OK `result` of `input` says its data is in the
// result_region `input` named (the same region id, offset and size) and carries none inline, or,
// when `input` named no result_region, names none.
absl::Status CheckResultRegion(const MatrixInput& input, const v1::MatrixResult& result);

// The wire spec of an input (does not validate; call CheckInput first).
v1::MatrixSpec ToSpec(const MatrixInput& input);

// Maps a wire MatrixResult (without its data) to a MatrixOutput with the per-matrix status.
// An all-zero block means the whole matrix. INTERNAL when the server sent an OK result that is
// unusable (no dtype, bad shape, block outside the shape).
absl::StatusOr<MatrixOutput> FromResult(const v1::MatrixResult& result);

// FAILED_PRECONDITION when `input` was sent as a batch (NdLayout::kBatch) and the successful
// `output` does not echo that layout: the server predates MatrixSpec.nd_layout and computed the
// flattened matrix instead, a different answer of the same size. The same when `input` asked for
// Normalization::kBf16 and `output` does not echo it (a server older than the option normalized
// in fp32). OK otherwise.
absl::Status CheckLayoutEchoed(const MatrixInput& input, const MatrixOutput& output);

// INTERNAL ("server protocol error") unless `output`, the result at position `index`, is the
// result of `input` as this client sent it: the same index, name and global shape, and (when OK)
// the block that was sent (CheckInput's: the whole 2-D view when unset). A group step's answer is
// thereby provably this rank's own blocks of this plan; a mismatch is never returned as data.
absl::Status CheckResultIsFor(const MatrixInput& input, int index, const MatrixOutput& output);

// Bytes the data of an OK output must have: block.numel() · ElementSize(dtype); 0 on error.
size_t ExpectedBytes(const MatrixOutput& output);

// Stores an OK result's `bytes` for `input`: into input.result (output.in_place) or output.data.
// (A result in the input's result_region has no bytes to store: see CheckResultRegion.)
// INTERNAL when the server's result does not have the size the result buffer was given for (its
// dtype differs from the one asked for).
absl::Status StoreResult(const MatrixInput& input, absl::string_view bytes, MatrixOutput& output);

// INTERNAL unless the server's OK result of `expected` bytes fits `input`'s result buffer (when it has one).
absl::Status CheckResultBuffer(const MatrixInput& input, const MatrixOutput& output, size_t expected);

}  // namespace orthoserve::client
