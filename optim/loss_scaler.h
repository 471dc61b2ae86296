// loss_scaler.h: dynamic loss scaling for FP16 training, with PyTorch GradScaler semantics.
//
// FP16 gradients of a small loss underflow to zero; multiplying the loss by a large scale
// S before backward lifts them into range, and the optimizer divides by S again. If any
// gradient overflowed (inf/NaN) the step is skipped and S halves; after `growth_interval`
// clean steps in a row S doubles. On the GPU the state lives on the device and is updated
// by the optimizer's kernels (launchers.h), so no step waits for the host; this class holds
// the settings and a host model of the same rule, which the tests check the kernels against.
#pragma once
#include <cstdint>

namespace mf {

struct LossScalerConfig {
  float initial_scale = 65536.0f;  // 2^16
  std::int32_t growth_interval = 2000;
  float min_scale = 1.0f / 16384;  // 2^-14: below it no scale helps; training is diverging
  float max_scale = 16777216.0f;   // 2^24
};

// The update rule on the host (the reference for the device kernel).
struct LossScalerModel {
  explicit LossScalerModel(const LossScalerConfig& c = {}) : config(c), scale(c.initial_scale) {}
  // Returns true when the step is applied (no inf/NaN).
  bool update(bool found_inf) {
    if (found_inf) {
      scale = scale / 2 < config.min_scale ? config.min_scale : scale / 2;
      clean_steps = 0;
      ++skipped;
      return false;
    }
    if (++clean_steps >= config.growth_interval) {
      scale = scale * 2 > config.max_scale ? config.max_scale : scale * 2;
      clean_steps = 0;
    }
    return true;
  }
  LossScalerConfig config;
  float scale;
  std::int32_t clean_steps = 0;
  std::int32_t skipped = 0;
};

}  // namespace mf
