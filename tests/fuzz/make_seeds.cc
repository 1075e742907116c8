// fuzz_seeds DIR: writes the seed corpus of every fuzz target (tests/fuzz/CMakeLists.txt) into
// DIR/<target>/: messages as the real encoders make them (protobuf for the public protocol, the
// fleet's codecs, LeaderValue/MemberValue, FormatCudaIpcMessage, EncodeNpy), each once and with a
// few edge cases. tests/fuzz/corpus/ was made by `fuzz_seeds tests/fuzz/corpus`; findings are
// added there by hand, under names that say what they were.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "client/cpp/npy.h"
#include "etcd/mvccpb/kv.pb.h"
#include "orthoserve/v1/orthogonalizer.pb.h"
#include "server/fleet/wire/etcd_values.h"
#include "server/fleet/wire/fleet_codec.h"
#include "server/rpc/spec_codec.h"
#include "server/shm/cuda_ipc_message.h"

namespace orthoserve {
namespace {

namespace fs = std::filesystem;

fs::path root;

void Write(const std::string& target, const std::string& name, const std::string& bytes) {
  const fs::path dir = root / target;
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << bytes;
}

// Public specs that between them set most fields.
std::vector<v1::MatrixSpec> Specs() {
  std::vector<v1::MatrixSpec> specs;
  v1::MatrixSpec plain;
  plain.set_name("w0");
  plain.add_shape(4);
  plain.add_shape(3);
  plain.set_dtype(v1::DTYPE_FP32);
  specs.push_back(plain);

  v1::MatrixSpec batch;
  batch.set_name("conv");
  for (int d : {2, 3, 2, 2}) batch.add_shape(d);
  batch.set_dtype(v1::DTYPE_BF16);
  batch.set_result_dtype(v1::DTYPE_FP32);
  batch.set_nd_layout(v1::ND_LAYOUT_BATCH);
  batch.set_algorithm(v1::ALGORITHM_GATHERED);
  batch.mutable_options()->set_steps(3);
  batch.mutable_options()->set_precision(v1::PRECISION_HIGHEST);
  batch.mutable_options()->set_scale_mode(v1::SCALE_MODE_UNIT_RMS_NORM);
  specs.push_back(batch);

  v1::MatrixSpec custom;
  custom.set_name("qkv");
  custom.add_shape(6);
  custom.add_shape(4);
  custom.set_dtype(v1::DTYPE_FP16);
  custom.set_algorithm(v1::ALGORITHM_TP_DISTRIBUTED);
  custom.set_partition_dim(1);
  v1::NsOptions* o = custom.mutable_options();
  o->set_coefficients(v1::COEFFICIENTS_CUSTOM);
  v1::CoefficientTriple* t = o->add_custom_coefficients();
  t->set_a(3.4445);
  t->set_b(-4.775);
  t->set_c(2.0315);
  o->set_eps(1e-5);
  o->set_eps_mode(v1::EPS_MODE_ADD);
  o->set_transpose(v1::TRANSPOSE_ON);
  o->set_extra_scale(0.5);
  for (int n : {1, 1, 1}) o->add_split_qkv(n);
  custom.mutable_block()->set_rows(6);
  custom.mutable_block()->set_cols(2);
  specs.push_back(custom);

  v1::MatrixSpec region = plain;
  region.set_name("in_region");
  region.set_algorithm(v1::ALGORITHM_ROW_SHARDED);
  region.mutable_block()->set_row_offset(2);
  region.mutable_block()->set_rows(2);
  region.mutable_block()->set_cols(3);
  region.mutable_input_region()->set_region_id("r-0123456789abcdef");
  region.mutable_input_region()->set_offset(64);
  region.mutable_input_region()->set_size(24);
  region.mutable_result_region()->set_region_id("r-0123456789abcdef");
  region.mutable_result_region()->set_offset(128);
  region.mutable_result_region()->set_size(24);
  specs.push_back(region);
  return specs;
}

std::string Data(const v1::MatrixSpec& spec) {
  int64_t n = spec.block().rows() * spec.block().cols();
  if (n == 0) {
    n = 1;
    for (int64_t d : spec.shape()) n *= d;
  }
  const size_t element = spec.dtype() == v1::DTYPE_FP32 ? 4 : 2;
  return std::string(static_cast<size_t>(n) * element, '\x3f');
}

void PublicSeeds() {
  const std::vector<v1::MatrixSpec> specs = Specs();
  for (size_t i = 0; i < specs.size(); ++i) Write("matrix_spec", "spec_" + specs[i].name(), specs[i].SerializeAsString());
  v1::MatrixSpec huge = specs[0];
  huge.set_shape(0, int64_t{1} << 40);
  Write("matrix_spec", "edge_huge_shape", huge.SerializeAsString());
  Write("matrix_spec", "edge_empty", "");

  // Stream messages: a slice-size byte (0: one slice), then the message.
  std::vector<std::pair<std::string, v1::StreamRequest>> messages;
  v1::StreamRequest header;
  header.mutable_header()->set_num_matrices(2);
  header.mutable_header()->set_call_id("c-1");
  messages.push_back({"header_lone", header});
  v1::StepHeader* h = header.mutable_header();
  h->set_job("job");
  h->set_group("tp0");
  h->set_step(41);
  h->set_rank(1);
  h->set_world(2);
  h->set_attempt(1);
  h->set_run_id("run-7");
  h->set_result_chunk_bytes(4096);
  messages.push_back({"header_group", header});
  for (const v1::MatrixSpec& s : specs) {
    v1::StreamRequest m;
    *m.mutable_spec() = s;
    messages.push_back({"spec_" + s.name(), m});
  }
  v1::StreamRequest chunk;
  chunk.mutable_chunk()->set_index(1);
  chunk.mutable_chunk()->set_data(Data(specs[0]));
  messages.push_back({"chunk", chunk});
  v1::StreamRequest end;
  end.mutable_end();
  messages.push_back({"end", end});
  for (const auto& [name, m] : messages) {
    for (char slice : {'\0', '\x05'}) {
      Write("stream_request", name + (slice == 0 ? "" : "_sliced"), std::string(1, slice) + m.SerializeAsString());
    }
  }

  v1::OrthogonalizeRequest unary;
  unary.set_call_id("c-2");
  for (int i : {0, 1}) {
    v1::Matrix* m = unary.add_matrices();
    *m->mutable_spec() = specs[i];
    m->set_data(Data(specs[i]));
  }
  Write("unary_request", "two_matrices", std::string(1, '\0') + unary.SerializeAsString());
  Write("unary_request", "two_matrices_sliced", std::string(1, '\x07') + unary.SerializeAsString());
  v1::OrthogonalizeRequest bad = unary;
  bad.mutable_matrices(0)->mutable_data()->pop_back();
  Write("unary_request", "edge_short_data", std::string(1, '\0') + bad.SerializeAsString());
}

void FleetSeeds() {
  const std::vector<v1::MatrixSpec> specs = Specs();
  SpecList plans;
  std::vector<Block> blocks;
  for (size_t i = 0; i < specs.size(); ++i) {
    const absl::StatusOr<ParsedSpec> p = ParseMatrixSpec(specs[i], static_cast<int>(i), SpecLimits{}, true);
    if (!p.ok()) {
      std::fprintf(stderr, "fuzz_seeds: spec %zu: %s\n", i, p.status().ToString().c_str());
      std::exit(1);
    }
    plans.push_back(p->plan);
    blocks.push_back(p->block);
  }
  ReadyReport report;
  report.key = GroupKey{"tenant", "job", "tp0", 41, "run-7"};
  report.trainer_rank = 1;
  report.trainer_world = 2;
  report.fleet_rank = 1;
  report.submission = 17;
  report.attempt = 1;
  report.epoch = 3;
  report.incarnation = 0x1234567890abcdefULL;
  report.digest = 99;
  report.sent = SenderBlocks(plans, blocks);
  Write("fleet_report", "report", ReadyReportToProto(report).SerializeAsString());
  report.step_digests = {98, 99};
  const MemoryId memory{7, 8, 9};
  report.region_spans = {SpanUse{SharedSpan{memory, 64, 24}, false, 1, 3},
                         SpanUse{SharedSpan{memory, 128, 24}, true, 1, 3}};
  Write("fleet_report", "report_kept_with_regions", ReadyReportToProto(report).SerializeAsString());

  LogEntry batch;
  batch.index = 12;
  batch.generation = 3;
  batch.key = report.key;
  batch.submissions = {16, 17};
  batch.digests = {98, 99};
  batch.cached = {false, true};
  batch.plan.trainer_world = 2;
  batch.plan.fleet_world = 2;
  batch.plan.matrices = plans;
  for (MatrixPlan& m : batch.plan.matrices) {
    const int64_t half = m.view.rows / 2;
    m.blocks = {BlockPlacement{0, 0, Block{0, 0, half, m.view.cols}},
                BlockPlacement{1, 1, Block{half, 0, m.view.rows - half, m.view.cols}}};
    m.owner = m.algorithm == Algorithm::kAuto ? 1 : -1;
  }
  Write("fleet_log_entry", "batch", LogEntryToProto(batch).SerializeAsString());
  batch.part_offset = 2;
  batch.more_parts = true;
  Write("fleet_log_entry", "batch_part", LogEntryToProto(batch).SerializeAsString());
  LogEntry failure;
  failure.index = 13;
  failure.key = report.key;
  failure.status = absl::DeadlineExceededError("step 41: not every trainer rank arrived");
  failure.failure = kStepFailureTimeout;
  Write("fleet_log_entry", "failure", LogEntryToProto(failure).SerializeAsString());
  LogEntry membership;
  membership.index = 14;
  membership.generation = 4;
  membership.members = {Member{0, "127.0.0.1:50051", 5, 50061}, Member{1, "[::1]:50052", 6, 0}};
  membership.graceful = true;
  Write("fleet_log_entry", "membership", LogEntryToProto(membership).SerializeAsString());
}

void EtcdSeeds() {
  auto kv = [](const std::string& key, const std::string& value, int64_t lease) {
    mvccpb::KeyValue p;
    p.set_key(key);
    p.set_value(value);
    p.set_create_revision(5);
    p.set_mod_revision(7);
    p.set_version(1);
    p.set_lease(lease);
    return p.SerializeAsString();
  };
  const std::string w4(1, '\x04');
  Write("etcd_value", "leader", w4 + kv("/fleet/coordinator/694d7f2a1b3c", LeaderValue(1, "10.0.0.2:50061"), 0x694d));
  Write("etcd_value", "leader_ipv6", w4 + kv("/fleet/coordinator/1", LeaderValue(0, "[fe80::1%eth0]:7000"), 1));
  Write("etcd_value", "member", w4 + kv("/fleet/members/3", MemberValue(0xfedcba9876543210ULL, "host-3.local:50061"), 2));
  Write("etcd_value", "edge_leader_no_lease", w4 + kv("/fleet/coordinator/x", LeaderValue(0, "127.0.0.1:1"), 0));
  Write("etcd_value", "edge_rank_int_max", std::string(1, '\0') + kv("/fleet/members/2147483647",
                                                                       "2147483647 127.0.0.1:50061", 3));
  Write("etcd_value", "edge_rank_outside_world", w4 + kv("/fleet/coordinator/2", "2147483647 127.0.0.1:50061", 3));
}

void LocalSeeds() {
  CudaIpcHandover h;
  h.device_uuid = "GPU-01234567-89ab-cdef-0123-456789abcdef";
  h.offset = 2 << 20;
  h.size = 4096;
  h.handle = std::string(64, '\xa5');
  Write("cuda_ipc_message", "message", FormatCudaIpcMessage(h));
  h.offset = 0;
  h.size = 9223372036854775807;
  std::string line = FormatCudaIpcMessage(h);
  Write("cuda_ipc_message", "edge_largest_size", line);
  line.pop_back();
  Write("cuda_ipc_message", "edge_no_newline", line);

  client::NpyArray a;
  a.shape = {2, 3};
  a.data.assign(24, '\x01');
  Write("npy", "f32_2x3.npy", *client::EncodeNpy(a));
  a.dtype = DType::kF16;
  a.shape = {3, 1, 2};
  a.data.assign(12, '\x02');
  Write("npy", "f16_3x1x2.npy", *client::EncodeNpy(a));
  a.dtype = DType::kBF16;
  a.shape = {2, 2};
  a.data.assign(8, '\x03');
  Write("npy", "bf16_2x2.npy", *client::EncodeNpy(a));
  a.dtype = DType::kF32;
  a.shape = {};
  a.data.assign(4, '\x04');
  Write("npy", "f32_scalar.npy", *client::EncodeNpy(a));
  a.shape = {0, 5};
  a.data.clear();
  Write("npy", "f32_0x5.npy", *client::EncodeNpy(a));
  // A header long enough for version 2.0.
  a.shape.assign(40, 1);
  a.shape[0] = 1;
  a.data.assign(4, '\x05');
  Write("npy", "f32_40_dims.npy", *client::EncodeNpy(a));
}

}  // namespace
}  // namespace orthoserve

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  orthoserve::root = argv[1];
  orthoserve::PublicSeeds();
  orthoserve::FleetSeeds();
  orthoserve::EtcdSeeds();
  orthoserve::LocalSeeds();
  return 0;
}
