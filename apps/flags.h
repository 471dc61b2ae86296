// flags.h: a small strict command-line parser for the apps. Every flag is declared with its
// help text; a value that does not parse or is out of range, an unknown flag or a missing
// value throws FlagError with a one-line message naming the flag. The ranges of the number
// flags can also be asked for, to check values that come from elsewhere (a checkpoint).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace mf::apps {

// what() is always one line: line breaks and tabs in the message (a value given as
// $'1\n2' is quoted in it) become spaces.
class FlagError : public std::runtime_error {
 public:
  explicit FlagError(const std::string& message);
};

class Flags {
 public:
  explicit Flags(std::string program, std::string usage) : program_(std::move(program)), usage_(std::move(usage)) {}

  void add_bool(const std::string& name, bool* target, const std::string& help);
  void add_string(const std::string& name, std::string* target, const std::string& help,
                  std::vector<std::string> choices = {});
  void add_int(const std::string& name, std::int64_t* target, std::int64_t lo, std::int64_t hi, const std::string& help);
  void add_double(const std::string& name, double* target, double lo, double hi, const std::string& help,
                  bool hi_inclusive = true);

  // Parses argv; returns false when --help was given (help already printed to stdout).
  bool parse(int argc, char** argv);
  std::string help() const;
  // True when the flag was given on the command line.
  bool given(const std::string& name) const { return given_.count(name) != 0; }
  const std::vector<std::string>& positional() const { return positional_; }
  void allow_positional(const std::string& what) { positional_name_ = what; }

  // Whether --name would accept `value`: an int flag's value within [lo, hi]; a double
  // flag's value finite and within its range (NaN is never accepted), and, when the upper
  // end is excluded, still below it once rounded to float (0.99999999999 is 1). Throws
  // std::logic_error when --name is not declared, or is not an int (resp. double) flag.
  bool accepts(const std::string& name, std::int64_t value) const;
  bool accepts(const std::string& name, double value) const;
  // The range --name accepts, as its errors word it: "between 1 and 65536" (int),
  // "in [0, 1)" (double). Throws std::logic_error for a flag without a range.
  std::string range_text(const std::string& name) const;

 private:
  enum class Kind { kBool, kString, kInt, kDouble };
  struct Spec {
    bool takes_value;
    std::string help, default_text;
    std::function<void(const std::string&)> set;
    Kind kind = Kind::kBool;
    std::int64_t int_lo = 0, int_hi = 0;  // kInt: the closed range
    double lo = 0, hi = 0;                // kDouble: [lo, hi] or [lo, hi)
    bool hi_inclusive = true;
  };
  const Spec& spec_of(const std::string& name, Kind kind) const;
  std::string program_, usage_, positional_name_;
  std::map<std::string, Spec> specs_;
  std::vector<std::string> order_;
  std::map<std::string, bool> given_;
  std::vector<std::string> positional_;
};

}  // namespace mf::apps
