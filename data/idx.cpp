// idx.cpp: IDX parser (validated before anything large is allocated) and writer; inputs in idx_stream.cpp.
#include "data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>

#include "data/idx_stream.h"

namespace mf::data {
namespace {

using detail::FilePtr;
using detail::errno_text;

// Decompressed data grows the buffer at most by what it already holds (starting here), so a
// header's claim only costs memory once the stream has actually delivered comparable amounts.
constexpr std::size_t kFirstGrowth = std::size_t{1} << 20;
// Trailing bytes are counted up to this many; beyond it the message says "more than".
constexpr std::uint64_t kMaxTrailingCount = std::uint64_t{1} << 20;
constexpr unsigned kIdxUnsignedByte = 0x08;
constexpr int kMaxIdxDims = 4;

std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", static_cast<unsigned>(v));
  return buf;
}

std::string hex8(unsigned v) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", v & 0xffu);
  return buf;
}

std::string join_dims(const std::vector<std::int64_t>& dims) {
  std::string s;
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? " x " : "") + std::to_string(dims[i]);
  return s;
}

std::uint32_t load_be32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         std::uint32_t{p[3]};
}

void store_be32(std::uint8_t* p, std::uint32_t v) {
  p[0] = static_cast<std::uint8_t>(v >> 24);
  p[1] = static_cast<std::uint8_t>(v >> 16);
  p[2] = static_cast<std::uint8_t>(v >> 8);
  p[3] = static_cast<std::uint8_t>(v);
}

void check_magic(const std::string& path, const std::uint8_t* magic) {
  const std::uint32_t m = load_be32(magic);
  const std::string wrong =
      "wrong magic number " + hex32(m) + " (expected 0x00000801 to 0x00000804 for unsigned-byte IDX)";
  if (magic[0] != 0 || magic[1] != 0) {
    std::string hint;
    if (magic[0] == '<') hint = "; this looks like an HTML page (a failed download?)";
    else if (magic[0] == 'v' && magic[1] == 'e') hint = "; this looks like a text file (a Git LFS pointer?)";
    throw DataError(path, wrong + hint);
  }
  const unsigned type = magic[2];
  if (type != kIdxUnsignedByte) {
    const char* known = nullptr;
    switch (type) {
      case 0x09: known = "signed byte"; break;
      case 0x0b: known = "int16"; break;
      case 0x0c: known = "int32"; break;
      case 0x0d: known = "float32"; break;
      case 0x0e: known = "float64"; break;
      default: break;
    }
    if (known) {
      throw DataError(path, wrong + ": type code " + hex8(type) + " (" + known +
                                ") is not supported, only 0x08 (unsigned byte)");
    }
    throw DataError(path, wrong + ": unknown IDX type code " + hex8(type));
  }
  const int ndim = magic[3];
  if (ndim < 1 || ndim > kMaxIdxDims) {
    throw DataError(path, wrong + ": " + std::to_string(ndim) + " dimensions (expected 1 to 4)");
  }
}

}  // namespace

namespace detail {

std::string errno_text(int err) { return std::strerror(err); }

// Parses one IDX stream. known_size is the whole input's size when it is known up front (raw
// files, memory): the header's claim is checked against it before the values are allocated.
IdxArray parse_stream(Input& in, const std::string& path, std::optional<std::uint64_t> known_size,
                      bool gzipped) {
  const std::string has = gzipped ? "decompressed data has " : "file has ";
  std::uint8_t magic[4];
  std::size_t got = in.read(magic, sizeof magic);
  if (got == 0) {
    throw DataError(path, gzipped ? "empty file (the gzip stream decompresses to 0 bytes)"
                                  : "empty file (0 bytes)");
  }
  if (got < sizeof magic) {
    throw DataError(path, "truncated header: an IDX file starts with a 4-byte magic number, " + has +
                              "only " + std::to_string(got) + " bytes");
  }
  check_magic(path, magic);

  const int ndim = magic[3];
  const std::size_t header_bytes = 4 + 4 * static_cast<std::size_t>(ndim);
  std::uint8_t dim_bytes[4 * kMaxIdxDims];
  got = in.read(dim_bytes, 4 * static_cast<std::size_t>(ndim));
  if (got < 4 * static_cast<std::size_t>(ndim)) {
    throw DataError(path, "truncated header: " + std::to_string(ndim) + " dimensions need a " +
                              std::to_string(header_bytes) + "-byte header, " + has +
                              std::to_string(4 + got) + " bytes");
  }

  IdxArray out;
  for (int d = 0; d < ndim; ++d) out.dims.push_back(load_be32(dim_bytes + 4 * d));
  for (int d = 0; d < ndim; ++d) {
    if (out.dims[d] == 0) {
      throw DataError(path, "dimension " + std::to_string(d + 1) + " of " + std::to_string(ndim) +
                                " is 0 (dims " + join_dims(out.dims) + ")");
    }
  }
  // Each dim is < 2^32 and the running product stays <= 2^31, so no step can overflow 64 bits.
  std::uint64_t count = 1;
  for (const std::int64_t d : out.dims) {
    count *= static_cast<std::uint64_t>(d);
    if (count > kMaxIdxElements) {
      throw DataError(path, "header claims " + join_dims(out.dims) + " elements, more than the limit of " +
                                std::to_string(kMaxIdxElements));
    }
  }
  const std::uint64_t expected = header_bytes + count;
  const auto truncated = [&](std::uint64_t actual) {
    return DataError(path, "truncated: header says " + std::to_string(expected) + " bytes, " + has +
                               std::to_string(actual));
  };
  const auto trailing = [&](std::uint64_t extra, bool more) {
    return DataError(path, std::string(more ? "more than " : "") + std::to_string(extra) +
                               " bytes of trailing data after the " + std::to_string(expected) +
                               " bytes the header describes (dims " + join_dims(out.dims) + ")");
  };

  if (known_size) {
    if (*known_size < expected) throw truncated(*known_size);
    if (*known_size > expected) throw trailing(*known_size - expected, false);
    out.values.resize(count);
    got = in.read(out.values.data(), count);
    if (got < count) throw truncated(header_bytes + got);  // the file shrank while being read
  } else {
    // Size unknown until the data has arrived: grow geometrically with what was really read.
    std::size_t have = 0;
    while (have < count) {
      const std::size_t step = std::min<std::size_t>(count - have, std::max(have, kFirstGrowth));
      out.values.resize(have + step);
      got = in.read(out.values.data() + have, step);
      have += got;
      if (got < step) {
        out.values.clear();
        throw truncated(header_bytes + have);
      }
    }
  }

  // Whatever follows must be nothing. Reading on also makes inflate verify the gzip trailer.
  std::uint8_t scratch[4096];
  std::uint64_t extra = 0;
  while ((got = in.read(scratch, sizeof scratch)) > 0) {
    extra += got;
    if (extra > kMaxTrailingCount) throw trailing(kMaxTrailingCount, true);
  }
  if (extra) throw trailing(extra, false);
  return out;
}

}  // namespace detail

void write_idx(const std::string& path, const std::vector<std::int64_t>& dims,
               const std::vector<std::uint8_t>& values, bool gzip) {
  const std::string where = "write_idx(" + path + "): ";
  if (dims.empty() || dims.size() > static_cast<std::size_t>(kMaxIdxDims)) {
    throw std::invalid_argument(where + std::to_string(dims.size()) + " dimensions (IDX allows 1 to 4)");
  }
  std::uint64_t count = 1;
  for (const std::int64_t d : dims) {
    if (d <= 0 || d > std::int64_t{0xffffffff}) {
      throw std::invalid_argument(where + "dimension " + std::to_string(d) + " is outside 1..4294967295");
    }
    count *= static_cast<std::uint64_t>(d);
    if (count > kMaxIdxElements) {
      throw std::invalid_argument(where + "dims " + join_dims(dims) + " exceed the limit of " +
                                  std::to_string(kMaxIdxElements) + " elements");
    }
  }
  if (count != values.size()) {
    throw std::invalid_argument(where + "dims " + join_dims(dims) + " hold " + std::to_string(count) +
                                " values, got " + std::to_string(values.size()));
  }
  std::vector<std::uint8_t> header(4 + 4 * dims.size());
  header[2] = kIdxUnsignedByte;
  header[3] = static_cast<std::uint8_t>(dims.size());
  for (std::size_t d = 0; d < dims.size(); ++d) store_be32(&header[4 + 4 * d], static_cast<std::uint32_t>(dims[d]));

  if (gzip) {
    gzFile g = gzopen(path.c_str(), "wb");
    if (!g) throw DataError(path, "cannot open for writing: " + errno_text(errno));
    const auto put = [&](const std::uint8_t* p, std::size_t n) {
      while (n > 0) {  // gzwrite takes an unsigned count: write in pieces of at most 1 GiB
        const unsigned k = static_cast<unsigned>(std::min<std::size_t>(n, std::size_t{1} << 30));
        if (gzwrite(g, p, k) != static_cast<int>(k)) {
          int zerr = 0;
          const std::string msg = gzerror(g, &zerr);
          gzclose(g);
          throw DataError(path, "write error: " + (zerr == Z_ERRNO ? errno_text(errno) : msg));
        }
        p += k;
        n -= k;
      }
    };
    put(header.data(), header.size());
    put(values.data(), values.size());
    const int rc = gzclose(g);
    if (rc != Z_OK) throw DataError(path, std::string("write error on close: ") + zError(rc));
    return;
  }
  FilePtr f(std::fopen(path.c_str(), "wb"));
  if (!f) throw DataError(path, "cannot open for writing: " + errno_text(errno));
  if (std::fwrite(header.data(), 1, header.size(), f.get()) != header.size() ||
      (!values.empty() && std::fwrite(values.data(), 1, values.size(), f.get()) != values.size())) {
    throw DataError(path, "write error: " + errno_text(errno));
  }
  if (std::fclose(f.release()) != 0) throw DataError(path, "write error on close: " + errno_text(errno));
}

}  // namespace mf::data
