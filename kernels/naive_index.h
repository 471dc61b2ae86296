// naive_index.h: where each element of a convolution's and a dense layer's tensors lives,
// for the naive rung's CPU loops (kernels/cpu/naive.cpp) and its CUDA kernels
// (kernels/gpu/naive.cu). Both use these same functions, so what a loop nest indexes on the
// CPU is what a thread indexes on the GPU. Activations are NHWC, the convolution's kernel
// (K, k, k, C), the dense layer's (in, units); stride 1, no padding.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define MF_HOST_DEVICE __host__ __device__
#else
#define MF_HOST_DEVICE
#endif

namespace mf::naive {

// n images of h x w x c, k x k kernels, oh x ow outputs of `filters` channels.
struct Conv {
  std::int64_t n, h, w, c, k, filters, oh, ow;
  MF_HOST_DEVICE std::int64_t x_at(std::int64_t img, std::int64_t row, std::int64_t col, std::int64_t ch) const {
    return ((img * h + row) * w + col) * c + ch;
  }
  MF_HOST_DEVICE std::int64_t y_at(std::int64_t img, std::int64_t i, std::int64_t j, std::int64_t f) const {
    return ((img * oh + i) * ow + j) * filters + f;
  }
  MF_HOST_DEVICE std::int64_t w_at(std::int64_t f, std::int64_t r, std::int64_t s, std::int64_t ch) const {
    return ((f * k + r) * k + s) * c + ch;
  }
};

inline Conv conv_sizes(std::int64_t n, std::int64_t h, std::int64_t w, std::int64_t c, std::int64_t k,
                       std::int64_t filters) {
  return Conv{n, h, w, c, k, filters, h - k + 1, w - k + 1};
}

// n samples of `in` features to `units` outputs: x (n, in), w (in, units), y (n, units).
struct Dense {
  std::int64_t n, in, units;
  MF_HOST_DEVICE std::int64_t x_at(std::int64_t s, std::int64_t i) const { return s * in + i; }
  MF_HOST_DEVICE std::int64_t y_at(std::int64_t s, std::int64_t u) const { return s * units + u; }
  MF_HOST_DEVICE std::int64_t w_at(std::int64_t i, std::int64_t u) const { return i * units + u; }
};

}  // namespace mf::naive
