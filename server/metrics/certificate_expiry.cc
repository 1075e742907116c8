// Implementation of server/metrics/certificate_expiry.h.
#include "server/metrics/certificate_expiry.h"

#include <openssl/asn1.h>
#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <ctime>
#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace orthoserve {

absl::StatusOr<absl::Time> CertificateNotAfter(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, " cannot be read"));
  std::stringstream text;
  text << in.rdbuf();
  const std::string pem = text.str();
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), &BIO_free);
  if (bio == nullptr) return absl::InternalError("BIO_new_mem_buf failed");
  std::unique_ptr<X509, decltype(&X509_free)> cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr),
                                                   &X509_free);
  if (cert == nullptr) return absl::InvalidArgumentError(absl::StrCat(path, " holds no PEM certificate that parses"));
  std::tm tm = {};
  if (ASN1_TIME_to_tm(X509_get0_notAfter(cert.get()), &tm) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": the certificate's notAfter does not parse"));
  }
  return absl::FromUnixSeconds(static_cast<int64_t>(timegm(&tm)));
}

absl::Status CertificatesUnexpired(const std::vector<std::pair<std::string, std::string>>& files, absl::Time now) {
  for (const auto& [label, path] : files) {
    const absl::StatusOr<absl::Time> not_after = CertificateNotAfter(path);
    if (not_after.ok() && *not_after <= now) {
      return absl::FailedPreconditionError(absl::StrCat("the ", label, " certificate ", path, " expired at ",
                                                        absl::FormatTime(*not_after, absl::UTCTimeZone()),
                                                        ": new TLS connections fail until it is renewed"));
    }
  }
  return absl::OkStatus();
}

std::vector<prometheus::MetricFamily> CertificateExpiry::Collect() const {
  prometheus::MetricFamily family;
  family.name = "orthoserve_certificate_expiry_timestamp_seconds";
  family.help =
      "When each certificate this rank serves with expires (its notAfter, Unix seconds), read from its file at every "
      "scrape; certificate: server (--tls-cert), client_ca (--tls-client-ca), fleet (--fleet-tls-cert), fleet_ca "
      "(--fleet-tls-ca).";
  family.type = prometheus::MetricType::Gauge;
  for (const auto& [name, path] : files_) {
    absl::StatusOr<absl::Time> not_after = CertificateNotAfter(path);
    {
      absl::MutexLock lock(&mu_);
      if (!not_after.ok()) {
        if (warned_.insert(name).second) {
          LOG_WARNING("metrics") << "the " << name << " certificate's expiry is not reported: " << not_after.status();
        }
        continue;
      }
      warned_.erase(name);
    }
    prometheus::ClientMetric sample;
    sample.label.push_back(prometheus::ClientMetric::Label{"certificate", name});
    sample.gauge.value = static_cast<double>(absl::ToUnixSeconds(*not_after));
    family.metric.push_back(std::move(sample));
  }
  return {std::move(family)};
}

}  // namespace orthoserve
