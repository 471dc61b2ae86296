// fuzz_image.cpp: libFuzzer target for what predict does to an untrusted image file:
// decode_gray_image (stb_image: PNG, JPEG, BMP) then mnist_preprocess. Only
// ImageError may come out. The pixel limit is lowered to 4 Mpixel: a header claiming a big
// image makes a slow but bounded decode (what kMaxImagePixels is for), and under the
// sanitizers that would only slow the search for memory errors.
#include <cstddef>
#include <cstdint>

#include "apps/image.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const mf::apps::GrayImage img = mf::apps::decode_gray_image(data, size, "fuzz-input", std::int64_t{1} << 22);
    const auto x = mf::apps::mnist_preprocess(img, "fuzz-input");
    if (x.size() != 28 * 28) __builtin_trap();
    for (float v : x)
      if (!(v >= 0.0f && v <= 1.0f)) __builtin_trap();
  } catch (const mf::apps::ImageError&) {
  }
  return 0;
}
