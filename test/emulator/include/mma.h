// mma.h for the CPU emulation: the part of CUDA's warp matrix functions (nvcuda::wmma, the
// C++ face of the Tensor Cores) that kernels/gpu/*.cu use, for the shapes they use:
// m16n16k8 with TF32 multiplicands and m16n16k16 with half ones, f32 accumulators.
//
// On a GPU a fragment is spread over the warp's 32 lanes in a mapping CUDA leaves
// unspecified (CUDA C++ Programming Guide, "Warp Matrix Functions": "the mapping of matrix
// elements into fragment internal storage is unspecified"), so a kernel may only fill it,
// load and store it, multiply it, or change every element x[0 .. num_elements - 1] alike.
// Here each lane holds the whole tile (num_elements is the tile's size, 256 or 128 rather
// than a GPU's 8 or 4): any kernel that keeps to those rules gets the same tile.
//
// What it checks, from the guide: the pointer of a load or store is 256-bit (32-byte)
// aligned and ldm a multiple of 16 bytes; a TF32 multiplicand's elements were rounded with
// __float_to_tf32 before the product (the guide leaves unconverted ones undefined). The
// functions make the block one whose threads run at once, and none of them waits for the
// other lanes: a store is made by lane 0 alone, so a lane that reads another's part of a
// stored tile without a __syncwarp() between may see it unwritten, and a store that comes
// while another lane still reads the tile's previous contents overwrites them, as on a GPU
// (there each lane writes its own part); a load sees the others' writes only after a
// __syncwarp(). Each lane computes the whole product itself, 32 times the work.
// What it cannot: the GPU's order of summation inside a product (here k by k in f32; the
// tests' tolerances allow for the difference).
#pragma once
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "test/emulator/cuda_emulator.h"

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
namespace precision {
struct tf32 {};
}  // namespace precision
enum layout_t { mem_row_major, mem_col_major };

namespace detail {
// What a fragment of multiplicand type T stores: tf32 in a float, as on a GPU.
template <class T>
struct storage {
  using type = T;
};
template <>
struct storage<precision::tf32> {
  using type = float;
};
template <class Use, int M, int N, int K>
struct dims;
template <int M, int N, int K>
struct dims<matrix_a, M, N, K> {
  static constexpr int rows = M, cols = K;
};
template <int M, int N, int K>
struct dims<matrix_b, M, N, K> {
  static constexpr int rows = K, cols = N;
};
template <int M, int N, int K>
struct dims<accumulator, M, N, K> {
  static constexpr int rows = M, cols = N;
};
inline void check_access(const void* p, unsigned ldm, std::size_t element_bytes, const char* what) {
  if (reinterpret_cast<std::uintptr_t>(p) % 32 != 0)
    throw std::runtime_error(std::string("emulated wmma: ") + what + " pointer not 256-bit aligned");
  if (ldm * element_bytes % 16 != 0)
    throw std::runtime_error(std::string("emulated wmma: ") + what + " ldm of " + std::to_string(ldm) +
                             " elements is not a multiple of 16 bytes");
}
// A warp function: the block's threads must run at once (cuda_emulator.h, launch).
inline void warp_function() { mf::emulator::sync_point(); }
inline float to_float(float v) { return v; }
inline void check_tf32(const float* x, int n) {
  for (int i = 0; i < n; ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, &x[i], sizeof bits);
    if ((bits & 0x1fffu) != 0 && (bits & 0x7f800000u) != 0x7f800000u)
      throw std::runtime_error("emulated wmma: a tf32 multiplicand not rounded with __float_to_tf32");
  }
}
inline float to_float(__half v) { return __half2float(v); }
}  // namespace detail

// Stored row by row: element (i, j) of the tile is x[i * cols + j].
template <class Use, int M, int N, int K, class T, class Layout = void>
class fragment {
 public:
  using element_type = typename detail::storage<T>::type;
  static constexpr int rows = detail::dims<Use, M, N, K>::rows, cols = detail::dims<Use, M, N, K>::cols;
  static constexpr int num_elements = rows * cols;
  element_type x[num_elements];
};

template <class Use, int M, int N, int K, class T, class Layout>
void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, const typename fragment<Use, M, N, K, T, Layout>::element_type& v) {
  for (auto& e : f.x) e = v;
}

// Multiplicands: the layout is the fragment's.
template <class Use, int M, int N, int K, class T, class Layout, class P>
void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const P* p, unsigned ldm) {
  using F = fragment<Use, M, N, K, T, Layout>;
  static_assert(!std::is_void<Layout>::value, "an accumulator's load names its layout");
  detail::check_access(p, ldm, sizeof(P), "load_matrix_sync");
  detail::warp_function();
  constexpr bool row = std::is_same<Layout, row_major>::value;
  for (int i = 0; i < F::rows; ++i)
    for (int j = 0; j < F::cols; ++j) f.x[i * F::cols + j] = p[row ? i * ldm + j : j * ldm + i];
}

template <int M, int N, int K>
void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f, unsigned ldm, layout_t layout) {
  using F = fragment<accumulator, M, N, K, float>;
  detail::check_access(p, ldm, sizeof(float), "store_matrix_sync");
  detail::warp_function();
  if (mf::emulator::this_thread % mf::emulator::kWarp != 0) return;
  for (int i = 0; i < F::rows; ++i)
    for (int j = 0; j < F::cols; ++j) p[layout == mem_row_major ? i * ldm + j : j * ldm + i] = f.x[i * F::cols + j];
}

// d = a b + c, in f32, k by k.
template <int M, int N, int K, class T, class LayoutA, class LayoutB>
void mma_sync(fragment<accumulator, M, N, K, float>& d, const fragment<matrix_a, M, N, K, T, LayoutA>& a,
              const fragment<matrix_b, M, N, K, T, LayoutB>& b, const fragment<accumulator, M, N, K, float>& c) {
  detail::warp_function();
  if constexpr (std::is_same<T, precision::tf32>::value) {
    detail::check_tf32(a.x, M * K);
    detail::check_tf32(b.x, K * N);
  }
  float fa[M * K], fb[N * K];  // b transposed: column j's k entries together
  for (int i = 0; i < M * K; ++i) fa[i] = detail::to_float(a.x[i]);
  for (int k = 0; k < K; ++k)
    for (int j = 0; j < N; ++j) fb[j * K + k] = detail::to_float(b.x[k * N + j]);
  fragment<accumulator, M, N, K, float> out;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      float acc = c.x[i * N + j];
      for (int k = 0; k < K; ++k) acc += fa[i * K + k] * fb[j * K + k];
      out.x[i * N + j] = acc;
    }
  d = out;
}

// f rounded to TF32 (10 bits of mantissa), to nearest with ties away from zero as the
// GPU's cvt.rna.tf32.f32 does; infinities and NaNs pass unchanged.
inline float __float_to_tf32(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7f800000u) != 0x7f800000u) bits = (bits + 0x1000u) & ~0x1fffu;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

}  // namespace nvcuda::wmma
