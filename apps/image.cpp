// image.cpp: decoding, MNIST-style preprocessing and PNG encoding (see image.h).
#include "apps/image.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <memory>

#include "apps/atomic_file.h"

#define STBI_NO_STDIO
#define STBI_WRITE_NO_STDIO
#include <stb_image.h>
#include <stb_image_resize.h>
#include <stb_image_write.h>

namespace mf::apps {

namespace {

constexpr std::size_t kMaxFileBytes = std::size_t{1} << 30;  // 1 GiB: no digit photo is bigger
constexpr int kMinContrast = 32;      // grey levels of ink above the background, else blank
constexpr float kNoiseFraction = 0.2f;  // ink below this fraction of the strongest is noise

struct StbiFree {
  void operator()(stbi_uc* p) const { stbi_image_free(p); }
};

std::string stb_reason() {
  const char* r = stbi_failure_reason();
  return r && *r ? r : "unknown error";
}

// stb_image 2.27 (Debian's libstb-dev) builds a JPEG Huffman table from 16 counts without
// checking that they sum to at most 256 (what the table has room for), so a crafted DHT
// segment writes past the end of it (found by fuzz/fuzz_image; stb 2.28 checks). This finds
// every DHT stb would read and refuses the file if one overflows:
//  - up to the frame header (SOF), walk the marker segments exactly as stb's
//    stbi__decode_jpeg_header does (junk bytes before a marker skipped, 0xFF fill bytes,
//    APPn/COM/DQT/DRI skipped by their length, anything else ends stb's decoding);
//  - from there on (scans, where stb's own scanning is harder to mirror) every 0xFF 0xC4
//    byte pair is read as a DHT, which can only refuse more, never less.
bool jpeg_dht_overflows(const std::uint8_t* p, std::size_t size) {
  std::size_t pos = 0;
  auto at_eof = [&] { return pos >= size; };
  auto get8 = [&]() -> int { return pos < size ? p[pos++] : 0; };
  auto get16 = [&]() -> int {
    const int hi = get8();
    return (hi << 8) | get8();
  };
  // A DHT segment starting at pos (after its marker): true if a table overflows.
  auto dht_overflows = [&](std::size_t start) {
    pos = start;
    int len = get16() - 2;
    while (len > 0 && !at_eof()) {
      const int q = get8();
      if ((q >> 4) > 1 || (q & 15) > 3) return false;  // stb refuses the file here
      int n = 0;
      for (int i = 0; i < 16; ++i) n += get8();
      if (n > 256) return true;
      pos += static_cast<std::size_t>(n);
      len -= 17 + n;
    }
    return false;
  };
  constexpr int kNone = -1;
  auto get_marker = [&]() -> int {
    if (at_eof()) return kNone;
    int x = get8();
    if (x != 0xff) return kNone;
    while (x == 0xff && !at_eof()) x = get8();
    return x;
  };
  if (get_marker() != 0xd8) return false;  // no SOI: stb does not take it for a JPEG
  int m = get_marker();
  for (;;) {
    if (m == 0xc0 || m == 0xc1 || m == 0xc2) break;  // SOF: the header walk ends
    if (m == 0xc4 || m == 0xdb || m == 0xdd || (m >= 0xe0 && m <= 0xef) || m == 0xfe) {
      const std::size_t seg = pos;
      if (m == 0xc4 && dht_overflows(seg)) return true;
      pos = seg;
      const int len = get16();
      if (len < 2) return false;  // stb refuses the file here
      pos = std::min(size, seg + static_cast<std::size_t>(len));
    } else {
      return false;  // stb stops with an error: nothing more is read
    }
    m = get_marker();
    while (m == kNone) {
      if (at_eof()) return false;
      m = get_marker();
    }
  }
  for (std::size_t i = pos; i + 1 < size; ++i) {
    if (p[i] != 0xff) continue;
    std::size_t j = i + 1;
    while (j < size && p[j] == 0xff) ++j;
    if (j < size && p[j] == 0xc4 && dht_overflows(j + 1)) return true;
  }
  return false;
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
  int w = 0, h = 0, comp = 0;
  // stbi_info tries every format and keeps the last one's complaint, so a PNG it refuses
  // for its size would read "unknown image type": look at the PNG header (IHDR) first.
  static const std::uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (size >= 24 && std::equal(kPng, kPng + 8, bytes)) {
    auto be32 = [&](std::size_t at) {
      return (std::uint32_t{bytes[at]} << 24) | (std::uint32_t{bytes[at + 1]} << 16) |
             (std::uint32_t{bytes[at + 2]} << 8) | std::uint32_t{bytes[at + 3]};
    };
    const std::uint32_t pw = be32(16), ph = be32(20);
    if (pw == 0 || ph == 0)
      throw ImageError(name, "zero-size image (" + std::to_string(pw) + "x" + std::to_string(ph) + ")");
    if (pw > static_cast<std::uint32_t>(kMaxImageSide) || ph > static_cast<std::uint32_t>(kMaxImageSide))
      throw ImageError(name, "image is " + std::to_string(pw) + "x" + std::to_string(ph) + " pixels, more than " +
                                 std::to_string(kMaxImageSide) + " a side: refusing to decode it");
  }
  if (jpeg_dht_overflows(bytes, size))
    throw ImageError(name, "corrupt JPEG: a Huffman table holds more than 256 codes");
  // Header only: the size is checked before a single pixel is decoded or allocated.
  if (!stbi_info_from_memory(bytes, len, &w, &h, &comp)) {
    const std::string why = stb_reason();
    if (why == "0-pixel image") throw ImageError(name, "zero-size image (0 pixels wide or high)");
    throw ImageError(name, "not a readable image (PNG, JPEG or BMP expected): " + why);
  }
  if (w <= 0 || h <= 0)
    throw ImageError(name, "zero-size image (" + std::to_string(w) + "x" + std::to_string(h) + ")");
  if (w > kMaxImageSide || h > kMaxImageSide)
    throw ImageError(name, "image is " + std::to_string(w) + "x" + std::to_string(h) + " pixels, more than " +
                               std::to_string(kMaxImageSide) + " a side: refusing to decode it");
  if (static_cast<std::int64_t>(w) * h > max_pixels)
    throw ImageError(name, "image is " + std::to_string(w) + "x" + std::to_string(h) + " pixels, more than " +
                               std::to_string(max_pixels >> 20) + " Mpixel: refusing to decode it");
  const bool alpha = comp == 2 || comp == 4;
  const int want = alpha ? 2 : 1;  // grey (+ alpha)
  int w2 = 0, h2 = 0, c2 = 0;
  std::unique_ptr<stbi_uc, StbiFree> px(stbi_load_from_memory(bytes, len, &w2, &h2, &c2, want));
  if (!px) throw ImageError(name, std::string("cannot decode the image: ") + stb_reason());
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
  std::string bytes;
  try {
    bytes = read_file_bytes(path, kMaxFileBytes);
  } catch (const std::runtime_error& e) {
    const std::string w = e.what();
    throw ImageError(path, w.rfind(path + ": ", 0) == 0 ? w.substr(path.size() + 2) : w);
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
  return stbi_info_from_memory(reinterpret_cast<const stbi_uc*>(bytes.data()), static_cast<int>(bytes.size()), width,
                               height, channels) != 0;
}

}  // namespace mf::apps
