// batching.cpp: per-epoch shuffles and the pixel-to-float batch gather.
#include "data/batching.h"

#include <array>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

namespace mf::data {
namespace {

// float(p) / 255.0f for every byte: a table lookup is cheaper than a divide per pixel.
const std::array<float, 256>& pixel_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int p = 0; p < 256; ++p) t[p] = static_cast<float>(p) / 255.0f;
    return t;
  }();
  return table;
}

}  // namespace

std::uint64_t ShuffleRng::bounded(std::uint64_t bound) {
  if (bound == 0) throw std::invalid_argument("ShuffleRng::bounded: bound must be >= 1");
  // (2^64 - bound) mod bound == 2^64 mod bound: the size of the biased low range to reject.
  const std::uint64_t threshold = (0 - bound) % bound;
  while (true) {
    const std::uint64_t r = next();
    if (r >= threshold) return r % bound;
  }
}

ShuffleRng epoch_rng(std::uint64_t seed, int epoch) {
  const std::uint64_t e = static_cast<std::uint64_t>(static_cast<std::int64_t>(epoch));
  return ShuffleRng(Rng::mix64(Rng::mix64(seed) ^ (e + Rng::kGoldenGamma)));
}

std::vector<std::int32_t> epoch_permutation(std::int64_t n, std::uint64_t seed, int epoch) {
  if (n < 0 || n > std::numeric_limits<std::int32_t>::max()) {
    throw std::invalid_argument("epoch_permutation: n must be in [0, 2^31 - 1], got " + std::to_string(n));
  }
  std::vector<std::int32_t> p(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) p[i] = static_cast<std::int32_t>(i);
  ShuffleRng rng = epoch_rng(seed, epoch);
  for (std::int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<std::int64_t>(rng.bounded(static_cast<std::uint64_t>(i) + 1));
    std::swap(p[i], p[j]);
  }
  return p;
}

std::int64_t num_batches(std::int64_t n, std::int64_t batch_size) {
  if (n < 0 || batch_size < 1) {
    throw std::invalid_argument("num_batches: need n >= 0 and batch_size >= 1, got n = " + std::to_string(n) +
                                ", batch_size = " + std::to_string(batch_size));
  }
  return n / batch_size + (n % batch_size != 0);  // ceil without overflowing n + batch_size
}

std::int64_t batch_length(std::int64_t n, std::int64_t batch_size, std::int64_t batch) {
  const std::int64_t nb = num_batches(n, batch_size);
  if (batch < 0 || batch >= nb) {
    throw std::invalid_argument("batch_length: batch " + std::to_string(batch) + " is not in [0, " +
                                std::to_string(nb) + ")");
  }
  return batch + 1 < nb ? batch_size : n - batch * batch_size;
}

void gather_batch(const Dataset& d, const std::int32_t* indices, std::int64_t n, float* x_out,
                  std::int32_t* y_out) {
  check_dataset(d, "gather_batch");
  if (n < 0) throw std::invalid_argument("gather_batch: n must be >= 0, got " + std::to_string(n));
  const std::array<float, 256>& table = pixel_table();
  const std::int64_t size = d.sample_size();
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t idx = indices[i];
    if (idx < 0 || idx >= d.count) {
      throw std::out_of_range("gather_batch: indices[" + std::to_string(i) + "] = " + std::to_string(idx) +
                              " is outside [0, " + std::to_string(d.count) + ")");
    }
    if (x_out) {
      const std::uint8_t* src = d.images.data() + idx * size;
      float* dst = x_out + i * size;
      for (std::int64_t k = 0; k < size; ++k) dst[k] = table[src[k]];
    }
    if (y_out) y_out[i] = d.labels[static_cast<std::size_t>(idx)];
  }
}

}  // namespace mf::data
