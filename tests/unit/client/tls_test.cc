// TLS and mutual TLS of the C++ client against the fake server, with the test certificates in
// tests/unit/client/testdata (see its README).
#include <fstream>
#include <sstream>
#include <string>

#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "grpcpp/security/server_credentials.h"
#include "gtest/gtest.h"
#include "tests/unit/client/fake_server.h"
#include "tests/util/status_matchers.h"

namespace orthoserve::client {
namespace {

using ::orthoserve::client::testing::FakeServer;
using ::orthoserve::testing::StatusIs;
using ::testing::HasSubstr;

std::string TestData(const std::string& name) { return std::string(ORTHOSERVE_CLIENT_TESTDATA) + "/" + name; }

std::string Slurp(const std::string& name) {
  std::ifstream in(TestData(name));
  std::ostringstream text;
  text << in.rdbuf();
  EXPECT_FALSE(text.str().empty()) << name;
  return text.str();
}

std::shared_ptr<grpc::ServerCredentials> ServerTls(bool require_client_cert) {
  grpc::SslServerCredentialsOptions options(require_client_cert
                                                ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                                : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_root_certs = Slurp("ca.pem");
  options.pem_key_cert_pairs.push_back({Slurp("server.key"), Slurp("server.pem")});
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<v1::ServerInfo> InfoOver(const FakeServer& server, ClientOptions options) {
  options.address = server.address;
  options.timeout = absl::Seconds(10);
  options.retry.enabled = false;  // Handshake failures are UNAVAILABLE, which would be retried.
  auto client = Client::Create(options);
  if (!client.ok()) return client.status();
  return (*client)->GetServerInfo();
}

TEST(ClientTls, ServerAuthenticatedByCa) {
  FakeServer server;
  server.Start(ServerTls(false));
  ClientOptions options;
  options.tls_ca_file = TestData("ca.pem");
  EXPECT_OK(InfoOver(server, options));
  options.tls_server_name = "localhost";  // Also in the certificate.
  EXPECT_OK(InfoOver(server, options));
  options.tls_server_name = "elsewhere.example";
  EXPECT_THAT(InfoOver(server, options), StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
  ClientOptions wrong_root;
  wrong_root.tls_ca_file = TestData("other_ca.pem");
  EXPECT_THAT(InfoOver(server, wrong_root), StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
  ClientOptions plaintext;  // A plaintext client cannot talk to a TLS server.
  EXPECT_THAT(InfoOver(server, plaintext), StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
}

TEST(ClientTls, MutualTlsNeedsTheClientCertificate) {
  FakeServer server;
  server.Start(ServerTls(true));
  ClientOptions options;
  options.tls_ca_file = TestData("ca.pem");
  options.tls_cert_file = TestData("client.pem");
  options.tls_key_file = TestData("client.key");
  options.bearer_token = "t";
  ASSERT_OK(InfoOver(server, options));
  {
    absl::MutexLock lock(&server.service->mu);
    EXPECT_EQ(server.service->last_authorization, "Bearer t");
  }
  ClientOptions no_cert;
  no_cert.tls_ca_file = TestData("ca.pem");
  EXPECT_THAT(InfoOver(server, no_cert), StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
}

TEST(ClientTls, MissingFilesAreNotFound) {
  ClientOptions options;
  options.tls_ca_file = TestData("no-such-ca.pem");
  EXPECT_THAT(Client::Create(options), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no-such-ca.pem")));
}

}  // namespace
}  // namespace orthoserve::client
