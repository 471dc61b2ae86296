// conv2d_cpu_kernels.h: the register-tiled micro-kernels of the CPU convolution.
//
// A convolution is a matrix product whose left matrix is never built ("implicit GEMM"):
// in NHWC the k*k*C inputs of output pixel (n, oh, ow) are k runs of k*C contiguous floats,
// one per kernel row, `row_stride` = W*C floats apart. So the product can read x directly:
//
//   y[p][o] = b[o] + sum over r < k, j < k*C of  x[in_p + r*row_stride + j] * Wt[r*k*C + j][o]
//
// with Wt the kernel transposed to (k*k*C, K). A tile of kRows pixels x kVecs*16 filters
// keeps its kRows*kVecs accumulators in vector registers (24 of AVX-512's 32), and each
// step of the sum costs kVecs loads of Wt, kRows broadcasts of x and kRows*kVecs FMAs:
// enough arithmetic per load to keep both FMA units of a core busy.
//
// Vec is a GCC/Clang vector of one register's width: 16 floats with AVX-512 (32 registers,
// so 24 accumulators per tile), else 8 floats (AVX2's 16 registers: 12 accumulators and at
// most 2 vectors of filters per tile). The same source serves both; the build's -march
// decides (MF_CPU_ARCH).
#pragma once
#include <cstdint>
#include <type_traits>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace mf::cpu {

#if defined(__AVX512F__)
constexpr int kLanes = 16;     // floats per vector register
constexpr int kTileRegs = 24;  // accumulators per tile
constexpr int kMaxVecs = 4;    // vectors of filters per tile
#else
constexpr int kLanes = 8;
constexpr int kTileRegs = 12;
constexpr int kMaxVecs = 2;
#endif
typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));

// The widest tile (in vectors, a power of two up to kMaxVecs) whose width divides n.
inline int vecs_for(std::int64_t n) {
  for (int v = kMaxVecs; v > 1; v /= 2)
    if (n % (v * kLanes) == 0) return v;
  return 1;
}

inline Vec load(const float* p) {
  Vec v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, Vec v) { __builtin_memcpy(p, &v, sizeof v); }
// s in every lane: one vbroadcastss. (s - 0 is exactly s for every float, -0 included, so
// the compiler drops the subtraction; "0 + s" would not be exact for -0 and is kept.)
inline Vec splat(float s) { return s - Vec{}; }
// ReLU as PyTorch and TensorFlow have it: NaN passes through (a NaN weight or input then
// reaches the loss, where training stops on it, instead of vanishing at the next layer).
// One compare and one masked move, as for "v > 0 ? v : 0".
inline Vec relu(Vec v) { return v <= 0.0f ? Vec{} : v; }
inline float relu(float v) { return v <= 0.0f ? 0.0f : v; }

// One forward tile: rows pixels (kRows at compile time) x kVecs*16 filters from o0.
//   in[i]  first input of pixel i's receptive field (its top-left, channel 0)
//   out[i] output row of pixel i (K floats); writes out[i][o0 .. o0 + 16*kVecs)
//   wt     (k*run, K) transposed kernel; bias may be null (no bias)
template <int kRows, int kVecs>
inline void conv_tile(const float* const* in, std::int64_t row_stride, std::int64_t k, std::int64_t run,
                      const float* wt, std::int64_t K, std::int64_t o0, const float* bias, bool apply_relu,
                      float* const* out) {
  Vec acc[kRows][kVecs];
  for (int v = 0; v < kVecs; ++v) {
    const Vec b = bias ? load(bias + o0 + v * kLanes) : Vec{};
    for (int i = 0; i < kRows; ++i) acc[i][v] = b;
  }
  for (std::int64_t r = 0; r < k; ++r) {
    const float* w = wt + r * run * K + o0;
    const std::int64_t off = r * row_stride;
    for (std::int64_t j = 0; j < run; ++j, w += K) {
      Vec wv[kVecs];
      for (int v = 0; v < kVecs; ++v) wv[v] = load(w + v * kLanes);
      for (int i = 0; i < kRows; ++i) {
        const Vec a = splat(in[i][off + j]);
        for (int v = 0; v < kVecs; ++v) acc[i][v] += a * wv[v];
      }
    }
  }
  for (int i = 0; i < kRows; ++i)
    for (int v = 0; v < kVecs; ++v) store(out[i] + o0 + v * kLanes, apply_relu ? relu(acc[i][v]) : acc[i][v]);
}

// One weight-gradient tile: ACCUMULATES into dwt rows j0 .. j0+kRows (input index within
// the receptive field, all in one kernel row: offset = r*row_stride + (j0 - r*run)), columns
// o0 .. o0 + 16*kVecs, the sum over npix pixels of x[in_p + offset + i] * dz_p[o].
template <int kRows, int kVecs>
inline void wgrad_tile(const float* const* in, const float* const* dz, std::int64_t npix, std::int64_t offset,
                       std::int64_t o0, float* dwt, std::int64_t K) {
  Vec acc[kRows][kVecs];
  for (int i = 0; i < kRows; ++i)
    for (int v = 0; v < kVecs; ++v) acc[i][v] = load(dwt + i * K + o0 + v * kLanes);
  for (std::int64_t p = 0; p < npix; ++p) {
    Vec d[kVecs];
    for (int v = 0; v < kVecs; ++v) d[v] = load(dz[p] + o0 + v * kLanes);
    const float* x = in[p] + offset;
    for (int i = 0; i < kRows; ++i) {
      const Vec a = splat(x[i]);
      for (int v = 0; v < kVecs; ++v) acc[i][v] += a * d[v];
    }
  }
  for (int i = 0; i < kRows; ++i)
    for (int v = 0; v < kVecs; ++v) store(dwt + i * K + o0 + v * kLanes, acc[i][v]);
}

// One data-gradient tile, the transpose of conv_tile: for pixels i of the tile and inputs
// j0 .. j0 + 16*kVecs of their receptive fields (within one kernel row, at `offset` from
// the field's start), ADDS sum over o < K of dz_i[o] * W[o][j] into dx. W is the kernel
// (K, kkC) as stored, w = W + (r*run + j0). Overlapping fields of neighbouring pixels are
// added one after the other, so the caller only has to keep threads on separate images.
template <int kRows, int kVecs>
inline void dgrad_tile(const float* const* dz, float* const* dx, std::int64_t offset, const float* w,
                       std::int64_t kk_c, std::int64_t K) {
  Vec acc[kRows][kVecs];
  for (int i = 0; i < kRows; ++i)
    for (int v = 0; v < kVecs; ++v) acc[i][v] = Vec{};
  for (std::int64_t o = 0; o < K; ++o, w += kk_c) {
    Vec wv[kVecs];
    for (int v = 0; v < kVecs; ++v) wv[v] = load(w + v * kLanes);
    for (int i = 0; i < kRows; ++i) {
      const Vec a = splat(dz[i][o]);
      for (int v = 0; v < kVecs; ++v) acc[i][v] += a * wv[v];
    }
  }
  for (int i = 0; i < kRows; ++i)
    for (int v = 0; v < kVecs; ++v) {
      float* d = dx[i] + offset + v * kLanes;
      store(d, load(d) + acc[i][v]);
    }
}

// ---- Sparse gradients ----
// Behind ReLU and 2x2 max-pooling, most of the gradient reaching a convolution's output is
// exactly zero: pooling passes each window's gradient to one of its four positions, ReLU
// zeroes the rest, and rows and columns the pooling floor drops get none at all (for the
// model's second convolution, 11x11 -> 5x5, about 80 % zeros). The dense tiles above
// multiply those zeros anyway. The sparse path lists the nonzero entries (pack_nonzeros)
// and does work in proportion to the list, with one kernel (sparse_rows_sum) for both
// gradients:
//   data gradient    dx[field of p] += sum over p's nonzero filters o of dz[p][o] * W[o][.]
//   weight gradient  dW[o][.]       += sum over the pixels p where o is nonzero of dz[p][o] * x[field of p]
// Same sums, other order; fewer operations per load than a dense tile, but far fewer of them.

// Appends the nonzero entries of dz[0 .. K) as (o, dz[o]) to idx/val and returns their
// count. Writes up to kLanes slots past the last entry it keeps (the caller leaves room).
// NaN and inf count as nonzero, so they reach the gradients as in the dense path.
inline int pack_nonzeros(const float* dz, std::int64_t K, std::int32_t* idx, float* val) {
  int n = 0;
  std::int64_t o = 0;
#if defined(__AVX512F__)
  // Compress in registers, then store whole vectors (a masked compress to memory is slow
  // on some cores); the next store overwrites the junk past the kept lanes.
  const __m512i lanes = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  for (; o + 16 <= K; o += 16) {
    const __m512 v = _mm512_loadu_ps(dz + o);
    const __mmask16 keep = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_NEQ_UQ);
    const __m512i i = _mm512_add_epi32(lanes, _mm512_set1_epi32(static_cast<std::int32_t>(o)));
    _mm512_storeu_ps(val + n, _mm512_maskz_compress_ps(keep, v));
    _mm512_storeu_si512(idx + n, _mm512_maskz_compress_epi32(keep, i));
    // The count goes through _cvtmask16_u32 (kmovw into a 32-bit register, upper bits
    // zero) rather than __builtin_popcount(keep): GCC 12 with -fsanitize=thread spills the
    // 16-bit mask with kmovw and counts the 32 bits at that stack slot, stale upper half
    // included, so n overran the row and a thread's entries ran into the next's.
    n += __builtin_popcount(_cvtmask16_u32(keep));
  }
#endif
  for (; o < K; ++o) {  // branch-free: always write, advance only past a nonzero
    idx[n] = static_cast<std::int32_t>(o);
    val[n] = dz[o];
    n += !(dz[o] == 0.0f);
  }
  return n;
}

// out[0 .. kV*kLanes) += sum over e < n of val[e] * rows[idx[e] * stride + (0 .. kV*kLanes)]:
// a sparse vector times the rows of a dense matrix, kV vectors of the rows at a time, the
// sums in registers.
template <int kV>
inline void sparse_rows_sum(const float* rows, std::int64_t stride, const std::int32_t* idx, const float* val,
                            std::int64_t n, float* out) {
  Vec acc[kV];
  for (int v = 0; v < kV; ++v) acc[v] = Vec{};
  for (std::int64_t e = 0; e < n; ++e) {
    const float* row = rows + idx[e] * stride;
    const Vec a = splat(val[e]);
    for (int v = 0; v < kV; ++v) acc[v] += a * load(row + v * kLanes);
  }
  for (int v = 0; v < kV; ++v) store(out + v * kLanes, load(out + v * kLanes) + acc[v]);
}

// Calls f(std::integral_constant<int, n>) for n (1 .. kMax) chosen at run time: the tile
// templates take their sizes at compile time, and the last, partial tile of a range needs
// a smaller one.
template <int kMax, class F>
inline void with_count(int n, F&& f) {
  if constexpr (kMax >= 1) {
    if (n == kMax) return f(std::integral_constant<int, kMax>{});
    with_count<kMax - 1>(n, f);
  }
}
template <int kVecs, class F>
inline void with_rows(int rows, F&& f) {
  with_count<kTileRegs / kVecs>(rows, f);
}
// Vectors of a receptive-field row sparse_rows_sum takes at a time.
constexpr int kMaxChunkVecs = kTileRegs / 3;

// Calls f(j0, std::integral_constant<int, vecs>) over [0, n) floats (a multiple of kLanes)
// in chunks of at most kMaxChunkVecs vectors.
template <class F>
inline void for_each_chunk(std::int64_t n, F&& f) {
  for (std::int64_t j0 = 0; j0 < n; j0 += kMaxChunkVecs * kLanes) {
    const int vecs = static_cast<int>(n - j0 >= kMaxChunkVecs * kLanes ? kMaxChunkVecs : (n - j0) / kLanes);
    with_count<kMaxChunkVecs>(vecs, [&](auto v) { f(j0, v); });
  }
}

// y (N, H-k+1, W-k+1, K) = conv(x (N, H, W, C), Wt) [+ bias] [ReLU], Wt the kernel
// transposed to (k*k*C, K), with K a multiple of kLanes; tiles dealt to the CPU threads.
// (A dense layer is the case H = W = k = 1.) Defined in conv2d_cpu.cpp.
void conv_forward(std::int64_t n, std::int64_t h, std::int64_t w, std::int64_t c, std::int64_t k, const float* x,
                  const float* wt, std::int64_t K, const float* bias, bool relu, float* y);

}  // namespace mf::cpu
