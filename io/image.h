// image.h: image files for predict: decoding (stb_image), MNIST-style preprocessing of a
// photographed or drawn digit, and PNG encoding (stb_image_write).
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/file_error.h"

namespace mf::io {

// An image file cannot be used. what() is one line: "<path>: <problem>".
class ImageError : public FileError {
 public:
  ImageError(const std::string& path, const std::string& problem) : FileError(Kind::kImage, path, problem) {}
};

// Largest width or height, and pixel count, decoded: checked from the header, before any
// pixel is decoded, so that a 40-byte file claiming 10000 x 10000 pixels costs nothing.
// 64 Mpixel is more than any phone camera's photo.
constexpr int kMaxImageSide = 16384;
constexpr std::int64_t kMaxImagePixels = std::int64_t{1} << 26;

// 8-bit grey, row-major, 0 black .. 255 white.
struct GrayImage {
  int width = 0, height = 0;
  std::vector<std::uint8_t> pixels;
};

// Decodes PNG, JPEG or BMP bytes to grey (stb's luma weights
// 77/150/29 of 256); top-down BMPs (negative height) too. A transparent image is composited
// over the opposite of its strokes' shade (dark strokes over white, light strokes over
// black), so a digit drawn on a transparent canvas keeps its contrast. Throws ImageError
// (`name` stands in for the path) for an empty input, an unknown format (told by the first
// bytes), a file cut short (a PNG before IEND, a JPEG before its end marker, a BMP short of
// the pixel bytes its header gives: stb would fill them with zeros), a broken one ("corrupt
// or unsupported PNG", with stb's reason), a zero or absurd size (over kMaxImageSide a side
// or `max_pixels` in all).
GrayImage decode_gray_image(const std::uint8_t* bytes, std::size_t size, const std::string& name,
                            std::int64_t max_pixels = kMaxImagePixels);
GrayImage read_gray_image(const std::string& path);

constexpr int kMnistSide = 28;   // MNIST images are 28x28
constexpr int kMnistBox = 20;    // the digit is scaled to fit 20x20 inside them

// Makes a digit image look like an MNIST sample, as MNIST itself was made:
//   1. the background is the median of the border pixels; a light background (> 127) means
//      dark ink on paper, so the image is inverted to MNIST's white ink on black;
//   2. ink = grey level above the background, stretched so the strongest stroke is 255;
//      below 20 % of that is noise (paper texture, JPEG ringing) and is set to 0. If the
//      strongest stroke is under 32 grey levels above the background the image is blank:
//      ImageError "no ink";
//   3. crop to the bounding box of the ink, scale it (stb_image_resize, f32, antialiased)
//      so the longer side is 20 px, keeping the aspect ratio;
//   4. paste it into a 28x28 black image so that its centre of mass lands on the centre.
// Returns 28 * 28 floats in [0, 1] (pixels / 255), row-major: one (28, 28, 1) sample.
std::vector<float> mnist_preprocess(const GrayImage& image, const std::string& name);

// PNG bytes of a w x h image with `channels` (1 grey, 3 RGB, 4 RGBA) 8-bit channels, rows
// packed. Throws std::runtime_error if the encoder fails.
std::string encode_png(int width, int height, int channels, const std::uint8_t* pixels);
// encode_png, written atomically (atomic_file.h).
void write_png(const std::string& path, int width, int height, int channels, const std::uint8_t* pixels);

// Width, height and channel count from an image file's header (stbi_info), or false.
bool image_info(const std::string& path, int* width, int* height, int* channels);

// Whether an allocation of stb_image's failed since the last call (stb_impl.cpp); the call
// starts afresh.
bool stb_ran_out_of_memory();

}  // namespace mf::io
