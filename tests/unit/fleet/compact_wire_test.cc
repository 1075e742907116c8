// What keeps the coordinator's wire cheap at W = 1024 (fleet protocol 4): a log entry's placements
// by rule where they follow torch.chunk, exactly or not at all; a report's spec list decoded once
// per distinct list (SpecListCache); and each log entry encoded once for all its readers
// (EncodedLog).
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/fleet/wire/encoded_log.h"
#include "server/fleet/wire/fleet_codec.h"
#include "server/fleet/wire/spec_list_cache.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using ::orthoserve::testing::StatusIs;
using ::testing::HasSubstr;

MatrixPlan Plan(std::string name, int64_t rows, int64_t cols) {
  MatrixPlan m;
  m.name = std::move(name);
  m.shape = {rows, cols};
  m.view = Matrix2d{rows, cols};
  return m;
}

// A W-rank batch entry of `specs`, matrix i chunked over the W ranks along dim `dims[i]`, trainer
// rank r on fleet rank r·S/W.
LogEntry ChunkedEntry(const std::vector<MatrixPlan>& specs, const std::vector<int>& dims, int world, int fleet) {
  LogEntry entry;
  entry.index = 7;
  entry.key = GroupKey{"t", "j", "g", 3, "run"};
  entry.plan.trainer_world = world;
  entry.plan.fleet_world = fleet;
  for (size_t i = 0; i < specs.size(); ++i) {
    MatrixPlan m = specs[i];
    for (int r = 0; r < world; ++r) {
      m.blocks.push_back(BlockPlacement{r, FleetRankOfTrainer(r, world, fleet), ChunkBlock(m.view, world, r, dims[i])});
    }
    m.owner = static_cast<int>(i) % fleet;
    entry.plan.matrices.push_back(std::move(m));
  }
  for (int r = 0; r < world; ++r) {
    entry.submissions.push_back(100 + r);
    entry.digests.push_back(1000 + r);
  }
  return entry;
}

void ExpectSamePlacements(const BatchPlan& a, const BatchPlan& b) {
  ASSERT_EQ(a.matrices.size(), b.matrices.size());
  for (size_t i = 0; i < a.matrices.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("matrix ", i));
    EXPECT_EQ(a.matrices[i].owner, b.matrices[i].owner);
    ASSERT_EQ(a.matrices[i].blocks.size(), b.matrices[i].blocks.size());
    for (size_t k = 0; k < a.matrices[i].blocks.size(); ++k) {
      const BlockPlacement& x = a.matrices[i].blocks[k];
      const BlockPlacement& y = b.matrices[i].blocks[k];
      EXPECT_TRUE(x.trainer_rank == y.trainer_rank && x.fleet_rank == y.fleet_rank && x.block == y.block) << k;
    }
  }
}

TEST(CompactPlacementsTest, ChunkedMatricesTravelByRuleAndComeBackExactly) {
  // Rows not divisible by W (the last ranks shorter or empty) and a column-chunked matrix.
  const std::vector<MatrixPlan> specs = {Plan("q", 37, 16), Plan("k", 5, 9), Plan("down", 12, 29)};
  const LogEntry entry = ChunkedEntry(specs, {0, 0, 1}, 8, 3);
  const fleet::v1::LogEntry proto = LogEntryToProto(entry);
  ASSERT_EQ(proto.matrices_size(), 3);
  EXPECT_EQ(proto.matrices(0).block_rule(), fleet::v1::BLOCK_RULE_CHUNK_ROWS);
  EXPECT_EQ(proto.matrices(1).block_rule(), fleet::v1::BLOCK_RULE_CHUNK_ROWS);
  EXPECT_EQ(proto.matrices(2).block_rule(), fleet::v1::BLOCK_RULE_CHUNK_COLS);
  for (const fleet::v1::PlannedMatrix& pm : proto.matrices()) EXPECT_EQ(pm.placements_size(), 0);
  ASSERT_EQ(proto.trainer_fleet_ranks_size(), 8);
  EXPECT_EQ(proto.trainer_fleet_ranks(7), 2);

  absl::StatusOr<LogEntry> back = LogEntryFromProto(proto);
  ASSERT_OK(back);
  ExpectSamePlacements(entry.plan, back->plan);
  EXPECT_EQ(back->submissions, entry.submissions);
  EXPECT_EQ(back->digests, entry.digests);
  EXPECT_EQ(LogEntryToProto(*back).SerializeAsString(), proto.SerializeAsString());
}

TEST(CompactPlacementsTest, AnEntryOfAThousandRanksIsKilobytesNotMegabytes) {
  std::vector<MatrixPlan> specs;
  for (int i = 0; i < 56; ++i) specs.push_back(Plan(absl::StrCat("layers.", i, ".w"), 8192, 8192));
  const LogEntry entry = ChunkedEntry(specs, std::vector<int>(specs.size(), 0), 1024, 64);
  const size_t bytes = LogEntryToProto(entry).ByteSizeLong();
  // 56 · 1024 explicit placements would be over 1 MB; by rule, the W fleet ranks once.
  EXPECT_LT(bytes, 16u << 10) << bytes;
  absl::StatusOr<LogEntry> back = LogEntryFromProto(LogEntryToProto(entry));
  ASSERT_OK(back);
  ExpectSamePlacements(entry.plan, back->plan);
}

TEST(CompactPlacementsTest, PlacementsThatDepartFromTheRuleInAnyWayAreSentExplicitly) {
  const std::vector<MatrixPlan> specs = {Plan("a", 8, 4), Plan("b", 8, 4), Plan("c", 8, 4), Plan("d", 8, 4),
                                         Plan("e", 8, 4)};
  LogEntry entry = ChunkedEntry(specs, {0, 0, 0, 0, 0}, 4, 2);
  // b: two ranks' blocks swapped (a tiling, not torch.chunk's order).
  std::swap(entry.plan.matrices[1].blocks[0].block, entry.plan.matrices[1].blocks[1].block);
  // c: rank 2 on another fleet rank than in the other matrices.
  entry.plan.matrices[2].blocks[2].fleet_rank = 0;
  // d: uneven rows (3, 1, 2, 2), still a tiling.
  entry.plan.matrices[3].blocks[0].block = Block{0, 0, 3, 4};
  entry.plan.matrices[3].blocks[1].block = Block{3, 0, 1, 4};
  entry.plan.matrices[3].blocks[2].block = Block{4, 0, 2, 4};
  // e: a block out of the matrix (ValidatePlan's to refuse; the codec carries it as it is).
  entry.plan.matrices[4].blocks[3].block = Block{6, 0, 9, 4};
  const fleet::v1::LogEntry proto = LogEntryToProto(entry);
  EXPECT_EQ(proto.matrices(0).block_rule(), fleet::v1::BLOCK_RULE_CHUNK_ROWS);
  for (int i = 1; i < 5; ++i) {
    EXPECT_EQ(proto.matrices(i).block_rule(), fleet::v1::BLOCK_RULE_EXPLICIT) << i;
    EXPECT_EQ(proto.matrices(i).placements_size(), 4) << i;
  }
  absl::StatusOr<LogEntry> back = LogEntryFromProto(proto);
  ASSERT_OK(back);
  ExpectSamePlacements(entry.plan, back->plan);
}

TEST(CompactPlacementsTest, ARuleWithoutItsFleetRanksOrAnUnknownRuleIsRefused) {
  const LogEntry entry = ChunkedEntry({Plan("a", 8, 4), Plan("b", 6, 6)}, {0, 1}, 4, 2);
  fleet::v1::LogEntry missing = LogEntryToProto(entry);
  missing.mutable_trainer_fleet_ranks()->RemoveLast();
  EXPECT_THAT(LogEntryFromProto(missing),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("matrix 0 (\"a\"): placed by rule, but the entry names 3 fleet ranks for 4")));
  fleet::v1::LogEntry unknown = LogEntryToProto(entry);
  unknown.mutable_matrices(1)->set_block_rule(static_cast<fleet::v1::BlockRule>(9));
  EXPECT_THAT(LogEntryFromProto(unknown),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("matrix 1 (\"b\"): unknown block rule 9")));
}

ReadyReport Report(const SharedSpecs& specs, int rank, int world) {
  ReadyReport report;
  report.key = GroupKey{"t", "j", "g", 3, "run"};
  report.trainer_rank = rank;
  report.trainer_world = world;
  std::vector<Block> blocks;
  for (const MatrixPlan& m : *specs) blocks.push_back(ChunkBlock(m.view, world, rank, 0));
  report.sent = SenderBlocks(specs, std::move(blocks));
  return report;
}

TEST(SpecListCacheTest, IdenticalListsAreDecodedOnceAndShared) {
  auto specs = std::make_shared<const SpecList>(SpecList{Plan("a", 8, 4), Plan("b", 6, 6)});
  auto other = std::make_shared<const SpecList>(SpecList{Plan("a", 8, 4), Plan("b", 6, 7)});
  SpecListCache cache;
  std::vector<ReadyReport> decoded;
  for (int r = 0; r < 4; ++r) {
    absl::StatusOr<ReadyReport> d = ReadyReportFromProto(ReadyReportToProto(Report(specs, r, 4)), &cache);
    ASSERT_OK(d);
    decoded.push_back(*std::move(d));
  }
  EXPECT_EQ(cache.decoded(), 1);
  for (int r = 1; r < 4; ++r) EXPECT_EQ(decoded[r].sent.specs, decoded[0].sent.specs) << r;
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(decoded[r].sent.blocks[1] == (Block{r < 3 ? 2 * r : 6, 0, r < 3 ? 2 : 0, 6}));

  // A list that differs in one dimension is its own.
  absl::StatusOr<ReadyReport> d = ReadyReportFromProto(ReadyReportToProto(Report(other, 0, 4)), &cache);
  ASSERT_OK(d);
  EXPECT_EQ(cache.decoded(), 2);
  EXPECT_NE(d->sent.specs, decoded[0].sent.specs);
  EXPECT_EQ(d->sent.spec(1).view.cols, 7);
}

TEST(SpecListCacheTest, HoldsItsCapacityOfListsUsedLast) {
  SpecListCache cache(2);
  std::vector<std::string> lists;
  for (int i = 0; i < 3; ++i) lists.push_back(SpecListToBytes(SpecList{Plan(absl::StrCat("m", i), 4, 4)}));
  ASSERT_OK(cache.Decode(lists[0]));
  ASSERT_OK(cache.Decode(lists[1]));
  ASSERT_OK(cache.Decode(lists[0]));  // 0 used last: 1 goes when 2 comes.
  ASSERT_OK(cache.Decode(lists[2]));
  EXPECT_EQ(cache.decoded(), 3);
  ASSERT_OK(cache.Decode(lists[0]));
  EXPECT_EQ(cache.decoded(), 3);
  absl::StatusOr<SharedSpecs> again = cache.Decode(lists[1]);
  ASSERT_OK(again);
  EXPECT_EQ(cache.decoded(), 4);
  EXPECT_EQ((**again)[0].name, "m1");
}

TEST(SpecListCacheTest, ACorruptListOrBlocksOfTheWrongCountAreRefused) {
  SpecListCache cache;
  EXPECT_THAT(cache.Decode(std::string("\xff\xff\xff", 3)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("spec list does not parse")));
  EXPECT_EQ(cache.decoded(), 0);
  auto specs = std::make_shared<const SpecList>(SpecList{Plan("a", 8, 4), Plan("b", 6, 6)});
  fleet::v1::ReadyReport proto = ReadyReportToProto(Report(specs, 0, 2));
  proto.mutable_blocks()->RemoveLast();
  EXPECT_THAT(ReadyReportFromProto(proto, &cache),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("carries 7 block numbers for 2 matrices")));
}

TEST(EncodedLogTest, EachEntryIsEncodedOnceForAllItsReaders) {
  auto entry = std::make_shared<const LogEntry>(ChunkedEntry({Plan("a", 64, 32), Plan("b", 6, 6)}, {0, 1}, 16, 4));
  const std::string expected = LogEntryToProto(*entry).SerializeAsString();
  EncodedLog log;
  constexpr int kReaders = 8;
  std::vector<EncodedLog::Bytes> got(kReaders);
  std::vector<std::thread> readers;
  for (int i = 0; i < kReaders; ++i) readers.emplace_back([&, i] { got[i] = log.Encoded(entry); });
  for (std::thread& t : readers) t.join();
  EXPECT_EQ(log.encodings(), 1);
  for (int i = 0; i < kReaders; ++i) {
    ASSERT_NE(got[i], nullptr);
    EXPECT_EQ(got[i], got[0]) << i;  // The same bytes, not a copy.
  }
  EXPECT_EQ(*got[0], expected);

  // Another entry has its own encoding, and one that every holder let go is forgotten: a new
  // entry (possibly at the freed address) is encoded anew, never answered with old bytes.
  for (int step = 0; step < 4; ++step) {
    auto next = std::make_shared<const LogEntry>(
        ChunkedEntry({Plan(absl::StrCat("n", step), 8 + step, 4)}, {0}, 2, 2));
    EXPECT_EQ(*log.Encoded(next), LogEntryToProto(*next).SerializeAsString()) << step;
  }
  EXPECT_EQ(log.encodings(), 5);
  EXPECT_EQ(*log.Encoded(entry), expected);
  EXPECT_EQ(log.encodings(), 5);
}

}  // namespace
}  // namespace orthoserve
