// maxpool2d_cpu.cpp: 2x2/2 max pooling on the CPU, NHWC, the batch split across threads.
// The innermost loop runs over channels, which are contiguous, so it vectorises.
#include <algorithm>
#include <cstring>

#include "kernels/cpu/conv2d_cpu_kernels.h"
#include "layers/maxpool2d.h"
#include "runtime/parallel.h"

namespace mf {

Shape MaxPool2D::output_shape(const Shape& in) const {
  check_input(in, {-1, -1, -1, -1});
  if (in[1] < 2 || in[2] < 2)
    throw std::invalid_argument(label() + ": input " + in.str() + " is smaller than the 2x2 window");
  return Shape{in[0], in[1] / 2, in[2] / 2, in[3]};
}

// Forward records which of the four positions won (take_max below) as one byte per
// output; backward then reads those bytes and dY, not the whole input again, which halves
// its memory traffic (this layer is bound by memory, not arithmetic). Channels are
// contiguous, so both run a vector of channels at a time (conv2d_cpu_kernels.h),
// with selects rather than branches: which position wins is data-dependent, and branches
// would mispredict. Leftover channels (C not a multiple of the vector width) take the scalar loop.
namespace {

typedef std::int32_t Ints __attribute__((vector_size(cpu::kLanes * 4)));
typedef std::uint8_t Bytes __attribute__((vector_size(cpu::kLanes)));

// Which input wins a window: the first NaN if there is one (a NaN input gives a NaN output,
// which reaches the loss and stops the run, as in PyTorch and on the GPU path,
// kernels/gpu/maxpool.cu), else the first of the largest values. Done as a tournament, (a, b)
// and (e, f), then the two winners, carrying each value's position 0..3 along.
//
// (a, ia) when a >= b (the first of equal values) or a is NaN, else (b, ib), a NaN b
// included. Works on one float or, lane by lane, on a vector of them.
template <class T, class I>
void take_max(T a, I ia, T b, I ib, T& m, I& im) {
  const auto take_a = (a >= b) | (a != a);
  m = take_a ? a : b;
  im = take_a ? ia : ib;
}

}  // namespace

void MaxPool2D::forward_cpu(const Tensor& x, Tensor& y) {
  const std::int64_t h = x.dim(1), w = x.dim(2), c = x.dim(3), oh = h / 2, ow = w / 2;
  const std::int64_t cv = c - c % cpu::kLanes;  // channels done as whole vectors
  ensure(argmax_, y.shape(), DType::kU8, Device::kCpu);
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  std::uint8_t* ap = argmax_.data<std::uint8_t>();
  const cpu::Vec k0{}, k1 = cpu::splat(1.0f), k2 = cpu::splat(2.0f), k3 = cpu::splat(3.0f);  // positions
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
            cpu::Vec ab, ef, m, iab, ief, idx;
            take_max(a, k0, b, k1, ab, iab);
            take_max(e, k2, f, k3, ef, ief);
            take_max(ab, iab, ef, ief, m, idx);
            cpu::store(yp + o + ch, m);
            const Bytes q = __builtin_convertvector(__builtin_convertvector(idx, Ints), Bytes);
            __builtin_memcpy(ap + o + ch, &q, sizeof q);
          }
          for (std::int64_t ch = cv; ch < c; ++ch) {
            float ab, ef, m;
            int iab, ief, idx;
            take_max(x00[ch], 0, x01[ch], 1, ab, iab);
            take_max(x10[ch], 2, x11[ch], 3, ef, ief);
            take_max(ab, iab, ef, ief, m, idx);
            yp[o + ch] = m;
            ap[o + ch] = static_cast<std::uint8_t>(idx);
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
