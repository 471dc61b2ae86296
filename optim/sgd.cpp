// sgd.cpp: the SGD update on the CPU, or one kernel launch on the GPU.
#include "optim/sgd.h"

#include <cstdint>
#include <sstream>
#include <stdexcept>

#include "kernels/gpu/launchers.h"
#include "optim/hyperparams.h"

namespace mf {

SGD::SGD(float lr, float momentum) : lr_(lr), momentum_(momentum) {
  check_finite_positive("SGD", "learning rate", lr);
  if (!(momentum >= 0 && momentum < 1)) throw std::invalid_argument("SGD: need 0 <= momentum < 1");
}

void SGD::set_learning_rate(float lr) {
  check_finite_positive("SGD", "learning rate", lr);
  lr_ = lr;
}

std::string SGD::describe() const {
  std::ostringstream os;
  os << "SGD(lr=" << lr_ << ", momentum=" << momentum_ << ")";
  return os.str();
}

void SGD::attach(const std::vector<Parameter*>& params) {
  // Refused before packing: packing points the parameters at this optimizer's buffers, which
  // would leave a model's earlier optimizer updating buffers the model no longer reads.
  for (const Parameter* p : params)
    if (p->half.defined()) throw std::invalid_argument("SGD: mixed precision training uses Adam");
  pack_ = std::make_unique<ParamPack>(params);
  velocity_ = Tensor::zeros(Shape{pack_->total()}, DType::kF32, pack_->device());
  step_ = Tensor::zeros(Shape{1}, DType::kI32, pack_->device());
}

void SGD::step() {
  if (!pack_) throw std::logic_error("SGD::step before attach()");
  const std::int64_t n = pack_->total();
  if (pack_->device() == Device::kGpu) {
    const GpuStream s = compute_stream();
    launch_sgd_step(pack_->values().data<float>(), pack_->grads().data<float>(), velocity_.data<float>(), n, lr_,
                    momentum_, s);
    launch_finish_step(step_.data<std::int32_t>(), s);
    return;
  }
  float* w = pack_->values().data<float>();
  float* g = pack_->grads().data<float>();
  float* vel = velocity_.data<float>();
  for (std::int64_t i = 0; i < n; ++i) {
    vel[i] = momentum_ * vel[i] - lr_ * g[i];
    w[i] += vel[i];
    g[i] = 0.0f;
  }
  std::int32_t& count = step_.data<std::int32_t>()[0];
  if (count < INT32_MAX) ++count;  // the count stops at its int32's end, as on the GPU
}

std::int64_t SGD::iterations() const {
  return step_.defined() ? step_.to(Device::kCpu).data<std::int32_t>()[0] : 0;  // as an integer: floats stop at 2^24
}

std::vector<std::pair<std::string, Tensor>> SGD::state() {
  return {{"sgd.velocity", velocity_}, {"sgd.step", step_}};
}

}  // namespace mf
