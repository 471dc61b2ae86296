// maxpool2d.h: 2x2 max pooling with stride 2, NHWC, "valid" (an odd last row/column is dropped).
#pragma once
#include "layers/layer.h"

namespace mf {

class MaxPool2D final : public Layer {
 public:
  MaxPool2D() = default;
  std::string type() const override { return "MaxPooling2D"; }
  // x: (N, H, W, C) -> y: (N, H/2, W/2, C)
  Shape output_shape(const Shape& in) const override;
  // argmax_: a training forward writes it, backward reads it; a training forward at a
  // larger batch (from a callback) moves it.
  void step_buffers(std::vector<const void*>& out) const override { out.push_back(argmax_.raw()); }

 protected:
  // Backward routes each gradient to the window's maximum, the first one on ties.
  void forward_cpu(const Tensor& x, Tensor& y) override;
  void backward_cpu(const Tensor& dy, Tensor& dx) override;
#if MF_WITH_CUDA
  void forward_gpu(const Tensor& x, Tensor& y) override;
  void backward_gpu(const Tensor& dy, Tensor& dx) override;
#endif

 private:
  Tensor argmax_;  // u8 (N, H/2, W/2, C): 0..3 = (row, column) position of the winner in its window
  // GPU inference: the kernel always writes winners; they go here, so that a validation pass
  // at another batch size never moves argmax_, which a captured training step writes.
  Tensor infer_argmax_;
};

}  // namespace mf
