// compare.cu: counts the 32-bit words in which two buffers differ, for doctor --burn, which
// compares every product of its GEMM stress test with the first one bit for bit.
//
// A bitwise test, not a tolerance: cuBLAS gives the same bits for the same problem on the
// same GPU, so any difference is a fault of the hardware or the driver (and NaN, which is
// never equal to itself as a float, is equal to itself as a word).
#include <algorithm>
#include <cstdint>

#include "runtime/cuda_check.h"
#include "runtime/kernel_util.cuh"
#include "kernels/gpu/launchers.h"

namespace mf {

namespace {

using namespace gpu;

constexpr int kWarp = 32;

// *count += the number of i < n with a[i] != b[i]. Grid-stride; each warp adds its total
// with one atomic, and only when it is not zero (the usual case: no atomics at all).
__global__ void count_mismatch_kernel(const std::uint32_t* __restrict__ a, const std::uint32_t* __restrict__ b,
                                      std::int64_t n, unsigned long long* count) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  unsigned long long local = 0;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    local += a[i] != b[i];
  for (int offset = kWarp / 2; offset > 0; offset /= 2) local += __shfl_xor_sync(0xffffffffu, local, offset);
  if ((threadIdx.x & (kWarp - 1)) == 0 && local != 0) atomicAdd(count, local);
}

}  // namespace

void launch_count_mismatch(const std::uint32_t* a, const std::uint32_t* b, std::int64_t n, unsigned long long* count,
                           GpuStream stream) {
  if (n <= 0) return;
  // Four blocks an SM are enough to keep the memory system busy on a stream of 32-bit words;
  // more would only mean more warps' atomics.
  const int blocks = static_cast<int>(std::min<std::int64_t>(blocks_for(n), 4 * sm_count()));
  count_mismatch_kernel<<<blocks, kBlock, 0, stream>>>(a, b, n, count);
  MF_CHECK_LAUNCH();
}

}  // namespace mf
