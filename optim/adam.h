// adam.h: Adam with Keras's defaults and update form, on CPU or GPU, FP32 or mixed precision.
#pragma once
#include <memory>

#include "optim/optimizer.h"
#include "optim/loss_scaler.h"
#include "optim/param_pack.h"

namespace mf {

struct AdamConfig {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-7f;
};

class Adam final : public Optimizer {
 public:
  // Throws std::invalid_argument unless lr and eps are finite and > 0, 0 <= beta1, beta2 < 1,
  // and the scaler's scales are finite with 0 < min_scale <= initial_scale <= max_scale and
  // its growth_interval >= 1 (checked in FP32 too: the settings are the optimizer's).
  explicit Adam(const AdamConfig& config = {}, const LossScalerConfig& scaler = {});
  std::string name() const override { return "Adam"; }
  std::string describe() const override;

  void attach(const std::vector<Parameter*>& params) override;
  // Keras's form ("epsilon hat"): with t the number of this update,
  //   lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t)
  //   m = beta1 m + (1 - beta1) g,  v = beta2 v + (1 - beta2) g^2,  w -= lr_t m / (sqrt(v) + eps)
  // Mixed precision: g = f16 grad / loss scale; a step with an inf/NaN gradient is
  // skipped (the weights stay as they are) and the scale adjusts.
  void step() override;
  // FP32 on the GPU only (see Optimizer): the step count, and Adam without its finish launch.
  std::int32_t* device_step_count() override;
  void step_after_count_moved() override;

  float learning_rate() const override { return config_.lr; }
  // Throws std::invalid_argument unless lr is finite and > 0 (the constructor's check).
  void set_learning_rate(float lr) override;
  std::int64_t iterations() const override;
  const float* device_loss_scale() const override;
  double loss_scale() const override;
  double min_loss_scale() const override { return scaler_config_.min_scale; }
  std::int64_t take_skipped_steps() override;
  std::vector<std::pair<std::string, Tensor>> state() override;

  const AdamConfig& config() const { return config_; }
  const LossScalerConfig& scaler_config() const { return scaler_config_; }

 private:
  void step_cpu();
  void step_gpu_f32(bool count_moved);
  AdamConfig config_;
  LossScalerConfig scaler_config_;
  std::unique_ptr<ParamPack> pack_;
  Tensor m_, v_;
  Tensor step_;    // i32 (1): updates applied, on the parameters' device
  Tensor scaler_;  // mixed precision: LossScaleState (i32 x 4) on the device
  std::int64_t skipped_seen_ = 0;
};

}  // namespace mf
