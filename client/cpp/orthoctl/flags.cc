// Implementation of client/cpp/orthoctl/flags.h.
#include "client/cpp/orthoctl/flags.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace orthoserve::orthoctl {

FlagSet::FlagSet(std::string usage_line, std::string summary)
    : usage_line_(std::move(usage_line)), summary_(std::move(summary)) {}

void FlagSet::Add(const std::string& name, const std::string& value_name, const std::string& help, Setter set) {
  flags_.push_back(Flag{name, value_name, help, std::move(set)});
}

void FlagSet::AddString(const std::string& name, const std::string& value_name, const std::string& help,
                        std::string* target) {
  Add(name, value_name, help, [target](absl::string_view v) {
    *target = std::string(v);
    return absl::OkStatus();
  });
}

void FlagSet::AddInt(const std::string& name, const std::string& value_name, const std::string& help, int* target) {
  Add(name, value_name, help, [target, name](absl::string_view v) {
    if (!absl::SimpleAtoi(v, target)) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " expects an integer, got \"", v, "\""));
    }
    return absl::OkStatus();
  });
}

void FlagSet::AddDouble(const std::string& name, const std::string& value_name, const std::string& help,
                        double* target) {
  Add(name, value_name, help, [target, name](absl::string_view v) {
    if (!absl::SimpleAtod(v, target)) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " expects a number, got \"", v, "\""));
    }
    return absl::OkStatus();
  });
}

void FlagSet::AddBool(const std::string& name, const std::string& help, bool* target) {
  Add(name, "", help, [target, name](absl::string_view v) {
    if (!absl::SimpleAtob(v, target)) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " expects true or false, got \"", v, "\""));
    }
    return absl::OkStatus();
  });
}

FlagSet::Flag* FlagSet::Find(absl::string_view name) {
  for (Flag& f : flags_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

bool FlagSet::seen(const std::string& name) const {
  for (const Flag& f : flags_) {
    if (f.name == name) return f.seen;
  }
  return false;
}

absl::Status FlagSet::Parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    absl::string_view arg = args[i];
    if (arg == "-h" || arg == "--help") {
      help_requested_ = true;
      return absl::OkStatus();
    }
    if (!absl::StartsWith(arg, "--") || arg.size() == 2) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument \"", arg, "\"; flags start with --"));
    }
    arg.remove_prefix(2);
    absl::string_view name = arg;
    absl::string_view value;
    const bool inline_value = absl::StrContains(arg, '=');
    if (inline_value) {
      std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(arg, absl::MaxSplits('=', 1));
      name = kv.first;
      value = kv.second;
    }
    Flag* flag = Find(name);
    if (flag == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, "; see --help"));
    if (flag->seen) return absl::InvalidArgumentError(absl::StrCat("flag --", name, " is given twice"));
    flag->seen = true;
    if (!inline_value) {
      if (flag->value_name.empty()) {
        value = "true";
      } else if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value (", flag->value_name, ")"));
      } else {
        value = args[++i];
      }
    }
    absl::Status set = flag->set(value);
    if (!set.ok()) {
      if (absl::StrContains(set.message(), absl::StrCat("--", name))) return set;
      return absl::InvalidArgumentError(absl::StrCat("--", name, ": ", set.message()));
    }
  }
  return absl::OkStatus();
}

std::string FlagSet::Usage() const {
  std::string out = absl::StrCat("usage: ", usage_line_, "\n\n", summary_, "\n\nflags:\n");
  size_t width = 0;
  std::vector<std::string> heads;
  for (const Flag& f : flags_) {
    heads.push_back(absl::StrCat("  --", f.name, f.value_name.empty() ? "" : " ", f.value_name));
    width = std::max(width, heads.back().size());
  }
  for (size_t i = 0; i < flags_.size(); ++i) {
    absl::StrAppend(&out, heads[i], std::string(width + 2 - heads[i].size(), ' '), flags_[i].help, "\n");
  }
  absl::StrAppend(&out, "  -h, --help", std::string(width + 2 > 12 ? width + 2 - 12 : 2, ' '), "show this help\n");
  return out;
}

}  // namespace orthoserve::orthoctl
