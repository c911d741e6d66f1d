#include "common/args.h"

#include <cerrno>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace qlinear {

void ArgParser::add(const std::string& name, std::string* value, const std::string& help) {
  options_.push_back({name, Kind::kString, value, help, value->empty() ? "" : *value});
}
void ArgParser::add(const std::string& name, int64_t* value, const std::string& help) {
  options_.push_back({name, Kind::kInt, value, help, absl::StrCat(*value)});
}
void ArgParser::add(const std::string& name, double* value, const std::string& help) {
  options_.push_back({name, Kind::kDouble, value, help, absl::StrCat(*value)});
}
void ArgParser::add(const std::string& name, bool* value, const std::string& help) {
  options_.push_back({name, Kind::kBool, value, help, *value ? "true" : "false"});
}

void ArgParser::add_action(const std::string& name, bool* value, const std::string& help) {
  options_.push_back({name, Kind::kAction, value, help, ""});
}

ArgParser::Option* ArgParser::find(const std::string& name) {
  for (Option& o : options_) {
    if (o.name == name) return &o;
  }
  return nullptr;
}

absl::Status ArgParser::parse(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      help_ = true;
      continue;
    }
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) {
      positional_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    Option* opt = find(name);
    bool negated = false;
    if (opt == nullptr && name.compare(0, 3, "no-") == 0) {
      opt = find(name.substr(3));
      negated = opt != nullptr && opt->kind == Kind::kBool;
      if (!negated) opt = nullptr;
    }
    if (opt == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown option --", name, " (see --help)"));
    }
    if (opt->kind == Kind::kAction) {
      if (has_value) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      }
      *static_cast<bool*>(opt->value) = true;
      continue;
    }
    if (opt->kind == Kind::kBool) {
      bool v = !negated;
      if (has_value) {
        if (value == "true" || value == "1") {
          v = !negated;
        } else if (value == "false" || value == "0") {
          v = negated;
        } else {
          return absl::InvalidArgumentError(
              absl::StrCat("--", name, " takes true or false, got '", value, "'"));
        }
      }
      *static_cast<bool*>(opt->value) = v;
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argc)
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      // A forgotten value must not take the next option for it (`--layer-manifest
      // --no-demo-layer` read a manifest named "--no-demo-layer"); --name=VALUE still gives one.
      if (absl::StartsWith(argv[i + 1], "--")) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, " needs a value, not the option '", argv[i + 1],
                         "' (a value that starts with -- is given as --", name, "=VALUE)"));
      }
      value = argv[++i];
    }
    switch (opt->kind) {
      case Kind::kString:
        *static_cast<std::string*>(opt->value) = value;
        break;
      case Kind::kInt:
        if (!absl::SimpleAtoi(value, static_cast<int64_t*>(opt->value))) {
          return absl::InvalidArgumentError(
              absl::StrCat("--", name, " takes an integer, got '", value, "'"));
        }
        break;
      case Kind::kDouble:
        if (!absl::SimpleAtod(value, static_cast<double*>(opt->value))) {
          return absl::InvalidArgumentError(
              absl::StrCat("--", name, " takes a number, got '", value, "'"));
        }
        break;
      case Kind::kBool:
      case Kind::kAction:
        break;
    }
  }
  return absl::OkStatus();
}

std::string ArgParser::help() const {
  std::string out = absl::StrCat("Usage: ", usage_, "\n\n", description_, "\n");
  if (!options_.empty()) out += "\nOptions:\n";
  for (const Option& o : options_) {
    std::string left = absl::StrCat("  --", o.name);
    if (o.kind == Kind::kBool) {
      left += " | --no-" + o.name;
    } else if (o.kind != Kind::kAction) {
      left += o.kind == Kind::kString ? "=STR" : o.kind == Kind::kInt ? "=INT" : "=NUM";
    }
    if (left.size() < 30)
      left.resize(30, ' ');
    else
      left += "  ";
    out += left + o.help;
    if (!o.default_text.empty()) out += absl::StrCat(" (default: ", o.default_text, ")");
    out += "\n";
  }
  out += "  --help" + std::string(22, ' ') + "Show this help\n";
  return out;
}

}  // namespace qlinear
