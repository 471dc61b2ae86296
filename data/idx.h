// idx.h: reading and writing IDX files (the MNIST container format), raw or gzip-compressed.
//
// IDX layout, all integers big-endian: two zero bytes, a type code, the number of dimensions
// (1..4), one uint32 per dimension, then the values row-major. Only unsigned bytes (type 0x08,
// magic 0x00000801..0x00000804) are supported; that is what MNIST and Fashion-MNIST use.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/file_error.h"

namespace mf::data {

// A data file is missing or malformed. what() is one line: "<path>: <what is wrong>".
class DataError : public FileError {
 public:
  DataError(const std::string& path, const std::string& problem) : FileError(Kind::kData, path, problem) {}
};

// An IDX file's contents: dims outermost first; values.size() == product of dims.
struct IdxArray {
  std::vector<std::int64_t> dims;
  std::vector<std::uint8_t> values;
};

// Largest element count a header may claim. MNIST's biggest file has 47,040,000.
constexpr std::uint64_t kMaxIdxElements = std::uint64_t{1} << 31;

// Reads a raw or gzip-compressed unsigned-byte IDX file. Gzip is recognised by its magic bytes
// (0x1f 0x8b), not by the file name. Throws DataError for anything wrong: cannot open, empty,
// truncated header or data, wrong magic, unsupported type, bad dimensions, trailing bytes,
// corrupt gzip. A header's claimed size is checked against the real file size (raw) or the
// bytes actually decompressed so far (gzip) before memory is committed to it, so a tiny file
// claiming gigabytes fails fast.
IdxArray read_idx(const std::string& path);

// The same for bytes already in memory (raw or gzip); `name` stands in for the path in errors.
IdxArray parse_idx(const std::uint8_t* bytes, std::size_t size, const std::string& name);

// Writes an unsigned-byte IDX file, gzip-compressed if `gzip` (whatever the name). Throws
// std::invalid_argument if dims are not 1..4 positive values below 2^32 whose product is
// values.size(), and DataError if the file cannot be written.
void write_idx(const std::string& path, const std::vector<std::int64_t>& dims,
               const std::vector<std::uint8_t>& values, bool gzip);

}  // namespace mf::data
