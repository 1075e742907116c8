// service_bench: the service's overhead on loopback (docs/architecture.md), measured side by side in one run:
// a remote stream step vs the in-process CPU engine on the same matrices, and a transport-bound
// step (steps = 0) vs a raw loopback TCP echo of the same bytes; and the same two through a
// shared-memory region (docs/shared_memory.md; the server needs --shm-socket). One JSON line per
// measurement.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cpp/client.h"
#include "client/cpp/matrix.h"
#include "client/cpp/orthoctl/flags.h"
#include "client/cpp/region.h"
#include "common/malloc_tuning.h"
#include "common/ns_options.h"
#include "common/shape.h"
#include "common/status.h"
#include "server/engine/cpu/cpu_backend.h"
#include "server/engine/newton_schulz.h"

namespace orthoserve::bench {
namespace {

using client::Client;
using client::MatrixInput;
using client::MatrixOutput;

// "RxC,RxC,..." cycled to `count` shapes.
absl::StatusOr<std::vector<Matrix2d>> ParseShapes(const std::string& text, int count) {
  std::vector<Matrix2d> distinct;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<std::string> dims = absl::StrSplit(part, 'x');
    int64_t r = 0, c = 0;
    if (dims.size() != 2 || !absl::SimpleAtoi(dims[0], &r) || !absl::SimpleAtoi(dims[1], &c) || r < 1 || c < 1) {
      return absl::InvalidArgumentError(absl::StrCat("shapes: expected RxC[,RxC...], got ", part));
    }
    distinct.push_back({r, c});
  }
  if (distinct.empty() || count < 1) return absl::InvalidArgumentError("need at least one shape and one matrix");
  std::vector<Matrix2d> shapes;
  for (int i = 0; i < count; ++i) shapes.push_back(distinct[i % distinct.size()]);
  return shapes;
}

// Random normal fp32 matrices of `shapes` with `options`, as client inputs over `storage`.
std::vector<MatrixInput> MakeInputs(const std::vector<Matrix2d>& shapes, const NsOptions& options, uint32_t seed,
                                    std::vector<std::vector<float>>* storage) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  storage->assign(shapes.size(), {});
  std::vector<MatrixInput> inputs(shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    (*storage)[i].resize(static_cast<size_t>(shapes[i].numel()));
    for (float& v : (*storage)[i]) v = normal(rng);
    inputs[i].name = absl::StrCat("m", i);
    inputs[i].shape = {shapes[i].rows, shapes[i].cols};
    inputs[i].dtype = DType::kF32;
    inputs[i].options = options;
    inputs[i].data = (*storage)[i].data();
    inputs[i].bytes = (*storage)[i].size() * sizeof(float);
  }
  return inputs;
}

struct StepTiming {
  double wall_s = 0;
  double first_result_s = 0;  // From the start to the first complete result.
  double server_s = 0;
};

absl::StatusOr<StepTiming> TimeStep(Client& client, const std::vector<MatrixInput>& inputs,
                                    std::vector<std::vector<char>>* results) {
  StepTiming t;
  const absl::Time start = absl::Now();
  bool first = true;
  ASSIGN_OR_RETURN(std::vector<MatrixOutput> out, client.Step(client::StepOptions{}, inputs, [&](const MatrixOutput&) {
    if (first) t.first_result_s = absl::ToDoubleSeconds(absl::Now() - start);
    first = false;
  }));
  t.wall_s = absl::ToDoubleSeconds(absl::Now() - start);
  if (out.size() != inputs.size()) return absl::InternalError("wrong number of results");
  for (MatrixOutput& o : out) {
    RETURN_IF_ERROR(Annotate(o.status, o.name));
    if (o.in_place) continue;  // In the inputs' result buffers.
    if (o.data.size() != client::ExpectedBytes(o)) return absl::InternalError(absl::StrCat(o.name, ": short result"));
    if (results != nullptr) results->push_back(std::move(o.data));
  }
  if (auto summary = client.last_summary()) t.server_s = summary->server_seconds();
  return t;
}

// The same work in process (fp32 in and out) into `results` as they are: allocated once by the
// caller, one per input, and reused (the in-process reference of the shm part, whose region
// results also land in memory written before: no fresh pages on either side). One backend runs
// every matrix in one Backend::Run; with several, each runs on a thread of its own and takes the
// next matrix not taken yet, as a server's compute workers (--workers) do.
absl::StatusOr<double> TimeEngineInto(const std::vector<Backend*>& backends, const std::vector<MatrixInput>& inputs,
                                      std::vector<std::vector<char>>* results) {
  if (results->size() != inputs.size()) results->assign(inputs.size(), {});
  std::vector<NsKernelArgs> args;
  args.reserve(inputs.size());
  std::vector<NsTask> tasks;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Matrix2d shape{inputs[i].shape[0], inputs[i].shape[1]};
    args.push_back(ResolveKernelArgs(inputs[i].options, shape, shape));
    (*results)[i].resize(inputs[i].bytes);
    tasks.push_back(NsTask{shape, DType::kF32, inputs[i].data, DType::kF32, (*results)[i].data(), &args.back()});
  }
  std::vector<absl::Status> statuses(tasks.size());
  std::atomic<size_t> next{0};
  const absl::Time start = absl::Now();
  if (backends.size() == 1) {
    statuses = backends[0]->Run(tasks);
  } else {
    auto work = [&](Backend* backend) {
      for (size_t i = next++; i < tasks.size(); i = next++) statuses[i] = backend->Run({tasks[i]})[0];
    };
    std::vector<std::thread> threads;
    for (size_t w = 1; w < backends.size(); ++w) threads.emplace_back(work, backends[w]);
    work(backends[0]);
    for (std::thread& t : threads) t.join();
  }
  const double s = absl::ToDoubleSeconds(absl::Now() - start);
  for (const absl::Status& st : statuses) RETURN_IF_ERROR(st);
  return s;
}

// The same work in process: one Backend::Run over every matrix, into new result vectors (as a
// stream step's MatrixOutput::data).
absl::StatusOr<double> TimeEngine(Backend& backend, const std::vector<MatrixInput>& inputs,
                                  std::vector<std::vector<char>>* results) {
  results->assign(inputs.size(), {});
  return TimeEngineInto({&backend}, inputs, results);
}

// `workers` one-thread CPU backends (`owned`) and their pointers, for TimeEngineInto.
absl::StatusOr<std::vector<Backend*>> EngineWorkers(int workers, std::vector<std::unique_ptr<CpuBackend>>* owned) {
  std::vector<Backend*> backends;
  for (int w = 0; w < workers; ++w) {
    ASSIGN_OR_RETURN(std::unique_ptr<CpuBackend> backend, CpuBackend::Create(CpuBackend::Options{1}));
    backends.push_back(backend.get());
    owned->push_back(std::move(backend));
  }
  return backends;
}

// CPU seconds (user + system) this process has used, all threads.
double ProcessCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

absl::Status Errno(absl::string_view what) { return absl::InternalError(absl::StrCat(what, ": ", strerror(errno))); }

// Raw loopback TCP: a client sends `bytes` from `data` (cycled) to an echo thread that sends
// every byte back; the client receives them on a second thread. Returns the seconds from the
// connect to the last byte received back (the same bytes each way as a step moves).
absl::StatusOr<double> TimeRawEcho(const char* data, size_t data_size, size_t bytes, size_t io_size) {
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  if (listener < 0) return Errno("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0 || listen(listener, 1) != 0) {
    absl::Status s = Errno("bind/listen");
    close(listener);
    return s;
  }
  std::atomic<bool> echo_failed{false};
  std::thread echo([&] {
    int conn = accept(listener, nullptr, nullptr);
    if (conn < 0) {
      echo_failed = true;
      return;
    }
    std::vector<char> buf(io_size);
    for (;;) {
      ssize_t n = recv(conn, buf.data(), buf.size(), 0);
      if (n <= 0) break;
      for (ssize_t sent = 0; sent < n;) {
        ssize_t m = send(conn, buf.data() + sent, static_cast<size_t>(n - sent), MSG_NOSIGNAL);
        if (m <= 0) {
          echo_failed = true;
          close(conn);
          return;
        }
        sent += m;
      }
    }
    close(conn);
  });
  const absl::Time start = absl::Now();
  int sock = socket(AF_INET, SOCK_STREAM, 0);
  absl::Status status;
  size_t received = 0;
  if (sock < 0 || connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    status = Errno("connect");
  } else {
    std::thread sender([&] {
      for (size_t sent = 0; sent < bytes;) {
        const size_t offset = sent % data_size;
        const size_t n = std::min({io_size, bytes - sent, data_size - offset});
        ssize_t m = send(sock, data + offset, n, MSG_NOSIGNAL);
        if (m <= 0) break;
        sent += static_cast<size_t>(m);
      }
      shutdown(sock, SHUT_WR);
    });
    std::vector<char> buf(io_size);
    while (received < bytes) {
      ssize_t n = recv(sock, buf.data(), buf.size(), 0);
      if (n <= 0) break;
      received += static_cast<size_t>(n);
    }
    sender.join();
  }
  const double s = absl::ToDoubleSeconds(absl::Now() - start);
  if (sock >= 0) close(sock);
  echo.join();
  close(listener);
  RETURN_IF_ERROR(status);
  if (echo_failed || received != bytes) {
    return absl::InternalError(absl::StrCat("raw echo moved ", received, " of ", bytes, " bytes"));
  }
  return s;
}

// Puts every input's bytes, then room for every result, into a new region on `client`'s server
// (64-byte aligned slices), and returns the inputs naming those slices instead of their data.
absl::StatusOr<std::vector<MatrixInput>> InRegion(Client& client, const std::vector<MatrixInput>& inputs,
                                                  const std::string& name, std::unique_ptr<client::Region>* region) {
  auto align = [](int64_t n) { return (n + 63) / 64 * 64; };
  int64_t total = 0;
  for (const MatrixInput& in : inputs) total += 2 * align(static_cast<int64_t>(in.bytes));
  client::RegionOptions options;
  options.name = name;
  ASSIGN_OR_RETURN(*region, client.CreateRegion(total, options));
  std::vector<MatrixInput> out = inputs;
  int64_t offset = 0;
  for (MatrixInput& in : out) {
    const int64_t size = static_cast<int64_t>(in.bytes);
    std::memcpy((*region)->data() + offset, in.data, in.bytes);
    in.input_region = (*region)->Slice(offset, size);
    offset += align(size);
    in.data = nullptr;
    in.bytes = 0;
  }
  for (MatrixInput& in : out) {
    const int64_t size = in.input_region->size;  // fp32 in and out.
    in.result_region = (*region)->Slice(offset, size);
    offset += align(size);
  }
  return out;
}

// Whether the results `region_inputs` left in `region` equal `expected`, matrix by matrix.
bool RegionResultsEqual(const client::Region& region, const std::vector<MatrixInput>& region_inputs,
                        const std::vector<std::vector<char>>& expected) {
  if (expected.size() != region_inputs.size()) return false;
  for (size_t i = 0; i < expected.size(); ++i) {
    const client::RegionSlice& r = *region_inputs[i].result_region;
    if (expected[i].size() != static_cast<size_t>(r.size) ||
        std::memcmp(region.data() + r.offset, expected[i].data(), expected[i].size()) != 0) {
      return false;
    }
  }
  return true;
}

struct Config {
  std::string server = "127.0.0.1:47800";
  std::string model_shapes = "2304x768,768x768,3072x768,768x3072";
  std::string stream_shapes = "4096x1024";
  std::string precision = "medium";
  std::string parts = "overhead,transport";
  int model_matrices = 16, stream_matrices = 16, reps = 5, warmup = 1, timeout_s = 900, io_kib = 1024;
  int engine_workers = 1;  // The shm part's in-process engine: the server's --workers (one-thread backends).
  bool keep_freed_memory = false;  // Call KeepFreedMemory() in this (the client's) process first.
};

std::string LoadAverage1() {
  std::ifstream in("/proc/loadavg");
  std::string first;
  if (!(in >> first)) return "null";
  return first;
}

absl::Status Run(const Config& config) {
  if (config.reps < 1 || config.warmup < 0 || config.io_kib < 1 || config.engine_workers < 1) {
    return absl::InvalidArgumentError("--reps, --io-kib and --engine-workers must be >= 1, --warmup >= 0");
  }
  std::string client_malloc = "default";
  if (config.keep_freed_memory) {
    const MallocTuning tuning = KeepFreedMemory();
    std::cerr << "client " << tuning.description << "\n";
    if (!tuning.applied) {
      return absl::FailedPreconditionError(absl::StrCat("--keep-freed-memory: ", tuning.description));
    }
    client_malloc = "kept";
  }
  NsOptions options;  // quintic, 5 steps, eps 1e-7, spectral scale: the server's defaults.
  RETURN_IF_ERROR(ParsePrecision(config.precision, &options.precision));
  client::ClientOptions copts;
  copts.address = config.server;
  copts.timeout = absl::Seconds(config.timeout_s);
  copts.max_send_message_bytes = -1;
  copts.max_receive_message_bytes = -1;
  ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Create(copts));
  ASSIGN_OR_RETURN(v1::ServerInfo info, client->GetServerInfo());
  std::cerr << "server " << config.server << ": fleet_world " << info.fleet_world() << ", chunk "
            << client->chunk_bytes() << " B\n";
  const std::vector<std::string> parts = absl::StrSplit(config.parts, ',', absl::SkipEmpty());
  auto wants = [&](const char* p) { return std::find(parts.begin(), parts.end(), p) != parts.end(); };

  if (wants("overhead")) {
    ASSIGN_OR_RETURN(std::vector<Matrix2d> shapes, ParseShapes(config.model_shapes, config.model_matrices));
    std::vector<std::vector<float>> storage;
    std::vector<MatrixInput> inputs = MakeInputs(shapes, options, 1, &storage);
    ASSIGN_OR_RETURN(std::unique_ptr<CpuBackend> backend, CpuBackend::Create(CpuBackend::Options{1}));
    double flops = 0;
    for (const Matrix2d& s : shapes) flops += NsFlops(s.rows, s.cols, options);
    bool identical = true;
    for (int it = 0; it < config.warmup + config.reps; ++it) {
      std::vector<std::vector<char>> engine_out, remote_out;
      ASSIGN_OR_RETURN(double engine_s, TimeEngine(*backend, inputs, &engine_out));
      ASSIGN_OR_RETURN(StepTiming remote, TimeStep(*client, inputs, &remote_out));
      identical = identical && engine_out == remote_out;
      if (it < config.warmup) continue;
      std::cout << absl::StrFormat(
                       "{\"part\": \"overhead\", \"rep\": %d, \"engine_s\": %.6f, \"remote_s\": %.6f, "
                       "\"remote_server_s\": %.6f, \"first_result_s\": %.6f, \"gflop\": %.3f, \"load1\": %s}",
                       it - config.warmup, engine_s, remote.wall_s, remote.server_s, remote.first_result_s, flops / 1e9,
                       LoadAverage1())
                << std::endl;
    }
    std::cout << absl::StrFormat("{\"part\": \"overhead\", \"identical_results\": %s}", identical ? "true" : "false")
              << std::endl;
  }

  if (wants("transport")) {
    ASSIGN_OR_RETURN(std::vector<Matrix2d> shapes, ParseShapes(config.stream_shapes, config.stream_matrices));
    NsOptions zero = options;
    zero.steps = 0;  // Normalize and scale only: the step is bound by moving the bytes.
    std::vector<std::vector<float>> storage;
    std::vector<MatrixInput> inputs = MakeInputs(shapes, zero, 2, &storage);
    size_t bytes = 0;
    for (const MatrixInput& in : inputs) bytes += in.bytes;
    const char* raw_data = reinterpret_cast<const char*>(storage[0].data());
    const size_t raw_size = storage[0].size() * sizeof(float);
    // The same step with each result written into a buffer of the caller's (MatrixInput::result),
    // allocated once and reused, as a trainer's own tensors would be.
    std::vector<std::vector<char>> result_buffers;
    std::vector<MatrixInput> into = inputs;
    for (MatrixInput& in : into) {
      result_buffers.emplace_back(in.bytes);
      in.result = result_buffers.back().data();
      in.result_bytes = in.bytes;
    }
    for (int it = 0; it < config.warmup + config.reps; ++it) {
      const double cpu0 = ProcessCpuSeconds();
      ASSIGN_OR_RETURN(double raw_s, TimeRawEcho(raw_data, raw_size, bytes, static_cast<size_t>(config.io_kib) << 10));
      const double cpu1 = ProcessCpuSeconds();
      ASSIGN_OR_RETURN(StepTiming step, TimeStep(*client, inputs, nullptr));
      const double cpu2 = ProcessCpuSeconds();
      ASSIGN_OR_RETURN(StepTiming step_into, TimeStep(*client, into, nullptr));
      const double cpu3 = ProcessCpuSeconds();
      if (it < config.warmup) continue;
      std::cout << absl::StrFormat(
                       "{\"part\": \"transport\", \"rep\": %d, \"bytes_each_way\": %d, \"raw_s\": %.6f, "
                       "\"raw_cpu_s\": %.6f, \"stream_s\": %.6f, \"stream_client_cpu_s\": %.6f, "
                       "\"stream_server_s\": %.6f, \"first_result_s\": %.6f, \"into_s\": %.6f, "
                       "\"into_client_cpu_s\": %.6f, \"into_server_s\": %.6f, \"client_malloc\": \"%s\", "
                       "\"load1\": %s}",
                       it - config.warmup, bytes, raw_s, cpu1 - cpu0, step.wall_s, cpu2 - cpu1, step.server_s,
                       step.first_result_s, step_into.wall_s, cpu3 - cpu2, step_into.server_s, client_malloc,
                       LoadAverage1())
                << std::endl;
    }
  }
  if (wants("shm")) {
    // (a) Transport-bound: steps = 0, the transport part's matrices through a region (inputs read
    // and results written in place) vs a raw TCP echo of the same bytes, with the stream step that
    // writes into the caller's buffers beside them for reference.
    ASSIGN_OR_RETURN(std::vector<Matrix2d> shapes, ParseShapes(config.stream_shapes, config.stream_matrices));
    NsOptions zero = options;
    zero.steps = 0;
    std::vector<std::vector<float>> storage;
    std::vector<MatrixInput> inputs = MakeInputs(shapes, zero, 2, &storage);
    size_t bytes = 0;
    for (const MatrixInput& in : inputs) bytes += in.bytes;
    std::unique_ptr<client::Region> region;
    ASSIGN_OR_RETURN(std::vector<MatrixInput> shm_inputs, InRegion(*client, inputs, "service_bench", &region));
    std::vector<std::vector<char>> result_buffers;
    std::vector<MatrixInput> into = inputs;
    for (MatrixInput& in : into) {
      result_buffers.emplace_back(in.bytes);
      in.result = result_buffers.back().data();
      in.result_bytes = in.bytes;
    }
    const char* raw_data = reinterpret_cast<const char*>(storage[0].data());
    const size_t raw_size = storage[0].size() * sizeof(float);
    // The steps = 0 computation alone, in this process on as many one-thread backends as the
    // server has workers (--engine-workers): what the region step costs with no transport at all.
    std::vector<std::unique_ptr<CpuBackend>> owned;
    ASSIGN_OR_RETURN(const std::vector<Backend*> engine, EngineWorkers(config.engine_workers, &owned));
    bool identical = true;
    std::vector<std::vector<char>> engine_out;
    for (int it = 0; it < config.warmup + config.reps; ++it) {
      ASSIGN_OR_RETURN(double engine_s, TimeEngineInto(engine, inputs, &engine_out));
      const double cpu0 = ProcessCpuSeconds();
      ASSIGN_OR_RETURN(double raw_s, TimeRawEcho(raw_data, raw_size, bytes, static_cast<size_t>(config.io_kib) << 10));
      const double cpu1 = ProcessCpuSeconds();
      ASSIGN_OR_RETURN(StepTiming shm, TimeStep(*client, shm_inputs, nullptr));
      const double cpu2 = ProcessCpuSeconds();
      ASSIGN_OR_RETURN(StepTiming step_into, TimeStep(*client, into, nullptr));
      identical = identical && RegionResultsEqual(*region, shm_inputs, result_buffers) &&
                  RegionResultsEqual(*region, shm_inputs, engine_out);
      if (it < config.warmup) continue;
      std::cout << absl::StrFormat(
                       "{\"part\": \"shm_transport\", \"rep\": %d, \"bytes_each_way\": %d, \"raw_s\": %.6f, "
                       "\"raw_cpu_s\": %.6f, \"shm_s\": %.6f, \"shm_client_cpu_s\": %.6f, \"shm_server_s\": %.6f, "
                       "\"into_s\": %.6f, \"engine_s\": %.6f, \"load1\": %s}",
                       it - config.warmup, bytes, raw_s, cpu1 - cpu0, shm.wall_s, cpu2 - cpu1, shm.server_s,
                       step_into.wall_s, engine_s, LoadAverage1())
                << std::endl;
    }
    std::cout << absl::StrFormat("{\"part\": \"shm_transport\", \"shm_identical_results\": %s}",
                                 identical ? "true" : "false")
              << std::endl;
    region.reset();  // Unregisters it and unmaps it before (b) maps its own.

    // (b) The overhead part's model matrices through a region vs the in-process engine.
    ASSIGN_OR_RETURN(std::vector<Matrix2d> model, ParseShapes(config.model_shapes, config.model_matrices));
    std::vector<std::vector<float>> model_storage;
    std::vector<MatrixInput> model_inputs = MakeInputs(model, options, 1, &model_storage);
    ASSIGN_OR_RETURN(std::vector<MatrixInput> model_shm, InRegion(*client, model_inputs, "service_bench", &region));
    double flops = 0;
    for (const Matrix2d& s : model) flops += NsFlops(s.rows, s.cols, options);
    bool model_identical = true;
    std::vector<std::vector<char>> model_out;
    for (int it = 0; it < config.warmup + config.reps; ++it) {
      ASSIGN_OR_RETURN(double engine_s, TimeEngineInto(engine, model_inputs, &model_out));
      ASSIGN_OR_RETURN(StepTiming shm, TimeStep(*client, model_shm, nullptr));
      model_identical = model_identical && RegionResultsEqual(*region, model_shm, model_out);
      if (it < config.warmup) continue;
      std::cout << absl::StrFormat(
                       "{\"part\": \"shm_overhead\", \"rep\": %d, \"engine_s\": %.6f, \"shm_s\": %.6f, "
                       "\"shm_server_s\": %.6f, \"first_result_s\": %.6f, \"gflop\": %.3f, \"load1\": %s}",
                       it - config.warmup, engine_s, shm.wall_s, shm.server_s, shm.first_result_s, flops / 1e9,
                       LoadAverage1())
                << std::endl;
    }
    std::cout << absl::StrFormat("{\"part\": \"shm_overhead\", \"shm_identical_results\": %s}",
                                 model_identical ? "true" : "false")
              << std::endl;
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  orthoctl::FlagSet flags("service_bench [flags]",
                          "Alternates an in-process engine run and a remote stream step on the same model matrices "
                          "(overhead), then a raw loopback TCP echo and a steps = 0 stream step of the same bytes, twice: "
                          "results returned in new vectors, and written into the caller's buffers (transport); with "
                          "shm, the steps = 0 step through a shared-memory region vs the raw echo, and the model "
                          "matrices through a region vs the engine (the server needs --shm-socket and this process "
                          "must run on its host); prints one JSON line per measurement.");
  Config c;
  flags.AddString("server", "HOST:PORT", "server (default 127.0.0.1:47800)", &c.server);
  flags.AddString("model-shapes", "RxC,...", "overhead shapes, cycled (default GPT-2 small layer)", &c.model_shapes);
  flags.AddInt("model-matrices", "N", "overhead matrices per step (default 16: four layers)", &c.model_matrices);
  flags.AddString("stream-shapes", "RxC,...", "transport shapes, cycled (default 4096x1024)", &c.stream_shapes);
  flags.AddInt("stream-matrices", "N", "transport matrices per step (default 16)", &c.stream_matrices);
  flags.AddString("precision", "P", "highest|high|medium (default medium)", &c.precision);
  flags.AddString("parts", "P,...", "overhead, transport and/or shm (default overhead,transport)", &c.parts);
  flags.AddInt("reps", "N", "timed pairs per part (default 5)", &c.reps);
  flags.AddInt("warmup", "N", "untimed pairs per part first (default 1)", &c.warmup);
  flags.AddInt("timeout", "S", "deadline of each step in seconds (default 900)", &c.timeout_s);
  flags.AddInt("io-kib", "N", "raw TCP send/recv size in KiB (default 1024)", &c.io_kib);
  flags.AddInt("engine-workers", "N",
               "shm part: the in-process engine runs the matrices on N one-thread backends at once, as a server "
               "started with --workers N --blas-threads 1 (default 1)",
               &c.engine_workers);
  flags.AddBool("keep-freed-memory",
                "first tell this process's malloc to keep freed memory, as a trainer may (common/malloc_tuning.h)",
                &c.keep_freed_memory);
  absl::Status parsed = flags.Parse(std::vector<std::string>(argv + 1, argv + argc));
  if (flags.help_requested()) {
    std::cout << flags.Usage();
    return 0;
  }
  if (!parsed.ok()) {
    std::cerr << parsed << "\n" << flags.Usage();
    return 2;
  }
  absl::Status status = Run(c);
  if (!status.ok()) {
    std::cerr << "service_bench: " << status << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace orthoserve::bench

int main(int argc, char** argv) { return orthoserve::bench::Main(argc, argv); }
