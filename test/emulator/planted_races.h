// planted_races.h: kernels with the synchronisation bugs the CUDA emulation must expose, each
// beside its correct twin (planted_races.cu), for test_emulated_races.cpp. Pointers are
// emulated device memory, which is host memory; every call has finished when it returns.
#pragma once

namespace mf::planted {

// out[b] = sum of block b's 256-element chunk of x (blocks * 256 elements), through shared
// memory; `sync` false leaves out the __syncthreads() between writing and reading it.
void block_sums(const float* x, int blocks, bool sync, float* out);

// *out = sum of x (blocks * 32 elements): each block writes its chunk's sum to partials, and
// the last block to finish adds them in block order. `trust_index` makes the block with the
// largest index take itself for the last one instead of counting. *counter must be zero; the
// last block leaves it so.
void last_block_sum(const float* x, int blocks, bool trust_index, float* partials, unsigned* counter, float* out);

// *out += each block's chunk sum (32 elements a block), by one float atomicAdd per block.
void atomic_sum(const float* x, int blocks, float* out);

// d (16 x 16, row-major) = a (16 x 8, row-major) b (8 x 16, row-major) on the emulated
// Tensor Cores (TF32, one warp): the lanes stage a in shared memory and the warp loads its
// fragment from there; `sync` false leaves out the __syncwarp() between the two.
void wmma_product(const float* a, const float* b, bool sync, float* d);

}  // namespace mf::planted
