// orthoserve_certificate_expiry_timestamp_seconds (server/metrics/certificate_expiry.h): the
// notAfter of a certificate file, against openssl's own reading of the same file; files that do
// not read are left out; and the family is exported even without certificates.
#include "server/metrics/certificate_expiry.h"

#include <fstream>
#include <string>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/metrics/metrics.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using ::orthoserve::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// tests/unit/client/testdata/server.pem: `openssl x509 -noout -enddate` says
// "notAfter=Nov  5 15:15:40 2126 GMT", which `date -d ... +%s` makes 4949565340.
constexpr int64_t kTestServerNotAfter = 4949565340;

std::string TestData(const std::string& name) { return std::string(ORTHOSERVE_SOURCE_DIR) + "/tests/unit/client/testdata/" + name; }

TEST(CertificateExpiryTest, TheNotAfterOfTheFirstCertificateInTheFile) {
  absl::StatusOr<absl::Time> not_after = CertificateNotAfter(TestData("server.pem"));
  ASSERT_OK(not_after);
  EXPECT_EQ(absl::ToUnixSeconds(*not_after), kTestServerNotAfter);
  EXPECT_THAT(CertificateNotAfter(TestData("nothing-here.pem")), StatusIs(absl::StatusCode::kNotFound, HasSubstr("cannot be read")));
  const std::string junk = ::testing::TempDir() + "/junk.pem";
  std::ofstream(junk) << "-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n";
  EXPECT_THAT(CertificateNotAfter(junk), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no PEM certificate")));
  EXPECT_THAT(CertificateNotAfter(TestData("server.key")), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
}

TEST(CertificateExpiryTest, OneSamplePerReadableFileNamedByItsRole) {
  CertificateExpiry expiry({{"server", TestData("server.pem")}, {"fleet", TestData("gone.pem")}, {"client_ca", TestData("ca.pem")}});
  const std::vector<prometheus::MetricFamily> families = expiry.Collect();
  ASSERT_EQ(families.size(), 1u);
  EXPECT_EQ(families[0].name, "orthoserve_certificate_expiry_timestamp_seconds");
  ASSERT_EQ(families[0].metric.size(), 2u);  // "fleet" does not read.
  EXPECT_EQ(families[0].metric[0].label[0].value, "server");
  EXPECT_EQ(families[0].metric[0].gauge.value, static_cast<double>(kTestServerNotAfter));
  EXPECT_EQ(families[0].metric[1].label[0].value, "client_ca");
}

TEST(CertificateExpiryTest, TheLivenessCheckFailsOnceACertificateHasExpired) {
  const std::vector<std::pair<std::string, std::string>> files = {{"fleet", TestData("gone.pem")},
                                                                  {"server", TestData("server.pem")}};
  const absl::Time not_after = absl::FromUnixSeconds(kTestServerNotAfter);
  EXPECT_OK(CertificatesUnexpired(files, not_after - absl::Seconds(1)));
  // A file that does not read ("fleet") is the metric's concern, not liveness's.
  EXPECT_THAT(CertificatesUnexpired(files, not_after),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("the server certificate"), HasSubstr("server.pem"),
                             HasSubstr("expired at 2126-11-05T15:15:40"))));
  EXPECT_OK(CertificatesUnexpired({}, not_after));
}

TEST(CertificateExpiryTest, TheFamilyIsExportedWithoutCertificates) {
  Metrics::Options options;
  options.process_metrics = false;
  auto metrics = Metrics::Create(options);
  ASSERT_OK(metrics);
  bool found = false;
  for (const prometheus::MetricFamily& f : (*metrics)->Collect()) {
    if (f.name == "orthoserve_certificate_expiry_timestamp_seconds") {
      found = true;
      EXPECT_TRUE(f.metric.empty());
    }
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace orthoserve
