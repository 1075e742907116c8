// orthoctl: the command-line client of orthoserve (info, health, orthogonalize, bench).
#include <iostream>
#include <string>
#include <vector>

#include "client/cpp/orthoctl/commands.h"

int main(int argc, char** argv) {
  using namespace orthoserve::orthoctl;  // NOLINT(build/namespaces)
  if (argc < 2) {
    std::cerr << MainUsage();
    return kExitUsage;
  }
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "-h" || command == "--help" || command == "help") {
    std::cout << MainUsage();
    return kExitOk;
  }
  if (command == "info") return RunInfo(args, std::cout, std::cerr);
  if (command == "health") return RunHealth(args, std::cout, std::cerr);
  if (command == "orthogonalize") return RunOrthogonalize(args, std::cout, std::cerr);
  if (command == "bench") return RunBench(args, std::cout, std::cerr);
  std::cerr << "orthoctl: unknown subcommand \"" << command << "\"\n\n" << MainUsage();
  return kExitUsage;
}
