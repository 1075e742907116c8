// Implementation of client/cpp/matrix.h.
#include "client/cpp/matrix.h"

#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "proto/convert/grpc_status.h"
#include "common/message_text.h"
#include "common/status.h"
#include "proto/convert/ns_options_proto.h"

namespace orthoserve::client {

namespace {

absl::Status CheckSlice(const RegionSlice& slice, const std::string& what, const char* field) {
  if (slice.region_id.empty() || slice.address.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": its ", field, " has no ",
                                                   slice.region_id.empty() ? "region id" : "address",
                                                   "; make slices with Region::Slice"));
  }
  return absl::OkStatus();
}

// The region fields of `input` (named `what`) against its other fields.
absl::Status CheckRegions(const MatrixInput& input, const std::string& what) {
  if (input.input_region.has_value()) {
    RETURN_IF_ERROR(CheckSlice(*input.input_region, what, "input_region"));
    if (input.data != nullptr || input.bytes != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": it names an input_region and also carries data (", input.bytes,
          " bytes); give one or the other (data null and bytes 0 for a matrix in a region)"));
    }
  }
  if (input.result_region.has_value()) {
    RETURN_IF_ERROR(CheckSlice(*input.result_region, what, "result_region"));
    if (input.result != nullptr || input.result_bytes != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": it names a result_region and also a result buffer; give one or the other"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Block> CheckInput(const MatrixInput& input) {
  const std::string what = absl::StrCat("matrix \"", input.name, "\"");
  ASSIGN_OR_RETURN(Matrix2d m, ViewAs2d(input.shape, what + " shape", input.layout));
  Block block = input.block.value_or(WholeBlock(m));
  RETURN_IF_ERROR(CheckBlockInside(block, m, what + " block"));
  const size_t expected = static_cast<size_t>(block.numel()) * ElementSize(input.dtype);
  RETURN_IF_ERROR(CheckRegions(input, what));
  // An input in a region carries no data (CheckRegions); its slice is checked by the server.
  if (!input.input_region.has_value() && input.bytes != expected) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", input.bytes, " data bytes given, but block ",
                                                   BlockString(block), " of ", DTypeName(input.dtype), " needs ",
                                                   expected));
  }
  if (!input.input_region.has_value() && expected > 0 && input.data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": data is null"));
  }
  if (input.result != nullptr || input.result_bytes != 0) {
    const DType result_dtype = input.result_dtype.value_or(input.dtype);
    const size_t needed = static_cast<size_t>(block.numel()) * ElementSize(result_dtype);
    if (input.result == nullptr || input.result_bytes != needed) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": result buffer of ", input.result_bytes, " bytes",
                                                     input.result == nullptr ? " is null" : "", "; block ",
                                                     BlockString(block), " of ", DTypeName(result_dtype), " needs ",
                                                     needed));
    }
  }
  return block;
}

absl::Status CheckResultBuffer(const MatrixInput& input, const MatrixOutput& output, size_t expected) {
  if (input.result == nullptr || !output.status.ok() || expected == input.result_bytes) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("matrix \"", input.name, "\": the server's result is ", expected, " bytes of ",
                                          DTypeName(output.dtype), ", but its result buffer holds ", input.result_bytes,
                                          " (the server did not use the result dtype asked for)"));
}

absl::Status StoreResult(const MatrixInput& input, absl::string_view bytes, MatrixOutput& output) {
  RETURN_IF_ERROR(CheckResultBuffer(input, output, bytes.size()));
  if (input.result != nullptr) {
    std::memcpy(input.result, bytes.data(), bytes.size());
    output.in_place = true;
    return absl::OkStatus();
  }
  output.data.assign(bytes.begin(), bytes.end());
  return absl::OkStatus();
}

v1::MatrixSpec ToSpec(const MatrixInput& input) {
  v1::MatrixSpec spec;
  spec.set_name(input.name);
  for (int64_t d : input.shape) spec.add_shape(d);
  if (input.layout != NdLayout::kFlatten) spec.set_nd_layout(NdLayoutToProto(input.layout));
  spec.set_dtype(DTypeToProto(input.dtype));
  if (input.result_dtype.has_value()) spec.set_result_dtype(DTypeToProto(*input.result_dtype));
  *spec.mutable_options() = NsOptionsToProto(input.options);
  spec.set_algorithm(input.algorithm);
  spec.set_partition_dim(input.partition_dim);
  if (input.block.has_value()) *spec.mutable_block() = BlockToProto(*input.block);
  if (input.input_region.has_value()) *spec.mutable_input_region() = RegionSliceToProto(*input.input_region);
  if (input.result_region.has_value()) *spec.mutable_result_region() = RegionSliceToProto(*input.result_region);
  return spec;
}

v1::RegionSlice RegionSliceToProto(const RegionSlice& slice) {
  v1::RegionSlice out;
  out.set_region_id(slice.region_id);
  out.set_offset(slice.offset);
  out.set_size(slice.size);
  return out;
}

absl::Status CheckResultRegion(const MatrixInput& input, const v1::MatrixResult& result) {
  auto error = [&](absl::string_view what) {
    return absl::InternalError(absl::StrCat("server protocol error: the result for matrix ", result.index(), " (\"",
                                            BoundedText(input.name), "\") ", what));
  };
  if (!input.result_region.has_value()) {
    if (result.has_result_region()) return error("names a result_region, but none was asked for");
    return absl::OkStatus();
  }
  const v1::RegionSlice& got = result.result_region();
  const RegionSlice& sent = *input.result_region;
  if (!result.has_result_region() || got.region_id() != sent.region_id || got.offset() != sent.offset ||
      got.size() != sent.size) {
    return error(absl::StrCat("was not written into the region slice this call named (", sent.region_id, " at ",
                              sent.offset, "+", sent.size, ")"));
  }
  if (!result.data().empty()) return error("carries data inline as well as in its result_region");
  return absl::OkStatus();
}

absl::StatusOr<MatrixOutput> FromResult(const v1::MatrixResult& result) {
  MatrixOutput out;
  out.index = result.index();
  out.name = result.name();
  out.shape.assign(result.shape().begin(), result.shape().end());
  out.block = BlockFromProto(result.block());
  out.status = StatusFromCode(result.code(), result.message());
  if (!out.status.ok()) return out;
  const std::string what = absl::StrCat("server result for matrix ", result.index(), " \"", result.name(), "\"");
  auto dtype = DTypeFromProto(result.dtype(), what + " dtype");
  if (!dtype.ok()) return absl::InternalError(dtype.status().message());
  out.dtype = *dtype;
  auto layout = NdLayoutFromProto(result.nd_layout(), what + " nd_layout");
  if (!layout.ok()) return absl::InternalError(layout.status().message());
  out.layout = *layout;
  // Only bf16 is echoed; any other value leaves kFp32, which refuses a bf16 request.
  if (result.normalization() == v1::NORMALIZATION_BF16) out.normalization = Normalization::kBf16;
  auto m = ViewAs2d(out.shape, what + " shape", out.layout);
  if (!m.ok()) return absl::InternalError(m.status().message());
  if (out.block == Block{}) out.block = WholeBlock(*m);
  absl::Status inside = CheckBlockInside(out.block, *m, what + " block");
  if (!inside.ok()) return absl::InternalError(inside.message());
  return out;
}

absl::Status CheckLayoutEchoed(const MatrixInput& input, const MatrixOutput& output) {
  if (!output.status.ok()) return absl::OkStatus();
  if (input.options.normalization == Normalization::kBf16 && output.normalization != Normalization::kBf16) {
    return absl::FailedPreconditionError(absl::StrCat(
        "matrix \"", input.name, "\": the server did not normalize it in bf16 (its result does not echo "
        "normalization bf16: the server predates NsOptions.normalization and normalized in fp32); upgrade the "
        "server, or send normalization fp32"));
  }
  if (input.layout != NdLayout::kBatch || output.layout == NdLayout::kBatch) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "matrix \"", input.name, "\": the server did not read it as a batch of matrices (its result does not echo "
      "nd_layout batch: the server predates MatrixSpec.nd_layout and computed the flattened matrix); upgrade the "
      "server, or send it flattened"));
}

absl::Status CheckResultIsFor(const MatrixInput& input, int index, const MatrixOutput& output) {
  auto mismatch = [&](absl::string_view what, const std::string& got, const std::string& sent) {
    return absl::InternalError(absl::StrCat("server protocol error: the result for matrix ", index, " (\"",
                                            BoundedText(input.name), "\") is not for what this client sent: its ",
                                            what, " is ", got, ", sent ", sent));
  };
  if (output.index != index) return mismatch("index", absl::StrCat(output.index), absl::StrCat(index));
  if (output.name != input.name) {
    return mismatch("name", absl::StrCat("\"", BoundedText(output.name), "\""),
                    absl::StrCat("\"", BoundedText(input.name), "\""));
  }
  if (output.shape != input.shape) {
    return mismatch("shape", absl::StrCat("[", ListText(output.shape), "]"), absl::StrCat("[", ListText(input.shape), "]"));
  }
  if (!output.status.ok()) return absl::OkStatus();  // An error names no block.
  absl::StatusOr<Block> sent = CheckInput(input);
  if (!sent.ok()) return absl::InternalError(sent.status().message());
  if (!(output.block == *sent)) {
    auto text = [](const Block& b) {
      return absl::StrCat("rows ", b.row_offset, "+", b.rows, ", cols ", b.col_offset, "+", b.cols);
    };
    return mismatch("block", text(output.block), text(*sent));
  }
  return absl::OkStatus();
}

size_t ExpectedBytes(const MatrixOutput& output) {
  if (!output.status.ok()) return 0;
  return static_cast<size_t>(output.block.numel()) * ElementSize(output.dtype);
}

}  // namespace orthoserve::client
