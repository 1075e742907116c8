// EtcdClient over mutual TLS: an etcd member that requires client certificates (the test
// certificates of tests/unit/client/testdata) serves a client with the right files and refuses
// one without a certificate or trusting another CA.
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/etcd/etcd_fixture.h"
#include "tests/util/status_matchers.h"

namespace orthoserve::testing {
namespace {

using ::testing::HasSubstr;

std::string TestData(const std::string& name) { return std::string(ORTHOSERVE_CLIENT_TESTDATA) + "/" + name; }

TEST(EtcdTlsTest, MutualTlsServesTheRightClientOnly) {
  EtcdTlsFiles files;
  files.ca_file = TestData("ca.pem");
  files.server_cert_file = TestData("server.pem");
  files.server_key_file = TestData("server.key");
  files.client_cert_file = TestData("client.pem");
  files.client_key_file = TestData("client.key");
  absl::StatusOr<std::unique_ptr<EtcdCluster>> cluster = EtcdCluster::Start(1, &files);
  ASSERT_OK(cluster);

  etcd::EtcdOptions options;
  options.endpoints = (*cluster)->endpoints();
  options.dial_timeout = absl::Seconds(1);
  options.call_timeout = absl::Seconds(3);
  options.tls_ca_file = files.ca_file;
  options.tls_cert_file = files.client_cert_file;
  options.tls_key_file = files.client_key_file;
  absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> client = etcd::EtcdClient::Create(options);
  ASSERT_OK(client);
  ASSERT_OK((*client)->Put("/tls", "yes"));
  EXPECT_THAT((*client)->Get("/tls"),
              IsOkAndHolds(::testing::Optional(::testing::Field(&etcd::KeyValue::value, "yes"))));

  // TLS without a client certificate: etcd refuses the handshake.
  etcd::EtcdOptions no_cert = options;
  no_cert.tls_cert_file.clear();
  no_cert.tls_key_file.clear();
  absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> anonymous = etcd::EtcdClient::Create(no_cert);
  ASSERT_OK(anonymous);
  EXPECT_THAT((*anonymous)->Get("/tls"), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("")));

  // A client that trusts another CA does not accept etcd's certificate.
  etcd::EtcdOptions other_ca = options;
  other_ca.tls_ca_file = TestData("other_ca.pem");
  absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> wary = etcd::EtcdClient::Create(other_ca);
  ASSERT_OK(wary);
  EXPECT_THAT((*wary)->Get("/tls"), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("")));
}

}  // namespace
}  // namespace orthoserve::testing
