// dataset_key.cpp: the dataset's identity and its byte hash.
#include "data/dataset_key.h"

#include <cstring>

namespace mf::data {

std::uint64_t hash_bytes(const std::uint8_t* p, std::size_t n, std::uint64_t seed) {
  constexpr std::uint64_t kOdd = 0x9E3779B97F4A7C15ull;
  std::uint64_t lane[4] = {seed ^ n, seed + 1, seed + 2, seed + 3};
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int j = 0; j < 4; ++j) {
      std::uint64_t w;
      std::memcpy(&w, p + i + 8 * j, 8);
      lane[j] = (lane[j] ^ w) * kOdd;
    }
  for (; i < n; ++i) lane[0] = (lane[0] ^ p[i]) * kOdd;
  std::uint64_t h = lane[0];
  for (int j = 1; j < 4; ++j) h = (h * kOdd) ^ lane[j];
  return h;
}

DataKey data_key(const Dataset& d) {
  DataKey k;
  k.images = d.images.data();
  k.labels = d.labels.data();
  k.count = d.count, k.rows = d.rows, k.cols = d.cols, k.channels = d.channels;
  k.hash = hash_bytes(d.images.data(), d.images.size(), hash_bytes(d.labels.data(), d.labels.size(), 0));
  return k;
}

}  // namespace mf::data
