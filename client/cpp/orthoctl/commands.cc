// Implementation of client/cpp/orthoctl/commands.h: info, health, orthogonalize, bench.
#include "client/cpp/orthoctl/commands.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "client/cpp/npy.h"
#include "client/cpp/orthoctl/connection_flags.h"
#include "client/cpp/orthoctl/flags.h"
#include "client/cpp/orthoctl/ns_flags.h"
#include "common/shape.h"
#include "common/status.h"
#include "google/protobuf/util/json_util.h"

namespace orthoserve::orthoctl {
namespace {

using client::Client;
using client::MatrixInput;
using client::MatrixOutput;

std::string StatusText(const absl::Status& status) {
  return absl::StrCat(absl::StatusCodeToString(status.code()), ": ", status.message());
}

// Prints `status` and returns `code`.
int Fail(std::ostream& err, int code, const absl::Status& status) {
  err << "orthoctl: " << StatusText(status) << "\n";
  return code;
}

// Parses flags; returns -1 to continue, or the exit code (help printed, or a usage error).
int ParseOrExit(FlagSet& flags, const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  absl::Status parsed = flags.Parse(args);
  if (!parsed.ok()) {
    err << "orthoctl: " << parsed.message() << "\n";
    return kExitUsage;
  }
  if (flags.help_requested()) {
    out << flags.Usage();
    return kExitOk;
  }
  return -1;
}

// Exit code for a failure to build the client: bad option combinations are usage errors,
// unreadable files I/O errors.
int ClientSetupExit(const absl::Status& status) {
  return status.code() == absl::StatusCode::kInvalidArgument ? kExitUsage : kExitIo;
}

absl::StatusOr<std::unique_ptr<Client>> MakeClient(const ConnectionFlagValues& conn, int chunk_bytes, int* exit_code) {
  absl::StatusOr<client::ClientOptions> options = ClientOptionsFromFlags(conn);
  if (!options.ok()) {
    *exit_code = ClientSetupExit(options.status());
    return options.status();
  }
  if (chunk_bytes < 0) {
    *exit_code = kExitUsage;
    return absl::InvalidArgumentError("--chunk-bytes must be >= 0");
  }
  options->chunk_bytes = static_cast<size_t>(chunk_bytes);
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Create(*options);
  if (!c.ok()) *exit_code = ClientSetupExit(c.status());
  return c;
}

// Converts `count` elements between dtypes through fp32.
std::vector<char> Convert(DType from, DType to, const std::vector<char>& data) {
  if (from == to) return data;
  const size_t count = data.size() / ElementSize(from);
  std::vector<float> wide(count);
  ConvertToF32(from, data.data(), count, wide.data());
  std::vector<char> narrow(count * ElementSize(to));
  ConvertFromF32(to, wide.data(), count, narrow.data());
  return narrow;
}

std::string ShapeText(const std::vector<int64_t>& shape) { return absl::StrCat("[", absl::StrJoin(shape, ", "), "]"); }

void PrintInfo(const v1::ServerInfo& info, std::ostream& out) {
  out << "version:       " << info.version() << "\n"
      << "backend:       " << info.backend() << " (" << info.device() << ")\n"
      << "fleet:         rank " << info.fleet_rank() << " of " << info.fleet_world()
      << (info.ready() ? ", ready" : ", NOT ready") << "\n"
      << "auth required: " << (info.auth_required() ? "yes" : "no") << "\n";
  if (info.has_coordinator()) {
    const v1::FleetCoordinator& c = info.coordinator();
    out << "coordinator:   ";
    if (c.rank() < 0) {
      out << "none known yet";
    } else {
      out << "rank " << c.rank();
    }
    if (c.membership() == "etcd") {
      out << " (elected in etcd, term " << c.term() << "; etcd "
          << (c.etcd_reachable() ? std::string("reachable")
                                 : absl::StrCat("UNREACHABLE for ", static_cast<int64_t>(c.etcd_unreachable_seconds()),
                                                " s: ", c.etcd_error()))
          << ")";
    } else {
      out << " (static)";
    }
    out << "\n";
  }
  out << "members:\n";
  for (const v1::FleetMember& m : info.members()) {
    out << "  " << m.rank() << "  " << m.address() << (m.ready() ? "  ready" : "  not ready") << "\n";
  }
  out << "dtypes:        " << absl::StrJoin(info.dtypes(), ", ") << "\n"
      << "coefficients:  " << absl::StrJoin(info.coefficients(), ", ") << "\n"
      << "precisions:    " << absl::StrJoin(info.precisions(), ", ") << "\n"
      << "scale modes:   " << absl::StrJoin(info.scale_modes(), ", ") << "\n"
      << "algorithms:    " << absl::StrJoin(info.algorithms(), ", ") << "\n"
      << "nd layouts:    " << absl::StrJoin(info.nd_layouts(), ", ") << "\n";
  const v1::Limits& l = info.limits();
  out << "limits:\n"
      << "  max_message_bytes          " << l.max_message_bytes() << "\n"
      << "  chunk_bytes                " << l.chunk_bytes() << "\n"
      << "  max_matrix_elements        " << l.max_matrix_elements() << "\n"
      << "  max_inflight_bytes         " << l.max_inflight_bytes() << "\n"
      << "  max_tenant_inflight_bytes  " << l.max_tenant_inflight_bytes() << "\n"
      << "  max_concurrent_streams     " << l.max_concurrent_streams() << "\n"
      << "  max_tenant_concurrent_streams " << l.max_tenant_concurrent_streams() << "\n"
      << "  max_steps                  " << l.max_steps() << "\n"
      << "  rendezvous_timeout_seconds " << l.rendezvous_timeout_seconds() << "\n"
      << "  max_name_bytes             " << l.max_name_bytes() << "\n"
      << "  max_shape_dims             " << l.max_shape_dims() << "\n"
      << "  max_matrices_per_step      " << l.max_matrices_per_step() << "\n"
      << "  max_group_world            " << l.max_group_world() << "\n"
      << "  max_tenant_pending_steps   " << l.max_tenant_pending_steps() << "\n";
}

}  // namespace

std::string MainUsage() {
  return "usage: orthoctl SUBCOMMAND [flags]\n\n"
         "Command-line client of an orthoserve server (Muon's Newton–Schulz orthogonalization).\n\n"
         "subcommands:\n"
         "  info            print the server's version, backend, fleet, options and limits (--json for JSON)\n"
         "  health          grpc.health.v1 check; exit 0 when SERVING\n"
         "  orthogonalize   orthogonalize a .npy matrix (--in IN.npy --out OUT.npy) in one stream step\n"
         "  bench           time repeated steps of random matrices; median latency and throughput (--shm: through\n"
         "                  a shared-memory region, on the server's host)\n\n"
         "Every subcommand takes --server HOST:PORT (default 127.0.0.1:50051), --timeout, --token-file,\n"
         "--tls-ca, --tls-cert, --tls-key, --tls-server-name. `orthoctl SUBCOMMAND --help` lists its flags.\n"
         "info, orthogonalize and bench retry calls that fail with UNAVAILABLE (or ABORTED by a fleet change)\n"
         "for up to --retry-deadline seconds (default 120); --no-retry makes one attempt.\n\n"
         "exit codes: 0 ok, 1 usage error, 2 RPC failure (server error, failed matrix, not serving),\n"
         "3 I/O error (a file could not be read, parsed or written)\n";
}

int RunInfo(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  FlagSet flags("orthoctl info [flags]",
                "Prints GetServerInfo: version, backend, device, fleet members, supported "
                "options and limits.");
  ConnectionFlagValues conn;
  bool json = false;
  AddConnectionFlags(&flags, &conn);
  AddRetryFlags(&flags, &conn);
  flags.AddBool("json", "print the ServerInfo message as JSON (proto field names)", &json);
  if (int rc = ParseOrExit(flags, args, out, err); rc >= 0) return rc;
  int rc = kExitRpc;
  absl::StatusOr<std::unique_ptr<Client>> c = MakeClient(conn, 0, &rc);
  if (!c.ok()) return Fail(err, rc, c.status());
  absl::StatusOr<v1::ServerInfo> info = (*c)->GetServerInfo();
  if (!info.ok()) return Fail(err, kExitRpc, info.status());
  if (json) {
    google::protobuf::util::JsonPrintOptions options;
    options.add_whitespace = true;
    options.preserve_proto_field_names = true;
    options.always_print_primitive_fields = true;
    std::string text;
    if (!google::protobuf::util::MessageToJsonString(*info, &text, options).ok()) {
      return Fail(err, kExitRpc, absl::InternalError("cannot print ServerInfo as JSON"));
    }
    out << text;
    if (text.empty() || text.back() != '\n') out << "\n";
  } else {
    PrintInfo(*info, out);
  }
  return kExitOk;
}

int RunHealth(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  FlagSet flags("orthoctl health [flags]",
                "Calls grpc.health.v1.Health/Check for the whole server. Prints SERVING and exits 0 when the server "
                "serves; prints why and exits 2 otherwise (not serving, unreachable, no health service).");
  ConnectionFlagValues conn;
  AddConnectionFlags(&flags, &conn);
  if (int rc = ParseOrExit(flags, args, out, err); rc >= 0) return rc;
  int rc = kExitRpc;
  absl::StatusOr<std::unique_ptr<Client>> c = MakeClient(conn, 0, &rc);
  if (!c.ok()) return Fail(err, rc, c.status());
  absl::Status health = (*c)->Health();
  if (!health.ok()) return Fail(err, kExitRpc, health);
  out << "SERVING\n";
  return kExitOk;
}

int RunOrthogonalize(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  FlagSet flags("orthoctl orthogonalize --in IN.npy --out OUT.npy [flags]",
                "Reads a float32 ('<f4'), float16 ('<f2') or, with --bf16, bfloat16 ('<V2') C-order .npy array (2-D, "
                "or N-d viewed as shape[0] x "
                "prod(rest)), orthogonalizes it on the server in one OrthogonalizeStream step (any size; chunked), "
                "and writes the result in the input's dtype and shape. Unset options take the server defaults "
                "(docs/numerics.md).");
  ConnectionFlagValues conn;
  NsFlagValues ns;
  std::string in_path, out_path, name;
  int chunk_bytes = 0;
  bool bf16 = false;
  flags.AddString("in", "IN.npy", "input array (required)", &in_path);
  flags.AddString("out", "OUT.npy", "output file (required; overwritten)", &out_path);
  flags.AddString("name", "NAME", "matrix name sent to the server (default: the input's file name)", &name);
  flags.AddInt("chunk-bytes", "N", "DataChunk size (default 4 MiB, lowered to the server's limit)", &chunk_bytes);
  flags.AddBool("bf16",
                "read a 2-byte void ('<V2', ml_dtypes bfloat16) input as bfloat16; the output is written as '<V2' "
                "too (np.load(OUT).view(ml_dtypes.bfloat16))",
                &bf16);
  AddNsFlags(&flags, &ns);
  AddConnectionFlags(&flags, &conn);
  AddRetryFlags(&flags, &conn);
  if (int rc = ParseOrExit(flags, args, out, err); rc >= 0) return rc;
  if (in_path.empty() || out_path.empty()) {
    err << "orthoctl: orthogonalize needs --in and --out; see --help\n";
    return kExitUsage;
  }
  absl::StatusOr<NsOptions> options = NsOptionsFromFlags(ns);
  if (!options.ok()) return Fail(err, kExitUsage, options.status());
  absl::StatusOr<std::optional<DType>> wire = WireDTypeFromFlags(ns);
  if (!wire.ok()) return Fail(err, kExitUsage, wire.status());
  absl::StatusOr<v1::Algorithm> algorithm = AlgorithmFromFlags(ns);
  if (!algorithm.ok()) return Fail(err, kExitUsage, algorithm.status());
  absl::StatusOr<NdLayout> layout = NdLayoutFromFlags(ns);
  if (!layout.ok()) return Fail(err, kExitUsage, layout.status());

  client::NpyReadOptions read_options;
  read_options.void2_as_bf16 = bf16;
  absl::StatusOr<client::NpyArray> array = client::ReadNpy(in_path, read_options);
  if (!array.ok()) return Fail(err, kExitIo, array.status());
  absl::StatusOr<Matrix2d> m = ViewAs2d(array->shape, in_path + " shape", *layout);
  if (!m.ok()) return Fail(err, kExitIo, m.status());
  absl::Status for_shape = ValidateNsOptionsForShape(*options, *m, "options");
  if (!for_shape.ok()) return Fail(err, kExitUsage, for_shape);

  int rc = kExitRpc;
  absl::StatusOr<std::unique_ptr<Client>> c = MakeClient(conn, chunk_bytes, &rc);
  if (!c.ok()) return Fail(err, rc, c.status());

  const DType wire_dtype = wire->value_or(array->dtype);
  const std::vector<char> payload = Convert(array->dtype, wire_dtype, array->data);
  MatrixInput input;
  input.name = name.empty() ? in_path.substr(in_path.find_last_of('/') + 1) : name;
  input.shape = array->shape;
  input.layout = *layout;
  input.dtype = wire_dtype;
  input.options = *options;
  input.algorithm = *algorithm;
  input.data = payload.data();
  input.bytes = payload.size();
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<MatrixOutput>> result = (*c)->Step(client::StepOptions{}, {&input, 1});
  const absl::Duration elapsed = absl::Now() - start;
  if (!result.ok()) return Fail(err, kExitRpc, result.status());
  MatrixOutput& output = (*result)[0];
  if (!output.status.ok())
    return Fail(err, kExitRpc, Annotate(output.status, absl::StrCat("matrix \"", input.name, "\"")));
  if (!(output.block == WholeBlock(*m))) {
    return Fail(err, kExitRpc,
                absl::InternalError(
                    absl::StrCat("server returned block ", BlockString(output.block), ", not the whole matrix")));
  }
  client::NpyArray result_array;
  result_array.dtype = array->dtype;
  result_array.shape = array->shape;
  result_array.data = Convert(output.dtype, array->dtype, output.data);
  absl::Status written = client::WriteNpy(out_path, result_array);
  if (!written.ok()) return Fail(err, kExitIo, written);
  std::optional<v1::StepSummary> summary = (*c)->last_summary();
  out << absl::StrFormat("%s: %s %s in %.3f ms", out_path, ShapeText(array->shape), DTypeName(array->dtype),
                         absl::ToDoubleMilliseconds(elapsed));
  if (summary.has_value()) {
    out << absl::StrFormat(" (server %.3f ms, fleet rank %d)", summary->server_seconds() * 1e3, summary->fleet_rank());
  }
  out << "\n";
  return kExitOk;
}

int RunBench(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  FlagSet flags("orthoctl bench [flags]",
                "Times --iters steps (after --warmup untimed ones), each carrying --matrices random normal matrices of "
                "--shape in --wire-dtype, as lone-client stream steps (or unary calls with --unary). Prints the "
                "median/p99/min/max latency per step and the median throughput: matrices/s, payload GB/s (sent + "
                "received bytes) and NS GFLOP/s (2 per multiply-add, as computed). With --shm (orthoctl on the "
                "server's host, the server started with --shm-socket) the matrices go through a shared-memory "
                "region instead: their inputs are written into it once, the server reads them and writes the "
                "results there in place, and only the specs travel on the connection (payload GB/s then counts the "
                "same bytes, moved through the region).");
  ConnectionFlagValues conn;
  NsFlagValues ns;
  std::string shape_text = "1024,1024";
  int matrices = 1, iters = 10, warmup = 2, chunk_bytes = 0, seed = 1;
  bool unary = false;
  flags.AddString("shape", "R,C[,...]", "matrix shape (default 1024,1024)", &shape_text);
  flags.AddInt("matrices", "N", "matrices per step (default 1)", &matrices);
  flags.AddInt("iters", "N", "timed steps (default 10)", &iters);
  double duration = 0;
  flags.AddDouble("duration", "SECONDS", "stop timing steps after this long, even before --iters (default 0: no limit)",
                  &duration);
  flags.AddInt("warmup", "N", "untimed steps first (default 2)", &warmup);
  flags.AddInt("seed", "N", "random seed (default 1)", &seed);
  flags.AddInt("chunk-bytes", "N", "DataChunk size (default 4 MiB, lowered to the server's limit)", &chunk_bytes);
  flags.AddBool("unary", "use the unary Orthogonalize call instead of a stream step", &unary);
  bool shm = false;
  std::string shm_socket;
  flags.AddBool("shm",
                "move inputs and results through a shared-memory region registered on the server (same host; the "
                "server needs --shm-socket) instead of sending bytes",
                &shm);
  flags.AddString("shm-socket", "PATH",
                  "with --shm: the server's handover socket as seen here (default: the path the server reports)",
                  &shm_socket);
  AddNsFlags(&flags, &ns);
  AddConnectionFlags(&flags, &conn);
  AddRetryFlags(&flags, &conn);
  if (int rc = ParseOrExit(flags, args, out, err); rc >= 0) return rc;
  std::vector<int64_t> shape;
  for (absl::string_view part : absl::StrSplit(shape_text, ',')) {
    int64_t d = 0;
    if (!absl::SimpleAtoi(part, &d)) return Fail(err, kExitUsage, absl::InvalidArgumentError("--shape expects R,C"));
    shape.push_back(d);
  }
  absl::StatusOr<NdLayout> layout = NdLayoutFromFlags(ns);
  if (!layout.ok()) return Fail(err, kExitUsage, layout.status());
  absl::StatusOr<Matrix2d> m = ViewAs2d(shape, "--shape", *layout);
  if (!m.ok()) return Fail(err, kExitUsage, m.status());
  if (matrices < 1 || iters < 1 || warmup < 0) {
    return Fail(err, kExitUsage, absl::InvalidArgumentError("--matrices and --iters must be >= 1, --warmup >= 0"));
  }
  if (!shm_socket.empty() && !shm) {
    return Fail(err, kExitUsage, absl::InvalidArgumentError("--shm-socket goes with --shm"));
  }
  absl::StatusOr<NsOptions> options = NsOptionsFromFlags(ns);
  if (!options.ok()) return Fail(err, kExitUsage, options.status());
  absl::Status for_shape = ValidateNsOptionsForShape(*options, *m, "options");
  if (!for_shape.ok()) return Fail(err, kExitUsage, for_shape);
  absl::StatusOr<std::optional<DType>> wire = WireDTypeFromFlags(ns);
  if (!wire.ok()) return Fail(err, kExitUsage, wire.status());
  absl::StatusOr<v1::Algorithm> algorithm = AlgorithmFromFlags(ns);
  if (!algorithm.ok()) return Fail(err, kExitUsage, algorithm.status());
  int rc = kExitRpc;
  absl::StatusOr<std::unique_ptr<Client>> c = MakeClient(conn, chunk_bytes, &rc);
  if (!c.ok()) return Fail(err, rc, c.status());

  const DType dtype = wire->value_or(DType::kF32);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<char>> payloads(matrices);
  std::vector<MatrixInput> inputs(matrices);
  for (int i = 0; i < matrices; ++i) {
    std::vector<float> values(static_cast<size_t>(m->numel()));
    for (float& v : values) v = normal(rng);
    payloads[i].resize(values.size() * ElementSize(dtype));
    ConvertFromF32(dtype, values.data(), values.size(), payloads[i].data());
    inputs[i].name = absl::StrCat("bench", i);
    inputs[i].shape = shape;
    inputs[i].layout = *layout;
    inputs[i].dtype = dtype;
    inputs[i].options = *options;
    inputs[i].algorithm = *algorithm;
    inputs[i].data = payloads[i].data();
    inputs[i].bytes = payloads[i].size();
  }
  // --shm: every input, then every result, at 64-byte aligned offsets of one region.
  std::unique_ptr<client::Region> region;
  if (shm) {
    const int64_t bytes_each = static_cast<int64_t>(payloads[0].size());
    const int64_t stride = (bytes_each + 63) / 64 * 64;
    client::RegionOptions region_options;
    region_options.name = "orthoctl-bench";
    region_options.socket_path = shm_socket;
    absl::StatusOr<std::unique_ptr<client::Region>> made = (*c)->CreateRegion(2 * matrices * stride, region_options);
    if (!made.ok()) return Fail(err, kExitRpc, Annotate(made.status(), "--shm"));
    region = *std::move(made);
    for (int i = 0; i < matrices; ++i) {
      const int64_t in_offset = i * stride, out_offset = (matrices + i) * stride;
      std::memcpy(region->data() + in_offset, payloads[i].data(), payloads[i].size());
      inputs[i].input_region = region->Slice(in_offset, bytes_each);
      inputs[i].result_region = region->Slice(out_offset, bytes_each);
      inputs[i].data = nullptr;
      inputs[i].bytes = 0;
    }
    payloads.clear();
  }
  std::vector<double> seconds, server_seconds;
  absl::Time timed_start = absl::InfiniteFuture();
  for (int it = 0; it < warmup + iters; ++it) {
    if (it == warmup) timed_start = absl::Now();
    if (duration > 0 && absl::Now() - timed_start > absl::Seconds(duration)) break;
    const absl::Time start = absl::Now();
    absl::StatusOr<std::vector<MatrixOutput>> result =
        unary ? (*c)->Orthogonalize(inputs) : (*c)->Step(client::StepOptions{"", "", it, 0, 1, ""}, inputs);
    const double s = absl::ToDoubleSeconds(absl::Now() - start);
    if (!result.ok()) return Fail(err, kExitRpc, result.status());
    for (const MatrixOutput& o : *result) {
      if (!o.status.ok()) return Fail(err, kExitRpc, Annotate(o.status, absl::StrCat("matrix \"", o.name, "\"")));
    }
    if (it < warmup) continue;
    seconds.push_back(s);
    if (!unary && (*c)->last_summary().has_value()) server_seconds.push_back((*c)->last_summary()->server_seconds());
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  };
  const double med = median(seconds);
  const double bytes = 2.0 * matrices * static_cast<double>(m->numel()) * ElementSize(dtype);
  const double flops = matrices * NsFlops(m->rows, m->cols, *options);
  std::string transport = unary ? "unary" : absl::StrCat("stream, chunk ", (*c)->chunk_bytes(), " B");
  if (region != nullptr) {
    transport = absl::StrFormat("%s, inputs and results in shared-memory region %s (%.1f MiB) on %s",
                                unary ? "unary" : "stream", region->id(),
                                static_cast<double>(region->size()) / (1 << 20), region->address());
  }
  out << absl::StrFormat("bench: %d x %s %s per step, %d iters after %d warmup, %s", matrices, ShapeText(shape),
                         DTypeName(dtype), static_cast<int>(seconds.size()), warmup, transport)
      << "\n";
  // p99 by nearest rank: the smallest latency that at least 99% of the steps did not exceed.
  std::vector<double> sorted = seconds;
  std::sort(sorted.begin(), sorted.end());
  const double p99 = sorted[static_cast<size_t>(std::ceil(0.99 * static_cast<double>(sorted.size()))) - 1];
  out << absl::StrFormat("latency:    median %.3f ms  p99 %.3f ms  min %.3f ms  max %.3f ms", med * 1e3, p99 * 1e3,
                         *std::min_element(seconds.begin(), seconds.end()) * 1e3,
                         *std::max_element(seconds.begin(), seconds.end()) * 1e3);
  if (!server_seconds.empty()) out << absl::StrFormat("  (server median %.3f ms)", median(server_seconds) * 1e3);
  out << "\n";
  out << absl::StrFormat("throughput: %.2f matrices/s  %.3f GB/s payload  %.1f GFLOP/s\n", matrices / med,
                         bytes / med / 1e9, flops / med / 1e9);
  if ((*c)->retries() > 0) out << "retries:    " << (*c)->retries() << " (their waits are in the latencies)\n";
  return kExitOk;
}

}  // namespace orthoserve::orthoctl
