// test_predict.cpp: image decoding and MNIST-style preprocessing, the predict tool end to
// end on images drawn here, and the training plot's PNG.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <zlib.h>

#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "apps/common.h"
#include "test/test_util.h"

#if MF_WITH_STB
#include "io/image.h"
#include "apps/plot.h"
#include "data/idx.h"
#include "data/mnist.h"
#include <stb_image_write.h>
#include "train/sequential.h"
#include "optim/adam.h"
#include "tensor/rng.h"

namespace fs = std::filesystem;
using namespace mf;

namespace {

using mf::testing::count_lines;
using mf::testing::run_program;
using mf::testing::RunResult;
using mf::testing::sh_quote;
using mf::testing::TempDir;

// A grey w x h canvas, background `bg`, with rectangles of `ink`.
struct Drawing {
  int w, h;
  std::vector<std::uint8_t> px;
  Drawing(int w_, int h_, std::uint8_t bg) : w(w_), h(h_), px(static_cast<std::size_t>(w_) * h_, bg) {}
  void rect(int x0, int y0, int x1, int y1, std::uint8_t ink) {
    for (int y = y0; y < y1; ++y)
      for (int x = x0; x < x1; ++x) px[static_cast<std::size_t>(y) * w + x] = ink;
  }
  void ring(double cx, double cy, double r0, double r1, std::uint8_t ink) {
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x) {
        const double d = std::hypot(x + 0.5 - cx, y + 0.5 - cy);
        if (d >= r0 && d <= r1) px[static_cast<std::size_t>(y) * w + x] = ink;
      }
  }
  Drawing inverted() const {
    Drawing d(w, h, 0);
    for (std::size_t i = 0; i < px.size(); ++i) d.px[i] = static_cast<std::uint8_t>(255 - px[i]);
    return d;
  }
  void save(const std::string& path) const { io::write_png(path, w, h, 1, px.data()); }
};

// "1": a vertical bar, off-centre, on a 120x90 canvas.
Drawing one(std::uint8_t bg = 0, std::uint8_t ink = 255) {
  Drawing d(120, 90, bg);
  d.rect(30, 10, 40, 80, ink);
  return d;
}
Drawing zero() {
  Drawing d(100, 100, 0);
  d.ring(50, 50, 22, 32, 255);
  return d;
}

io::GrayImage gray(const Drawing& d) { return io::GrayImage{d.w, d.h, d.px}; }

// Little-endian integer of n bytes, appended to b.
void put_le(std::string& b, std::uint32_t v, int n) {
  for (int i = 0; i < n; ++i) b += static_cast<char>((v >> (8 * i)) & 0xff);
}

// The 54-byte header of a BMP (BITMAPINFOHEADER, no compression): w x h pixels of `bpp` bits,
// a negative h meaning top-down rows, and `palette` colours between header and pixels.
std::string bmp_header(int w, int h, int bpp, int palette, std::uint32_t pixel_bytes) {
  std::string b = "BM";
  const std::uint32_t offset = 54 + 4 * static_cast<std::uint32_t>(palette);
  put_le(b, offset + pixel_bytes, 4);  // file size
  put_le(b, 0, 4);                     // reserved
  put_le(b, offset, 4);                // where the pixels start
  put_le(b, 40, 4);                    // BITMAPINFOHEADER
  put_le(b, static_cast<std::uint32_t>(w), 4);
  put_le(b, static_cast<std::uint32_t>(h), 4);
  put_le(b, 1, 2);  // planes
  put_le(b, static_cast<std::uint32_t>(bpp), 2);
  put_le(b, 0, 4);  // BI_RGB
  put_le(b, pixel_bytes, 4);
  put_le(b, 2835, 4), put_le(b, 2835, 4);  // 72 dpi
  put_le(b, static_cast<std::uint32_t>(palette), 4), put_le(b, 0, 4);
  return b;
}

// A BMP of a grey drawing, 8-bit with a grey palette, 16-bit (5-5-5: each channel the grey's
// top five bits), 24-bit or 32-bit (opaque), rows padded to 4 bytes, stored bottom-up (the
// usual form) or top-down (negative height).
std::string bmp(const Drawing& d, int bpp, bool top_down) {
  const int row = (d.w * bpp / 8 + 3) / 4 * 4;
  const int palette = bpp == 8 ? 256 : 0;
  std::string b = bmp_header(d.w, top_down ? -d.h : d.h, bpp, palette, static_cast<std::uint32_t>(row * d.h));
  for (int i = 0; i < palette; ++i) put_le(b, static_cast<std::uint32_t>(i) * 0x010101u, 4);
  for (int r = 0; r < d.h; ++r) {
    const int y = top_down ? r : d.h - 1 - r;
    std::string line;
    for (int x = 0; x < d.w; ++x) {
      const std::uint32_t g = d.px[static_cast<std::size_t>(y) * d.w + x];
      if (bpp == 16) put_le(line, (g >> 3) * 0x421u, 2);                   // x, 5 red, 5 green, 5 blue bits
      else if (bpp == 32) put_le(line, g * 0x010101u | 0xff000000u, 4);  // blue, green, red, alpha
      else line.append(bpp / 8, static_cast<char>(g));
    }
    line.resize(static_cast<std::size_t>(row), '\0');
    b += line;
  }
  return b;
}

// A grey test pattern with no symmetry, so a flipped or shifted decode shows.
Drawing pattern(int w, int h) {
  Drawing d(w, h, 0);
  for (std::size_t i = 0; i < d.px.size(); ++i) d.px[i] = static_cast<std::uint8_t>((i * 7) % 251);
  return d;
}

// A PNG chunk: length, type, data, and the CRC of type and data.
std::string png_chunk(const std::string& type, const std::string& data) {
  auto be32 = [](std::uint32_t v) {
    return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
                       static_cast<char>(v)};
  };
  const std::string body = type + data;
  return be32(static_cast<std::uint32_t>(data.size())) + body +
         be32(static_cast<std::uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(body.data()),
                                               static_cast<uInt>(body.size()))));
}

// An 8-bit PNG of colour type 0 (grey) or 2 (RGB, each pixel's grey three times), with the
// chunks in `extra` (a tRNS, a tEXt...) between IHDR and IDAT.
std::string png_of(const Drawing& d, int colour_type, const std::string& extra = "") {
  const int channels = colour_type == 2 ? 3 : 1;
  std::string raw;
  for (int y = 0; y < d.h; ++y) {
    raw += '\0';  // filter: none
    for (int x = 0; x < d.w; ++x) raw.append(channels, static_cast<char>(d.px[static_cast<std::size_t>(y) * d.w + x]));
  }
  uLongf n = compressBound(static_cast<uLong>(raw.size()));
  std::string idat(n, '\0');
  if (compress(reinterpret_cast<Bytef*>(idat.data()), &n, reinterpret_cast<const Bytef*>(raw.data()),
               static_cast<uLong>(raw.size())) != Z_OK)
    throw std::runtime_error("compress failed");
  idat.resize(n);
  std::string ihdr;
  for (std::uint32_t v : {static_cast<std::uint32_t>(d.w), static_cast<std::uint32_t>(d.h)})
    for (int i = 3; i >= 0; --i) ihdr += static_cast<char>(v >> (8 * i));
  ihdr += std::string{8, static_cast<char>(colour_type), 0, 0, 0};
  return std::string("\x89PNG\r\n\x1a\n", 8) + png_chunk("IHDR", ihdr) + extra + png_chunk("IDAT", idat) +
         png_chunk("IEND", "");
}

void save_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// What read_gray_image throws for `path` ("" if it decodes).
std::string image_error(const std::string& path) {
  try {
    io::read_gray_image(path);
  } catch (const io::ImageError& e) {
    return e.what();
  }
  return "";
}

// Runs predict with `args`, its output in `dir` (run_program).
RunResult run(const std::string& args, const TempDir& dir, const std::string& before = "") {
  return run_program(MF_PREDICT_BIN, args, dir, before);
}

std::string mnist_dir() {
  const char* d = std::getenv("MF_MNIST_DIR");
  return d && *d ? d : apps::default_data_dir();
}

}  // namespace

TEST(Preprocess, VerticalBarBecomesACentred20PixelStroke) {
  const std::vector<float> x = io::mnist_preprocess(gray(one()), "one");
  ASSERT_EQ(x.size(), 28u * 28u);
  int top = 28, bottom = -1, left = 28, right = -1;
  double mass = 0, mx = 0, my = 0;
  for (int y = 0; y < 28; ++y)
    for (int c = 0; c < 28; ++c) {
      const float v = x[y * 28 + c];
      ASSERT_GE(v, 0.0f);
      ASSERT_LE(v, 1.0f);
      if (v > 0.5f) top = std::min(top, y), bottom = std::max(bottom, y), left = std::min(left, c), right = std::max(right, c);
      mass += v, mx += v * c, my += v * y;
    }
  EXPECT_EQ(bottom - top + 1, 20) << "the longer side is scaled to 20 px";
  EXPECT_LE(right - left + 1, 4) << "10x70 keeps its aspect ratio: about 3 px wide";
  EXPECT_NEAR(mx / mass, 13.5, 0.75) << "centre of mass on the centre";
  EXPECT_NEAR(my / mass, 13.5, 0.75);
}

TEST(Preprocess, DarkOnLightGivesTheSameTensorAsLightOnDark) {
  const Drawing light_on_dark = one(0, 255);
  EXPECT_EQ(io::mnist_preprocess(gray(light_on_dark.inverted()), "inv"),
            io::mnist_preprocess(gray(light_on_dark), "orig"));
  // And through a PNG file on disk.
  TempDir dir;
  light_on_dark.inverted().save(dir.file("ink.png"));
  EXPECT_EQ(io::mnist_preprocess(io::read_gray_image(dir.file("ink.png")), "file"),
            io::mnist_preprocess(gray(light_on_dark), "orig"));
}

TEST(Preprocess, GreyPaperAndFaintInkAreNormalised) {
  // Pencil on grey paper (200 background, 90 ink) looks like the clean drawing.
  const std::vector<float> clean = io::mnist_preprocess(gray(one(0, 255)), "clean");
  const std::vector<float> paper = io::mnist_preprocess(gray(one(200, 90)), "paper");
  double diff = 0;
  for (std::size_t i = 0; i < clean.size(); ++i) diff = std::max(diff, std::fabs(static_cast<double>(clean[i] - paper[i])));
  EXPECT_LT(diff, 0.02);
}

TEST(Preprocess, BlankImagesAreRefused) {
  for (std::uint8_t bg : {0, 128, 255}) {
    Drawing d(50, 40, bg);
    d.rect(10, 10, 12, 12, static_cast<std::uint8_t>(bg > 127 ? bg - 20 : bg + 20));  // a faint speck
    try {
      io::mnist_preprocess(gray(d), "blank.png");
      ADD_FAILURE() << "expected 'no ink' for background " << int(bg);
    } catch (const io::ImageError& e) {
      EXPECT_NE(std::string(e.what()).find("blank.png: no ink"), std::string::npos) << e.what();
    }
  }
}

TEST(Preprocess, TransparentCanvasKeepsTheStrokes) {
  // Black strokes on a fully transparent canvas (what drawing apps export).
  TempDir dir;
  const Drawing d = one();
  std::vector<std::uint8_t> rgba(static_cast<std::size_t>(d.w) * d.h * 4, 0);
  for (std::size_t i = 0; i < d.px.size(); ++i)
    if (d.px[i]) rgba[4 * i + 3] = 255;  // opaque black where the ink is, transparent elsewhere
  io::write_png(dir.file("alpha.png"), d.w, d.h, 4, rgba.data());
  EXPECT_EQ(io::mnist_preprocess(io::read_gray_image(dir.file("alpha.png")), "a"),
            io::mnist_preprocess(gray(d), "orig"));
}

// A grey or RGB PNG whose tRNS chunk makes one level transparent (an optimiser's form of an
// on/off alpha channel): stbi_info counts no alpha channel for it, but the transparent
// background is composited as an alpha channel's is, and the digit reads as the same.
TEST(Preprocess, ColourKeyTransparencyIsTransparentToo) {
  TempDir dir;
  Drawing d = one(0, 24);  // dark grey strokes; the background (0) is the transparent level
  std::vector<std::uint8_t> rgba(static_cast<std::size_t>(d.w) * d.h * 4, 0);
  for (std::size_t i = 0; i < d.px.size(); ++i)
    if (d.px[i]) rgba[4 * i] = rgba[4 * i + 1] = rgba[4 * i + 2] = 24, rgba[4 * i + 3] = 255;
  io::write_png(dir.file("alpha.png"), d.w, d.h, 4, rgba.data());
  const std::vector<float> want = io::mnist_preprocess(io::read_gray_image(dir.file("alpha.png")), "alpha");
  save_bytes(dir.file("grey-key.png"), png_of(d, 0, png_chunk("tRNS", std::string(2, '\0'))));
  save_bytes(dir.file("rgb-key.png"), png_of(d, 2, png_chunk("tRNS", std::string(6, '\0'))));
  for (const char* name : {"grey-key.png", "rgb-key.png"}) {
    SCOPED_TRACE(name);
    try {
      EXPECT_EQ(io::mnist_preprocess(io::read_gray_image(dir.file(name)), name), want);
    } catch (const io::ImageError& e) {
      ADD_FAILURE() << e.what();
    }
  }
  // Without the tRNS chunk the same pixels are a dark picture whose strokes are barely there
  // (what the colour-keyed files gave before): refused as blank.
  save_bytes(dir.file("no-key.png"), png_of(d, 2));
  try {
    io::mnist_preprocess(io::read_gray_image(dir.file("no-key.png")), "no-key.png");
    ADD_FAILURE() << "no-key.png: expected 'no ink'";
  } catch (const io::ImageError& e) {
    EXPECT_NE(std::string(e.what()).find("no-key.png: no ink"), std::string::npos) << e.what();
  }
}

// A PNG's chunks carry a CRC, which stb does not check: a damaged file decoded into another
// picture (another digit, classified with confidence). A critical chunk (IHDR, IDAT...) or
// tRNS whose CRC does not match is refused, as libpng refuses it; a damaged text chunk,
// which nothing reads, is not.
TEST(Images, PngWithADamagedChunkIsRefused) {
  TempDir dir;
  const Drawing d = one();
  const std::string png = png_of(d, 0);
  save_bytes(dir.file("whole.png"), png);
  ASSERT_EQ(image_error(dir.file("whole.png")), "");
  const std::size_t idat = png.find("IDAT");
  ASSERT_NE(idat, std::string::npos);
  for (const std::size_t at : {std::size_t{17}, idat + 4 + 10, png.size() - 2}) {  // IHDR, IDAT, IEND's CRC
    SCOPED_TRACE(at);
    std::string bad = png;
    bad[at] = static_cast<char>(bad[at] ^ 0x10);
    const std::string path = dir.file("flip" + std::to_string(at) + ".png");
    save_bytes(path, bad);
    const std::string chunk = at < idat ? "IHDR" : at < png.size() - 12 ? "IDAT" : "IEND";
    EXPECT_EQ(image_error(path), path + ": corrupt PNG: the checksum (CRC) of its " + chunk +
                                     " chunk does not match its contents (a damaged copy or download?)");
  }
  // A length field with its top bit set (over the format's 2^31 - 1) is damage, not a cut.
  std::string long_idat = png;
  long_idat[idat - 4] = static_cast<char>(long_idat[idat - 4] | 0x80);
  save_bytes(dir.file("long.png"), long_idat);
  EXPECT_EQ(image_error(dir.file("long.png")),
            dir.file("long.png") + ": corrupt PNG: its IDAT chunk's length is over 2^31 - 1 bytes, more than the "
                                   "format allows");
  std::string text = png_chunk("tEXt", std::string("Comment\0drawn by hand", 22));
  text[text.size() - 1] = static_cast<char>(text.back() ^ 1);
  save_bytes(dir.file("text.png"), png_of(d, 0, text));
  EXPECT_EQ(image_error(dir.file("text.png")), "");
}

TEST(Images, BadFilesGiveOneClearError) {
  TempDir dir;
  auto expect_error = [](const std::string& path, const std::string& what) {
    try {
      io::read_gray_image(path);
      ADD_FAILURE() << path << ": expected '" << what << "'";
    } catch (const io::ImageError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).rfind(path + ": ", 0), 0u) << e.what();
    }
  };
  expect_error(dir.file("missing.png"), "cannot open");
  std::ofstream(dir.file("empty.png")).close();
  expect_error(dir.file("empty.png"), "empty file");
  std::ofstream(dir.file("text.png")) << "this is not an image\n";
  expect_error(dir.file("text.png"), "not a readable image");
  fs::create_directory(dir.file("folder.png"));
  expect_error(dir.file("folder.png"), "folder");

  // A real PNG whose header is patched to claim absurd or zero sizes (its CRC made right):
  // refused from the header, before any decoding.
  one().save(dir.file("ok.png"));
  std::string png = io::read_file_bytes(dir.file("ok.png"));
  auto patched = [&](std::uint32_t w, std::uint32_t h, const std::string& name) {
    std::string p = png;
    for (int i = 0; i < 4; ++i) {
      p[16 + i] = static_cast<char>((w >> (24 - 8 * i)) & 0xff);  // IHDR width, big-endian
      p[20 + i] = static_cast<char>((h >> (24 - 8 * i)) & 0xff);
    }
    const auto crc = static_cast<std::uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(p.data() + 12), 17));
    for (int i = 0; i < 4; ++i) p[29 + i] = static_cast<char>((crc >> (24 - 8 * i)) & 0xff);
    std::ofstream(dir.file(name), std::ios::binary) << p;
    return dir.file(name);
  };
  expect_error(patched(100000, 100000, "huge.png"), "refusing to decode");
  expect_error(patched(20000, 10, "wide.png"), "more than 16384");
  expect_error(patched(0, 90, "zero.png"), "zero-size");
  // A JPEG whose Huffman table claims 512 codes (room for 256): stb_image 2.27 would write
  // past its table (found by fuzz/fuzz_image).
  std::string jpeg("\xff\xd8\xff\xc4\x02\x13\x00", 7);
  jpeg += std::string(16, '\x20') + std::string(512, '\x01') + "\xff\xd9";
  std::ofstream(dir.file("dht.jpg"), std::ios::binary) << jpeg;
  expect_error(dir.file("dht.jpg"), "corrupt JPEG: a Huffman table holds more than 256 codes");
  // A JPEG ending inside a segment header (once sent the DHT check into an endless loop).
  const unsigned char cut_jpeg[] = {0xff, 0xd8, 0xff, 0xe0, 0x00, 0x10, 0x00, 0x04, 0x11, 0x14, 0x14, 0xff,
                                    0xc0, 0x00, 0x11, 0x02, 0x11, 0x5b, 0x01, 0x03, 0x11, 0x01, 0xff, 0xc4};
  std::ofstream(dir.file("cut.jpg"), std::ios::binary)
      << std::string(reinterpret_cast<const char*>(cut_jpeg), sizeof cut_jpeg);
  expect_error(dir.file("cut.jpg"), "");
  // Truncated in the middle of the pixel data.
  std::ofstream(dir.file("cut.png"), std::ios::binary) << png.substr(0, png.size() / 2);
  expect_error(dir.file("cut.png"), "truncated PNG");
}

// A top-down BMP (negative height in its header, stb_info reports it as is) decodes to the
// same pixels as the same image stored bottom-up, 8-bit paletted, 16-, 24- or 32-bit.
TEST(Images, TopDownBmpDecodesLikeBottomUp) {
  TempDir dir;
  const Drawing d = pattern(27, 20);  // 27 px: rows need padding to 4 bytes
  // 16-bit keeps a grey's top five bits; stb widens them back to 8 by repeating the top ones.
  Drawing d16 = d;
  for (std::uint8_t& g : d16.px) g = static_cast<std::uint8_t>((g >> 3 << 3) | (g >> 5));
  for (int bpp : {8, 16, 24, 32})
    for (bool top_down : {false, true}) {
      SCOPED_TRACE(std::to_string(bpp) + (top_down ? "-bit top-down" : "-bit bottom-up"));
      const std::string path = dir.file("p.bmp");
      save_bytes(path, bmp(d, bpp, top_down));
      try {
        const io::GrayImage img = io::read_gray_image(path);
        EXPECT_EQ(img.width, d.w);
        EXPECT_EQ(img.height, d.h);
        EXPECT_TRUE(img.pixels == (bpp == 16 ? d16 : d).px) << "pixels differ (flipped?)";
      } catch (const io::ImageError& e) {
        ADD_FAILURE() << e.what();
      }
    }
}

// stb fills the rows missing from a cut BMP with zeros: such a file must be refused from its
// size, before decoding, as must a bare header claiming 16384x4096 pixels (4.5 s, 489 MB).
TEST(Images, TruncatedBmpIsRefusedFromItsSize) {
  TempDir dir;
  const Drawing d = pattern(27, 20);
  for (int bpp : {8, 16, 24, 32}) {
    const std::string full = bmp(d, bpp, false);
    const std::size_t pixels = static_cast<std::size_t>((d.w * bpp / 8 + 3) / 4 * 4) * d.h;
    const std::size_t header = full.size() - pixels;
    for (std::size_t keep : {header + pixels / 2, header, std::size_t{60}, std::size_t{30}}) {
      const std::string path = dir.file("cut" + std::to_string(bpp) + "_" + std::to_string(keep) + ".bmp");
      save_bytes(path, full.substr(0, keep));
      const std::string e = image_error(path);
      EXPECT_EQ(e.rfind(path + ": truncated BMP", 0), 0u) << e;
      if (keep >= header) {
        EXPECT_NE(e.find("the header says " + std::to_string(pixels) + " bytes of pixels, the file has " +
                         std::to_string(keep - header)),
                  std::string::npos)
            << e;
      }
    }
  }
  save_bytes(dir.file("giant.bmp"), bmp_header(16384, 4096, 24, 0, 16384u * 3 * 4096));
  const std::string giant = image_error(dir.file("giant.bmp"));
  EXPECT_EQ(giant.rfind(dir.file("giant.bmp") + ": truncated BMP", 0), 0u) << giant;
  // Past the pixel limit, the size is what is wrong.
  save_bytes(dir.file("square.bmp"), bmp_header(16384, 16384, 8, 0, 16384u * 16384));
  const std::string square = image_error(dir.file("square.bmp"));
  EXPECT_NE(square.find("16384x16384 pixels, more than 64 Mpixel"), std::string::npos) << square;
}

// A BMP of w x h colour indices of `bpp` bits (1, 4 or 8) with a grey palette of `palette`
// entries, rows bottom-up and padded to 4 bytes; `pad` fills the bits past each row's last
// pixel.
std::string palette_bmp(int w, int h, int bpp, int palette, const std::vector<int>& indices, std::uint8_t pad = 0) {
  const int row = (w * bpp + 7) / 8, stride = (row + 3) / 4 * 4;
  std::string b = bmp_header(w, h, bpp, palette, static_cast<std::uint32_t>(stride * h));
  for (int i = 0; i < palette; ++i) put_le(b, static_cast<std::uint32_t>(255 * i / std::max(1, palette - 1)) * 0x010101u, 4);
  for (int r = h - 1; r >= 0; --r) {
    std::string line(static_cast<std::size_t>(stride), static_cast<char>(pad));
    for (int x = 0; x < w; ++x) {
      const int bit = x * bpp, v = indices[static_cast<std::size_t>(r * w + x)];
      auto& byte = reinterpret_cast<std::uint8_t&>(line[static_cast<std::size_t>(bit / 8)]);
      const int shift = 8 - bpp - bit % 8;
      byte = static_cast<std::uint8_t>((byte & ~(((1 << bpp) - 1) << shift)) | (v << shift));
    }
    b += line;
  }
  return b;
}

// stb 2.27 reads a palette BMP's pixels through a 256-entry palette on its stack, of which
// it fills only the entries the file holds: a pixel past them took stack garbage. Such a
// file is refused, naming the colour and the palette's size; pixels inside it, and padding
// bits past a row's end whatever they hold, still decode.
TEST(Images, BmpPixelsPastThePaletteAreRefused) {
  TempDir dir;
  const int w = 7, h = 3;
  struct Case {
    int bpp, palette;
  };
  for (const Case c : {Case{8, 4}, Case{4, 3}, Case{1, 1}}) {
    SCOPED_TRACE(std::to_string(c.bpp) + " bits, " + std::to_string(c.palette) + " colours");
    std::vector<int> inside(static_cast<std::size_t>(w * h));
    for (std::size_t i = 0; i < inside.size(); ++i) inside[i] = static_cast<int>(i % static_cast<std::size_t>(c.palette));
    const std::string ok = dir.file("ok" + std::to_string(c.bpp) + ".bmp");
    save_bytes(ok, palette_bmp(w, h, c.bpp, c.palette, inside, 0xff));
    EXPECT_EQ(image_error(ok), "");
    for (const int at : {0, w * h / 2, w * h - 1}) {
      std::vector<int> past = inside;
      past[static_cast<std::size_t>(at)] = (1 << c.bpp) - 1;
      const std::string bad = dir.file("past" + std::to_string(c.bpp) + "_" + std::to_string(at) + ".bmp");
      save_bytes(bad, palette_bmp(w, h, c.bpp, c.palette, past));
      EXPECT_EQ(image_error(bad), bad + ": corrupt BMP: a pixel uses colour " + std::to_string((1 << c.bpp) - 1) +
                                      " of a palette of " + std::to_string(c.palette));
    }
  }
  // An OS/2 BMP (12-byte header, 3-byte palette entries) of 6 colours: stb reads only the
  // first 2 of them, so colour 3 is refused, and colour 1 decodes.
  auto os2_bmp = [](int colour) {
    std::string b = "BM";
    const std::uint32_t offset = 14 + 12 + 6 * 3;
    put_le(b, offset + 8, 4), put_le(b, 0, 4), put_le(b, offset, 4);
    put_le(b, 12, 4), put_le(b, 4, 2), put_le(b, 2, 2), put_le(b, 1, 2), put_le(b, 8, 2);
    for (int i = 0; i < 6; ++i) b.append(3, static_cast<char>(40 * i));
    for (int i = 0; i < 8; ++i) b += static_cast<char>(i == 5 ? colour : 0);
    return b;
  };
  save_bytes(dir.file("os2_ok.bmp"), os2_bmp(1));
  EXPECT_EQ(image_error(dir.file("os2_ok.bmp")), "");
  save_bytes(dir.file("os2.bmp"), os2_bmp(3));
  EXPECT_EQ(image_error(dir.file("os2.bmp")),
            dir.file("os2.bmp") + ": corrupt BMP: a pixel uses colour 3, and stb_image 2.27 reads only the first 2 "
                                  "of this OS/2 BMP's 6 palette entries");
  // Pixels said to start inside the headers: stb would read no palette at all.
  std::string inside_headers = palette_bmp(w, h, 8, 2, std::vector<int>(w * h, 1));
  inside_headers[10] = 50;  // the pixels' offset, 4 bytes before the info header ends
  save_bytes(dir.file("inside.bmp"), inside_headers);
  EXPECT_EQ(image_error(dir.file("inside.bmp")),
            dir.file("inside.bmp") + ": corrupt BMP: the pixels start at byte 50, inside the headers");
}

// A PNG or JPEG cut short is reported as such, naming its format, never with stb's
// leftovers ("IDA", "unknown error", or "bad png sig" for a JPEG).
TEST(Images, CutPngAndJpegNameTheirFormat) {
  TempDir dir;
  const Drawing d = zero().inverted();
  const std::string png = io::encode_png(d.w, d.h, 1, d.px.data());
  std::string jpeg;
  ASSERT_TRUE(stbi_write_jpg_to_func(
      [](void* out, void* data, int n) { static_cast<std::string*>(out)->append(static_cast<char*>(data), n); },
      &jpeg, d.w, d.h, 1, d.px.data(), 90));
  ASSERT_GT(jpeg.size(), 400u);
  auto check = [&](const std::string& bytes, std::size_t keep, const std::string& name, const std::string& want) {
    const std::string path = dir.file(name + std::to_string(keep));
    save_bytes(path, bytes.substr(0, keep));
    const std::string e = image_error(path);
    EXPECT_EQ(e.rfind(path + ": " + want, 0), 0u) << "cut at " << keep << " of " << bytes.size() << ": " << e;
  };
  for (std::size_t keep : {std::size_t{20}, std::size_t{40}, png.size() / 2, png.size() - 12, png.size() - 5})
    check(png, keep, "cut.png.", "truncated PNG");
  for (std::size_t keep : {std::size_t{200}, jpeg.size() / 2, jpeg.size() - 2})
    check(jpeg, keep, "cut.jpg.", "truncated JPEG");
  // Whole files still decode.
  save_bytes(dir.file("whole.jpg"), jpeg);
  EXPECT_EQ(image_error(dir.file("whole.jpg")), "");
  save_bytes(dir.file("whole.png"), png);
  EXPECT_EQ(image_error(dir.file("whole.png")), "");
}

// The inputs fuzz/fuzz_image once failed on, replayed in every build (the sanitized ones
// check what the fuzzer checked): each is refused with an ImageError, or decoded and
// prepared into 784 values in [0, 1], as fuzz_image demands.
TEST(Images, FuzzRegressionsAreRefusedOrPreparedSafely) {
  const fs::path folder = fs::path(MF_SOURCE_DIR) / "fuzz" / "regressions" / "image";
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(folder)) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 5u) << folder;
  for (const fs::path& file : files) {
    SCOPED_TRACE(file.string());
    try {
      const io::GrayImage img = io::read_gray_image(file.string());
      std::vector<float> x;
      try {
        x = io::mnist_preprocess(img, file.string());
      } catch (const io::ImageError&) {
        continue;  // decoded, but nothing to classify (a blank image)
      }
      ASSERT_EQ(x.size(), 28u * 28u);
      for (float v : x) ASSERT_TRUE(v >= 0.0f && v <= 1.0f) << v;
    } catch (const io::ImageError& e) {
      EXPECT_EQ(std::string(e.what()).rfind(file.string() + ": ", 0), 0u) << e.what();
    }
  }
}

// Leaves freed heap blocks of many sizes filled with `byte`, for the next allocations to reuse.
void leave_the_heap_filled_with(unsigned char byte) {
  std::vector<void*> blocks;
  for (std::size_t size = 256; size <= (std::size_t{1} << 17); size += size / 8) {
    void* p = std::malloc(size);
    if (!p) continue;
    std::memset(p, byte, size);
    blocks.push_back(p);
  }
  for (void* p : blocks) std::free(p);
}

// jpeg_bits_run_out.jpg's scans use Huffman tables that no DHT segment defines. stb 2.27
// keeps its tables in a block it never clears, so with plain malloc the decoded pixels were
// whatever the heap held (blank in a test, a "4" in predict); stb's blocks are now zeroed
// and the image is the same after any heap contents.
TEST(Images, AJpegUsingUndefinedHuffmanTablesDecodesTheSameWhateverTheHeapHeld) {
  const std::string file = std::string(MF_SOURCE_DIR) + "/fuzz/regressions/image/jpeg_bits_run_out.jpg";
  leave_the_heap_filled_with(0x00);
  const io::GrayImage a = io::read_gray_image(file);
  leave_the_heap_filled_with(0xa5);
  const io::GrayImage b = io::read_gray_image(file);
  leave_the_heap_filled_with(0x3c);
  const io::GrayImage c = io::read_gray_image(file);
  EXPECT_EQ(a.width, 140);
  EXPECT_EQ(a.height, 12);
  EXPECT_EQ(b.pixels, a.pixels);
  EXPECT_EQ(c.pixels, a.pixels);
}

TEST(Plot, WritesAValidPng) {
  TempDir dir;
  std::vector<EpochLog> h;
  for (int e = 0; e < 5; ++e) {
    EpochLog l;
    l.epoch = e;
    l.loss = 1.0 / (e + 1);
    l.accuracy = 0.9 + 0.02 * e;
    l.val_loss = 1.1 / (e + 1);
    l.val_accuracy = 0.89 + 0.02 * e;
    h.push_back(l);
  }
  const std::string path = dir.file("curves.png");
  apps::write_training_plot(path, h, "test run");
  int w = 0, ht = 0, c = 0;
  ASSERT_TRUE(io::image_info(path, &w, &ht, &c));
  EXPECT_EQ(w, 1000);
  EXPECT_GT(ht, 400);
  EXPECT_EQ(c, 3);
  // One epoch, no validation set (NaN): still a plot.
  h.resize(1);
  h[0].val_loss = h[0].val_accuracy = std::nan("");
  apps::write_training_plot(path, h);
  ASSERT_TRUE(io::image_info(path, &w, &ht, &c));
  EXPECT_THROW(apps::write_training_plot(path, {}), std::invalid_argument);
}

// An untrained model's checkpoint, dir/m.ckpt, and a drawn "1", dir/one.png.
static void untrained_checkpoint_and_a_one(const TempDir& dir) {
  Rng rng(1);
  Sequential m = Sequential::mnist_cnn(rng);
  io::save_checkpoint(dir.file("m.ckpt"), m, nullptr, {});
  one().save(dir.file("one.png"));
}

// A data folder, both sets 20 flat grey 28x28 images labelled 3 (--grid draws the test set).
static void synthetic_mnist(const TempDir& data) {
  const std::vector<std::uint8_t> img(20 * 28 * 28, 7), lab(20, 3);
  data::write_idx(data.file("train-images-idx3-ubyte"), {20, 28, 28}, img, false);
  data::write_idx(data.file("train-labels-idx1-ubyte"), {20}, lab, false);
  data::write_idx(data.file("t10k-images-idx3-ubyte"), {20, 28, 28}, img, false);
  data::write_idx(data.file("t10k-labels-idx1-ubyte"), {20}, lab, false);
}

// Weights that are finite (what a checkpoint's checks ask) but so large that the class scores
// overflow: each image, and --grid, is an error naming the checkpoint, not "nan%" ranked as
// if it were a score.
TEST(PredictTool, ScoresThatOverflowAreAnErrorNotNan) {
  TempDir dir("_model"), data("_data");
  synthetic_mnist(data);
  std::vector<std::uint8_t> img(20 * 28 * 28);  // a pattern, not a flat grey: the features are not all 0
  for (std::size_t i = 0; i < img.size(); ++i) img[i] = static_cast<std::uint8_t>(i * 37 % 256);
  data::write_idx(data.file("t10k-images-idx3-ubyte"), {20, 28, 28}, img, false);
  one().save(dir.file("one.png"));
  Rng rng(1);
  Sequential m = Sequential::mnist_cnn(rng);
  Parameter* kernel = m.parameters()[m.parameters().size() - 2];  // dense_1: kernel, then bias
  ASSERT_EQ(kernel->name, "kernel");
  for (std::int64_t i = 0; i < kernel->value.numel(); ++i) kernel->value.data<float>()[i] = 3e38f;
  const std::string ckpt = dir.file("huge.ckpt");
  io::save_checkpoint(ckpt, m, nullptr, {});
  const std::string why = "the model's class scores are not finite (NaN or infinite): the weights in " + ckpt +
                          " are too large (a damaged checkpoint, or a run that diverged)";
  RunResult r = run("--model " + ckpt + " " + dir.file("one.png"), dir);
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "predict: error: " + dir.file("one.png") + ": " + why + "\n");
  EXPECT_EQ(r.out, "");
  r = run("--model " + ckpt + " --data " + data.file("") + " --grid " + dir.file("grid.png"), dir);
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "predict: error: --grid: " + why + " (for some of the test images in " + data.file("") + ")\n");
  EXPECT_FALSE(fs::exists(dir.file("grid.png")));
}

// A stream that starts like no image (/dev/zero, given by mistake) is refused from its first
// bytes: it used to be read to the 1 GiB limit first (17 s and 2.3 GB here), then refused
// as too large, and under a memory limit it ran out of memory and stopped every image.
TEST(ReadImage, AStreamThatIsNoImageIsRefusedFromItsFirstBytes) {
  EXPECT_EQ(image_error("/dev/zero"), "/dev/zero: not a readable image: its first bytes match no PNG, JPEG or BMP file");
  // A pipe that says nothing of its size, with a PNG's first bytes, is read on and decoded.
  TempDir dir;
  one().save(dir.file("one.png"));
  const std::string png = io::read_file_bytes(dir.file("one.png"));
  ASSERT_LT(png.size(), 4096u) << "more than a pipe is sure to hold";
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ASSERT_EQ(::write(fds[1], png.data(), png.size()), static_cast<ssize_t>(png.size()));
  ::close(fds[1]);
  EXPECT_EQ(image_error("/dev/fd/" + std::to_string(fds[0])), "");
  ::close(fds[0]);
}

TEST(PredictTool, ClassifiesFilesAndReportsEachBadOne) {
  TempDir dir;
  untrained_checkpoint_and_a_one(dir);
  one().inverted().save(dir.file("one_ink.png"));
  Drawing(40, 40, 255).save(dir.file("blank.png"));
  std::ofstream(dir.file("notes.txt")) << "not an image";

  RunResult r = run("--model " + dir.file("m.ckpt") + " --top 3 " + dir.file("one.png") + " " + dir.file("one_ink.png"),
                    dir);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(count_lines(r.out), 2) << r.out;
  EXPECT_NE(r.out.find(dir.file("one.png") + ": "), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '%'), 6) << "three classes per file: " << r.out;
  EXPECT_TRUE(r.err.empty()) << r.err;

  r = run("--model " + dir.file("m.ckpt") + " " + dir.file("one.png") + " " + dir.file("blank.png") + " " +
              dir.file("notes.txt") + " " + dir.file("missing.png"),
          dir);
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(count_lines(r.out), 1) << "the good file is still classified: " << r.out;
  EXPECT_EQ(count_lines(r.err), 3) << r.err;
  EXPECT_NE(r.err.find("blank.png: no ink"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("notes.txt: not a readable image"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("missing.png: cannot open"), std::string::npos) << r.err;

  r = run("--model " + dir.file("missing.ckpt") + " " + dir.file("one.png"), dir);
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("missing.ckpt: cannot open"), std::string::npos) << r.err;
  r = run(dir.file("one.png"), dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--model is required"), std::string::npos) << r.err;
  r = run("--model " + dir.file("m.ckpt"), dir);  // nothing to do
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("give image files to classify, or --grid PATH"), std::string::npos) << r.err;
}

// --grid naming a folder is refused before the model is loaded or any image classified
// (the grid is written last, after a pass over the 10,000 test digits).
TEST(PredictTool, GridPathThatIsAFolderIsRefusedUpFront) {
  TempDir dir;
  untrained_checkpoint_and_a_one(dir);
  for (const std::string& grid : {dir.path().string(), dir.file("new/")}) {
    SCOPED_TRACE(grid);
    const RunResult r = run("--model " + dir.file("m.ckpt") + " --data /nonexistent/mnist --grid " + grid + " " +
                                dir.file("one.png"),
                            dir);
    EXPECT_EQ(r.status, 1);
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find("predict: error: --grid " + grid + ": "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("a folder, not a file"), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << "nothing was classified: " << r.out;
  }
}

// The grid PNG is written last, over whatever --grid names: the checkpoint, an image being
// classified or a data file would be lost. A usage error (status 2), before anything is read,
// whatever the spelling, and every file left as it was.
TEST(PredictTool, GridOnTheCheckpointAnImageOrTheDataIsRefused) {
  TempDir dir, data;
  untrained_checkpoint_and_a_one(dir);
  synthetic_mnist(data);
  fs::create_symlink(dir.file("m.ckpt"), dir.file("link.ckpt"));
  const std::string ckpt = io::read_file_bytes(dir.file("m.ckpt")), png = io::read_file_bytes(dir.file("one.png"));
  const std::string labels = io::read_file_bytes(data.file("t10k-labels-idx1-ubyte"));
  const std::string model = "--model " + dir.file("m.ckpt") + " --data " + data.file("") + " ";
  struct Case {
    std::string args, expect;
  };
  for (const Case& c : std::vector<Case>{
           {"--grid " + dir.file("m.ckpt"), "--grid " + dir.file("m.ckpt") + " and --model " + dir.file("m.ckpt") +
                                                " name the same file: the grid would overwrite the checkpoint"},
           {"--grid " + dir.file("link.ckpt"), "the grid would overwrite the checkpoint"},
           {"--grid " + dir.file("one.png") + " " + dir.file("one.png"),
            "--grid " + dir.file("one.png") + " and the image " + dir.file("one.png") +
                " name the same file: the grid would overwrite the image"},
           {"--grid " + data.file("t10k-labels-idx1-ubyte"),
            "--grid " + data.file("t10k-labels-idx1-ubyte") + " is the data file " +
                data.file("t10k-labels-idx1-ubyte") + ": writing there would destroy the data"}}) {
    SCOPED_TRACE(c.args);
    const RunResult r = run(model + c.args, dir);
    EXPECT_EQ(r.status, 2);
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
    EXPECT_EQ(r.err.rfind("predict: error: --grid ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << "nothing was classified: " << r.out;
  }
  EXPECT_TRUE(io::read_file_bytes(dir.file("m.ckpt")) == ckpt) << "the checkpoint was overwritten";
  EXPECT_TRUE(io::read_file_bytes(dir.file("one.png")) == png) << "the image was overwritten";
  EXPECT_TRUE(io::read_file_bytes(data.file("t10k-labels-idx1-ubyte")) == labels) << "the data were overwritten";
  // A new file beside them is fine: the grid of the 20 synthetic test digits.
  const RunResult r = run(model + "--grid " + dir.file("grid.png"), dir);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir.file("grid.png")));
}

// Past the file-size limit (ulimit -f 1: 512 or 1024 bytes, less than the grid's PNG)
// writing the grid fails with one line and leaves no temporary file; SIGXFSZ used to end
// predict in the middle of the write, without a word, leaving grid.png.tmp.PID behind.
TEST(PredictTool, FileSizeLimitIsAnErrorThatLeavesNoTemporaryFile) {
  TempDir dir, data;
  untrained_checkpoint_and_a_one(dir);
  synthetic_mnist(data);
  const RunResult r = run("--model " + dir.file("m.ckpt") + " --data " + data.file("") + " --grid " +
                              dir.file("grid.png"),
                          dir, "ulimit -f 1");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("predict: error: " + dir.file("grid.png") + ": write failed: File too large"),
            std::string::npos)
      << r.err;
  for (const auto& e : fs::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename().string().find("grid.png"), std::string::npos) << e.path();
}

// `predict --grid g.png ... | head`: the reader leaving is reported at exit, in one line,
// after the grid is written. SIGPIPE used to end predict at its next full buffer, without
// a word (status 141) and without the grid. --ascii makes the output (about 100 KB) more
// than a pipe holds, so predict writes while the reader is gone.
TEST(PredictTool, ClosedPipeIsReportedAfterTheGridIsWritten) {
  TempDir dir, data;
  untrained_checkpoint_and_a_one(dir);
  synthetic_mnist(data);
  std::string images;
  for (int i = 0; i < 100; ++i) images += " " + dir.file("one.png");
  const std::string cmd = "{ " + sh_quote(mf::testing::program_path(MF_PREDICT_BIN)) + " --model " +
                          dir.file("m.ckpt") + " --data " + data.file("") + " --ascii --grid " + dir.file("grid.png") +
                          images + " 2> " + dir.file("err.txt") + "; echo $? > " + dir.file("status.txt") +
                          "; } | head -c 1 > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  EXPECT_EQ(io::read_file_bytes(dir.file("status.txt")), "1\n");
  const std::string err = io::read_file_bytes(dir.file("err.txt"));
  EXPECT_EQ(err, "predict: error: could not write the output (standard output): Broken pipe\n");
  EXPECT_TRUE(fs::exists(dir.file("grid.png")));
}

TEST(PredictTool, ATrainedModelReadsDrawnDigits) {
  const std::string data = mnist_dir();
  if (!fs::exists(data)) GTEST_SKIP() << "no MNIST at " << data;
  const data::Mnist mnist = data::load_mnist(data);
  Rng rng(0);
  Sequential m = Sequential::mnist_cnn(rng);
  m.compile(std::make_unique<Adam>());
  FitOptions fo;
  fo.epochs = 1;
  fo.batch_size = 32;
  m.fit(data::subset(mnist.train, 0, 3000), nullptr, fo);
  TempDir dir;
  io::save_checkpoint(dir.file("m.ckpt"), m, *m.optimizer(), {});
  one().save(dir.file("one.png"));
  one().inverted().save(dir.file("one_ink.png"));
  zero().inverted().save(dir.file("zero_ink.png"));
  const RunResult r = run("--model " + dir.file("m.ckpt") + " --top 1 " + dir.file("one.png") + " " +
                              dir.file("one_ink.png") + " " + dir.file("zero_ink.png"),
                          dir);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("one.png: 1 ("), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("one_ink.png: 1 ("), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("zero_ink.png: 0 ("), std::string::npos) << r.out;
}

#else
TEST(Predict, SkippedWithoutStb) { GTEST_SKIP() << "built without the stb headers (libstb-dev)"; }
#endif
