// When the certificates a rank serves with expire: orthoserve_certificate_expiry_timestamp_seconds,
// read from the PEM files at every scrape (so a rotated file shows its new date), for the alerts
// that page an operator before a certificate runs out (deploy/prometheus/orthoserve-rules.yaml).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace orthoserve {

// The notAfter of the first certificate in PEM file `path`. NOT_FOUND when the file cannot be
// read, INVALID_ARGUMENT when it holds no certificate that parses.
absl::StatusOr<absl::Time> CertificateNotAfter(const std::string& path);

// OK while no certificate of `files` ((label, PEM path) pairs) has expired at `now`;
// FAILED_PRECONDITION naming the first that has (its label, file and notAfter). A file that does
// not read is not this check's concern (OK): the metric leaves it out and logs it.
absl::Status CertificatesUnexpired(const std::vector<std::pair<std::string, std::string>>& files, absl::Time now);

// One gauge family, orthoserve_certificate_expiry_timestamp_seconds{certificate}: one sample per
// named file whose certificate reads (a file that does not read is left out, and its name logged
// once until it reads again). The family is there, without samples, when no file is named.
class CertificateExpiry final : public prometheus::Collectable {
 public:
  // (label value, PEM path) pairs, e.g. {"server", "/etc/orthoserve/tls/tls.crt"}.
  explicit CertificateExpiry(std::vector<std::pair<std::string, std::string>> files) : files_(std::move(files)) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  std::vector<std::pair<std::string, std::string>> files_;
  mutable absl::Mutex mu_;
  mutable absl::flat_hash_set<std::string> warned_ ABSL_GUARDED_BY(mu_);  // Names whose file did not read.
};

}  // namespace orthoserve
