// dataset_key.h: what identifies a dataset's contents, so that a copy of it (the GPU's
// resident copy) is made again only when the data changed.
#pragma once
#include <cstddef>
#include <cstdint>

#include "data/mnist.h"

namespace mf::data {

// Where its bytes are, its sizes, and a hash of every label and every pixel. Another
// dataset, or the same vectors refilled or edited in place (one pixel is enough), changes it.
// The hash reads the bytes at memory speed (a few ms for MNIST's 47 MB, about an upload's
// own time); a sample of the pixels missed edits that fell between the samples.
struct DataKey {
  const void* images = nullptr;
  const void* labels = nullptr;
  std::int64_t count = -1, rows = 0, cols = 0, channels = 0;
  std::uint64_t hash = 0;
  bool operator==(const DataKey& o) const {
    return images == o.images && labels == o.labels && count == o.count && rows == o.rows && cols == o.cols &&
           channels == o.channels && hash == o.hash;
  }
};

DataKey data_key(const Dataset& d);

// A 64-bit hash of n bytes, four 8-byte words at a time in four independent lanes (so the
// multiplies overlap). Each step, (lane ^ word) * odd, is one-to-one in the lane for a given
// word: a lane that differs stays different, so any single changed word changes the result.
std::uint64_t hash_bytes(const std::uint8_t* p, std::size_t n, std::uint64_t seed);

}  // namespace mf::data
