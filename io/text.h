// text.h: numbers and times as the files microflow writes spell them (checkpoint metadata,
// --metrics-json).
#pragma once
#include <string>

namespace mf::io {

// The shortest decimal that reads back (strtod) as the same double, so that two files
// compare equal exactly when their numbers do; "nan", "inf" or "-inf" when not finite.
std::string exact_decimal(double v);
// Now, in UTC, as ISO 8601: "2026-12-06T19:29:42Z".
std::string utc_now();

}  // namespace mf::io
