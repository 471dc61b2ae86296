// maxpool2d_gpu.cu: MaxPool2D on the GPU: the 2x2/2 kernels of kernels/gpu/maxpool.cu, NHWC, f32
// or f16. Forward records each window's winner (a u8 on the device) so that backward routes
// the gradient there, the same rule as the CPU path (first position on ties).
#include <cstdint>
#include <stdexcept>

#include "runtime/gpu_runtime.h"
#include "kernels/gpu/launchers.h"
#include "layers/maxpool2d.h"

namespace mf {

void MaxPool2D::forward_gpu(const Tensor& x, Tensor& y) {
  // Training keeps the winners for backward. Inference needs none, but the kernel writes
  // them anyway: into a buffer of their own, so that a validation pass at a larger batch
  // (which would grow argmax_ to a new address) never moves the buffer a captured
  // training step writes.
  Tensor& winners = training_ ? argmax_ : infer_argmax_;
  ensure(winners, y.shape(), DType::kU8, Device::kGpu);
  launch_maxpool2x2_forward(x.raw(), y.raw(), winners.data<std::uint8_t>(), x.dtype() == DType::kF16, x.dim(0),
                            x.dim(1), x.dim(2), x.dim(3), compute_stream());
}

void MaxPool2D::backward_gpu(const Tensor& dy, Tensor& dx) {
  if (!dx.defined()) return;
  // Writes all of dx: the winner's gradient, zero for the rest of the window and for the
  // row and column an odd H or W leaves out.
  launch_maxpool2x2_backward(dy.raw(), argmax_.data<std::uint8_t>(), dx.raw(), dy.dtype() == DType::kF16, x_.dim(0),
                             x_.dim(1), x_.dim(2), x_.dim(3), compute_stream());
}

}  // namespace mf
