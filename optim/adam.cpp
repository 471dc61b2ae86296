// adam.cpp: the Adam update; the CPU loop here, the GPU as one kernel launch (launchers.h).
#include "optim/adam.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "kernels/gpu/launchers.h"
#include "optim/hyperparams.h"
#include "runtime/parallel.h"

namespace mf {

namespace {
// A NaN or infinite scale makes every FP16 step a skipped one; a growth interval below 1
// doubles the scale at every clean step, so that about every other step overflows and is
// skipped; min above max or a start outside them has no meaning for the clamp.
void check_scaler(const LossScalerConfig& c) {
  const bool scales_ok = std::isfinite(c.min_scale) && std::isfinite(c.max_scale) && c.min_scale > 0 &&
                         c.min_scale <= c.initial_scale && c.initial_scale <= c.max_scale;
  if (scales_ok && c.growth_interval >= 1) return;
  std::ostringstream os;
  os << "Adam: the loss scaler needs finite scales with 0 < min_scale <= initial_scale <= max_scale and "
        "growth_interval >= 1, got initial_scale "
     << c.initial_scale << ", min_scale " << c.min_scale << ", max_scale " << c.max_scale << ", growth_interval "
     << c.growth_interval;
  throw std::invalid_argument(os.str());
}
}  // namespace

Adam::Adam(const AdamConfig& config, const LossScalerConfig& scaler) : config_(config), scaler_config_(scaler) {
  check_finite_positive("Adam", "learning rate", config.lr);
  check_finite_positive("Adam", "epsilon", config.eps);
  if (!(config.beta1 >= 0 && config.beta1 < 1) || !(config.beta2 >= 0 && config.beta2 < 1))
    throw std::invalid_argument("Adam: need 0 <= beta1, beta2 < 1");
  check_scaler(scaler);
}

void Adam::set_learning_rate(float lr) {
  check_finite_positive("Adam", "learning rate", lr);
  config_.lr = lr;
}

std::string Adam::describe() const {
  std::ostringstream os;
  os << "Adam(lr=" << config_.lr << ", beta1=" << config_.beta1 << ", beta2=" << config_.beta2
     << ", eps=" << config_.eps << ")";
  return os.str();
}

void Adam::attach(const std::vector<Parameter*>& params) {
  pack_ = std::make_unique<ParamPack>(params);
  const Device dev = pack_->device();
  m_ = Tensor::zeros(Shape{pack_->total()}, DType::kF32, dev);
  v_ = Tensor::zeros(Shape{pack_->total()}, DType::kF32, dev);
  step_ = Tensor::zeros(Shape{1}, DType::kI32, dev);
  if (pack_->mixed()) {
    static_assert(sizeof(LossScaleState) == 4 * sizeof(std::int32_t), "LossScaleState is four 32-bit fields");
    LossScaleState init{scaler_config_.initial_scale, 0, 0, 0};
    Tensor host = Tensor::empty(Shape{4}, DType::kI32);
    std::memcpy(host.raw(), &init, sizeof init);
    scaler_ = host.to(dev);
  }
}

void Adam::step() {
  if (!pack_) throw std::logic_error("Adam::step before attach()");
  if (pack_->device() == Device::kCpu) return step_cpu();
  const GpuStream s = compute_stream();
  const std::int64_t n = pack_->total();
  std::int32_t* t = step_.data<std::int32_t>();
  if (pack_->mixed()) {
    auto* st = static_cast<LossScaleState*>(scaler_.raw());
    launch_unscale_check(pack_->grads().data<Half>(), n, st, s);
    launch_adam_step_mixed(pack_->values().data<float>(), pack_->halves().data<Half>(), pack_->grads().data<Half>(),
                           m_.data<float>(), v_.data<float>(), n, config_.lr, config_.beta1, config_.beta2,
                           config_.eps, t, st, s);
    launch_finish_step_mixed(t, st, scaler_config_.growth_interval, scaler_config_.min_scale,
                             scaler_config_.max_scale, s);
  } else {
    step_gpu_f32(false);
    launch_finish_step(t, s);
  }
}

// FP32 GPU Adam: t = *step + 1, or *step itself once a kernel of the step has moved it.
void Adam::step_gpu_f32(bool count_moved) {
  launch_adam_step(pack_->values().data<float>(), pack_->grads().data<float>(), m_.data<float>(), v_.data<float>(),
                   pack_->total(), config_.lr, config_.beta1, config_.beta2, config_.eps, step_.data<std::int32_t>(),
                   compute_stream(), count_moved);
}

std::int32_t* Adam::device_step_count() {
  if (!pack_ || pack_->device() == Device::kCpu || pack_->mixed()) return nullptr;
  return step_.data<std::int32_t>();
}

void Adam::step_after_count_moved() {
  if (!device_step_count()) throw std::logic_error("Adam::step_after_count_moved: no device step count to have moved");
  step_gpu_f32(true);
}

void Adam::step_cpu() {
  std::int32_t& t_count = step_.data<std::int32_t>()[0];
  const double t = static_cast<double>(t_count) + 1.0;  // in int32 it would overflow at 2^31 - 1
  const float b1 = config_.beta1, b2 = config_.beta2, eps = config_.eps;
  const double lr_t = config_.lr * std::sqrt(1.0 - std::pow(static_cast<double>(b2), t)) /
                      (1.0 - std::pow(static_cast<double>(b1), t));
  const float lr = static_cast<float>(lr_t);
  float* w = pack_->values().data<float>();
  float* g = pack_->grads().data<float>();
  float* m = m_.data<float>();
  float* v = v_.data<float>();
  // Split over the CPU threads in runs of whole cache lines (16 floats).
  const std::int64_t lines = (pack_->total() + 15) / 16, n = pack_->total();
  cpu_pool().parallel_for(lines, [&](std::int64_t l0, std::int64_t l1, int) {
    const std::int64_t i1 = std::min(n, l1 * 16);
#pragma omp simd
    for (std::int64_t i = l0 * 16; i < i1; ++i) {
      const float gi = g[i];
      m[i] = b1 * m[i] + (1.0f - b1) * gi;
      v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
      w[i] -= lr * m[i] / (std::sqrt(v[i]) + eps);
      g[i] = 0.0f;
    }
  }, 1024);
  if (t_count < INT32_MAX) ++t_count;  // the count stops at its int32's end, as on the GPU
}

std::int64_t Adam::iterations() const {
  if (!step_.defined()) return 0;
  return step_.to(Device::kCpu).data<std::int32_t>()[0];  // read as an integer: to_vector's floats stop at 2^24
}

const float* Adam::device_loss_scale() const {
  return scaler_.defined() ? &static_cast<const LossScaleState*>(scaler_.raw())->scale : nullptr;
}

namespace {
LossScaleState read_state(const Tensor& t) {
  LossScaleState st{};
  const Tensor h = t.is_cpu() ? t : t.to(Device::kCpu);
  std::memcpy(&st, h.raw(), sizeof st);
  return st;
}
}  // namespace

double Adam::loss_scale() const { return scaler_.defined() ? read_state(scaler_).scale : 1.0; }

std::int64_t Adam::take_skipped_steps() {
  if (!scaler_.defined()) return 0;
  const std::int64_t total = read_state(scaler_).skipped;
  const std::int64_t d = total - skipped_seen_;
  skipped_seen_ = total;
  return d;
}

std::vector<std::pair<std::string, Tensor>> Adam::state() {
  std::vector<std::pair<std::string, Tensor>> s{{"adam.m", m_}, {"adam.v", v_}, {"adam.step", step_}};
  if (scaler_.defined()) s.emplace_back("adam.loss_scaler", scaler_);
  return s;
}

}  // namespace mf
