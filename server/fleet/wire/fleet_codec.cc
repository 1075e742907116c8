// Implementation of server/fleet/wire/fleet_codec.h.
#include "server/fleet/wire/fleet_codec.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/fleet_change.h"
#include "common/message_text.h"
#include "common/status.h"
#include "proto/convert/ns_options_proto.h"
#include "server/fleet/wire/plan_codec.h"

namespace orthoserve {

fleet::v1::GroupKey GroupKeyToProto(const GroupKey& key) {
  fleet::v1::GroupKey p;
  p.set_tenant(key.tenant);
  p.set_job(key.job);
  p.set_group(key.group);
  p.set_step(key.step);
  p.set_run(key.run);
  return p;
}

GroupKey GroupKeyFromProto(const fleet::v1::GroupKey& p) { return GroupKey{p.tenant(), p.job(), p.group(), p.step(), p.run()}; }

std::string SpecListToBytes(const SpecList& specs) {
  fleet::v1::SpecList proto;
  proto.mutable_matrices()->Reserve(static_cast<int>(specs.size()));
  for (const MatrixPlan& m : specs) *proto.add_matrices() = MatrixPlanToProto(m);
  return proto.SerializeAsString();
}

fleet::v1::ReadyReport ReadyReportToProto(const ReadyReport& report, const std::string* spec_list) {
  fleet::v1::ReadyReport p;
  *p.mutable_key() = GroupKeyToProto(report.key);
  p.set_trainer_rank(report.trainer_rank);
  p.set_trainer_world(report.trainer_world);
  p.set_fleet_rank(report.fleet_rank);
  p.set_submission(report.submission);
  p.set_attempt(report.attempt);
  p.set_epoch(report.epoch);
  p.set_incarnation(report.incarnation);
  p.set_digest(report.digest);
  for (uint64_t d : report.step_digests) p.add_step_digests(d);
  p.set_spec_list(spec_list != nullptr ? *spec_list : SpecListToBytes(*report.sent.specs));
  p.mutable_blocks()->Reserve(static_cast<int>(4 * report.sent.size()));
  for (const Block& b : report.sent.blocks) {
    p.add_blocks(b.row_offset);
    p.add_blocks(b.col_offset);
    p.add_blocks(b.rows);
    p.add_blocks(b.cols);
  }
  for (const SpanUse& use : report.region_spans) {
    fleet::v1::RegionSpan* span = p.add_region_spans();
    span->set_matrix(use.matrix);
    span->set_result(use.writes);
    span->set_host(use.span.memory.host);
    span->set_device(use.span.memory.device);
    span->set_inode(use.span.memory.inode);
    span->set_offset(use.span.offset);
    span->set_bytes(use.span.bytes);
  }
  return p;
}

absl::StatusOr<ReadyReport> ReadyReportFromProto(const fleet::v1::ReadyReport& p, SpecListCache* cache) {
  if (p.trainer_world() > kMaxFleetTrainerWorld) {
    return absl::InvalidArgumentError(absl::StrCat("the report's trainer world ", p.trainer_world(),
                                                   " is over the fleet's limit of ", kMaxFleetTrainerWorld));
  }
  ReadyReport report;
  report.key = GroupKeyFromProto(p.key());
  report.trainer_rank = p.trainer_rank();
  report.trainer_world = p.trainer_world();
  report.fleet_rank = p.fleet_rank();
  report.submission = p.submission();
  report.attempt = p.attempt();
  report.epoch = p.epoch();
  report.incarnation = p.incarnation();
  report.digest = p.digest();
  report.step_digests.assign(p.step_digests().begin(), p.step_digests().end());
  SharedSpecs specs;
  if (cache != nullptr) {
    ASSIGN_OR_RETURN(specs, cache->Decode(p.spec_list()));
  } else {
    ASSIGN_OR_RETURN(SpecList list, DecodeSpecList(p.spec_list()));
    specs = std::make_shared<const SpecList>(std::move(list));
  }
  if (static_cast<size_t>(p.blocks_size()) != 4 * specs->size()) {
    return absl::InvalidArgumentError(absl::StrCat("the report carries ", p.blocks_size(), " block numbers for ",
                                                   specs->size(), " matrices (4 each)"));
  }
  std::vector<Block> blocks(specs->size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    const int j = static_cast<int>(4 * i);
    blocks[i] = Block{p.blocks(j), p.blocks(j + 1), p.blocks(j + 2), p.blocks(j + 3)};
  }
  report.sent = SenderBlocks(std::move(specs), std::move(blocks));
  // At most two slices per matrix (its input and its result), each of a matrix of the step.
  if (static_cast<size_t>(p.region_spans_size()) > 2 * report.sent.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the report carries ", p.region_spans_size(),
                                                   " region slices for ", report.sent.size(), " matrices"));
  }
  report.region_spans.reserve(static_cast<size_t>(p.region_spans_size()));
  for (const fleet::v1::RegionSpan& span : p.region_spans()) {
    if (span.matrix() < 0 || static_cast<size_t>(span.matrix()) >= report.sent.size() || span.offset() < 0 ||
        span.bytes() < 0) {
      return absl::InvalidArgumentError(absl::StrCat("the report carries a region slice of matrix ", span.matrix(),
                                                     " at offset ", span.offset(), " of ", span.bytes(),
                                                     " bytes; the step has ", report.sent.size(), " matrices"));
    }
    report.region_spans.push_back(SpanUse{
        SharedSpan{MemoryId{span.host(), span.device(), span.inode()}, span.offset(), span.bytes()}, span.result(),
        report.trainer_rank, span.matrix()});
  }
  return report;
}

fleet::v1::Member MemberToProto(const Member& member) {
  fleet::v1::Member p;
  p.set_rank(member.rank);
  p.set_address(member.address);
  p.set_incarnation(member.incarnation);
  p.set_fleet_port(member.fleet_port);
  return p;
}

Member MemberFromProto(const fleet::v1::Member& p) {
  return Member{p.rank(), p.address(), p.incarnation(), p.fleet_port()};
}

namespace {

// The rule `m`'s placements follow with `fleet_ranks` as trainer rank r's fleet rank
// (fleet.proto, BlockRule), or BLOCK_RULE_EXPLICIT. Exact: a rule is chosen only when it gives
// back every placement as it is.
fleet::v1::BlockRule RuleOf(const MatrixPlan& m, int world, const std::vector<int>& fleet_ranks) {
  if (world < 1 || m.blocks.size() != static_cast<size_t>(world) || fleet_ranks.size() != m.blocks.size()) {
    return fleet::v1::BLOCK_RULE_EXPLICIT;
  }
  for (int dim = 0; dim < 2; ++dim) {
    bool follows = true;
    for (int r = 0; r < world && follows; ++r) {
      const BlockPlacement& b = m.blocks[r];
      follows = b.trainer_rank == r && b.fleet_rank == fleet_ranks[r] && b.block == ChunkBlock(m.view, world, r, dim);
    }
    if (follows) return dim == 0 ? fleet::v1::BLOCK_RULE_CHUNK_ROWS : fleet::v1::BLOCK_RULE_CHUNK_COLS;
  }
  return fleet::v1::BLOCK_RULE_EXPLICIT;
}

}  // namespace

fleet::v1::LogEntry LogEntryToProto(const LogEntry& entry) {
  fleet::v1::LogEntry p;
  p.set_index(entry.index);
  p.set_generation(entry.generation);
  p.set_retryable(IsFleetChange(entry.status));
  for (const Member& m : entry.members) *p.add_members() = MemberToProto(m);
  for (uint64_t s : entry.submissions) p.add_submissions(s);
  for (uint64_t d : entry.digests) p.add_digests(d);
  for (bool c : entry.cached) p.add_cached(c);
  p.set_graceful(entry.graceful);
  *p.mutable_key() = GroupKeyToProto(entry.key);
  p.set_code(static_cast<int>(entry.status.code()));
  p.set_message(std::string(entry.status.message()));
  p.set_failure(entry.failure);
  p.set_part_offset(entry.part_offset);
  p.set_more_parts(entry.more_parts);
  const int world = entry.plan.trainer_world;
  p.set_trainer_world(world);
  p.set_fleet_world(entry.plan.fleet_world);
  // Trainer rank r's fleet rank, as the first matrix with a placement for every rank has it.
  std::vector<int> fleet_ranks;
  for (const MatrixPlan& m : entry.plan.matrices) {
    if (m.blocks.size() != static_cast<size_t>(world)) continue;
    for (const BlockPlacement& b : m.blocks) fleet_ranks.push_back(b.fleet_rank);
    break;
  }
  bool ruled = false;
  p.mutable_matrices()->Reserve(static_cast<int>(entry.plan.matrices.size()));
  for (const MatrixPlan& m : entry.plan.matrices) {
    fleet::v1::PlannedMatrix* pm = p.add_matrices();
    *pm->mutable_plan() = MatrixPlanToProto(m);
    const fleet::v1::BlockRule rule = RuleOf(m, world, fleet_ranks);
    pm->set_block_rule(rule);
    ruled |= rule != fleet::v1::BLOCK_RULE_EXPLICIT;
    if (rule == fleet::v1::BLOCK_RULE_EXPLICIT) {
      pm->mutable_placements()->Reserve(static_cast<int>(m.blocks.size()));
      for (const BlockPlacement& b : m.blocks) {
        fleet::v1::Placement* placement = pm->add_placements();
        placement->set_trainer_rank(b.trainer_rank);
        placement->set_fleet_rank(b.fleet_rank);
        *placement->mutable_block() = BlockToProto(b.block);
      }
    }
    pm->set_owner(m.owner);
  }
  if (ruled) {
    p.mutable_trainer_fleet_ranks()->Reserve(static_cast<int>(fleet_ranks.size()));
    for (int f : fleet_ranks) p.add_trainer_fleet_ranks(f);
  }
  return p;
}

absl::StatusOr<LogEntry> LogEntryFromProto(const fleet::v1::LogEntry& p) {
  LogEntry entry;
  entry.index = p.index();
  entry.generation = p.generation();
  for (const fleet::v1::Member& m : p.members()) entry.members.push_back(MemberFromProto(m));
  entry.submissions.assign(p.submissions().begin(), p.submissions().end());
  entry.digests.assign(p.digests().begin(), p.digests().end());
  entry.cached.assign(p.cached().begin(), p.cached().end());
  entry.graceful = p.graceful();
  entry.key = GroupKeyFromProto(p.key());
  entry.status = absl::Status(static_cast<absl::StatusCode>(p.code()), p.message());
  if (p.retryable()) entry.status = MarkFleetChange(std::move(entry.status));
  entry.failure = p.failure();
  entry.part_offset = p.part_offset();
  entry.more_parts = p.more_parts();
  const int world = p.trainer_world();
  entry.plan.trainer_world = world;
  entry.plan.fleet_world = p.fleet_world();
  entry.plan.matrices.reserve(p.matrices_size());
  for (int i = 0; i < p.matrices_size(); ++i) {
    const fleet::v1::PlannedMatrix& pm = p.matrices(i);
    ASSIGN_OR_RETURN(MatrixPlan m, MatrixPlanFromProto(pm.plan(), i));
    switch (pm.block_rule()) {
      case fleet::v1::BLOCK_RULE_EXPLICIT:
        m.blocks.reserve(pm.placements_size());
        for (const fleet::v1::Placement& b : pm.placements()) {
          m.blocks.push_back(BlockPlacement{b.trainer_rank(), b.fleet_rank(), BlockFromProto(b.block())});
        }
        break;
      case fleet::v1::BLOCK_RULE_CHUNK_ROWS:
      case fleet::v1::BLOCK_RULE_CHUNK_COLS: {
        if (world < 1 || p.trainer_fleet_ranks_size() != world) {
          return absl::InvalidArgumentError(absl::StrCat(MatrixLabel(i, pm.plan().name()),
                                                         ": placed by rule, but the entry names ",
                                                         p.trainer_fleet_ranks_size(), " fleet ranks for ", world,
                                                         " trainer ranks"));
        }
        const int dim = pm.block_rule() == fleet::v1::BLOCK_RULE_CHUNK_ROWS ? 0 : 1;
        m.blocks.reserve(world);
        for (int r = 0; r < world; ++r) {
          m.blocks.push_back(BlockPlacement{r, p.trainer_fleet_ranks(r), ChunkBlock(m.view, world, r, dim)});
        }
        break;
      }
      default:
        return absl::InvalidArgumentError(
            absl::StrCat(MatrixLabel(i, pm.plan().name()), ": unknown block rule ", static_cast<int>(pm.block_rule())));
    }
    m.owner = pm.owner();
    entry.plan.matrices.push_back(std::move(m));
  }
  return entry;
}

}  // namespace orthoserve
