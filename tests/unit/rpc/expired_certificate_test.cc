// An expired serving certificate fails liveness as it fails readiness (docs/operations.md,
// "Health endpoints"): a Server on 127.0.0.1:0 whose --tls-cert has expired answers NOT_SERVING on
// its fleet port's health (the liveness probe), one whose certificate is valid SERVING.
// Certificates are made here with OpenSSL's API (the command line cannot date one in the past).
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/health.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "tests/unit/rpc/rpc_test_util.h"

namespace orthoserve::testing {
namespace {

// Writes a self-signed P-256 certificate (CN `name`) valid from `from` to `to` seconds from now,
// and its key, to `dir`/`name`.{crt,key}; false when OpenSSL fails.
bool WriteCertificate(const std::string& dir, const std::string& name, long from, long to) {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  X509* x = X509_new();
  bool ok = key != nullptr && x != nullptr;
  if (ok) {
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), from);
    X509_gmtime_adj(X509_getm_notAfter(x), to);
    X509_set_pubkey(x, key);
    X509_NAME* subject = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(name.c_str()), -1,
                               -1, 0);
    X509_set_issuer_name(x, subject);
    ok = X509_sign(x, key, EVP_sha256()) > 0;
  }
  if (ok) {
    FILE* crt = std::fopen(absl::StrCat(dir, "/", name, ".crt").c_str(), "w");
    FILE* pem = std::fopen(absl::StrCat(dir, "/", name, ".key").c_str(), "w");
    ok = crt != nullptr && pem != nullptr && PEM_write_X509(crt, x) == 1 &&
         PEM_write_PrivateKey(pem, key, nullptr, nullptr, 0, nullptr, nullptr) == 1;
    if (crt != nullptr) std::fclose(crt);
    if (pem != nullptr) std::fclose(pem);
  }
  X509_free(x);
  EVP_PKEY_free(key);
  return ok;
}

// The fleet port's "" health status, as the liveness probe asks it (plaintext here: no fleet TLS).
client::ServingStatus Liveness(const Server& server) {
  auto channel =
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", server.fleet_port()), grpc::InsecureChannelCredentials());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  absl::StatusOr<client::ServingStatus> status = client::CheckHealth(channel, &context, "");
  EXPECT_TRUE(status.ok()) << status.status();
  return status.ok() ? *status : client::ServingStatus::kUnknown;
}

TEST(ExpiredCertificateTest, LivenessFailsWhileTheServingCertificateHasExpired) {
  const std::string dir = ::testing::TempDir() + "/expired_certificate_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(WriteCertificate(dir, "expired", -2 * 86400, -86400));
  ASSERT_TRUE(WriteCertificate(dir, "valid", -60, 86400));
  for (const char* name : {"expired", "valid"}) {
    ServerOptions options = TestServerOptions();
    options.fleet_listen = "127.0.0.1:0";
    options.tls_cert = absl::StrCat(dir, "/", name, ".crt");
    options.tls_key = absl::StrCat(dir, "/", name, ".key");
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(options);
    ASSERT_OK(server);
    ASSERT_GT((*server)->fleet_port(), 0);
    const client::ServingStatus want =
        std::string(name) == "expired" ? client::ServingStatus::kNotServing : client::ServingStatus::kServing;
    // The first look at the files comes with the health watcher's first round (every 200 ms).
    client::ServingStatus got = Liveness(**server);
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (got != want && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(100));
      got = Liveness(**server);
    }
    EXPECT_EQ(client::ServingStatusName(got), client::ServingStatusName(want)) << name;
    // And it stays so (a valid certificate never turns it).
    absl::SleepFor(absl::Milliseconds(500));
    EXPECT_EQ(client::ServingStatusName(Liveness(**server)), client::ServingStatusName(want)) << name;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace orthoserve::testing
