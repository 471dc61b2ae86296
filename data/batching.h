// batching.h: deterministic per-epoch shuffles and gathering mini-batches as float tensors.
//
// The shuffle must not depend on the standard library: std::shuffle and the std::*_distribution
// algorithms are implementation-defined, so libstdc++, libc++ and MSVC give different orders.
// Here the generator (xoshiro256**, seeded through SplitMix64), the unbiased bounded integer and
// the Fisher-Yates loop are all our own code, so a (seed, epoch) pair means the same order anywhere.
#pragma once
#include <cstdint>
#include <vector>

#include "data/mnist.h"
#include "tensor/rng.h"

namespace mf::data {

// xoshiro256** (tensor/rng.h, the weights' generator too) with the shuffle's own bounded draw.
class ShuffleRng {
 public:
  explicit ShuffleRng(std::uint64_t seed) : rng_(seed) {}
  std::uint64_t next() { return rng_.next_u64(); }
  // Uniform in [0, bound), bound >= 1, without modulo bias: draws below 2^64 mod bound are
  // rejected, so the accepted range is a whole number of copies of [0, bound).
  std::uint64_t bounded(std::uint64_t bound);

 private:
  Rng rng_;
};

// The generator for one epoch: seed and epoch are hashed together (SplitMix64 finalizer), so
// every epoch of a run, and every seed, gets an unrelated stream.
ShuffleRng epoch_rng(std::uint64_t seed, int epoch);

// A permutation of 0..n-1 (Fisher-Yates, from the top down, j = bounded(i + 1)) drawn from
// epoch_rng(seed, epoch). Same output on every platform. Throws std::invalid_argument unless
// 0 <= n <= INT32_MAX.
std::vector<std::int32_t> epoch_permutation(std::int64_t n, std::uint64_t seed, int epoch);

// ceil(n / batch_size): the last, partial batch is kept, as Keras does. Throws
// std::invalid_argument unless n >= 0 and batch_size >= 1.
std::int64_t num_batches(std::int64_t n, std::int64_t batch_size);

// Number of samples in batch `batch` (0-based): batch_size, except the last one may be smaller.
// Throws std::invalid_argument unless 0 <= batch < num_batches(n, batch_size).
std::int64_t batch_length(std::int64_t n, std::int64_t batch_size, std::int64_t batch);

// Writes sample indices[0..n) of d, in that order: x_out gets n * d.sample_size() floats
// (image after image, row-major), each pixel p as float(p) / 255.0f, the correctly rounded
// float quotient, identical to Keras's x.astype("float32") / 255 (255 -> 1.0f exactly, 0 -> 0);
// y_out gets the n labels. Either output may be null to skip it. Overwrites, never
// accumulates. Throws std::out_of_range for an index outside [0, d.count).
void gather_batch(const Dataset& d, const std::int32_t* indices, std::int64_t n, float* x_out,
                  std::int32_t* y_out);

}  // namespace mf::data
