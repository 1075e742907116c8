// What fleet integration tests read from a running rank: whether its GetServerInfo says the fleet
// is whole, and a series of orthoserve_integrity_refusals_total from its /metrics.
#pragma once

#include <cstdlib>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
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

// orthoserve_integrity_refusals_total{cause="<cause>"} at the /metrics on 127.0.0.1:`port` (-1:
// not scraped).
inline double IntegrityRefusals(int port, absl::string_view cause) {
  const std::string scrape = HttpExchange(port, "GET /metrics HTTP/1.1");
  const std::string series = absl::StrCat("orthoserve_integrity_refusals_total{cause=\"", cause, "\"} ");
  const size_t at = scrape.find(series);
  return at == std::string::npos ? -1 : std::atof(scrape.c_str() + at + series.size());
}

}  // namespace orthoserve::testing
