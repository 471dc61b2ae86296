// planted_races.cu: the kernels of planted_races.h. Compiled for the CUDA emulation only
// (translate_launches), never for a GPU: they exist to show that the emulation turns each
// bug into a wrong result.
#include "test/emulator/planted_races.h"

#include "test/emulator/cuda_emulator.h"
#include "test/emulator/include/mma.h"

namespace mf::planted {

namespace {

constexpr int kThreads = 256;

template <bool kSync>
__global__ void block_sums_kernel(const float* x, float* out) {
  __shared__ float part[kThreads];
  const int t = threadIdx.x;
  part[t] = x[blockIdx.x * kThreads + t];
  if (kSync) __syncthreads();
  if (t == 0) {
    float total = 0.0f;
    for (int k = 0; k < kThreads; ++k) total += part[k];  // without the barrier: other warps' parts unwritten
    out[blockIdx.x] = total;
  }
}

constexpr int kChunk = 32;

template <bool kTrustIndex>
__global__ void last_block_sum_kernel(const float* x, float* partials, unsigned* counter, float* out) {
  __shared__ bool last;
  if (threadIdx.x == 0) {
    float s = 0.0f;
    for (int k = 0; k < kChunk; ++k) s += x[blockIdx.x * kChunk + k];
    partials[blockIdx.x] = s;
    __threadfence();
    const bool counted_last = atomicAdd(counter, 1u) == gridDim.x - 1;
    last = kTrustIndex ? blockIdx.x == gridDim.x - 1 : counted_last;  // the bug: the index says nothing
  }
  __syncthreads();
  if (!last || threadIdx.x != 0) return;
  __threadfence();
  float total = 0.0f;
  for (unsigned b = 0; b < gridDim.x; ++b) total += partials[b];
  *out = total;
  *counter = 0;
}

__global__ void atomic_sum_kernel(const float* x, float* out) {
  if (threadIdx.x != 0) return;
  float s = 0.0f;
  for (int k = 0; k < kChunk; ++k) s += x[blockIdx.x * kChunk + k];
  atomicAdd(out, s);
}

struct alignas(32) WmmaStage {
  float a[16][8];
};

template <bool kSync>
__global__ void wmma_product_kernel(const float* a, const float* b, float* d) {
  using namespace nvcuda;
  __shared__ WmmaStage st;
  for (int i = static_cast<int>(threadIdx.x); i < 16 * 8; i += 32) st.a[i / 8][i % 8] = a[i];
  if (kSync) __syncwarp();  // without it: a lane may load the tile before the others wrote theirs
  wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc;
  wmma::load_matrix_sync(fa, &st.a[0][0], 8);
  wmma::load_matrix_sync(fb, b, 16);
  for (int i = 0; i < fa.num_elements; ++i) fa.x[i] = wmma::__float_to_tf32(fa.x[i]);
  for (int i = 0; i < fb.num_elements; ++i) fb.x[i] = wmma::__float_to_tf32(fb.x[i]);
  wmma::fill_fragment(acc, 0.0f);
  wmma::mma_sync(acc, fa, fb, acc);
  wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);
}

}  // namespace

void wmma_product(const float* a, const float* b, bool sync, float* d) {
  if (sync) wmma_product_kernel<true><<<1, 32, 0, nullptr>>>(a, b, d);
  else wmma_product_kernel<false><<<1, 32, 0, nullptr>>>(a, b, d);
}

void block_sums(const float* x, int blocks, bool sync, float* out) {
  if (sync) block_sums_kernel<true><<<blocks, kThreads, 0, nullptr>>>(x, out);
  else block_sums_kernel<false><<<blocks, kThreads, 0, nullptr>>>(x, out);
}

void last_block_sum(const float* x, int blocks, bool trust_index, float* partials, unsigned* counter, float* out) {
  if (trust_index) last_block_sum_kernel<true><<<blocks, kChunk, 0, nullptr>>>(x, partials, counter, out);
  else last_block_sum_kernel<false><<<blocks, kChunk, 0, nullptr>>>(x, partials, counter, out);
}

void atomic_sum(const float* x, int blocks, float* out) { atomic_sum_kernel<<<blocks, kChunk, 0, nullptr>>>(x, out); }

}  // namespace mf::planted
