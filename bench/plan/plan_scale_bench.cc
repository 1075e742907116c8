// plan_scale_bench: the coordinator and the plan of one group step at training scale, in process
// (no network): a 70B-class model under FSDP — 80 layers × {q, k, v, o, gate, up, down} = 560
// matrices of Llama-70B's shapes, every matrix row-sharded over the W trainer ranks as
// torch.chunk does, trainer rank r streaming to fleet rank ⌊r·S/W⌋ of S — driven through a real
// Coordinator the way the fleet service drives it:
//
//  1. every trainer rank's ReadyReport is built as its fleet rank would send it
//     (ReadyReportToProto, untimed), decoded as FleetService::Report does (ReadyReportFromProto,
//     timed: the coordinator's CPU for a remote report) and handed to Coordinator::Report (timed);
//     the last rank's Report validates the W spec lists, builds the BatchPlan and runs
//     AssignOwners before it appends the log entry (timed on its own: "last report → entry");
//  2. fan-out: members read the entry as FleetService::ReadLog serves it — Coordinator::Read
//     (a copy of the entry), LogEntryToProto into a ReadLogResponse and its serialization (what
//     gRPC sends) — timed for `--readers` members and scaled to S;
//  3. a member's side: parsing that response, LogEntryFromProto and ValidatePlan (what
//     ExecuteBatch checks before it runs the batch);
//  4. memory: bytes allocated (glibc mallinfo2, all arenas) held by the coordinator for the
//     pending step just before its last report, and for the log entry after it.
//
// One JSON line per (W, S) point with the medians over --reps steps; bench/plan/run.sh runs the
// grid and writes bench/results/plan_scale.md with the growth exponents.
//
//   plan_scale_bench --w=64,256,1024 --s=8,64 --reps=3
#include <malloc.h>
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/shape.h"
#include "common/status.h"
#include "google/protobuf/io/coded_stream.h"
#include "orthoserve/fleet/v1/fleet.pb.h"
#include "proto/convert/ns_options_proto.h"
#include "server/distributed/batch.h"
#include "server/fleet/logic/coordinator.h"
#include "server/fleet/wire/fleet_codec.h"

ABSL_FLAG(std::string, w, "64,256,1024", "Trainer worlds W (comma-separated).");
ABSL_FLAG(std::string, s, "8,64", "Fleet worlds S (comma-separated).");
ABSL_FLAG(int, layers, 80, "Transformer layers; 7 matrices each.");
ABSL_FLAG(int, reps, 3, "Steps measured per (W, S) point; medians are reported.");
ABSL_FLAG(int, readers, 8, "Members whose log read is timed per step (the fan-out is scaled to S).");

namespace orthoserve {
namespace {

// Llama-2/3-70B: hidden 8192, 64 query heads and 8 KV heads of 128, MLP 28672.
struct LayerMatrix {
  const char* name;
  int64_t rows, cols;
};
constexpr LayerMatrix kLayer[] = {
    {"self_attn.q_proj", 8192, 8192}, {"self_attn.k_proj", 1024, 8192}, {"self_attn.v_proj", 1024, 8192},
    {"self_attn.o_proj", 8192, 8192}, {"mlp.gate_proj", 28672, 8192},   {"mlp.up_proj", 28672, 8192},
    {"mlp.down_proj", 8192, 28672},
};

// Bytes the process has allocated (in use), over every malloc arena and mmapped chunk.
int64_t Allocated() {
  struct mallinfo2 m = mallinfo2();
  return static_cast<int64_t>(m.uordblks + m.hblkhd);
}

// Peak resident set (VmHWM) in bytes.
int64_t PeakRss() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) {
      int64_t kb = 0;
      std::vector<std::string> parts = absl::StrSplit(line, ' ', absl::SkipWhitespace());
      if (parts.size() >= 2 && absl::SimpleAtoi(parts[1], &kb)) return kb * 1024;
    }
  }
  return 0;
}

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Wall and CPU seconds of this thread between Start and Stop, accumulated.
struct Timer {
  double wall = 0, cpu = 0;
  absl::Time w0;
  double c0 = 0;
  void Start() {
    w0 = absl::Now();
    c0 = ThreadCpuSeconds();
  }
  void Stop() {
    cpu += ThreadCpuSeconds() - c0;
    wall += absl::ToDoubleSeconds(absl::Now() - w0);
  }
};

std::vector<int> ParseList(const std::string& text) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int v = 0;
    if (absl::SimpleAtoi(part, &v)) out.push_back(v);
  }
  return out;
}

std::vector<MatrixPlan> ModelSpecs(int layers) {
  std::vector<MatrixPlan> specs;
  for (int l = 0; l < layers; ++l) {
    for (const LayerMatrix& lm : kLayer) {
      MatrixPlan m;
      m.name = absl::StrCat("model.layers.", l, ".", lm.name, ".weight");
      m.shape = {lm.rows, lm.cols};
      m.view = Matrix2d{lm.rows, lm.cols};
      m.dtype = DType::kBF16;
      m.result_dtype = DType::kBF16;
      m.algorithm = Algorithm::kAuto;
      specs.push_back(std::move(m));
    }
  }
  return specs;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One step's measurements.
struct StepFigures {
  double decode_wall = 0, decode_cpu = 0;                      // ReadyReportFromProto of the remote reports.
  double report_wall = 0, report_cpu = 0;                      // Coordinator::Report of the first W-1 reports.
  double last_wall = 0, last_cpu = 0;                          // The last report: validation, plan, owners, append.
  double owners_cpu = 0;                                       // AssignOwners alone (on a copy of the plan).
  double read_cpu = 0, encode_cpu = 0, serialize_cpu = 0;      // Per member: Read copy, LogEntryToProto, bytes.
  double parse_cpu = 0, from_proto_cpu = 0, validate_cpu = 0;  // A member: parse, LogEntryFromProto, ValidatePlan.
  double pending_bytes = 0;                                    // Held for the pending step before its last report.
  double entry_bytes = 0;                                      // Held for the log entry after it.
  double left_bytes = 0;                                       // Held after every member read past it.
  double report_wire_bytes = 0;                                // Σ ReadyReport sizes on the wire (W reports).
  double entry_wire_bytes = 0;                                 // One ReadLogResponse carrying the entry.
  double compact_wire_bytes = 0;                  // Projection: the entry with placements as W fleet ranks.
  double kept_wire_bytes = 0;                     // Σ kept reports sent with the next reads.
  double kept_decode_cpu = 0, kept_read_cpu = 0;  // Decoding them; Coordinator::Read taking them.
  double kept_bytes = 0;                          // Held between steps (the kept reports).
  double transient_bytes = 0;                     // Held while serving one member's read.
  int remote_reports = 0;                         // Reports from fleet ranks other than 0.
};

absl::Status RunPoint(int world, int fleet, int reps, int readers_sampled, const std::vector<MatrixPlan>& specs) {
  Coordinator::Options options;
  options.fleet_world = fleet;
  options.rendezvous_timeout = absl::Hours(1);
  options.stall_warning = absl::Hours(1);
  options.peer_timeout = absl::Hours(1);
  options.reform_delay = absl::Milliseconds(1);
  ASSIGN_OR_RETURN(std::unique_ptr<Coordinator> c, Coordinator::Create(options));
  std::vector<Member> members;
  for (int q = 0; q < fleet; ++q) {
    members.push_back(Member{q, absl::StrCat("10.0.", q / 256, ".", q % 256, ":50052"), 1000u + q});
    RETURN_IF_ERROR(c->Join(members.back()).status());
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (static_cast<int>(c->generation().members.size()) < fleet && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  const int64_t generation = c->generation().number;
  if (static_cast<int>(c->generation().members.size()) != fleet) return absl::InternalError("no generation formed");
  int64_t next = 0;  // Every member has read up to here.
  auto reader = [&](int q) { return ReaderState{q, c->epoch(), members[q].incarnation, generation, 0, {}}; };
  for (int q = 0; q < fleet; ++q) RETURN_IF_ERROR(c->Read(reader(q), 0, absl::ZeroDuration()).status());
  {
    ASSIGN_OR_RETURN(std::vector<LogEntry> entries, c->Read(reader(0), 0, absl::ZeroDuration()));
    next = entries.empty() ? 0 : entries.back().index + 1;
    for (int q = 0; q < fleet; ++q) RETURN_IF_ERROR(c->Read(reader(q), next, absl::ZeroDuration()).status());
  }

  // Each trainer rank's blocks: torch.chunk row shard r of every matrix.
  std::vector<std::vector<int64_t>> sizes, offsets;
  for (const MatrixPlan& m : specs) {
    sizes.push_back(ChunkSizes(m.view.rows, world));
    offsets.push_back(ChunkOffsets(m.view.rows, world));
  }
  // The spec list as every trainer rank sends it (blocks filled in per rank).
  fleet::v1::ReadyReport spec_proto;
  {
    ReadyReport r;
    r.sent = SenderBlocks(specs, std::vector<Block>(specs.size(), Block{}));
    spec_proto = ReadyReportToProto(r);
  }

  // Trainer rank r's report of step `key` as its fleet rank sends it (and, after the batch ran,
  // sends again as a kept report for replays: Executor::ReportOf gives the same fields).
  auto report_proto = [&](const GroupKey& key, int r) {
    const int fr = FleetRankOfTrainer(r, world, fleet);
    fleet::v1::ReadyReport proto = spec_proto;
    *proto.mutable_key() = GroupKeyToProto(key);
    proto.set_trainer_rank(r);
    proto.set_trainer_world(world);
    proto.set_fleet_rank(fr);
    proto.set_submission(1 + static_cast<uint64_t>(r));
    proto.set_epoch(c->epoch());
    proto.set_incarnation(members[fr].incarnation);
    for (size_t i = 0; i < specs.size(); ++i) {
      *proto.mutable_matrices(static_cast<int>(i))->mutable_block() =
          BlockToProto(Block{offsets[i][r], 0, sizes[i][r], specs[i].view.cols});
    }
    return proto;
  };

  std::vector<StepFigures> steps;
  const int64_t point_base = Allocated();
  for (int rep = 0; rep < reps; ++rep) {
    StepFigures f;
    const GroupKey key{"bench", "llama-70b", "fsdp", rep + 1, "bench-run"};
    Timer decode, report, last;
    const int64_t base = Allocated();
    for (int r = 0; r < world; ++r) {
      // What the coordinator holds for the step once every rank but the last has reported.
      if (r == world - 1) f.pending_bytes = static_cast<double>(Allocated() - base);
      const int fr = FleetRankOfTrainer(r, world, fleet);
      fleet::v1::ReadyReport proto = report_proto(key, r);  // Untimed: the sending fleet rank's work.
      f.report_wire_bytes += static_cast<double>(proto.ByteSizeLong());
      // Reports from fleet rank 0's own trainers reach the coordinator in process; the others
      // are decoded by the fleet service.
      const bool remote = fr != 0;
      Timer d;
      d.Start();
      absl::StatusOr<ReadyReport> decoded = ReadyReportFromProto(proto);
      d.Stop();
      if (!decoded.ok()) return decoded.status();
      if (remote) {
        decode.wall += d.wall;
        decode.cpu += d.cpu;
        ++f.remote_reports;
      }
      proto.Clear();
      Timer& t = r == world - 1 ? last : report;
      t.Start();
      absl::Status s = c->Report(*std::move(decoded));
      t.Stop();
      RETURN_IF_ERROR(s);
    }
    f.entry_bytes = static_cast<double>(Allocated() - base);
    f.decode_wall = decode.wall;
    f.decode_cpu = decode.cpu;
    f.report_wall = report.wall;
    f.report_cpu = report.cpu;
    f.last_wall = last.wall;
    f.last_cpu = last.cpu;

    // Fan-out, as FleetService::ReadLog serves each member.
    std::string wire;
    std::vector<double> read_cpu, encode_cpu, serialize_cpu, transient;
    LogEntry entry;
    for (int q = 0; q < std::min(fleet, readers_sampled); ++q) {
      Timer tr, te, ts;
      const int64_t held_before = Allocated();
      tr.Start();
      absl::StatusOr<std::vector<LogEntry>> entries = c->Read(reader(q), next, absl::ZeroDuration());
      tr.Stop();
      RETURN_IF_ERROR(entries.status());
      if (entries->size() != 1 || !entries->front().status.ok() || entries->front().membership()) {
        return absl::InternalError(absl::StrCat("expected one batch entry, got ", entries->size(), ": ",
                                                entries->empty() ? "" : entries->front().status.ToString()));
      }
      fleet::v1::ReadLogResponse response;
      te.Start();
      for (const LogEntry& e : *entries) *response.add_entries() = LogEntryToProto(e);
      te.Stop();
      ts.Start();
      wire.clear();
      response.SerializeToString(&wire);
      ts.Stop();
      // The entry's copy, its proto and the bytes, all alive until the response is sent: every
      // member's long poll wakes at the same append, so S of these can be held at once.
      transient.push_back(static_cast<double>(Allocated() - held_before));
      read_cpu.push_back(tr.cpu);
      encode_cpu.push_back(te.cpu);
      serialize_cpu.push_back(ts.cpu);
      if (q == 0) {
        // What the entry would weigh if placements that are the torch.chunk row shards were sent
        // as one packed list of W fleet ranks (the blocks follow from the shapes).
        fleet::v1::ReadLogResponse compact = response;
        for (fleet::v1::PlannedMatrix& pm : *compact.mutable_entries(0)->mutable_matrices()) pm.clear_placements();
        size_t ranks = 0;
        for (const BlockPlacement& b : entries->front().plan.matrices[0].blocks) {
          ranks += google::protobuf::io::CodedOutputStream::VarintSize32(static_cast<uint32_t>(b.fleet_rank));
        }
        f.compact_wire_bytes = static_cast<double>(
            compact.ByteSizeLong() + 1 + google::protobuf::io::CodedOutputStream::VarintSize64(ranks) + ranks);
        entry = std::move(entries->front());
      }
    }
    f.read_cpu = Median(read_cpu);
    f.encode_cpu = Median(encode_cpu);
    f.serialize_cpu = Median(serialize_cpu);
    f.transient_bytes = Median(transient);
    f.entry_wire_bytes = static_cast<double>(wire.size());
    {
      BatchPlan copy = entry.plan;
      Timer t;
      t.Start();
      AssignOwners(copy);
      t.Stop();
      f.owners_cpu = t.cpu;
      for (size_t i = 0; i < copy.matrices.size(); ++i) {
        if (copy.matrices[i].owner != entry.plan.matrices[i].owner) return absl::InternalError("owners differ");
      }
    }
    entry = LogEntry{};

    // A member's side.
    {
      Timer tp, tf, tv;
      fleet::v1::ReadLogResponse response;
      tp.Start();
      const bool parsed = response.ParseFromString(wire);
      tp.Stop();
      if (!parsed || response.entries_size() != 1) return absl::InternalError("the response does not parse");
      tf.Start();
      absl::StatusOr<LogEntry> received = LogEntryFromProto(response.entries(0));
      tf.Stop();
      RETURN_IF_ERROR(received.status());
      tv.Start();
      std::vector<absl::Status> statuses = ValidatePlan(received->plan);
      tv.Stop();
      for (const absl::Status& s : statuses) RETURN_IF_ERROR(s);
      if (received->plan.matrices.size() != specs.size() ||
          received->plan.matrices.back().blocks.size() != static_cast<size_t>(world)) {
        return absl::InternalError("the received plan is not the step's");
      }
      f.parse_cpu = tp.cpu;
      f.from_proto_cpu = tf.cpu;
      f.validate_cpu = tv.cpu;
    }
    std::string().swap(wire);
    // Every member reads past the entry: the coordinator drops it.
    ++next;
    for (int q = 0; q < fleet; ++q) RETURN_IF_ERROR(c->Read(reader(q), next, absl::ZeroDuration()).status());
    f.left_bytes = static_cast<double>(Allocated() - base);

    // Kept reports: after the batch ran, each member sends the reports of the trainer ranks it ran
    // with its next read (Executor::Keep), which the fleet service decodes and the coordinator
    // keeps for replays until the group's next step.
    {
      Timer decode_kept, read_kept;
      int r = 0;
      for (int q = 0; q < fleet; ++q) {
        ReaderState state = reader(q);
        for (; r < world && FleetRankOfTrainer(r, world, fleet) == q; ++r) {
          fleet::v1::ReadyReport proto = report_proto(key, r);
          f.kept_wire_bytes += static_cast<double>(proto.ByteSizeLong());
          decode_kept.Start();
          absl::StatusOr<ReadyReport> decoded = ReadyReportFromProto(proto);
          decode_kept.Stop();
          RETURN_IF_ERROR(decoded.status());
          state.kept.push_back(*std::move(decoded));
        }
        read_kept.Start();
        absl::Status s = c->Read(state, next, absl::ZeroDuration()).status();
        read_kept.Stop();
        RETURN_IF_ERROR(s);
      }
      f.kept_decode_cpu = decode_kept.cpu;
      f.kept_read_cpu = read_kept.cpu;
      // Between steps the coordinator holds the kept reports (the previous step's are replaced
      // by the first kept report of this one).
      f.kept_bytes = static_cast<double>(Allocated() - point_base);
    }
    steps.push_back(f);
  }

  auto med = [&](double StepFigures::*field) {
    std::vector<double> v;
    for (const StepFigures& f : steps) v.push_back(f.*field);
    return Median(v);
  };
  const int64_t blocks = static_cast<int64_t>(specs.size()) * world;
  const double fanout_cpu =
      fleet * (med(&StepFigures::read_cpu) + med(&StepFigures::encode_cpu) + med(&StepFigures::serialize_cpu));
  const double planning_cpu = med(&StepFigures::report_cpu) + med(&StepFigures::last_cpu);
  std::printf(
      "{\"W\": %d, \"S\": %d, \"matrices\": %zu, \"blocks\": %lld, \"reps\": %d, \"readers_timed\": %d, "
      "\"reports_in\": %d, \"remote_reports\": %d, \"entries_out\": %d, "
      "\"report_wire_bytes\": %.0f, \"entry_wire_bytes\": %.0f, \"bytes_out\": %.0f, "
      "\"decode_cpu_s\": %.6f, \"decode_wall_s\": %.6f, \"report_cpu_s\": %.6f, \"report_wall_s\": %.6f, "
      "\"last_report_cpu_s\": %.6f, \"last_report_wall_s\": %.6f, \"owners_cpu_s\": %.6f, "
      "\"planning_cpu_s\": %.6f, "
      "\"read_cpu_s_per_member\": %.6f, \"encode_cpu_s_per_member\": %.6f, \"serialize_cpu_s_per_member\": %.6f, "
      "\"fanout_cpu_s\": %.6f, \"coordinator_cpu_s\": %.6f, "
      "\"member_parse_cpu_s\": %.6f, \"member_from_proto_cpu_s\": %.6f, \"member_validate_cpu_s\": %.6f, "
      "\"pending_bytes\": %.0f, \"entry_bytes\": %.0f, \"left_bytes\": %.0f, \"compact_entry_wire_bytes\": %.0f, "
      "\"kept_wire_bytes\": %.0f, \"kept_decode_cpu_s\": %.6f, \"kept_read_cpu_s\": %.6f, \"kept_bytes\": %.0f, "
      "\"read_transient_bytes_per_member\": %.0f, "
      "\"peak_rss_bytes\": %lld}\n",
      world, fleet, specs.size(), static_cast<long long>(blocks), reps, std::min(fleet, readers_sampled), world,
      steps.empty() ? 0 : steps[0].remote_reports, fleet, med(&StepFigures::report_wire_bytes),
      med(&StepFigures::entry_wire_bytes), fleet * med(&StepFigures::entry_wire_bytes), med(&StepFigures::decode_cpu),
      med(&StepFigures::decode_wall), med(&StepFigures::report_cpu), med(&StepFigures::report_wall),
      med(&StepFigures::last_cpu), med(&StepFigures::last_wall), med(&StepFigures::owners_cpu), planning_cpu,
      med(&StepFigures::read_cpu), med(&StepFigures::encode_cpu), med(&StepFigures::serialize_cpu), fanout_cpu,
      med(&StepFigures::decode_cpu) + planning_cpu + fanout_cpu + med(&StepFigures::kept_decode_cpu) +
          med(&StepFigures::kept_read_cpu),
      med(&StepFigures::parse_cpu), med(&StepFigures::from_proto_cpu), med(&StepFigures::validate_cpu),
      med(&StepFigures::pending_bytes), med(&StepFigures::entry_bytes), med(&StepFigures::left_bytes),
      med(&StepFigures::compact_wire_bytes), med(&StepFigures::kept_wire_bytes), med(&StepFigures::kept_decode_cpu),
      med(&StepFigures::kept_read_cpu), med(&StepFigures::kept_bytes), med(&StepFigures::transient_bytes),
      static_cast<long long>(PeakRss()));
  std::fflush(stdout);
  c->Shutdown();
  return absl::OkStatus();
}

}  // namespace
}  // namespace orthoserve

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::vector<orthoserve::MatrixPlan> specs = orthoserve::ModelSpecs(absl::GetFlag(FLAGS_layers));
  for (int fleet : orthoserve::ParseList(absl::GetFlag(FLAGS_s))) {
    for (int world : orthoserve::ParseList(absl::GetFlag(FLAGS_w))) {
      absl::Status s =
          orthoserve::RunPoint(world, fleet, absl::GetFlag(FLAGS_reps), absl::GetFlag(FLAGS_readers), specs);
      if (!s.ok()) {
        std::fprintf(stderr, "W=%d S=%d: %s\n", world, fleet, s.ToString().c_str());
        return 1;
      }
    }
  }
  return 0;
}
