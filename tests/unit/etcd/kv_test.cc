// EtcdClient's keys and transactions against a real etcd, and its options and failures.
#include <string>

#include "absl/time/clock.h"
#include "etcd/etcdserverpb/rpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/etcd/etcd_fixture.h"
#include "tests/util/status_matchers.h"

namespace orthoserve::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::HasSubstr;

TEST(PrefixRangeEndTest, IncrementsTheLastByteAndDropsTrailingFF) {
  EXPECT_EQ(etcd::PrefixRangeEnd("a/"), "a0");
  EXPECT_EQ(etcd::PrefixRangeEnd(std::string("a\xff", 2)), "b");
  EXPECT_EQ(etcd::PrefixRangeEnd(""), std::string(1, '\0'));
  EXPECT_EQ(etcd::PrefixRangeEnd(std::string("\xff\xff", 2)), std::string(1, '\0'));
}

TEST(EtcdOptionsTest, RejectsBadOptionsNamingTheField) {
  etcd::EtcdOptions options;
  options.endpoints = " , ";
  EXPECT_THAT(etcd::EtcdClient::Create(options), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("endpoints")));
  options.endpoints = "127.0.0.1";
  EXPECT_THAT(etcd::EtcdClient::Create(options), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("host:port")));
  options.endpoints = "127.0.0.1:2379";
  options.call_timeout = absl::ZeroDuration();
  EXPECT_THAT(etcd::EtcdClient::Create(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("call_timeout")));
  options.call_timeout = absl::Seconds(1);
  options.tls_cert_file = "/nonexistent/cert.pem";
  EXPECT_THAT(etcd::EtcdClient::Create(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tls_key_file")));
  options.tls_cert_file.clear();
  options.tls_ca_file = "/nonexistent/ca.pem";
  EXPECT_THAT(etcd::EtcdClient::Create(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("/nonexistent/ca.pem")));
}

TEST(EtcdUnreachableTest, UnavailableWithinTheDialTimeout) {
  absl::StatusOr<int> port1 = PickFreePort();
  absl::StatusOr<int> port2 = PickFreePort();
  ASSERT_OK(port1);
  ASSERT_OK(port2);
  etcd::EtcdOptions options;
  options.endpoints = absl::StrCat("127.0.0.1:", *port1, ",127.0.0.1:", *port2);
  options.dial_timeout = absl::Milliseconds(500);
  options.call_timeout = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> client = etcd::EtcdClient::Create(options);
  ASSERT_OK(client);
  const absl::Time start = absl::Now();
  EXPECT_THAT((*client)->Get("k"),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr(absl::StrCat("127.0.0.1:", *port2))));
  // One dial timeout per endpoint, not the call timeout.
  EXPECT_LT(absl::Now() - start, 2 * options.dial_timeout + absl::Milliseconds(500));
  EXPECT_THAT((*client)->GrantLease(absl::Seconds(5)), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("")));
}

using EtcdKvTest = EtcdTest;

TEST_F(EtcdKvTest, PutGetPrefixDelete) {
  EXPECT_THAT(client_->Get("/a/1"), IsOkAndHolds(::testing::Eq(std::nullopt)));
  absl::StatusOr<int64_t> rev1 = client_->Put("/a/1", "one");
  ASSERT_OK(rev1);
  ASSERT_OK(client_->Put("/a/2", "two"));
  ASSERT_OK(client_->Put("/b/1", "other"));

  absl::StatusOr<std::optional<etcd::KeyValue>> got = client_->Get("/a/1");
  ASSERT_OK(got);
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->value, "one");
  EXPECT_EQ((*got)->mod_revision, *rev1);
  EXPECT_EQ((*got)->create_revision, *rev1);
  EXPECT_EQ((*got)->version, 1);

  absl::StatusOr<etcd::RangeResult> prefix = client_->GetPrefix("/a/");
  ASSERT_OK(prefix);
  EXPECT_THAT(prefix->kvs, ElementsAre(Field(&etcd::KeyValue::key, "/a/1"), Field(&etcd::KeyValue::key, "/a/2")));
  EXPECT_GE(prefix->revision, *rev1 + 2);

  EXPECT_THAT(client_->Delete("/a/1"), IsOkAndHolds(1));
  EXPECT_THAT(client_->Delete("/a/1"), IsOkAndHolds(0));
  EXPECT_THAT(client_->DeletePrefix("/a/"), IsOkAndHolds(1));
  prefix = client_->GetPrefix("/a/");
  ASSERT_OK(prefix);
  EXPECT_TRUE(prefix->kvs.empty());
  EXPECT_THAT(client_->Get("/b/1"), IsOkAndHolds(::testing::Optional(Field(&etcd::KeyValue::value, "other"))));
}

TEST_F(EtcdKvTest, CreateIfAbsentRefusesTheSecondCreator) {
  absl::StatusOr<etcd::TxnResult> first = client_->CreateIfAbsent("/lock", "first");
  ASSERT_OK(first);
  EXPECT_TRUE(first->succeeded);
  EXPECT_FALSE(first->current.has_value());

  std::unique_ptr<etcd::EtcdClient> other = NewClient();
  absl::StatusOr<etcd::TxnResult> second = other->CreateIfAbsent("/lock", "second");
  ASSERT_OK(second);
  EXPECT_FALSE(second->succeeded);
  ASSERT_TRUE(second->current.has_value());
  EXPECT_EQ(second->current->value, "first");
  EXPECT_EQ(second->current->create_revision, first->revision);
}

TEST_F(EtcdKvTest, PutIfModRevisionIsACompareAndSwap) {
  absl::StatusOr<int64_t> rev = client_->Put("/cas", "v1");
  ASSERT_OK(rev);
  absl::StatusOr<etcd::TxnResult> stale = client_->PutIfModRevision("/cas", "x", *rev - 1);
  ASSERT_OK(stale);
  EXPECT_FALSE(stale->succeeded);
  ASSERT_TRUE(stale->current.has_value());
  EXPECT_EQ(stale->current->mod_revision, *rev);

  absl::StatusOr<etcd::TxnResult> swapped = client_->PutIfModRevision("/cas", "v2", *rev);
  ASSERT_OK(swapped);
  EXPECT_TRUE(swapped->succeeded);
  EXPECT_GT(swapped->revision, *rev);
  // The revision it swapped from is gone: a second writer holding it loses.
  absl::StatusOr<etcd::TxnResult> again = client_->PutIfModRevision("/cas", "v3", *rev);
  ASSERT_OK(again);
  EXPECT_FALSE(again->succeeded);
  EXPECT_THAT(client_->Get("/cas"), IsOkAndHolds(::testing::Optional(Field(&etcd::KeyValue::value, "v2"))));
}

TEST_F(EtcdKvTest, PutWithAnUnknownLeaseIsNotFound) {
  EXPECT_THAT(client_->Put("/k", "v", /*lease=*/12345), StatusIs(absl::StatusCode::kNotFound, HasSubstr("lease")));
  EXPECT_THAT(client_->RevokeLease(12345), StatusIs(absl::StatusCode::kNotFound, HasSubstr("lease")));
}

}  // namespace
}  // namespace orthoserve::testing
