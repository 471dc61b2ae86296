// sgd.h: stochastic gradient descent with optional momentum (Keras's form), CPU or GPU, FP32.
#pragma once
#include <memory>

#include "optim/optimizer.h"
#include "optim/param_pack.h"

namespace mf {

class SGD final : public Optimizer {
 public:
  // Throws std::invalid_argument unless lr is finite and > 0 and 0 <= momentum < 1.
  explicit SGD(float lr = 0.01f, float momentum = 0.0f);
  std::string name() const override { return "SGD"; }
  std::string describe() const override;
  void attach(const std::vector<Parameter*>& params) override;
  // velocity = momentum * velocity - lr * g;  w += velocity   (momentum 0: w -= lr * g)
  void step() override;
  float learning_rate() const override { return lr_; }
  // Throws std::invalid_argument unless lr is finite and > 0 (the constructor's check).
  void set_learning_rate(float lr) override;
  std::int64_t iterations() const override;
  std::vector<std::pair<std::string, Tensor>> state() override;

 private:
  float lr_, momentum_;
  std::unique_ptr<ParamPack> pack_;
  Tensor velocity_, step_;
};

}  // namespace mf
