// fused_wmma.cuh: what the fused convolution's Tensor Core kernels share (fused_conv_tc.cu,
// the forward; fused_dgrad_tc.cuh, the data gradient): the two precisions' warp matrix
// shapes. TF32 multiplicands in FP32 (m16n16k8), half ones in FP16 (m16n16k16), f32 sums.
#pragma once
#include <cuda_fp16.h>
#include <mma.h>

namespace mf::fused_detail {

// What differs between the two precisions: the multiplicand type, the k of one product,
// and TF32's rounding of each loaded element (the CUDA guide leaves unrounded ones undefined).
template <class T>
struct Mma;
template <>
struct Mma<float> {
  using Precision = nvcuda::wmma::precision::tf32;
  static constexpr int kStep = 8;
  template <class Frag>
  __device__ static void round(Frag& f) {
    for (int i = 0; i < f.num_elements; ++i) f.x[i] = nvcuda::wmma::__float_to_tf32(f.x[i]);
  }
};
template <>
struct Mma<__half> {
  using Precision = __half;
  static constexpr int kStep = 16;
  template <class Frag>
  __device__ static void round(Frag&) {}
};

}  // namespace mf::fused_detail
