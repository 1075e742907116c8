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
//     the remote reports are decoded with one SpecListCache, as the fleet service's;
//  2. fan-out: members read the entry as FleetService::ReadLog serves it — Coordinator::ReadAsync
//     (the log's shared entry), EncodedLog::Encoded (encoded by the first reader only) into a
//     ReadLogResponse and its serialization (what gRPC sends) — timed for `--readers` members
//     and scaled to S;
//  3. a member's side: parsing that response and its entry, LogEntryFromProto and ValidatePlan
//     (what ExecuteBatch checks before it runs the batch);
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
#include "orthoserve/fleet/v1/fleet.pb.h"
#include "proto/convert/ns_options_proto.h"
#include "server/distributed/batch.h"
#include "server/fleet/logic/coordinator.h"
#include "server/fleet/wire/encoded_log.h"
#include "server/fleet/wire/fleet_codec.h"
#include "server/fleet/wire/spec_list_cache.h"

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
  double read_cpu = 0, encode_cpu = 0, serialize_cpu = 0;      // Per member (median): read, encoding, bytes.
  double fanout_cpu = 0;  // All S members: the sampled ones' sum, the others at the median.
  double parse_cpu = 0, from_proto_cpu = 0, validate_cpu = 0;  // A member: parse, LogEntryFromProto, ValidatePlan.
  double pending_bytes = 0;                                    // Held for the pending step before its last report.
  double entry_bytes = 0;                                      // Held for the log entry after it.
  double left_bytes = 0;                                       // Held after every member read past it.
  double report_wire_bytes = 0;                                // Σ ReadyReport sizes on the wire (W reports).
  double entry_wire_bytes = 0;                                 // One ReadLogResponse carrying the entry.
  double kept_wire_bytes = 0;                     // Σ kept reports sent with the next reads.
  double kept_decode_cpu = 0, kept_read_cpu = 0;  // Decoding them; Coordinator::Read taking them.
  double kept_bytes = 0;                          // Held between steps (the kept reports).
  double encodings = 0;                           // Entries encoded for the S members' reads.
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
      const int j = static_cast<int>(4 * i);
      proto.set_blocks(j, offsets[i][r]);
      proto.set_blocks(j + 1, 0);
      proto.set_blocks(j + 2, sizes[i][r]);
      proto.set_blocks(j + 3, specs[i].view.cols);
    }
    return proto;
  };

  // The fleet service's: one spec-list cache for reports and kept notices, one encoding per entry.
  SpecListCache spec_lists;
  EncodedLog encoded;
  auto read_shared = [&](const ReaderState& state, int64_t from) {
    absl::StatusOr<std::vector<SharedLogEntry>> out = absl::UnknownError("no answer");
    c->ReadAsync(state, from, absl::ZeroDuration(),
                 [&out](absl::StatusOr<std::vector<SharedLogEntry>> read) { out = std::move(read); });
    return out;
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
      absl::StatusOr<ReadyReport> decoded = remote ? ReadyReportFromProto(proto, &spec_lists) : ReadyReportFromProto(proto);
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
    const int64_t encodings_before = encoded.encodings();
    for (int q = 0; q < std::min(fleet, readers_sampled); ++q) {
      Timer tr, te, ts;
      const int64_t held_before = Allocated();
      tr.Start();
      absl::StatusOr<std::vector<SharedLogEntry>> entries = read_shared(reader(q), next);
      tr.Stop();
      RETURN_IF_ERROR(entries.status());
      if (entries->size() != 1 || !entries->front()->status.ok() || entries->front()->membership()) {
        return absl::InternalError(absl::StrCat("expected one batch entry, got ", entries->size(), ": ",
                                                entries->empty() ? "" : entries->front()->status.ToString()));
      }
      fleet::v1::ReadLogResponse response;
      te.Start();
      for (const SharedLogEntry& e : *entries) response.add_entries(*encoded.Encoded(e));
      te.Stop();
      ts.Start();
      wire.clear();
      response.SerializeToString(&wire);
      ts.Stop();
      // The response and its bytes, alive until it is sent (the entry and its encoding are the
      // log's, shared): every member's long poll wakes at the same append, so S of these can be
      // held at once.
      transient.push_back(static_cast<double>(Allocated() - held_before));
      read_cpu.push_back(tr.cpu);
      encode_cpu.push_back(te.cpu);
      serialize_cpu.push_back(ts.cpu);
      if (q == 0) entry = *entries->front();
    }
    // The first sampled reader encoded the entry; the others (and the S - readers not sampled)
    // share its bytes.
    f.encodings = static_cast<double>(encoded.encodings() - encodings_before);
    {
      double sampled = 0;
      for (size_t i = 0; i < read_cpu.size(); ++i) sampled += read_cpu[i] + encode_cpu[i] + serialize_cpu[i];
      f.fanout_cpu = sampled;
    }
    f.read_cpu = Median(read_cpu);
    f.encode_cpu = Median(encode_cpu);
    f.serialize_cpu = Median(serialize_cpu);
    f.transient_bytes = Median(transient);
    f.fanout_cpu += (fleet - static_cast<double>(read_cpu.size())) * (f.read_cpu + f.encode_cpu + f.serialize_cpu);
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

    // A member's side.
    {
      Timer tp, tf, tv;
      fleet::v1::ReadLogResponse response;
      tp.Start();
      const bool parsed = response.ParseFromString(wire);
      fleet::v1::LogEntry entry_proto;
      const bool entry_parsed = parsed && response.entries_size() == 1 && entry_proto.ParseFromString(response.entries(0));
      tp.Stop();
      if (!entry_parsed) return absl::InternalError("the response does not parse");
      tf.Start();
      absl::StatusOr<LogEntry> received = LogEntryFromProto(entry_proto);
      tf.Stop();
      RETURN_IF_ERROR(received.status());
      tv.Start();
      std::vector<absl::Status> statuses = ValidatePlan(received->plan);
      tv.Stop();
      for (const absl::Status& s : statuses) RETURN_IF_ERROR(s);
      if (received->plan.matrices.size() != entry.plan.matrices.size()) {
        return absl::InternalError("the received plan is not the step's");
      }
      for (size_t i = 0; i < entry.plan.matrices.size(); ++i) {
        const std::vector<BlockPlacement>& a = received->plan.matrices[i].blocks;
        const std::vector<BlockPlacement>& b = entry.plan.matrices[i].blocks;
        bool same = a.size() == b.size() && received->plan.matrices[i].owner == entry.plan.matrices[i].owner;
        for (size_t k = 0; same && k < a.size(); ++k) {
          same = a[k].trainer_rank == b[k].trainer_rank && a[k].fleet_rank == b[k].fleet_rank && a[k].block == b[k].block;
        }
        if (!same) return absl::InternalError(absl::StrCat("matrix ", i, ": the received placements differ"));
      }
      f.parse_cpu = tp.cpu;
      f.from_proto_cpu = tf.cpu;
      f.validate_cpu = tv.cpu;
    }
    entry = LogEntry{};
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
          absl::StatusOr<ReadyReport> decoded = ReadyReportFromProto(proto, &spec_lists);
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
  const double fanout_cpu = med(&StepFigures::fanout_cpu);
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
      "\"pending_bytes\": %.0f, \"entry_bytes\": %.0f, \"left_bytes\": %.0f, \"encodings_per_step\": %.0f, "
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
      med(&StepFigures::encodings), med(&StepFigures::kept_wire_bytes), med(&StepFigures::kept_decode_cpu),
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
