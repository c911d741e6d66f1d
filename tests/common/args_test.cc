// The command-line parser of the server and the CLI: values in both spellings (one that starts
// with -- only as --name=value), booleans and their --no- forms, action flags (--version), --help,
// positionals, and the errors, with their messages.
#include "common/args.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"

namespace qlinear {
namespace {

struct Argv {
  explicit Argv(std::vector<std::string> a) : args(std::move(a)) {
    for (std::string& s : args) ptrs.push_back(s.data());
  }
  int argc() const { return static_cast<int>(ptrs.size()); }
  char** argv() { return ptrs.data(); }
  std::vector<std::string> args;
  std::vector<char*> ptrs;
};

struct Parsed {
  std::string name = "x";
  int64_t count = 3;
  double scale = 0.5;
  bool flag = true;
  bool version = false;
};

absl::Status parse(std::vector<std::string> args, Parsed* p, ArgParser* parser) {
  parser->add("name", &p->name, "A name");
  parser->add("count", &p->count, "A count");
  parser->add("scale", &p->scale, "A scale");
  parser->add("flag", &p->flag, "A flag");
  parser->add_action("version", &p->version, "Print the version and exit");
  args.insert(args.begin(), "prog");
  Argv a(std::move(args));
  return parser->parse(a.argc(), a.argv());
}

TEST(ArgParserTest, ParsesValuesBooleansActionsAndPositionals) {
  Parsed p;
  ArgParser parser("prog [options]", "A program.");
  ASSERT_TRUE(parse({"--name=y", "--count", "7", "--scale=2.5", "--no-flag", "--version", "pos"},
                    &p, &parser)
                  .ok());
  EXPECT_EQ(p.name, "y");
  EXPECT_EQ(p.count, 7);
  EXPECT_EQ(p.scale, 2.5);
  EXPECT_FALSE(p.flag);
  EXPECT_TRUE(p.version);
  EXPECT_EQ(parser.positional(), std::vector<std::string>{"pos"});
  EXPECT_FALSE(parser.help_requested());

  Parsed q;
  ArgParser again("prog", "");
  ASSERT_TRUE(parse({"--flag=false", "-h"}, &q, &again).ok());
  EXPECT_FALSE(q.flag);
  EXPECT_FALSE(q.version);
  EXPECT_TRUE(again.help_requested());
}

TEST(ArgParserTest, RejectsWhatItCannotTakeWithAMessage) {
  const struct {
    std::vector<std::string> args;
    std::string message;
  } cases[] = {
      {{"--nope"}, "unknown option --nope (see --help)"},
      {{"--no-name"}, "unknown option --no-name"},
      {{"--no-version"}, "unknown option --no-version"},
      {{"--version=1"}, "--version takes no value"},
      {{"--count=seven"}, "--count takes an integer, got 'seven'"},
      {{"--scale=big"}, "--scale takes a number, got 'big'"},
      {{"--flag=maybe"}, "--flag takes true or false, got 'maybe'"},
      {{"--name"}, "--name needs a value"},
      // The next option is not taken for the value (the manifest path of `--layer-manifest
      // --no-demo-layer` was "--no-demo-layer").
      {{"--name", "--no-flag"},
       "--name needs a value, not the option '--no-flag' (a value that starts with -- is given as "
       "--name=VALUE)"},
      {{"--count", "--flag"}, "--count needs a value, not the option '--flag'"},
      {{"--name", "--"}, "--name needs a value, not the option '--'"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.message);
    Parsed p;
    ArgParser parser("prog", "");
    const absl::Status s = parse(c.args, &p, &parser);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), c.message)) << s;
  }
}

// In the --name=value form a value may start with --, and in both forms with a single -.
TEST(ArgParserTest, TakesAValueThatStartsWithDashesInTheEqualsForm) {
  Parsed p;
  ArgParser parser("prog", "");
  ASSERT_TRUE(parse({"--name=--odd", "--count", "-4", "--scale", "-1.5"}, &p, &parser).ok());
  EXPECT_EQ(p.name, "--odd");
  EXPECT_EQ(p.count, -4);
  EXPECT_EQ(p.scale, -1.5);
  EXPECT_TRUE(p.flag);
}

TEST(ArgParserTest, HelpListsEachOptionInItsForm) {
  Parsed p;
  ArgParser parser("prog [options]", "A program.");
  ASSERT_TRUE(parse({}, &p, &parser).ok());
  const std::string help = parser.help();
  EXPECT_TRUE(absl::StartsWith(help, "Usage: prog [options]\n\nA program.\n")) << help;
  EXPECT_TRUE(absl::StrContains(help, "  --name=STR")) << help;
  EXPECT_TRUE(absl::StrContains(help, "  --count=INT")) << help;
  EXPECT_TRUE(absl::StrContains(help, "  --scale=NUM")) << help;
  EXPECT_TRUE(absl::StrContains(help, "  --flag | --no-flag")) << help;
  EXPECT_TRUE(absl::StrContains(help, "A flag (default: true)")) << help;
  // An action: no value, no --no- form, no default.
  EXPECT_TRUE(absl::StrContains(help, "  --version                   Print the version and exit\n"))
      << help;
  EXPECT_FALSE(absl::StrContains(help, "--no-version")) << help;
  EXPECT_TRUE(absl::StrContains(help, "  --help")) << help;
}

}  // namespace
}  // namespace qlinear
