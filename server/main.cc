// orthoserve: one server rank. Flags (with ORTHOSERVE_* environment fallbacks) become
// ServerOptions; SIGTERM or SIGINT drains gracefully. `orthoserve --help` lists the flags.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/malloc_tuning.h"
#include "server/app/flags.h"
#include "server/app/server.h"

namespace {

// SIGTERM/SIGINT write one byte here; a waiter thread turns it into a drain. A handler (rather
// than sigwait) is needed because libraries start threads before main that would otherwise
// receive the signal with its default action.
int g_signal_pipe[2] = {-1, -1};

// Teardown after the drain deadline: the fleet's graceful leave (up to 5 s) and closing
// connections.
constexpr absl::Duration kTeardownMargin = absl::Seconds(10);

void OnSignal(int signal) {
  const char byte = static_cast<char>(signal);
  [[maybe_unused]] ssize_t n = write(g_signal_pipe[1], &byte, 1);
}

// Flags are documented with dashes (--metrics-address); abseil names them with underscores.
std::vector<char*> NormalizeFlagNames(int argc, char** argv, std::vector<std::string>& storage) {
  storage.assign(argv, argv + argc);
  for (std::string& arg : storage) {
    if (arg.rfind("--", 0) != 0) continue;
    size_t end = arg.find('=');
    for (size_t i = 2; i < std::min(end, arg.size()); ++i) {
      if (arg[i] == '-') arg[i] = '_';
    }
  }
  std::vector<char*> out;
  for (std::string& arg : storage) out.push_back(arg.data());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  // --help lists the server's flags (defined in server/app/flags.cc, not in this file, which is
  // where abseil looks by default); --version prints the release.
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) { return absl::EndsWith(file, "server/app/flags.cc"); };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  usage.normalize_filename = [](absl::string_view file) {
    const size_t at = file.rfind("server/app/");
    return std::string(at == absl::string_view::npos ? file : file.substr(at));
  };
  usage.version_string = [] { return std::string("orthoserve " ORTHOSERVE_VERSION "\n"); };
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(
      "Muon's Newton-Schulz orthogonalization as a gRPC service (one fleet rank).\n"
      "Every flag can also be set through ORTHOSERVE_<FLAG> (upper case, '-' as '_'); the command line wins.\n"
      "Flags may be written with dashes or underscores (--metrics-address, --metrics_address).");
  if (absl::Status env = orthoserve::ApplyEnvironmentFallbacks(); !env.ok()) {
    std::cerr << "orthoserve: " << env.message() << "\n";
    return 2;
  }
  std::vector<std::string> storage;
  std::vector<char*> args = NormalizeFlagNames(argc, argv, storage);
  absl::ParseCommandLine(static_cast<int>(args.size()), args.data());

  absl::StatusOr<orthoserve::ServerOptions> options = orthoserve::ServerOptionsFromFlags();
  if (orthoserve::CheckConfigRequested()) {
    std::cout << orthoserve::DescribeFlags();
    if (!options.ok()) {
      std::cerr << "orthoserve: invalid configuration: " << options.status().message() << "\n";
      return 2;
    }
    for (const std::string& warning : orthoserve::ServerOptionsWarnings(*options)) {
      std::cout << "warning: " << warning << "\n";
    }
    std::cout << "configuration OK\n";
    return 0;
  }
  if (!options.ok()) {
    std::cerr << "orthoserve: " << options.status().message() << "\n";
    return 2;
  }
  orthoserve::SetLogRank(options->rank);
  // Before the server makes its first large allocation. (Not inside LOG_INFO's stream, which
  // is not evaluated below the info level.)
  const orthoserve::MallocTuning malloc_tuning = orthoserve::KeepFreedMemory();
  LOG_INFO("server") << malloc_tuning.description;

  if (pipe(g_signal_pipe) != 0) {
    std::perror("orthoserve: pipe");
    return 1;
  }
  struct sigaction action = {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);

  absl::StatusOr<std::unique_ptr<orthoserve::Server>> server = orthoserve::Server::Create(*options);
  if (!server.ok()) {
    std::cerr << "orthoserve: " << server.status().message() << "\n";
    return 1;
  }
  orthoserve::Server* raw = server->get();
  const absl::Duration drain_timeout = options->drain_timeout;
  std::thread waiter([raw, drain_timeout] {
    char received = 0;
    while (read(g_signal_pipe[0], &received, 1) < 0 && errno == EINTR) {
    }
    LOG_INFO("server") << "received signal " << static_cast<int>(received) << ", draining";
    // Every wait in the server is bounded, so the drain ends within --drain-timeout and a few
    // seconds of teardown; this is the backstop that guarantees it to the supervisor.
    std::thread([drain_timeout] {
      absl::SleepFor(drain_timeout + kTeardownMargin);
      LOG_ERROR("server") << "the drain did not finish within --drain-timeout + "
                          << absl::FormatDuration(kTeardownMargin) << "; exiting now";
      _exit(1);
    }).detach();
    raw->Drain();
  });
  waiter.detach();
  raw->Wait();
  server->reset();
  return 0;
}
