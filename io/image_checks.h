// image_checks.h: internal to io/image*.cpp: the checks of a PNG's, JPEG's or BMP's structure stb 2.27 lacks.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace mf::io::detail {

// The big-endian u32 at p.
std::uint32_t be32(const std::uint8_t* p);

// What a walk over a PNG's chunks, up to IEND, finds: stb 2.27 names a chunk that is cut
// short by its type's first bytes ("IDA") or by nothing, and checks no chunk's CRC.
struct PngChunks {
  std::string cut;            // "" when every chunk is whole, else where the file ends
  std::string bad_crc;        // the first chunk stb uses whose CRC does not match, or ""
  std::string bad_length;     // a chunk whose length is over the format's 2^31 - 1, or ""
  bool colour_key = false;    // a tRNS chunk: one grey level or colour is transparent
};
PngChunks png_chunks(const std::uint8_t* p, std::size_t size);

// Whether a JPEG ends before its end-of-image marker (FF D9).
bool jpeg_truncated(const std::uint8_t* p, std::size_t size);

// Whether a DHT segment stb would read holds more than 256 codes (overflowing stb 2.27's table).
bool jpeg_dht_overflows(const std::uint8_t* p, std::size_t size);

// "" if a BMP's file and info headers are whole, else where it ends.
std::string bmp_header_truncation(const std::uint8_t* p, std::size_t size);

// Where a BMP's pixels lie, as stbi__bmp_load reads them, for whole headers that stbi_info
// accepted: they start at the header's offset; a row holds ceil(w * bpp / 8) bytes (stb
// reads 4 a pixel above 24 bits), padded to a multiple of 4 (the stride). row is 0 for a
// depth stb refuses itself (2 bits and such).
struct BmpLayout {
  std::uint32_t info_size, bpp;  // info header: 12 (OS/2) or a Windows one
  std::uint64_t offset, row, stride;
};
BmpLayout bmp_layout(const std::uint8_t* p, std::int64_t width);

// "" if a BMP holds all the pixel bytes its header promises, else the shortfall.
std::string bmp_truncation(const BmpLayout& b, std::size_t size, std::int64_t height);

// "" unless a palette BMP has a pixel whose colour index lies past the palette, else what is wrong.
std::string bmp_palette_overrun(const std::uint8_t* p, const BmpLayout& b, std::int64_t width, std::int64_t height);

}  // namespace mf::io::detail
