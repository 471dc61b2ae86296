// conv2d.h: the CPU's convolution kernels, for layers/conv2d_cpu.cpp: NHWC activations,
// stride 1, "valid" padding, the kernel (K, k, k, C), the batch split across threads. Three
// ways to compute the same products (the layer's file says which runs when):
// conv2d_direct.cpp, conv2d_implicit.cpp (register-tiled implicit GEMM and sparse
// gradients, on conv2d_cpu_kernels.h) and conv2d_im2col.cpp (im2col + Eigen GEMMs).
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace mf::cpu {

constexpr std::int64_t kTargetBlockRows = 512;  // output pixels per GEMM block
constexpr std::int64_t kMaxDirectInputs = 32;   // kkC up to this takes the direct path
// The sparse weight gradient reads receptive-field rows of a block of input images in no
// particular order: blocks of images whose inputs fit in a core's L1 data cache (48 KB on
// the cores measured; 2 MNIST feature maps of 13x13x32 floats) keep those reads out of L2.
constexpr std::int64_t kL1Bytes = 48 * 1024;
// The implicit backward when it listed dZ's nonzeros, as --verbose names it: cpu_config()
// adds how sparse dZ was.
inline constexpr char kImplicitListed[] = "implicit GEMM";  // one address in every file


// A convolution's sizes: n images of h x w x c, k x k kernels, oh x ow outputs of `filters`.
struct ConvGeom {
  std::int64_t n, h, w, c, k, oh, ow, kk_c, filters;
  std::int64_t pixels() const { return oh * ow; }
  // Where, in a batch of input images, output pixel p's receptive field starts (its top-left
  // input, channel 0); p counts the output pixels of the whole batch.
  std::int64_t field(std::int64_t p) const {
    const std::int64_t q = p % pixels();
    return ((p / pixels() * h + q / ow) * w + q % ow) * c;
  }
  std::int64_t images_per_block() const { return std::max<std::int64_t>(1, kTargetBlockRows / pixels()); }
  std::int64_t images_per_l1() const {
    return std::max<std::int64_t>(1, kL1Bytes / (h * w * c * static_cast<std::int64_t>(sizeof(float))));
  }
};

inline ConvGeom conv_geometry(std::int64_t n, std::int64_t h, std::int64_t w, std::int64_t c, std::int64_t k,
                              std::int64_t filters) {
  ConvGeom g{};
  g.n = n, g.h = h, g.w = w, g.c = c, g.k = k;
  g.oh = h - k + 1, g.ow = w - k + 1, g.kk_c = k * k * c, g.filters = filters;
  return g;
}

// What the kernels keep between calls (their buffers) and report (what ran, for --verbose).
struct ConvCpuState {
  std::vector<float> scratch;  // per-thread im2col and gradient buffers
  // The implicit backward: the output gradient's nonzero entries, pixel by pixel, and, per
  // thread, the same entries regrouped by filter.
  std::vector<float> nz_val;
  std::vector<std::int32_t> nz_idx;
  std::vector<std::int64_t> nz_rows;
  // What ran last, and how sparse dZ was when the implicit backward listed its nonzeros:
  // threads' shares done sparse (of all), the fraction of dZ entries nonzero and the
  // threshold below which a share goes sparse.
  const char* forward = nullptr;
  const char* backward = nullptr;
  struct Sparsity {
    int sparse_shares = 0, shares = 0;
    double nonzero = 0, threshold = 0;
  } sparsity;
};

// Forward: y = conv(x, w) + b, then ReLU when `relu`. Backward: dz = dy masked where y was
// not positive (with `relu`), dw += conv_filter(x, dz), db += sum of dz, and, when dx is not
// null, dx = conv_data(w, dz) (written whole).

// Direct: few inputs per output (k*k*C up to kMaxDirectInputs); its backward only for the
// first layer's 3x3, 1 channel, 32 filters, without dx.
void conv_forward_direct(ConvCpuState& st, const ConvGeom& g, const float* x, const float* w, const float* b,
                         bool relu, float* y);
void conv_backward_direct_3x3x1(ConvCpuState& st, const ConvGeom& g, const float* x, const float* y, const float* dy,
                                bool relu, float* dw, float* db);
// Implicit GEMM: filters a multiple of the vector width (kLanes); the backward also needs
// k*C a multiple of it when dx is asked for. Below `sparse_below` of dZ's entries nonzero
// (0: never) the gradients come from lists of its nonzero entries.
void conv_forward_implicit(ConvCpuState& st, const ConvGeom& g, const float* x, const float* w, const float* b,
                           bool relu, float* y);
void conv_backward_implicit(ConvCpuState& st, const ConvGeom& g, const float* x, const float* y, const float* dy,
                            const float* w, bool relu, double sparse_below, float* dw, float* db, float* dx);
// im2col + Eigen GEMMs: any shape.
void conv_forward_im2col(ConvCpuState& st, const ConvGeom& g, const float* x, const float* w, const float* b,
                         bool relu, float* y);
void conv_backward_im2col(ConvCpuState& st, const ConvGeom& g, const float* x, const float* y, const float* dy,
                          const float* w, bool relu, float* dw, float* db, float* dx);

// "fwd direct; bwd implicit GEMM, sparse lists: 2 of 2 thread shares sparse; ...".
std::string describe(const ConvCpuState& st);

// Shared by the paths: x lowered to the column matrix and back, and W transposed.
// col rows for images [n0, n1): row (n, oh, ow), columns (r, s, c).
void im2col(const ConvGeom& g, const float* x, std::int64_t n0, std::int64_t n1, float* col);
// dx[n, oh+r, ow .. ow+k-1, :] += dcol rows, for images [n0, n1) (dx zeroed by the caller).
void col2im_add(const ConvGeom& g, const float* dcol, std::int64_t n0, std::int64_t n1, float* dx);
// W (K, kkC) -> Wt (kkC, K)
void transpose_weights(const ConvGeom& g, const float* w, float* wt);

}  // namespace mf::cpu
