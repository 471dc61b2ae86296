// flatten.cpp: Flatten is a reshape. The output shares the input's storage, on either device.
#include "layers/flatten.h"

namespace mf {

Shape Flatten::output_shape(const Shape& in) const {
  if (in.rank() < 2) throw std::invalid_argument(label() + ": expected input of rank >= 2, got " + in.str());
  return Shape{in[0], in.sample_numel()};
}

void Flatten::forward_cpu(const Tensor& x, Tensor& y) { y = x.reshape(output_shape(x.shape())); }
void Flatten::backward_cpu(const Tensor& dy, Tensor& dx) {
  if (dx.defined()) dx = dy.reshape(x_.shape());
}

}  // namespace mf
