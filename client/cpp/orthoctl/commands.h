// orthoctl's subcommands. Each takes its arguments (after the subcommand name), writes results to
// `out` and diagnostics to `err`, and returns the process exit code below.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace orthoserve::orthoctl {

inline constexpr int kExitOk = 0;
inline constexpr int kExitUsage = 1;  // Bad flags or flag values (nothing was sent).
inline constexpr int kExitRpc = 2;    // The server failed the call, a matrix, or is not serving.
inline constexpr int kExitIo = 3;     // A file could not be read, parsed or written.

int RunInfo(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
int RunHealth(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
int RunOrthogonalize(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
int RunBench(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// The top-level help: subcommands and the exit codes.
std::string MainUsage();

}  // namespace orthoserve::orthoctl
