// flags.cpp: parsing and help text for flags.h.
#include "apps/flags.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace mf::apps {

namespace {
std::string fmt_double(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}
}  // namespace

void Flags::add_bool(const std::string& name, bool* target, const std::string& help) {
  specs_[name] = {false, help, "", [target](const std::string&) { *target = true; }};
  order_.push_back(name);
}

void Flags::add_string(const std::string& name, std::string* target, const std::string& help,
                       std::vector<std::string> choices) {
  std::string h = help;
  if (!choices.empty()) {
    h += " (";
    for (std::size_t i = 0; i < choices.size(); ++i) h += (i ? "|" : "") + choices[i];
    h += ")";
  }
  specs_[name] = {true, h, *target, [name, target, choices](const std::string& v) {
                    if (!choices.empty()) {
                      bool ok = false;
                      for (const auto& c : choices) ok = ok || c == v;
                      if (!ok) {
                        std::string list;
                        for (std::size_t i = 0; i < choices.size(); ++i) list += (i ? ", " : "") + choices[i];
                        throw FlagError("--" + name + " must be one of " + list + ", got '" + v + "'");
                      }
                    }
                    *target = v;
                  }};
  order_.push_back(name);
}

void Flags::add_int(const std::string& name, std::int64_t* target, std::int64_t lo, std::int64_t hi,
                    const std::string& help) {
  specs_[name] = {true, help, std::to_string(*target), [name, target, lo, hi](const std::string& v) {
                    errno = 0;
                    char* end = nullptr;
                    const long long x = std::strtoll(v.c_str(), &end, 10);
                    if (v.empty() || *end != '\0' || errno == ERANGE)
                      throw FlagError("--" + name + " expects a whole number, got '" + v + "'");
                    if (x < lo || x > hi)
                      throw FlagError("--" + name + " must be between " + std::to_string(lo) + " and " +
                                      std::to_string(hi) + ", got " + v);
                    *target = x;
                  }};
  order_.push_back(name);
}

void Flags::add_double(const std::string& name, double* target, double lo, double hi, const std::string& help,
                       bool hi_inclusive) {
  specs_[name] = {true, help, fmt_double(*target), [=](const std::string& v) {
                    errno = 0;
                    char* end = nullptr;
                    const double x = std::strtod(v.c_str(), &end);
                    if (v.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(x))
                      throw FlagError("--" + name + " expects a number, got '" + v + "'");
                    if (x < lo || (hi_inclusive ? x > hi : x >= hi))
                      throw FlagError("--" + name + " must be in [" + fmt_double(lo) + ", " + fmt_double(hi) +
                                      (hi_inclusive ? "]" : ")") + ", got " + v);
                    *target = x;
                  }};
  order_.push_back(name);
}

bool Flags::parse(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(help().c_str(), stdout);
      return false;
    }
    if (arg.rfind("--", 0) != 0 || arg == "--") {
      if (positional_name_.empty()) throw FlagError("unexpected argument '" + arg + "' (see --help)");
      positional_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (const auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    const auto it = specs_.find(name);
    if (it == specs_.end()) throw FlagError("unknown flag --" + name + " (see --help)");
    if (it->second.takes_value) {
      if (!has_value) {
        if (i + 1 >= argc) throw FlagError("--" + name + " needs a value");
        value = argv[++i];
      }
    } else if (has_value) {
      throw FlagError("--" + name + " takes no value");
    }
    it->second.set(value);
    given_[name] = true;
  }
  return true;
}

std::string Flags::help() const {
  std::ostringstream os;
  os << "usage: " << program_ << " " << usage_ << "\n\n";
  for (const auto& name : order_) {
    const Spec& s = specs_.at(name);
    std::string left = "  --" + name + (s.takes_value ? " VALUE" : "");
    if (left.size() < 28) left.resize(28, ' ');
    else left += "\n" + std::string(28, ' ');
    os << left << s.help;
    if (s.takes_value && !s.default_text.empty()) os << " [default: " << s.default_text << "]";
    os << "\n";
  }
  os << "  --help                    this text\n";
  return os.str();
}

}  // namespace mf::apps
