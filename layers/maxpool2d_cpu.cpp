// maxpool2d_cpu.cpp: 2x2/2 max pooling on the CPU, NHWC, the batch split across threads.
// The innermost loop runs over channels, which are contiguous, so it vectorises.
#include <algorithm>
#include <cstring>

#include "layers/conv2d_cpu_kernels.h"
#include "layers/maxpool2d.h"
#include "tensor/parallel.h"

namespace mf {

Shape MaxPool2D::output_shape(const Shape& in) const {
  check_input(in, {-1, -1, -1, -1});
  if (in[1] < 2 || in[2] < 2)
    throw std::invalid_argument(label() + ": input " + in.str() + " is smaller than the 2x2 window");
  return Shape{in[0], in[1] / 2, in[2] / 2, in[3]};
}

// Forward records which of the four positions won (the first on ties) as one byte per
// output; backward then reads those bytes and dY, not the whole input again, which halves
// its memory traffic (this layer is bound by memory, not arithmetic). Channels are
// contiguous, so both run a vector of channels at a time (conv2d_cpu_kernels.h),
// with selects rather than branches: which position wins is data-dependent, and branches
// would mispredict. Leftover channels (C not a multiple of the vector width) take the scalar loop.
namespace {

typedef std::int32_t Ints __attribute__((vector_size(cpu::kLanes * 4)));
typedef std::uint8_t Bytes __attribute__((vector_size(cpu::kLanes)));

// Index 0..3 of the first of a, b, e, f equal to their maximum m.
template <class T>
T first_max_index(T a, T b, T e, T m, T one, T zero) {
  const T is_a = a == m ? one : zero;
  const T is_b = b == m ? one - is_a : zero;
  const T is_e = e == m ? one - is_a - is_b : zero;
  const T is_f = one - is_a - is_b - is_e;
  return is_b + 2 * is_e + 3 * is_f;
}

}  // namespace

void MaxPool2D::forward_cpu(const Tensor& x, Tensor& y) {
  const std::int64_t h = x.dim(1), w = x.dim(2), c = x.dim(3), oh = h / 2, ow = w / 2;
  const std::int64_t cv = c - c % cpu::kLanes;  // channels done as whole vectors
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
          for (std::int64_t ch = 0; ch < cv; ch += cpu::kLanes) {
            const cpu::Vec a = cpu::load(x00 + ch), b = cpu::load(x01 + ch);
            const cpu::Vec e = cpu::load(x10 + ch), f = cpu::load(x11 + ch);
            const cpu::Vec ab = a >= b ? a : b, ef = e >= f ? e : f;
            const cpu::Vec m = ab >= ef ? ab : ef;
            cpu::store(yp + o + ch, m);
            const cpu::Vec idx = first_max_index(a, b, e, m, cpu::splat(1.0f), cpu::Vec{});
            const Bytes q = __builtin_convertvector(__builtin_convertvector(idx, Ints), Bytes);
            __builtin_memcpy(ap + o + ch, &q, sizeof q);
          }
          for (std::int64_t ch = cv; ch < c; ++ch) {
            const float m = std::max(std::max(x00[ch], x01[ch]), std::max(x10[ch], x11[ch]));
            yp[o + ch] = m;
            ap[o + ch] = static_cast<std::uint8_t>(first_max_index(x00[ch], x01[ch], x10[ch], m, 1.0f, 0.0f));
          }
        }
  });
}

void MaxPool2D::backward_cpu(const Tensor& dy, Tensor& dx) {
  if (!dx.defined()) return;
  const std::int64_t h = x_.dim(1), w = x_.dim(2), c = x_.dim(3), oh = h / 2, ow = w / 2;
  const std::int64_t cv = c - c % cpu::kLanes;
  const std::uint8_t* ap = argmax_.data<std::uint8_t>();
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
          float* d00 = dxp + ((n * h + 2 * i) * w + 2 * j) * c;
          float* d01 = d00 + c;
          float* d10 = d00 + w * c;
          float* d11 = d10 + c;
          // The gradient is only selected, never combined, so an inf or NaN reaches the
          // winner alone.
          for (std::int64_t ch = 0; ch < cv; ch += cpu::kLanes) {
            Bytes qb;
            __builtin_memcpy(&qb, ap + o + ch, sizeof qb);
            const cpu::Vec q = __builtin_convertvector(__builtin_convertvector(qb, Ints), cpu::Vec);
            const cpu::Vec g = cpu::load(dyp + o + ch), zero{};
            cpu::store(d00 + ch, q == 0.0f ? g : zero);
            cpu::store(d01 + ch, q == 1.0f ? g : zero);
            cpu::store(d10 + ch, q == 2.0f ? g : zero);
            cpu::store(d11 + ch, q == 3.0f ? g : zero);
          }
          for (std::int64_t ch = cv; ch < c; ++ch) {
            const int q = ap[o + ch];
            const float g = dyp[o + ch];
            d00[ch] = q == 0 ? g : 0.0f;
            d01[ch] = q == 1 ? g : 0.0f;
            d10[ch] = q == 2 ? g : 0.0f;
            d11[ch] = q == 3 ? g : 0.0f;
          }
        }
      }
    }
  });
}

}  // namespace mf
