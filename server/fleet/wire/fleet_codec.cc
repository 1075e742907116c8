// Implementation of server/fleet/wire/fleet_codec.h.
#include "server/fleet/wire/fleet_codec.h"

#include "common/fleet_change.h"
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

fleet::v1::ReadyReport ReadyReportToProto(const ReadyReport& report) {
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
  p.mutable_matrices()->Reserve(static_cast<int>(report.sent.size()));
  for (size_t i = 0; i < report.sent.size(); ++i) {
    fleet::v1::ReportedMatrix* m = p.add_matrices();
    *m->mutable_plan() = MatrixPlanToProto(report.sent.spec(i));
    *m->mutable_block() = BlockToProto(report.sent.blocks[i]);
  }
  return p;
}

absl::StatusOr<ReadyReport> ReadyReportFromProto(const fleet::v1::ReadyReport& p) {
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
  SpecList specs;
  std::vector<Block> blocks;
  specs.reserve(p.matrices_size());
  blocks.reserve(p.matrices_size());
  for (int i = 0; i < p.matrices_size(); ++i) {
    ASSIGN_OR_RETURN(MatrixPlan plan, MatrixPlanFromProto(p.matrices(i).plan(), i));
    specs.push_back(std::move(plan));
    blocks.push_back(BlockFromProto(p.matrices(i).block()));
  }
  report.sent = SenderBlocks(std::move(specs), std::move(blocks));
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
  p.set_trainer_world(entry.plan.trainer_world);
  p.set_fleet_world(entry.plan.fleet_world);
  p.mutable_matrices()->Reserve(static_cast<int>(entry.plan.matrices.size()));
  for (const MatrixPlan& m : entry.plan.matrices) {
    fleet::v1::PlannedMatrix* pm = p.add_matrices();
    *pm->mutable_plan() = MatrixPlanToProto(m);
    pm->mutable_placements()->Reserve(static_cast<int>(m.blocks.size()));
    for (const BlockPlacement& b : m.blocks) {
      fleet::v1::Placement* placement = pm->add_placements();
      placement->set_trainer_rank(b.trainer_rank);
      placement->set_fleet_rank(b.fleet_rank);
      *placement->mutable_block() = BlockToProto(b.block);
    }
    pm->set_owner(m.owner);
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
  entry.plan.trainer_world = p.trainer_world();
  entry.plan.fleet_world = p.fleet_world();
  entry.plan.matrices.reserve(p.matrices_size());
  for (int i = 0; i < p.matrices_size(); ++i) {
    const fleet::v1::PlannedMatrix& pm = p.matrices(i);
    ASSIGN_OR_RETURN(MatrixPlan m, MatrixPlanFromProto(pm.plan(), i));
    m.blocks.reserve(pm.placements_size());
    for (const fleet::v1::Placement& b : pm.placements()) {
      m.blocks.push_back(BlockPlacement{b.trainer_rank(), b.fleet_rank(), BlockFromProto(b.block())});
    }
    m.owner = pm.owner();
    entry.plan.matrices.push_back(std::move(m));
  }
  return entry;
}

}  // namespace orthoserve
