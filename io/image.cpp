// image.cpp: decoding, MNIST-style preprocessing and PNG encoding (see image.h).
#include "io/image.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <memory>

#include "io/atomic_file.h"
#include "io/image_checks.h"

#define STBI_NO_STDIO
#define STBI_WRITE_NO_STDIO
#include <stb_image.h>
#include <stb_image_resize.h>
#include <stb_image_write.h>

namespace mf::io {

namespace {

using detail::be32;
using detail::bmp_header_truncation;
using detail::bmp_layout;
using detail::bmp_palette_overrun;
using detail::bmp_truncation;
using detail::BmpLayout;
using detail::jpeg_dht_overflows;
using detail::jpeg_truncated;
using detail::png_chunks;
using detail::PngChunks;

constexpr std::size_t kMaxFileBytes = std::size_t{1} << 30;  // 1 GiB: no digit photo is bigger
constexpr int kMinContrast = 32;      // grey levels of ink above the background, else blank
constexpr float kNoiseFraction = 0.2f;  // ink below this fraction of the strongest is noise

struct StbiFree {
  void operator()(stbi_uc* p) const { stbi_image_free(p); }
};

// The formats stb_impl.cpp decodes, told apart by their first bytes as stb's own probes do:
// the 8-byte PNG signature, a JPEG's SOI marker (FF D8, after any FF fill bytes), "BM".
enum class Format { kUnknown, kPng, kJpeg, kBmp };

Format detect_format(const std::uint8_t* p, std::size_t size) {
  static const std::uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (size >= 8 && std::equal(kPng, kPng + 8, p)) return Format::kPng;
  if (size >= 2 && p[0] == 'B' && p[1] == 'M') return Format::kBmp;
  std::size_t i = 0;
  while (i < size && p[i] == 0xff) ++i;
  return i > 0 && i < size && p[i] == 0xd8 ? Format::kJpeg : Format::kUnknown;
}

const char* format_name(Format f) {
  switch (f) {
    case Format::kPng: return "PNG";
    case Format::kJpeg: return "JPEG";
    case Format::kBmp: return "BMP";
    case Format::kUnknown: break;
  }
  return "image";
}

// stb's reason for refusing a file, or "" where it is not the decoder's own: stb keeps the
// last complaint of any format it probed ("bad png sig" for a JPEG, "no SOI" for a PNG) and
// builds a PNG's from the bytes of a chunk type, which may be cut short or binary.
std::string stb_detail() {
  const char* r = stbi_failure_reason();
  const std::string why = r ? r : "";
  for (const char* probe : {"bad png sig", "no SOI", "not BMP", "unknown image type"})
    if (why == probe) return "";
  for (const char c : why)
    if (c < ' ' || c > '~') return "";
  return why;
}

std::uint8_t median(std::vector<std::uint8_t> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

}  // namespace

GrayImage decode_gray_image(const std::uint8_t* bytes, std::size_t size, const std::string& name,
                            std::int64_t max_pixels) {
  if (size == 0) throw ImageError(name, "empty file (0 bytes), not an image");
  if (size > static_cast<std::size_t>(INT_MAX)) throw ImageError(name, "file too large for an image decoder");
  const int len = static_cast<int>(size);
  const Format format = detect_format(bytes, size);
  if (format == Format::kUnknown)
    throw ImageError(name, "not a readable image: its first bytes match no PNG, JPEG or BMP file");
  const std::string kind = format_name(format);
  // A file cut short says so before stb looks at it: stb's own reasons for it are cryptic.
  PngChunks png;
  if (format == Format::kPng) {
    png = png_chunks(bytes, size);
    if (!png.cut.empty()) throw ImageError(name, "truncated PNG: " + png.cut);
    if (!png.bad_length.empty())
      throw ImageError(name, "corrupt PNG: its " + png.bad_length +
                                 " chunk's length is over 2^31 - 1 bytes, more than the format allows");
    if (!png.bad_crc.empty())
      throw ImageError(name, "corrupt PNG: the checksum (CRC) of its " + png.bad_crc +
                                 " chunk does not match its contents (a damaged copy or download?)");
    // stbi_info gives no reason when it refuses a header, so a PNG it refuses for its size
    // would read "corrupt": look at its header (IHDR, the first chunk) first.
    if (size >= 24 && std::equal(bytes + 12, bytes + 16, "IHDR")) {
      const std::uint32_t pw = be32(bytes + 16), ph = be32(bytes + 20);
      if (pw == 0 || ph == 0)
        throw ImageError(name, "zero-size image (" + std::to_string(pw) + "x" + std::to_string(ph) + ")");
      if (pw > static_cast<std::uint32_t>(kMaxImageSide) || ph > static_cast<std::uint32_t>(kMaxImageSide))
        throw ImageError(name, "image is " + std::to_string(pw) + "x" + std::to_string(ph) + " pixels, more than " +
                                   std::to_string(kMaxImageSide) + " a side: refusing to decode it");
    }
  }
  if (format == Format::kJpeg) {
    if (jpeg_dht_overflows(bytes, size))
      throw ImageError(name, "corrupt JPEG: a Huffman table holds more than 256 codes");
    if (jpeg_truncated(bytes, size))
      throw ImageError(name, "truncated JPEG: the file (" + std::to_string(size) +
                                 " bytes) ends before its end-of-image marker (FF D9)");
  }
  if (format == Format::kBmp) {
    const std::string cut = bmp_header_truncation(bytes, size);
    if (!cut.empty()) throw ImageError(name, "truncated BMP: " + cut);
  }
  // Header only: the size is checked before a single pixel is decoded or allocated.
  int w = 0, h = 0, comp = 0;
  if (!stbi_info_from_memory(bytes, len, &w, &h, &comp))
    throw ImageError(name, "corrupt or unsupported " + kind + ": stb_image cannot read its header");
  // A top-down BMP stores its height negated; stbi_info passes it on as it is (stb decodes
  // such a file the right way up).
  const std::int64_t width = w, height = format == Format::kBmp && h < 0 ? -std::int64_t{h} : h;
  const std::string size_text = std::to_string(width) + "x" + std::to_string(height);
  if (width <= 0 || height <= 0) throw ImageError(name, "zero-size image (" + size_text + ")");
  if (width > kMaxImageSide || height > kMaxImageSide)
    throw ImageError(name, "image is " + size_text + " pixels, more than " + std::to_string(kMaxImageSide) +
                               " a side: refusing to decode it");
  if (width * height > max_pixels)
    throw ImageError(name, "image is " + size_text + " pixels, more than " + std::to_string(max_pixels >> 20) +
                               " Mpixel: refusing to decode it");
  if (format == Format::kBmp) {
    const BmpLayout layout = bmp_layout(bytes, width);
    const std::string cut = bmp_truncation(layout, size, height);
    if (!cut.empty()) throw ImageError(name, "truncated BMP: " + cut);
    const std::string past = bmp_palette_overrun(bytes, layout, width, height);
    if (!past.empty()) throw ImageError(name, "corrupt BMP: " + past);
  }
  w = static_cast<int>(width), h = static_cast<int>(height);
  // A grey or RGB PNG with a tRNS chunk (one transparent level or colour, as optimisers
  // write an on/off alpha channel) has alpha too, though stbi_info counts 1 or 3 channels:
  // stb adds the alpha channel when it decodes. A palette's tRNS is in comp already.
  const bool alpha = comp == 2 || comp == 4 || (format == Format::kPng && png.colour_key);
  const int want = alpha ? 2 : 1;  // grey (+ alpha)
  int w2 = 0, h2 = 0, c2 = 0;
  stb_ran_out_of_memory();  // forget any earlier failure
  std::unique_ptr<stbi_uc, StbiFree> px(stbi_load_from_memory(bytes, len, &w2, &h2, &c2, want));
  if (!px) {
    const std::string why = stb_detail();
    // stb could not allocate its buffers (a 16-bit RGBA image takes 8 bytes a pixel, and
    // more while it is inflated): the file is fine, the memory is short. Its reason does not
    // always say so, hence the allocation check.
    if (stb_ran_out_of_memory() || why == "outofmem")
      throw ImageError(name, "out of host memory decoding this " + size_text + " " + kind +
                                 "; free some memory, or give a smaller image");
    throw ImageError(name, "corrupt or unsupported " + kind +
                               (why.empty() ? " (stb_image gives no reason)" : " (stb_image: " + why + ")"));
  }
  if (w2 != w || h2 != h) throw ImageError(name, "the image's header and its data disagree on its size");

  GrayImage img;
  img.width = w;
  img.height = h;
  const std::size_t n = static_cast<std::size_t>(w) * static_cast<std::size_t>(h);
  img.pixels.resize(n);
  const stbi_uc* p = px.get();
  if (!alpha) {
    std::copy(p, p + n, img.pixels.begin());
    return img;
  }
  // Composite over the opposite of the strokes' shade: the mean grey of the opaque pixels
  // says whether they are dark (then white paper behind them) or light (then black).
  double sum = 0;
  std::size_t opaque = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (p[2 * i + 1] >= 128) sum += p[2 * i], ++opaque;
  const int bg = opaque == 0 || sum / static_cast<double>(opaque) < 128 ? 255 : 0;
  for (std::size_t i = 0; i < n; ++i) {
    const int g = p[2 * i], a = p[2 * i + 1];
    img.pixels[i] = static_cast<std::uint8_t>((g * a + bg * (255 - a) + 127) / 255);
  }
  return img;
}

GrayImage read_gray_image(const std::string& path) {
  // A file that starts like no image is refused from its first bytes, not read whole first
  // (/dev/zero would fill 1 GiB before the size limit stopped it). Only 0xFF fill bytes
  // could still become a JPEG's start; the decoder judges an empty or short file.
  const HeadCheck starts_like_an_image = [&](const std::string& head) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(head.data());
    const bool all_fill = std::all_of(p, p + head.size(), [](std::uint8_t b) { return b == 0xff; });
    if (!all_fill && detect_format(p, head.size()) == Format::kUnknown)
      throw ImageError(path, "not a readable image: its first bytes match no PNG, JPEG or BMP file");
  };
  std::string bytes;
  try {
    bytes = read_file_bytes(path, kMaxFileBytes, starts_like_an_image);
  } catch (const ImageError&) {
    throw;
  } catch (const std::runtime_error& e) {
    throw ImageError(path, without_path(path, e.what()));
  }
  return decode_gray_image(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size(), path);
}

std::vector<float> mnist_preprocess(const GrayImage& image, const std::string& name) {
  const int w = image.width, h = image.height;
  if (w <= 0 || h <= 0 || image.pixels.size() != static_cast<std::size_t>(w) * static_cast<std::size_t>(h))
    throw ImageError(name, "empty or inconsistent image");
  auto at = [&](int x, int y) { return image.pixels[static_cast<std::size_t>(y) * w + x]; };

  // 1. Background from the border; invert dark-on-light.
  std::vector<std::uint8_t> border;
  for (int x = 0; x < w; ++x) border.push_back(at(x, 0)), border.push_back(at(x, h - 1));
  for (int y = 1; y + 1 < h; ++y) border.push_back(at(0, y)), border.push_back(at(w - 1, y));
  int bg = median(border);
  const bool invert = bg > 127;
  if (invert) bg = 255 - bg;

  // 2. Ink above the background; blank check; contrast stretch; noise floor.
  std::vector<int> ink(image.pixels.size());
  int strongest = 0;
  for (std::size_t i = 0; i < ink.size(); ++i) {
    const int v = invert ? 255 - image.pixels[i] : image.pixels[i];
    ink[i] = std::max(0, v - bg);
    strongest = std::max(strongest, ink[i]);
  }
  if (strongest < kMinContrast)
    throw ImageError(name, "no ink: the image is blank (nothing stands out from its " +
                               std::string(invert ? "light" : "dark") + " background)");
  const int floor_level = static_cast<int>(std::ceil(kNoiseFraction * static_cast<float>(strongest)));
  int x0 = w, y0 = h, x1 = -1, y1 = -1;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      int& v = ink[static_cast<std::size_t>(y) * w + x];
      if (v < floor_level) {
        v = 0;
        continue;
      }
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }

  // 3. Crop to the ink's bounding box, scale the longer side to 20 px.
  const int cw = x1 - x0 + 1, ch = y1 - y0 + 1;
  std::vector<float> crop(static_cast<std::size_t>(cw) * ch);
  for (int y = 0; y < ch; ++y)
    for (int x = 0; x < cw; ++x)
      crop[static_cast<std::size_t>(y) * cw + x] =
          static_cast<float>(ink[static_cast<std::size_t>(y + y0) * w + (x + x0)]) / static_cast<float>(strongest);
  const int longer = std::max(cw, ch);
  const int sw = std::max(1, static_cast<int>(std::lround(static_cast<double>(cw) * kMnistBox / longer)));
  const int sh = std::max(1, static_cast<int>(std::lround(static_cast<double>(ch) * kMnistBox / longer)));
  std::vector<float> scaled(static_cast<std::size_t>(sw) * sh);
  if (!stbir_resize_float(crop.data(), cw, ch, 0, scaled.data(), sw, sh, 0, 1))
    throw ImageError(name, "resizing the digit failed");
  // The resampling filters (Mitchell, Catmull-Rom) overshoot a little next to edges.
  for (float& v : scaled) v = std::clamp(v, 0.0f, 1.0f);

  // 4. Centre of mass onto the centre of the 28x28 field. Pixel centres sit at i + 0.5, so
  //    the field's centre is 14.0 in those coordinates: shift = round(14 - (com + 0.5)).
  double mass = 0, mx = 0, my = 0;
  for (int y = 0; y < sh; ++y)
    for (int x = 0; x < sw; ++x) {
      const double v = scaled[static_cast<std::size_t>(y) * sw + x];
      mass += v, mx += v * x, my += v * y;
    }
  if (!(mass > 0)) throw ImageError(name, "no ink left after scaling the digit to 20 px");
  const double half = kMnistSide / 2.0;
  const int dx = static_cast<int>(std::lround(half - 0.5 - mx / mass));
  const int dy = static_cast<int>(std::lround(half - 0.5 - my / mass));
  std::vector<float> out(static_cast<std::size_t>(kMnistSide) * kMnistSide, 0.0f);
  for (int y = 0; y < sh; ++y)
    for (int x = 0; x < sw; ++x) {
      const int ox = x + dx, oy = y + dy;
      if (ox < 0 || oy < 0 || ox >= kMnistSide || oy >= kMnistSide) continue;
      // Quantise to 8 bits as the MNIST files are, then / 255 as the training pixels are.
      const float v = scaled[static_cast<std::size_t>(y) * sw + x];
      out[static_cast<std::size_t>(oy) * kMnistSide + ox] = std::round(v * 255.0f) / 255.0f;
    }
  return out;
}

namespace {
void append_bytes(void* context, void* data, int size) {
  static_cast<std::string*>(context)->append(static_cast<const char*>(data), static_cast<std::size_t>(size));
}
}  // namespace

std::string encode_png(int width, int height, int channels, const std::uint8_t* pixels) {
  if (width <= 0 || height <= 0 || channels < 1 || channels > 4)
    throw std::invalid_argument("encode_png: bad image size or channel count");
  std::string out;
  if (!stbi_write_png_to_func(append_bytes, &out, width, height, channels, pixels, width * channels))
    throw std::runtime_error("PNG encoding failed");
  return out;
}

void write_png(const std::string& path, int width, int height, int channels, const std::uint8_t* pixels) {
  const std::string png = encode_png(width, height, channels, pixels);
  write_bytes_atomic(path, png.data(), png.size());
}

bool image_info(const std::string& path, int* width, int* height, int* channels) {
  std::string bytes;
  try {
    bytes = read_file_bytes(path, kMaxFileBytes);
  } catch (const std::runtime_error&) {
    return false;
  }
  if (bytes.empty() || bytes.size() > static_cast<std::size_t>(INT_MAX)) return false;
  if (!stbi_info_from_memory(reinterpret_cast<const stbi_uc*>(bytes.data()), static_cast<int>(bytes.size()), width,
                             height, channels))
    return false;
  if (height && *height < 0 && *height != INT_MIN) *height = -*height;  // a top-down BMP (see decode_gray_image)
  return true;
}

}  // namespace mf::io
