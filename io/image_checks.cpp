// image_checks.cpp: walks over a PNG's, JPEG's or BMP's structure that find what stb_image 2.27 misses.
#include "io/image_checks.h"

#include <algorithm>
#include <cctype>

#include <zlib.h>

namespace mf::io::detail {

std::uint32_t be32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
}

namespace {

std::uint32_t le32(const std::uint8_t* p) {
  return std::uint32_t{p[0]} | (std::uint32_t{p[1]} << 8) | (std::uint32_t{p[2]} << 16) | (std::uint32_t{p[3]} << 24);
}
std::uint32_t le16(const std::uint8_t* p) { return std::uint32_t{p[0]} | (std::uint32_t{p[1]} << 8); }

}  // namespace

PngChunks png_chunks(const std::uint8_t* p, std::size_t size) {
  PngChunks r;
  const std::string has = "the file (" + std::to_string(size) + " bytes) ends ";
  std::uint64_t pos = 8;  // after the signature; each chunk: length, type, data, CRC
  for (;;) {
    if (pos == size) return r.cut = has + "before its IEND chunk", r;
    if (pos + 8 > size) return r.cut = has + "inside a chunk header", r;
    const std::string type(reinterpret_cast<const char*>(p + pos + 4), 4);
    for (const char c : type)
      if (!std::isalpha(static_cast<unsigned char>(c))) return r;  // corrupt, not cut: stb says so
    // The format caps a chunk at 2^31 - 1 bytes: a length beyond is damage, not a cut.
    if (be32(p + pos) > 0x7fffffffu) return r.bad_length = type, r;
    const std::uint64_t end = pos + 12 + be32(p + pos);
    if (end > size) return r.cut = has + "inside its " + type + " chunk, which ends at byte " + std::to_string(end), r;
    // The CRC covers the type and the data. As libpng does, a bad one is an error in a
    // critical chunk (the type's first letter upper case: IHDR, PLTE, IDAT, IEND) and in
    // tRNS, which stb applies; other ancillary chunks (text, gamma...) stb skips anyway.
    const bool used = std::isupper(static_cast<unsigned char>(type[0])) || type == "tRNS";
    const auto data_end = static_cast<std::size_t>(end - 4);
    if (used && r.bad_crc.empty() &&
        crc32_z(0L, p + pos + 4, data_end - static_cast<std::size_t>(pos + 4)) != be32(p + data_end))
      r.bad_crc = type;
    if (type == "tRNS") r.colour_key = true;
    if (type == "IEND") return r;
    pos = end;
  }
}

// Whether a JPEG ends before its end-of-image marker (FF D9), which stb 2.27 requires too
// (reporting "expected marker", or another format's complaint when the cut is in the
// header). Marker segments are skipped by their length.
bool jpeg_truncated(const std::uint8_t* p, std::size_t size) {
  std::size_t pos = 0;
  while (pos < size) {
    if (p[pos] != 0xff) {  // junk between segments: skipped, as stb's header reader does
      ++pos;
      continue;
    }
    while (pos < size && p[pos] == 0xff) ++pos;  // fill bytes
    if (pos == size) return true;
    const int m = p[pos++];
    if (m == 0xd9) return false;
    if (m == 0x00 || m == 0x01 || (m >= 0xd0 && m <= 0xd8)) continue;  // markers without a length
    if (pos + 2 > size) return true;
    const std::size_t len = (std::size_t{p[pos]} << 8) | p[pos + 1];
    if (len < 2) return false;  // corrupt, not cut: stb says so
    if (pos + len > size) return true;
    pos += len;
    if (m != 0xda) continue;
    // After a scan header the entropy-coded data runs to the next marker: FF 00 is a stuffed
    // FF and FF D0-D7 a restart marker, neither ends it.
    for (; pos + 1 < size; ++pos) {
      const int next = p[pos + 1];
      if (p[pos] == 0xff && next != 0x00 && (next < 0xd0 || next > 0xd7)) break;
    }
    if (pos + 1 >= size) return true;
  }
  return true;
}

// "" if a BMP's file and info headers are whole, else where it ends (stb would read zeros).
// An info header of a size stb does not know is left to stb to refuse.
std::string bmp_header_truncation(const std::uint8_t* p, std::size_t size) {
  if (size < 18) return "the file (" + std::to_string(size) + " bytes) ends inside its header";
  const std::uint32_t info = le32(p + 14);
  if (info != 12 && info != 40 && info != 56 && info != 108 && info != 124) return "";
  const std::uint64_t header = 14 + std::uint64_t{info};  // file header + info header
  if (size < header)
    return "the file (" + std::to_string(size) + " bytes) ends inside its " + std::to_string(header) + "-byte header";
  return "";
}

BmpLayout bmp_layout(const std::uint8_t* p, std::int64_t width) {
  BmpLayout b;
  b.info_size = le32(p + 14);
  b.bpp = le16(p + (b.info_size == 12 ? 24 : 28));
  b.offset = le32(p + 10);
  const auto w = static_cast<std::uint64_t>(width);
  switch (b.bpp) {
    case 1: b.row = (w + 7) / 8; break;
    case 4: b.row = (w + 1) / 2; break;
    case 8: b.row = w; break;
    case 16: b.row = 2 * w; break;
    case 24: b.row = 3 * w; break;
    default: b.row = b.bpp > 16 ? 4 * w : 0;
  }
  b.stride = (b.row + 3) / 4 * 4;
  return b;
}

// "" if a BMP holds all the pixel bytes its header promises, else the shortfall: stb 2.27
// reads zeros past the end of a cut file and decodes it without a word. The last row's
// padding, which stb never reads, may be missing.
std::string bmp_truncation(const BmpLayout& b, std::size_t size, std::int64_t height) {
  if (b.row == 0) return "";
  const auto h = static_cast<std::uint64_t>(height);
  const std::uint64_t has = size > b.offset ? size - b.offset : 0;
  if (has >= b.stride * (h - 1) + b.row) return "";
  return "the header says " + std::to_string(b.stride * h) + " bytes of pixels, the file has " + std::to_string(has);
}

// "" unless a palette BMP (1, 4 or 8 bits a pixel) has a pixel whose colour index lies past
// the palette, else what is wrong. stb 2.27 keeps the palette in a 256-entry array on its
// stack and fills only the entries the file holds: a pixel past them took whatever the
// stack held (valgrind: uninitialised values), so such a file decoded to a different image
// in each process. The palette's size is counted as stb counts it, from the bytes between
// the headers and the pixels: 4 bytes an entry (in an OS/2 BMP 3, and stb counts 4 entries
// fewer than those bytes hold). stb refuses 0 entries, and more than 256, itself. For whole
// files only (bmp_truncation first).
std::string bmp_palette_overrun(const std::uint8_t* p, const BmpLayout& b, std::int64_t width, std::int64_t height) {
  if (b.bpp != 1 && b.bpp != 4 && b.bpp != 8) return "";
  const bool os2 = b.info_size == 12;
  const auto offset = static_cast<std::int64_t>(b.offset);
  const std::int64_t room = offset - 14 - (os2 ? 24 : std::int64_t{b.info_size});
  // stb: (offset - 14 - 24) / 3 for OS/2 (int division), (offset - 14 - hsz) >> 2 otherwise.
  const std::int64_t entries = os2 ? room / 3 : (room >= 0 ? room / 4 : -((-room + 3) / 4));
  if (entries < 0) return "the pixels start at byte " + std::to_string(offset) + ", inside the headers";
  if (entries == 0 || entries >= (std::int64_t{1} << b.bpp)) return "";
  const auto w = static_cast<std::uint64_t>(width), h = static_cast<std::uint64_t>(height);
  for (std::uint64_t y = 0; y < h; ++y) {
    const std::uint8_t* r = p + b.offset + y * b.stride;
    for (std::uint64_t x = 0; x < w; ++x) {
      const int index = b.bpp == 8 ? r[x] : b.bpp == 4 ? (x % 2 ? r[x / 2] & 15 : r[x / 2] >> 4) : (r[x / 8] >> (7 - x % 8)) & 1;
      if (index < entries) continue;
      if (os2)
        return "a pixel uses colour " + std::to_string(index) + ", and stb_image 2.27 reads only the first " +
               std::to_string(entries) + " of this OS/2 BMP's " + std::to_string((offset - 26) / 3) +
               " palette entries";
      return "a pixel uses colour " + std::to_string(index) + " of a palette of " + std::to_string(entries);
    }
  }
  return "";
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

}  // namespace mf::io::detail
