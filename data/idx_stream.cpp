// idx_stream.cpp: the IDX reader's inputs (file, memory, gzip) and its entry points read_idx, parse_idx.
#include "data/idx_stream.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>

#include "data/idx.h"

namespace mf::data {
namespace {

using detail::errno_text;
using detail::FilePtr;
using detail::Input;
using detail::parse_stream;

constexpr std::size_t kCompressedChunk = std::size_t{1} << 16;  // bytes handed to inflate at once

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

}  // namespace mf::data
