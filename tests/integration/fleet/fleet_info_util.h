// What fleet integration tests read from running ranks: whether GetServerInfo says the fleet is
// whole (and a wait until every rank's does), and a series of orthoserve_integrity_refusals_total
// from a rank's /metrics.
#pragma once

#include <cstdlib>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "orthoserve/v1/orthogonalizer.pb.h"
#include "tests/util/http_get.h"

namespace orthoserve::testing {

// Whether `info` answered, is ready, and lists all `world` members ready.
inline bool WholeFleet(const absl::StatusOr<v1::ServerInfo>& info, int world) {
  if (!info.ok() || !info->ready()) return false;
  int ready = 0;
  for (const v1::FleetMember& m : info->members()) ready += m.ready() ? 1 : 0;
  return ready == world;
}

// Waits until `info(r)` is WholeFleet for every rank r of `world`; false after `timeout`.
inline bool WaitWholeFleet(const std::function<absl::StatusOr<v1::ServerInfo>(int)>& info, int world,
                           absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    bool whole = true;
    for (int r = 0; r < world && whole; ++r) whole = WholeFleet(info(r), world);
    if (whole) return true;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return false;
}

// orthoserve_integrity_refusals_total{cause="<cause>"} at the /metrics on 127.0.0.1:`port` (-1:
// not scraped).
inline double IntegrityRefusals(int port, absl::string_view cause) {
  const std::string scrape = HttpExchange(port, "GET /metrics HTTP/1.1");
  const std::string series = absl::StrCat("orthoserve_integrity_refusals_total{cause=\"", cause, "\"} ");
  const size_t at = scrape.find(series);
  return at == std::string::npos ? -1 : std::atof(scrape.c_str() + at + series.size());
}

}  // namespace orthoserve::testing
