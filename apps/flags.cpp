// flags.cpp: parsing and help text for flags.h.
#include "apps/flags.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "apps/common.h"

namespace mf::apps {

namespace {
// Nine significant digits tell any two floats apart (and the doubles the flags hold, as far
// as a message needs): "1e-08" and "9.99999994e-09" never both print as "1e-08".
std::string fmt_double(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}
// The ranges, as the parsers and accepts() test them and as the errors and range_text()
// word them, written in one place.
std::string int_range_text(std::int64_t lo, std::int64_t hi) {
  return "between " + std::to_string(lo) + " and " + std::to_string(hi);
}
std::string double_range_text(double lo, double hi, bool hi_inclusive) {
  return "in [" + fmt_double(lo) + ", " + fmt_double(hi) + (hi_inclusive ? "]" : ")");
}
bool int_in_range(std::int64_t x, std::int64_t lo, std::int64_t hi) { return x >= lo && x <= hi; }
bool double_in_range(double x, double lo, double hi, bool hi_inclusive) {
  // Written so that NaN, which compares false with everything, is outside.
  return std::isfinite(x) && x >= lo && (hi_inclusive ? x <= hi : x < hi);
}
// The values are used in single precision. Rounding to float can only move a value within
// [lo, hi] to the float nearest a bound, which for an included bound is the bound itself
// as the program sees it (--lr 1e-8 becomes 9.99999994e-09, the float 1e-8): accepted. An
// excluded upper bound is different: --momentum 0.99999999999 becomes exactly 1, the value
// the range leaves out. So only that bound is checked again, on the float.
bool float_passes_excluded_bound(double x, double hi, bool hi_inclusive) {
  return !hi_inclusive && !(static_cast<double>(static_cast<float>(x)) < hi);
}
}  // namespace

// Every message goes through one_line here, so all three programs print flag errors on one
// line whatever the user typed into a value or a flag name.
FlagError::FlagError(const std::string& message) : std::runtime_error(one_line(message)) {}

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
                    // An empty value would read as "not given": `--resume ''` would start a
                    // fresh run over the checkpoint, `--save ''` would save nothing.
                    if (v.empty()) throw FlagError("--" + name + " needs a value, got an empty string");
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
  specs_[name].kind = Kind::kString;
  order_.push_back(name);
}

void Flags::add_int(const std::string& name, std::int64_t* target, std::int64_t lo, std::int64_t hi,
                    const std::string& help) {
  Spec spec{true, help, std::to_string(*target), [name, target, lo, hi](const std::string& v) {
               errno = 0;
               char* end = nullptr;
               const long long x = std::strtoll(v.c_str(), &end, 10);
               if (v.empty() || *end != '\0') throw FlagError("--" + name + " expects a whole number, got '" + v + "'");
               if (errno == ERANGE)
                 throw FlagError("--" + name + " must be " + int_range_text(lo, hi) + ", got " + v +
                                 " (beyond a 64-bit integer)");
               if (!int_in_range(x, lo, hi))
                 throw FlagError("--" + name + " must be " + int_range_text(lo, hi) + ", got " + v);
               *target = x;
             }};
  spec.kind = Kind::kInt;
  spec.int_lo = lo;
  spec.int_hi = hi;
  specs_[name] = std::move(spec);
  order_.push_back(name);
}

void Flags::add_double(const std::string& name, double* target, double lo, double hi, const std::string& help,
                       bool hi_inclusive) {
  Spec spec{true, help, fmt_double(*target), [=](const std::string& v) {
               errno = 0;
               char* end = nullptr;
               const double x = std::strtod(v.c_str(), &end);
               if (v.empty() || *end != '\0' || std::isnan(x) || (std::isinf(x) && errno != ERANGE))
                 throw FlagError("--" + name + " expects a number, got '" + v + "'");
               // Overflow (inf, or ERANGE with HUGE_VAL) and underflow (ERANGE, a subnormal or
               // zero) are numbers all the same: the range says what is wrong with them.
               const char* magnitude = errno != ERANGE && std::isfinite(x) ? ""
                                       : std::fabs(x) >= 1 ? " (beyond a double)"
                                                            : " (below the smallest normal double)";
               if (*magnitude || !double_in_range(x, lo, hi, hi_inclusive))
                 throw FlagError("--" + name + " must be " + double_range_text(lo, hi, hi_inclusive) + ", got " + v +
                                 magnitude);
               // The value is used in single precision: 0.99999999999 rounds to 1, outside [0, 1).
               if (float_passes_excluded_bound(x, hi, hi_inclusive))
                 throw FlagError("--" + name + " must be " + double_range_text(lo, hi, hi_inclusive) + ", got " + v +
                                 " (" + fmt_double(static_cast<float>(x)) + " in single precision)");
               *target = x;
             }};
  spec.kind = Kind::kDouble;
  spec.lo = lo;
  spec.hi = hi;
  spec.hi_inclusive = hi_inclusive;
  specs_[name] = std::move(spec);
  order_.push_back(name);
}

const Flags::Spec& Flags::spec_of(const std::string& name, Kind kind) const {
  const auto it = specs_.find(name);
  if (it == specs_.end() || it->second.kind != kind)
    throw std::logic_error("Flags: --" + name + " is not " + (kind == Kind::kInt ? "an int" : "a double") + " flag");
  return it->second;
}

bool Flags::accepts(const std::string& name, std::int64_t value) const {
  const Spec& s = spec_of(name, Kind::kInt);
  return int_in_range(value, s.int_lo, s.int_hi);
}

bool Flags::accepts(const std::string& name, double value) const {
  const Spec& s = spec_of(name, Kind::kDouble);
  return double_in_range(value, s.lo, s.hi, s.hi_inclusive) && !float_passes_excluded_bound(value, s.hi, s.hi_inclusive);
}

std::string Flags::range_text(const std::string& name) const {
  const auto it = specs_.find(name);
  if (it != specs_.end() && it->second.kind == Kind::kInt) return int_range_text(it->second.int_lo, it->second.int_hi);
  if (it != specs_.end() && it->second.kind == Kind::kDouble)
    return double_range_text(it->second.lo, it->second.hi, it->second.hi_inclusive);
  throw std::logic_error("Flags: --" + name + " is not a number flag with a range");
}

bool Flags::parse(int argc, char** argv) {
  bool only_arguments = false;  // after "--": the rest are arguments, even "--x"
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (!only_arguments && arg == "--") {
      only_arguments = true;
      continue;
    }
    if (!only_arguments && (arg == "--help" || arg == "-h")) {
      std::fputs(help().c_str(), stdout);
      return false;
    }
    if (only_arguments || arg.rfind("--", 0) != 0) {
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
        // `--save --quiet` forgot the file name; it did not mean a file called "--quiet".
        if (std::string(argv[i + 1]).rfind("--", 0) == 0)
          throw FlagError("--" + name + " needs a value, got the flag " + argv[i + 1] + " (write --" + name +
                          "=VALUE for a value that starts with --)");
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
  os << "  -h, --help                this text\n";
  return os.str();
}

}  // namespace mf::apps
