// flags.h: a small strict command-line parser for the apps. Every flag is declared with its
// help text; a value that does not parse or is out of range, an unknown flag or a missing
// value throws FlagError with a one-line message naming the flag.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace mf::apps {

class FlagError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
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

 private:
  struct Spec {
    bool takes_value;
    std::string help, default_text;
    std::function<void(const std::string&)> set;
  };
  std::string program_, usage_, positional_name_;
  std::map<std::string, Spec> specs_;
  std::vector<std::string> order_;
  std::map<std::string, bool> given_;
  std::vector<std::string> positional_;
};

}  // namespace mf::apps
