// fleet_bench: times the same batch of matrices on two fleets side by side (A, B, A, B, ...), as
// one lone-client step and as one step of a W-rank trainer group; one JSON line per measurement.
// bench/fleet/run.sh starts the fleets, runs this and writes bench/results/fleet.md.
#include <unistd.h>

#include <algorithm>
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
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cpp/client.h"
#include "client/cpp/group_client.h"
#include "client/cpp/matrix.h"
#include "client/cpp/orthoctl/flags.h"
#include "common/ns_options.h"
#include "common/shape.h"
#include "common/status.h"

namespace orthoserve::bench {
namespace {

using client::Client;
using client::ClientOptions;
using client::GroupClient;
using client::MatrixInput;
using client::MatrixOutput;

struct Fleet {
  std::string name;
  std::string address;
  std::vector<int> pids;  // Server processes whose CPU time is sampled around each step.
  std::unique_ptr<Client> lone;
  std::unique_ptr<GroupClient> group;
};

// utime + stime of a process (all its threads) in seconds; 0 when it cannot be read.
double ProcessCpuSeconds(int pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  if (paren == std::string::npos) return 0;
  // Fields after the command name start at field 3 (state); utime and stime are fields 14 and 15.
  std::vector<std::string> fields = absl::StrSplit(text.substr(paren + 2), ' ');
  if (fields.size() < 13) return 0;
  double utime = 0, stime = 0;
  if (!absl::SimpleAtod(fields[11], &utime) || !absl::SimpleAtod(fields[12], &stime)) return 0;
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// CPU seconds of each of the fleet's server processes, in --*-pids order.
std::vector<double> FleetCpuSeconds(const Fleet& fleet) {
  std::vector<double> seconds;
  for (int pid : fleet.pids) seconds.push_back(ProcessCpuSeconds(pid));
  return seconds;
}

std::vector<double> Minus(const std::vector<double>& after, const std::vector<double>& before) {
  std::vector<double> d(after.size());
  for (size_t i = 0; i < after.size(); ++i) d[i] = after[i] - before[i];
  return d;
}

absl::StatusOr<std::vector<int>> ParsePids(const std::string& text) {
  std::vector<int> pids;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int pid = 0;
    if (!absl::SimpleAtoi(part, &pid) || pid <= 0) return absl::InvalidArgumentError(absl::StrCat("bad pid ", part));
    pids.push_back(pid);
  }
  return pids;
}

// "RxC,RxC,..." cycled to `count` shapes.
absl::StatusOr<std::vector<std::vector<int64_t>>> ParseShapes(const std::string& text, int count) {
  std::vector<std::vector<int64_t>> distinct;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<std::string> dims = absl::StrSplit(part, 'x');
    int64_t r = 0, c = 0;
    if (dims.size() != 2 || !absl::SimpleAtoi(dims[0], &r) || !absl::SimpleAtoi(dims[1], &c) || r < 1 || c < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--shapes expects RxC[,RxC...], got ", part));
    }
    distinct.push_back({r, c});
  }
  if (distinct.empty() || count < 1) return absl::InvalidArgumentError("need at least one shape and one matrix");
  std::vector<std::vector<int64_t>> shapes;
  for (int i = 0; i < count; ++i) shapes.push_back(distinct[i % distinct.size()]);
  return shapes;
}

absl::Status CheckOutputs(const std::vector<MatrixOutput>& outputs, size_t expected) {
  if (outputs.size() != expected) {
    return absl::InternalError(absl::StrCat(outputs.size(), " results for ", expected, " matrices"));
  }
  for (const MatrixOutput& o : outputs) {
    if (!o.status.ok()) return o.status;
    if (o.data.size() != client::ExpectedBytes(o)) return absl::InternalError(absl::StrCat(o.name, ": short result"));
  }
  return absl::OkStatus();
}

// One result per (trainer rank, matrix), concatenated in that order; compared across fleets.
using Results = std::vector<std::vector<char>>;

struct Measurement {
  double wall_s = 0;
  double server_s = 0;        // Largest StepSummary.server_seconds among the trainer ranks.
  std::vector<double> cpu_s;  // Each server process's CPU time during the step.
};

absl::StatusOr<Measurement> RunLone(Fleet& fleet, const std::vector<MatrixInput>& inputs, Results* results) {
  Measurement m;
  const std::vector<double> cpu0 = FleetCpuSeconds(fleet);
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(std::vector<MatrixOutput> out, fleet.lone->Step(client::StepOptions{}, inputs));
  m.wall_s = absl::ToDoubleSeconds(absl::Now() - start);
  m.cpu_s = Minus(FleetCpuSeconds(fleet), cpu0);
  RETURN_IF_ERROR(CheckOutputs(out, inputs.size()));
  if (auto summary = fleet.lone->last_summary()) m.server_s = summary->server_seconds();
  if (results != nullptr) {
    results->clear();
    for (MatrixOutput& o : out) results->push_back(std::move(o.data));
  }
  return m;
}

absl::StatusOr<Measurement> RunGroup(Fleet& fleet, const std::vector<std::vector<MatrixInput>>& per_rank, int64_t step,
                                     Results* results) {
  const int world = static_cast<int>(per_rank.size());
  std::vector<absl::StatusOr<std::vector<MatrixOutput>>> outs(world, absl::UnknownError("not run"));
  Measurement m;
  const std::vector<double> cpu0 = FleetCpuSeconds(fleet);
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back(
        [&, r] { outs[r] = fleet.group->Step("fleet-bench", fleet.name, step, r, world, per_rank[r]); });
  }
  for (std::thread& t : threads) t.join();
  m.wall_s = absl::ToDoubleSeconds(absl::Now() - start);
  m.cpu_s = Minus(FleetCpuSeconds(fleet), cpu0);
  if (results != nullptr) results->clear();
  for (int r = 0; r < world; ++r) {
    if (!outs[r].ok()) return Annotate(outs[r].status(), absl::StrCat("trainer rank ", r));
    RETURN_IF_ERROR(CheckOutputs(*outs[r], per_rank[r].size()));
    for (MatrixOutput& o : *outs[r]) {
      if (results != nullptr) results->push_back(std::move(o.data));
    }
  }
  // Each trainer rank's Client keeps its own last summary; the slowest one bounds the step.
  for (int r = 0; r < world; ++r) {
    Client* c = fleet.group->member_client(fleet.group->FleetRankFor(r, world));
    if (auto summary = c->last_summary()) m.server_s = std::max(m.server_s, summary->server_seconds());
  }
  return m;
}

// The 1-minute load average (/proc/loadavg), as JSON text; "null" when unreadable.
std::string LoadAverage1() {
  std::ifstream in("/proc/loadavg");
  std::string first;
  if (!(in >> first)) return "null";
  return first;
}

void Print(const std::string& mode, const Fleet& fleet, int rep, const Measurement& m) {
  std::cout << absl::StrFormat(
                   "{\"mode\": \"%s\", \"fleet\": \"%s\", \"rep\": %d, \"wall_s\": %.6f, \"server_s\": %.6f, "
                   "\"rank_cpu_s\": [%s], \"load1\": %s}",
                   mode, fleet.name, rep, m.wall_s, m.server_s,
                   absl::StrJoin(m.cpu_s, ", ", [](std::string* o, double v) { absl::StrAppendFormat(o, "%.2f", v); }),
                   LoadAverage1())
            << std::endl;
}

struct Config {
  std::string a_address, b_address, a_name, b_name, a_pids, b_pids, shapes, precision, modes;
  int matrices = 16, reps = 5, warmup = 1, world = 2, timeout_s = 900, seed = 1;
};

absl::Status Run(const Config& config) {
  NsOptions options;
  RETURN_IF_ERROR(ParsePrecision(config.precision, &options.precision));
  ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> shapes, ParseShapes(config.shapes, config.matrices));
  if (config.reps < 1 || config.warmup < 0 || config.world < 1) {
    return absl::InvalidArgumentError("--reps and --world must be >= 1, --warmup >= 0");
  }
  std::vector<std::string> mode_list = absl::StrSplit(config.modes, ',', absl::SkipEmpty());
  for (const std::string& mode : mode_list) {
    if (mode != "lone" && mode != "group") return absl::InvalidArgumentError(absl::StrCat("unknown mode ", mode));
  }

  // Random normal fp32 matrices, whole (lone) and as `world` row blocks (group).
  std::mt19937 rng(static_cast<uint32_t>(config.seed));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> payloads(shapes.size());
  std::vector<MatrixInput> lone_inputs(shapes.size());
  std::vector<std::vector<MatrixInput>> group_inputs(config.world);
  for (size_t i = 0; i < shapes.size(); ++i) {
    const int64_t rows = shapes[i][0], cols = shapes[i][1];
    payloads[i].resize(static_cast<size_t>(rows * cols));
    for (float& v : payloads[i]) v = normal(rng);
    MatrixInput& in = lone_inputs[i];
    in.name = absl::StrCat("m", i);
    in.shape = shapes[i];
    in.dtype = DType::kF32;
    in.options = options;
    in.data = payloads[i].data();
    in.bytes = payloads[i].size() * sizeof(float);
    for (int r = 0; r < config.world; ++r) {
      // Contiguous row blocks, the first rows % world ones one row longer (may be empty).
      const int64_t base = rows / config.world, extra = rows % config.world;
      const int64_t offset = r * base + std::min<int64_t>(r, extra);
      const int64_t count = base + (r < extra ? 1 : 0);
      MatrixInput block = in;
      block.block = Block{offset, 0, count, cols};
      block.data = payloads[i].data() + offset * cols;
      block.bytes = static_cast<size_t>(count * cols) * sizeof(float);
      group_inputs[r].push_back(block);
    }
  }

  Fleet fleets[2];
  fleets[0].name = config.a_name;
  fleets[0].address = config.a_address;
  fleets[1].name = config.b_name;
  fleets[1].address = config.b_address;
  ASSIGN_OR_RETURN(fleets[0].pids, ParsePids(config.a_pids));
  ASSIGN_OR_RETURN(fleets[1].pids, ParsePids(config.b_pids));
  for (Fleet& fleet : fleets) {
    ClientOptions copts;
    copts.address = fleet.address;
    copts.timeout = absl::Seconds(config.timeout_s);
    copts.max_send_message_bytes = -1;
    copts.max_receive_message_bytes = -1;
    ASSIGN_OR_RETURN(fleet.lone, Client::Create(copts));
    ASSIGN_OR_RETURN(fleet.group, GroupClient::Create([&] { GroupClient::Options o; o.client = copts; return o; }()));
    std::cerr << "fleet " << fleet.name << " at " << fleet.address << ": " << fleet.group->fleet_world() << " ranks\n";
  }

  int64_t step = 0;
  for (const std::string& mode : mode_list) {
    // The first warm-up step's results of each fleet; AUTO on one backend is bit-identical (docs/architecture.md).
    Results first[2];
    for (int it = 0; it < config.warmup + config.reps; ++it) {
      for (int f = 0; f < 2; ++f) {
        Results* keep = it == 0 ? &first[f] : nullptr;
        absl::StatusOr<Measurement> m =
            mode == "lone" ? RunLone(fleets[f], lone_inputs, keep) : RunGroup(fleets[f], group_inputs, step, keep);
        if (!m.ok()) return Annotate(m.status(), absl::StrCat(mode, " step on fleet ", fleets[f].name));
        if (it >= config.warmup) Print(mode, fleets[f], it - config.warmup, *m);
      }
      ++step;
    }
    const bool identical = first[0] == first[1];
    std::cout << absl::StrFormat("{\"mode\": \"%s\", \"identical_results\": %s}", mode, identical ? "true" : "false")
              << std::endl;
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  orthoctl::FlagSet flags("fleet_bench [flags]",
                          "Times one batch of --matrices random matrices on fleet A and fleet B alternately "
                          "(A, B, A, B, ...), --reps times each, per mode; prints one JSON line per step.");
  Config c{"127.0.0.1:47600", "127.0.0.1:47610", "A", "B", "", "", "1024x1024", "medium", "lone,group"};
  flags.AddString("a", "HOST:PORT", "fleet A seed rank (default 127.0.0.1:47600)", &c.a_address);
  flags.AddString("b", "HOST:PORT", "fleet B seed rank (default 127.0.0.1:47610)", &c.b_address);
  flags.AddString("a-name", "NAME", "label of fleet A (default A)", &c.a_name);
  flags.AddString("b-name", "NAME", "label of fleet B (default B)", &c.b_name);
  flags.AddString("a-pids", "PID,...", "fleet A server pids, for CPU time (default none)", &c.a_pids);
  flags.AddString("b-pids", "PID,...", "fleet B server pids, for CPU time (default none)", &c.b_pids);
  flags.AddString("shapes", "RxC,...", "shapes, cycled to --matrices (default 1024x1024)", &c.shapes);
  flags.AddString("precision", "P", "highest|high|medium (default medium)", &c.precision);
  flags.AddString("modes", "M,...", "lone and/or group (default lone,group)", &c.modes);
  flags.AddInt("matrices", "N", "matrices per step (default 16)", &c.matrices);
  flags.AddInt("reps", "N", "timed steps per fleet and mode (default 5)", &c.reps);
  flags.AddInt("warmup", "N", "untimed steps per fleet and mode first (default 1)", &c.warmup);
  flags.AddInt("world", "W", "trainer ranks of the group mode; row blocks (default 2)", &c.world);
  flags.AddInt("timeout", "S", "deadline of each step in seconds (default 900)", &c.timeout_s);
  flags.AddInt("seed", "N", "random seed (default 1)", &c.seed);
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
    std::cerr << "fleet_bench: " << status << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace orthoserve::bench

int main(int argc, char** argv) { return orthoserve::bench::Main(argc, argv); }
