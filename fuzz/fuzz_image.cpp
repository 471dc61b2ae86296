// fuzz_image.cpp: libFuzzer target for what predict does to an untrusted image file:
// decode_gray_image (stb_image: PNG, JPEG, BMP) then mnist_preprocess. Only
// ImageError may come out. The pixel limit is lowered to 4 Mpixel: a header claiming a big
// image makes a slow but bounded decode (what kMaxImagePixels is for), and under the
// sanitizers that would only slow the search for memory errors.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include <zlib.h>

#include "io/image.h"

namespace {
// A PNG's chunks with their CRCs made right: decode_gray_image refuses a chunk whose CRC
// does not match (as libpng does), so a mutated PNG would stop there and never reach stb's
// decoder, which is what is searched. Other formats, and whatever follows a chunk that runs
// past the end, are left as they are.
std::vector<std::uint8_t> with_png_crcs_fixed(const std::uint8_t* data, std::size_t size) {
  std::vector<std::uint8_t> b(data, data + size);
  if (size < 8 || std::memcmp(data, "\x89PNG\r\n\x1a\n", 8) != 0) return b;
  for (std::size_t pos = 8; pos + 12 <= size;) {
    const std::uint64_t len = (std::uint64_t{b[pos]} << 24) | (b[pos + 1] << 16) | (b[pos + 2] << 8) | b[pos + 3];
    if (len > size - pos - 12) break;
    const std::size_t end = pos + 8 + static_cast<std::size_t>(len);
    const auto crc = static_cast<std::uint32_t>(crc32_z(0L, b.data() + pos + 4, end - pos - 4));
    for (int i = 0; i < 4; ++i) b[end + i] = static_cast<std::uint8_t>(crc >> (24 - 8 * i));
    pos = end + 4;
  }
  return b;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const std::vector<std::uint8_t> bytes = with_png_crcs_fixed(data, size);
    const mf::io::GrayImage img =
        mf::io::decode_gray_image(bytes.data(), bytes.size(), "fuzz-input", std::int64_t{1} << 22);
    const auto x = mf::io::mnist_preprocess(img, "fuzz-input");
    if (x.size() != 28 * 28) __builtin_trap();
    for (float v : x)
      if (!(v >= 0.0f && v <= 1.0f)) __builtin_trap();
  } catch (const mf::io::ImageError&) {
  }
  return 0;
}
