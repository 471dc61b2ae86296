// channel_util.h: training data for the model tests on both devices: a synthetic task the
// CNN learns in a few dozen steps, and images with channels checked against one channel.
// Header-only, so that the kernel tests, which link no layers, can keep test_util.cpp
// without them.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "data/mnist.h"
#include "tensor/rng.h"
#include "train/sequential.h"

namespace mf::testing {

// 28x28 images whose class is where a bright 5x5 square sits (two rows of five places) on a
// dim noisy background: a task the CNN learns in a few dozen steps.
inline data::Dataset synthetic(std::int64_t count, std::uint64_t seed) {
  data::Dataset d;
  d.count = count, d.rows = 28, d.cols = 28;
  d.images.resize(static_cast<std::size_t>(count * 28 * 28));
  d.labels.resize(static_cast<std::size_t>(count));
  Rng rng(seed);
  for (std::int64_t i = 0; i < count; ++i) {
    const int label = static_cast<int>(rng.below(10));
    d.labels[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(label);
    std::uint8_t* img = d.images.data() + i * 28 * 28;
    for (int p = 0; p < 28 * 28; ++p) img[p] = static_cast<std::uint8_t>(rng.below(40));
    const int r0 = (label / 5) * 14 + 4, c0 = (label % 5) * 5 + 2;
    for (int r = r0; r < r0 + 5; ++r)
      for (int c = c0; c < c0 + 5; ++c) img[r * 28 + c] = static_cast<std::uint8_t>(200 + rng.below(56));
  }
  return d;
}

// `d`'s images as channel `at` of `channels`, every other channel 0 (black), interleaved as
// a 4-D IDX file holds them.
inline data::Dataset in_channel(const data::Dataset& d, std::int64_t channels, std::int64_t at) {
  data::Dataset w = d;
  w.channels = channels;
  w.images.assign(d.images.size() * static_cast<std::size_t>(channels), 0);
  for (std::size_t i = 0; i < d.images.size(); ++i) w.images[i * channels + at] = d.images[i];
  return w;
}

// Gives `wide`, built like `narrow` but for images with more channels, `narrow`'s function
// on in_channel(images, .., at): its first layer (a Conv2D, kernel (filters, k, k, channels))
// gets `narrow`'s filters on input channel `at` and keeps its own weights on the others,
// which see only zeros; every other parameter is `narrow`'s. Both models on the CPU.
inline void copy_into_channel(Sequential& narrow, Sequential& wide, std::int64_t at) {
  const std::vector<Parameter*> from = narrow.parameters(), to = wide.parameters();
  ASSERT_EQ(from.size(), to.size());
  for (std::size_t i = 0; i < from.size(); ++i) {
    const float* src = from[i]->value.data<float>();
    float* dst = to[i]->value.data<float>();
    if (i == 0) {
      const std::int64_t wide_c = to[0]->value.dim(3);
      ASSERT_EQ(from[0]->value.dim(3), 1);
      ASSERT_EQ(from[0]->value.numel() * wide_c, to[0]->value.numel());
      for (std::int64_t j = 0; j < from[0]->value.numel(); ++j) dst[j * wide_c + at] = src[j];
    } else {
      ASSERT_EQ(from[i]->value.shape(), to[i]->value.shape()) << i;
      std::copy(src, src + from[i]->value.numel(), dst);
    }
  }
}

}  // namespace mf::testing
