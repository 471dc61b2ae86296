// text.cpp: see text.h.
#include "io/text.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>

namespace mf::io {

std::string exact_decimal(double v) {
  char b[64];
  if (!std::isfinite(v)) {
    std::snprintf(b, sizeof b, "%g", v);
    return b;
  }
  for (int digits = 1; digits <= 17; ++digits) {  // 17 digits always round-trip a double
    std::snprintf(b, sizeof b, "%.*g", digits, v);
    if (std::strtod(b, nullptr) == v) break;
  }
  return b;
}

std::string utc_now() {
  char b[32];
  const std::time_t t = std::time(nullptr);
  std::tm parts{};
  gmtime_r(&t, &parts);
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &parts);
  return b;
}

}  // namespace mf::io
