// The orthoserve binary's flags: definitions, ORTHOSERVE_* environment fallbacks and the
// mapping to ServerOptions. `orthoserve --help` lists every flag; README.md documents them.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "server/app/server.h"

namespace orthoserve {

// Applies ORTHOSERVE_<FLAG> environment variables (upper case, '-' as '_') to flags that the
// command line does not set; call before absl::ParseCommandLine. INVALID_ARGUMENT naming the
// variable when a value does not parse.
absl::Status ApplyEnvironmentFallbacks();

// Builds and validates ServerOptions from the parsed flags (everything but binding addresses
// and starting the backend). INVALID_ARGUMENT naming the flag.
absl::StatusOr<ServerOptions> ServerOptionsFromFlags();

// Whether --check-config was given.
bool CheckConfigRequested();

// The effective configuration, one "flag = value" per line.
std::string DescribeFlags();

}  // namespace orthoserve
