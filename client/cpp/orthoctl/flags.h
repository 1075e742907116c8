// A small per-subcommand flag parser for orthoctl: `--name value` or `--name=value`, booleans as
// `--name` (or `--name=true|false`), `-h`/`--help`, and a usage text listing every flag.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace orthoserve::orthoctl {

// Not thread-safe; the targets registered must outlive Parse.
class FlagSet {
 public:
  // Parses one flag's text into its target; INVALID_ARGUMENT says what is wrong with the value.
  using Setter = std::function<absl::Status(absl::string_view)>;

  // `usage_line` is shown first ("orthoctl info [flags]"), then `summary`.
  FlagSet(std::string usage_line, std::string summary);

  // A flag taking a value. `value_name` appears in the usage ("--steps N"); `help` should state
  // the default.
  void Add(const std::string& name, const std::string& value_name, const std::string& help, Setter set);
  void AddString(const std::string& name, const std::string& value_name, const std::string& help, std::string* target);
  void AddInt(const std::string& name, const std::string& value_name, const std::string& help, int* target);
  void AddDouble(const std::string& name, const std::string& value_name, const std::string& help, double* target);
  // A flag without a value; `--name=false` clears it.
  void AddBool(const std::string& name, const std::string& help, bool* target);

  // Parses `args` (without the program and subcommand names). INVALID_ARGUMENT naming the flag for
  // an unknown flag, a missing or bad value, a flag given twice, or a positional argument. Stops at
  // -h/--help, which sets help_requested().
  absl::Status Parse(const std::vector<std::string>& args);

  bool help_requested() const { return help_requested_; }
  // Whether `name` appeared in the last Parse.
  bool seen(const std::string& name) const;

  // The usage line, the summary and one line per flag (name, value, help).
  std::string Usage() const;

 private:
  struct Flag {
    std::string name;
    std::string value_name;  // Empty for booleans.
    std::string help;
    Setter set;
    bool seen = false;
  };
  Flag* Find(absl::string_view name);

  std::string usage_line_;
  std::string summary_;
  std::vector<Flag> flags_;
  bool help_requested_ = false;
};

}  // namespace orthoserve::orthoctl
