// maxpool2d_cpu.cpp: 2x2/2 max pooling on the CPU, NHWC, the batch split across threads.
// The innermost loop runs over channels, which are contiguous, so it vectorises.
#include <algorithm>
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

// The CPU path stores no argmax: backward compares the kept input with the output and
// routes the gradient to the first position that holds the maximum, which is the same
// rule (first on ties), and both loops then vectorise over channels.
void MaxPool2D::forward_cpu(const Tensor& x, Tensor& y) {
  const std::int64_t h = x.dim(1), w = x.dim(2), c = x.dim(3), oh = h / 2, ow = w / 2;
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  cpu_pool().parallel_for(x.dim(0), [&](std::int64_t n0, std::int64_t n1, int) {
    for (std::int64_t n = n0; n < n1; ++n)
      for (std::int64_t i = 0; i < oh; ++i)
        for (std::int64_t j = 0; j < ow; ++j) {
          const float* x00 = xp + ((n * h + 2 * i) * w + 2 * j) * c;
          const float* x01 = x00 + c;
          const float* x10 = x00 + w * c;
          const float* x11 = x10 + c;
          float* out = yp + ((n * oh + i) * ow + j) * c;
          for (std::int64_t ch = 0; ch < c; ++ch)
            out[ch] = std::max(std::max(x00[ch], x01[ch]), std::max(x10[ch], x11[ch]));
        }
  });
}

void MaxPool2D::backward_cpu(const Tensor& dy, Tensor& dx) {
  if (!dx.defined()) return;
  const std::int64_t h = x_.dim(1), w = x_.dim(2), c = x_.dim(3), oh = h / 2, ow = w / 2;
  const float* xp = x_.data<float>();
  const float* yp = y_.data<float>();
  const float* dyp = dy.data<float>();
  float* dxp = dx.data<float>();
  cpu_pool().parallel_for(x_.dim(0), [&](std::int64_t n0, std::int64_t n1, int) {
    for (std::int64_t n = n0; n < n1; ++n) {
      // Rows and columns dropped by the floor (odd H or W) get a zero gradient.
      if (h % 2) std::memset(dxp + (n * h + h - 1) * w * c, 0, w * c * sizeof(float));
      for (std::int64_t i = 0; i < oh; ++i) {
        if (w % 2)
          for (int r = 0; r < 2; ++r) std::memset(dxp + ((n * h + 2 * i + r) * w + w - 1) * c, 0, c * sizeof(float));
        for (std::int64_t j = 0; j < ow; ++j) {
          const std::int64_t o = ((n * oh + i) * ow + j) * c;
          const std::int64_t base = ((n * h + 2 * i) * w + 2 * j) * c;
          const float* __restrict x00 = xp + base;
          const float* __restrict x01 = x00 + c;
          const float* __restrict x10 = x00 + w * c;
          float* __restrict d00 = dxp + base;
          float* __restrict d01 = d00 + c;
          float* __restrict d10 = d00 + w * c;
          float* __restrict d11 = d10 + c;
          const float* __restrict ym = yp + o;
          const float* __restrict g = dyp + o;
          // Branch-free, so the channel loop vectorises (which of the four wins is data-
          // dependent: branches would mispredict). The 0/1 masks pick the first position
          // equal to the maximum; the gradient itself is only selected, never combined, so
          // an inf or NaN gradient still reaches the winner alone.
#pragma omp simd
          for (std::int64_t ch = 0; ch < c; ++ch) {
            const float m = ym[ch];
            const float a = x00[ch] == m ? 1.0f : 0.0f;
            const float b = x01[ch] == m ? 1.0f - a : 0.0f;
            const float e = x10[ch] == m ? 1.0f - a - b : 0.0f;
            const float f = 1.0f - a - b - e;
            d00[ch] = a > 0.0f ? g[ch] : 0.0f;
            d01[ch] = b > 0.0f ? g[ch] : 0.0f;
            d10[ch] = e > 0.0f ? g[ch] : 0.0f;
            d11[ch] = f > 0.0f ? g[ch] : 0.0f;
          }
        }
      }
    }
  });
}

}  // namespace mf
