// idx_stream.h: internal to data/idx*.cpp: the byte stream the IDX parser reads, and the parser itself.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/idx.h"

namespace mf::data::detail {

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

// std::strerror's text for the errno value `err`.
std::string errno_text(int err);

// Parses one IDX stream (idx.cpp); known_size: the whole input's size, when known up front.
IdxArray parse_stream(Input& in, const std::string& path, std::optional<std::uint64_t> known_size,
                      bool gzipped);

}  // namespace mf::data::detail
