// hyperparams.h: the check every optimizer applies to its learning rate and epsilon, in
// its constructor and in set_learning_rate() alike.
#pragma once
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>

namespace mf {

// Throws std::invalid_argument "<optimizer>: <what> must be finite and > 0, got <value>"
// unless value is a finite number above zero. A learning rate of 0 never trains, a negative
// one climbs the loss instead of descending it, and an infinite or NaN one (or epsilon)
// turns every weight into NaN or inf at the first step: all of them train with no error
// unless refused here.
inline void check_finite_positive(const char* optimizer, const char* what, float value) {
  if (std::isfinite(value) && value > 0.0f) return;
  std::ostringstream os;
  os << optimizer << ": " << what << " must be finite and > 0, got " << value;
  throw std::invalid_argument(os.str());
}

}  // namespace mf
