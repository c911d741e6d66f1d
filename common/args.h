// A small command-line parser for the server and the CLI: `--name=value`, `--name value`,
// `--flag` / `--no-flag` for booleans, `--help`; everything else is positional. In the
// `--name value` form a value may not start with `--` (that is the next option, the value
// forgotten): such a value is given as `--name=value`. Each option has a help line, and `help()`
// renders them as the usage text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace qlinear {

class ArgParser {
 public:
  ArgParser(std::string usage, std::string description)
      : usage_(std::move(usage)), description_(std::move(description)) {}

  void add(const std::string& name, std::string* value, const std::string& help);
  void add(const std::string& name, int64_t* value, const std::string& help);
  void add(const std::string& name, double* value, const std::string& help);
  void add(const std::string& name, bool* value, const std::string& help);
  // An action flag (`--version`): `--name` sets *value; it takes no value and has no `--no-` form.
  void add_action(const std::string& name, bool* value, const std::string& help);

  // Parses argv[first..argc). Unknown options and bad values are INVALID_ARGUMENT with a message
  // for the user. Sets help_requested() on --help / -h.
  absl::Status parse(int argc, char** argv, int first = 1);
  bool help_requested() const { return help_; }
  const std::vector<std::string>& positional() const { return positional_; }
  std::string help() const;

 private:
  enum class Kind { kString, kInt, kDouble, kBool, kAction };
  struct Option {
    std::string name;
    Kind kind;
    void* value;
    std::string help;
    std::string default_text;
  };
  Option* find(const std::string& name);

  std::string usage_;
  std::string description_;
  std::vector<Option> options_;
  std::vector<std::string> positional_;
  bool help_ = false;
};

}  // namespace qlinear
