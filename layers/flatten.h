// flatten.h: (N, H, W, C) -> (N, H*W*C) in (h, w, c) order, as Keras flattens. A view: no copy.
#pragma once
#include "layers/layer.h"

namespace mf {

class Flatten final : public Layer {
 public:
  std::string type() const override { return "Flatten"; }
  Shape output_shape(const Shape& in) const override;
  bool output_is_view() const override { return true; }

 protected:
  void forward_cpu(const Tensor& x, Tensor& y) override;
  void backward_cpu(const Tensor& dy, Tensor& dx) override;
  void forward_gpu(const Tensor& x, Tensor& y) override { forward_cpu(x, y); }
  void backward_gpu(const Tensor& dy, Tensor& dx) override { backward_cpu(dy, dx); }
};

}  // namespace mf
