// idx.cpp: IDX reader (raw or gzip, validated before anything large is allocated) and writer.
#include "data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>

namespace mf::data {
namespace {

constexpr std::size_t kCompressedChunk = std::size_t{1} << 16;  // bytes handed to inflate at once
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

std::string errno_text(int err) { return std::strerror(err); }

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

// A forward-only byte stream. read() returns fewer than n bytes only at the end of the data.
// peek() looks at the first bytes without consuming them (used once, to spot gzip).
class Input {
 public:
  virtual ~Input() = default;

  std::size_t read(std::uint8_t* dst, std::size_t n) {
    std::size_t got = 0;
    while (got < n && pushback_pos_ < pushback_.size()) dst[got++] = pushback_[pushback_pos_++];
    if (got < n) got += read_more(dst + got, n - got);
    return got;
  }

  std::size_t peek(std::uint8_t* dst, std::size_t n) {
    pushback_.resize(n);
    pushback_.resize(read_more(pushback_.data(), n));
    pushback_pos_ = 0;
    std::copy(pushback_.begin(), pushback_.end(), dst);
    return pushback_.size();
  }

 protected:
  virtual std::size_t read_more(std::uint8_t* dst, std::size_t n) = 0;

 private:
  std::vector<std::uint8_t> pushback_;
  std::size_t pushback_pos_ = 0;
};

struct FileClose {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileClose>;

class FileInput final : public Input {
 public:
  FileInput(std::FILE* f, const std::string& path) : f_(f), path_(path) {}

 protected:
  std::size_t read_more(std::uint8_t* dst, std::size_t n) override {
    std::size_t got = 0;
    while (got < n) {
      const std::size_t r = std::fread(dst + got, 1, n - got, f_);
      got += r;
      if (r == 0) {
        if (std::ferror(f_)) throw DataError(path_, "read error: " + errno_text(errno));
        break;
      }
    }
    return got;
  }

 private:
  std::FILE* f_;
  const std::string& path_;
};

class MemoryInput final : public Input {
 public:
  MemoryInput(const std::uint8_t* p, std::size_t size) : p_(p), left_(size) {}

 protected:
  std::size_t read_more(std::uint8_t* dst, std::size_t n) override {
    const std::size_t k = std::min(n, left_);
    if (k) std::memcpy(dst, p_, k);
    p_ += k;
    left_ -= k;
    return k;
  }

 private:
  const std::uint8_t* p_;
  std::size_t left_;
};

// Decompresses a gzip stream read from `src`. Several concatenated members are one stream (as
// gzip -d treats them); zero bytes after the last member are padding and ignored (as gzip -d
// does); anything else there, a cut-off stream, or a bad CRC is a DataError.
class GzipInput final : public Input {
 public:
  GzipInput(Input& src, const std::string& path) : src_(src), path_(path), in_(kCompressedChunk) {
    // 16 + MAX_WBITS: gzip wrapper only, so the CRC-32 and length in each trailer are checked.
    const int rc = inflateInit2(&strm_, 16 + MAX_WBITS);
    if (rc != Z_OK) throw DataError(path_, std::string("cannot start gzip decompression: ") + zError(rc));
    start_member();
  }
  ~GzipInput() override { inflateEnd(&strm_); }
  GzipInput(const GzipInput&) = delete;
  GzipInput& operator=(const GzipInput&) = delete;

 protected:
  std::size_t read_more(std::uint8_t* dst, std::size_t n) override {
    std::size_t got = 0;
    while (got < n && !finished_) {
      if (strm_.avail_in == 0 && !src_eof_) refill();
      if (between_members_) {
        skip_zero_padding();
        if (strm_.avail_in == 0 && src_eof_) {
          finished_ = true;
          break;
        }
        if (strm_.avail_in == 0) continue;
        const int rc = inflateReset(&strm_);
        if (rc != Z_OK) throw DataError(path_, std::string("gzip error: ") + zError(rc));
        start_member();
      }
      // avail_out is a uInt: hand over at most UINT_MAX bytes per call.
      const std::size_t want = std::min<std::size_t>(n - got, UINT_MAX);
      strm_.next_out = dst + got;
      strm_.avail_out = static_cast<uInt>(want);
      const int rc = inflate(&strm_, Z_NO_FLUSH);
      got += want - strm_.avail_out;
      switch (rc) {
        case Z_OK:
          break;
        case Z_STREAM_END:
          between_members_ = true;
          ++members_done_;
          break;
        case Z_BUF_ERROR:  // no progress: inflate needs more input than there is
          if (strm_.avail_in == 0 && src_eof_ && members_done_ > 0 && header_.done != 1) {
            // A whole member, then a few bytes that end before a gzip header does: junk
            // (or a second member cut inside its header), not a cut in the data.
            throw DataError(path_, "trailing garbage after the end of the gzip stream (bytes that are not a "
                                   "whole gzip member after member " + std::to_string(members_done_) + ")");
          }
          if (strm_.avail_in == 0 && src_eof_) {
            throw DataError(path_, "truncated gzip stream: the compressed data ends after " +
                                       std::to_string(compressed_read_) +
                                       " bytes, in the middle of the stream");
          }
          break;
        case Z_MEM_ERROR:
          throw DataError(path_, "out of memory while decompressing");
        default:  // Z_DATA_ERROR, Z_STREAM_ERROR, Z_NEED_DICT
          if (members_done_ > 0 && header_.done != 1) {
            throw DataError(path_, "trailing garbage after the end of the gzip stream");
          }
          throw DataError(path_, std::string("corrupt gzip data: ") +
                                     (strm_.msg ? strm_.msg : zError(rc)));
      }
    }
    return got;
  }

 private:
  void refill() {
    const std::size_t r = src_.read(in_.data(), in_.size());
    compressed_read_ += r;
    strm_.next_in = in_.data();
    strm_.avail_in = static_cast<uInt>(r);
    if (r < in_.size()) src_eof_ = true;
  }

  void skip_zero_padding() {
    while (true) {
      while (strm_.avail_in > 0 && *strm_.next_in == 0) {
        ++strm_.next_in;
        --strm_.avail_in;
      }
      if (strm_.avail_in > 0 || src_eof_) return;
      refill();
    }
  }

  // header_.done becomes 1 once inflate has read a whole member header (-1 if the bytes are not
  // gzip): an error before that, after a complete member, means what follows is not gzip at all.
  void start_member() {
    header_ = gz_header{};
    inflateGetHeader(&strm_, &header_);
    between_members_ = false;
  }

  Input& src_;
  const std::string& path_;
  std::vector<std::uint8_t> in_;
  z_stream strm_{};
  gz_header header_{};
  std::uint64_t compressed_read_ = 0;
  int members_done_ = 0;
  bool src_eof_ = false, between_members_ = false, finished_ = false;
};

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

IdxArray parse_input(Input& in, const std::string& path, std::optional<std::uint64_t> known_size) {
  std::uint8_t sig[2];
  const std::size_t n = in.peek(sig, sizeof sig);
  if (n == 0) throw DataError(path, "empty file (0 bytes)");
  if (n == 2 && sig[0] == 0x1f && sig[1] == 0x8b) {
    GzipInput gz(in, path);
    return parse_stream(gz, path, std::nullopt, /*gzipped=*/true);
  }
  return parse_stream(in, path, known_size, /*gzipped=*/false);
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!ec && std::filesystem::is_directory(status)) throw DataError(path, "cannot open: is a folder, not a file");
  FilePtr f(std::fopen(path.c_str(), "rb"));
  if (!f) throw DataError(path, "cannot open: " + errno_text(errno));
  // Regular files have a size to check the header against; pipes and the like are read as
  // they come, like gzip data.
  std::optional<std::uint64_t> size;
  if (!ec && std::filesystem::is_regular_file(status)) {
    const auto s = std::filesystem::file_size(path, ec);
    if (!ec) size = s;
  }
  FileInput in(f.get(), path);
  return parse_input(in, path, size);
}

IdxArray parse_idx(const std::uint8_t* bytes, std::size_t size, const std::string& name) {
  MemoryInput in(bytes, size);
  return parse_input(in, name, size);
}

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
