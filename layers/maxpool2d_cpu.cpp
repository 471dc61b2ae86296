// maxpool2d_cpu.cpp: 2x2/2 max pooling on the CPU, NHWC, the batch split across threads.
// The innermost loop runs over channels, which are contiguous, so it vectorises.
#include <cstring>

#include "layers/maxpool2d.h"
#include "tensor/parallel.h"

namespace mf {

Shape MaxPool2D::output_shape(const Shape& in) const {
  check_input(in, {-1, -1, -1, -1});
  if (in[1] < 2 || in[2] < 2)
    throw std::invalid_argument("MaxPooling2D: input " + in.str() + " is smaller than the 2x2 window");
  return Shape{in[0], in[1] / 2, in[2] / 2, in[3]};
}

void MaxPool2D::forward_cpu(const Tensor& x, Tensor& y) {
  const std::int64_t h = x.dim(1), w = x.dim(2), c = x.dim(3), oh = h / 2, ow = w / 2;
  ensure(argmax_, y.shape(), DType::kU8, Device::kCpu);
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  std::uint8_t* ap = argmax_.data<std::uint8_t>();
  cpu_pool().parallel_for(x.dim(0), [&](std::int64_t n0, std::int64_t n1, int) {
    for (std::int64_t n = n0; n < n1; ++n)
      for (std::int64_t i = 0; i < oh; ++i)
        for (std::int64_t j = 0; j < ow; ++j) {
          const float* x00 = xp + ((n * h + 2 * i) * w + 2 * j) * c;
          const float* x01 = x00 + c;
          const float* x10 = x00 + w * c;
          const float* x11 = x10 + c;
          const std::int64_t o = ((n * oh + i) * ow + j) * c;
          for (std::int64_t ch = 0; ch < c; ++ch) {
            // Strict '>' keeps the first of equal values: ties go to the earliest position.
            float best = x00[ch];
            std::uint8_t arg = 0;
            if (x01[ch] > best) best = x01[ch], arg = 1;
            if (x10[ch] > best) best = x10[ch], arg = 2;
            if (x11[ch] > best) best = x11[ch], arg = 3;
            yp[o + ch] = best;
            ap[o + ch] = arg;
          }
        }
  });
}

void MaxPool2D::backward_cpu(const Tensor& dy, Tensor& dx) {
  if (!dx.defined()) return;
  const std::int64_t h = x_.dim(1), w = x_.dim(2), c = x_.dim(3), oh = h / 2, ow = w / 2;
  const float* dyp = dy.data<float>();
  const std::uint8_t* ap = argmax_.data<std::uint8_t>();
  float* dxp = dx.data<float>();
  cpu_pool().parallel_for(x_.dim(0), [&](std::int64_t n0, std::int64_t n1, int) {
    // Rows and columns dropped by the floor (odd H or W) get a zero gradient.
    std::memset(dxp + n0 * h * w * c, 0, (n1 - n0) * h * w * c * sizeof(float));
    for (std::int64_t n = n0; n < n1; ++n)
      for (std::int64_t i = 0; i < oh; ++i)
        for (std::int64_t j = 0; j < ow; ++j) {
          float* d00 = dxp + ((n * h + 2 * i) * w + 2 * j) * c;
          float* win[4] = {d00, d00 + c, d00 + w * c, d00 + w * c + c};
          const std::int64_t o = ((n * oh + i) * ow + j) * c;
          for (std::int64_t ch = 0; ch < c; ++ch) win[ap[o + ch]][ch] = dyp[o + ch];
        }
  });
}

}  // namespace mf
