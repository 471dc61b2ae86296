// optimizer.h: the interface a model trains with (Keras's model.compile(optimizer=...));
// Adam and SGD implement it in optim/.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "layers/layer.h"

namespace mf {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;
  virtual std::string describe() const = 0;  // "Adam(lr=0.001, beta1=0.9, ...)"

  // Takes the model's parameters: packs them into one flat buffer each for values,
  // gradients (and f16 copies) on their device, so that one kernel updates them all,
  // and allocates the optimizer's state there.
  virtual void attach(const std::vector<Parameter*>& params) = 0;

  // One update from the accumulated gradients, which it then zeroes. On the GPU the
  // work is enqueued on the model's stream and nothing waits for it.
  virtual void step() = 0;

  // For a step whose own kernels can move the update count on (the fused rung's last
  // gradient kernel does, saving a launch): the device count to add 1 to before
  // step_after_count_moved(), or null where there is none to move that way (SGD has no
  // count; FP16 Adam moves it after its overflow check, which may skip the update).
  virtual std::int32_t* device_step_count() { return nullptr; }
  // step(), once device_step_count() has been moved on by this step's kernels.
  virtual void step_after_count_moved() { step(); }

  virtual float learning_rate() const = 0;
  // Throws std::invalid_argument unless lr is finite and > 0.
  virtual void set_learning_rate(float lr) = 0;

  // Number of updates applied (reads the device counter: synchronises on the GPU). The
  // counter is 32-bit: it stops at 2^31 - 1, where Adam's bias correction has long been 1.
  virtual std::int64_t iterations() const = 0;

  // Mixed precision: the device address of the dynamic loss scale (null in FP32), which
  // the loss multiplies its gradient by; and host reads of scale and skipped steps.
  virtual const float* device_loss_scale() const { return nullptr; }
  virtual double loss_scale() const { return 1.0; }
  virtual double min_loss_scale() const { return 1.0; }  // the scaler's floor
  virtual std::int64_t take_skipped_steps() { return 0; }  // since the last call

  // Named state tensors (moments, step count, loss scale), for checkpoints. Restoring
  // writes into these tensors in place.
  virtual std::vector<std::pair<std::string, Tensor>> state() = 0;
};

}  // namespace mf
