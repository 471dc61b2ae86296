// checkpoint_read.cpp: the checkpoint file format of checkpoint.h: parsing (every byte checked), reading.
#include "io/checkpoint.h"

#include <zlib.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <sstream>

#include "io/atomic_file.h"
#include "io/checkpoint_format.h"

namespace mf::io {

namespace {

using detail::dims_str;
using detail::kMagic;

constexpr std::size_t kHeaderBytes = 8 + 4 + 4 + 8;  // magic, version, reserved, file_size
constexpr std::size_t kMinBytes = kHeaderBytes + 4 + 4 + 4 + 4;  // + arch, meta, count, crc
constexpr std::size_t kMaxArchitecture = 64 << 10;
constexpr std::size_t kMaxMeta = 16 << 20;
constexpr std::size_t kMaxName = 4096;
constexpr int kMaxRank = 8;
constexpr std::size_t kMinRecord = 4 + 1 + 1 + 8;  // empty name, dtype, rank 0, nbytes

// ---- reading ----

// A cursor over the bytes that refuses to step past the end.
class Reader {
 public:
  Reader(const std::uint8_t* p, std::size_t size, const std::string& name) : p_(p), size_(size), name_(name) {}
  std::size_t pos() const { return pos_; }
  std::size_t left() const { return size_ - pos_; }
  [[noreturn]] void malformed(const std::string& what) const {
    throw CheckpointError(name_, "malformed checkpoint: " + what + " (at byte " + std::to_string(pos_) + ")");
  }
  void need(std::size_t n, const char* what) const {
    if (n > left())
      malformed(std::string(what) + " needs " + std::to_string(n) + " bytes, only " + std::to_string(left()) +
                " left");
  }
  std::uint8_t u8(const char* what) {
    need(1, what);
    return p_[pos_++];
  }
  std::uint32_t u32(const char* what) {
    need(4, what);
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(p_[pos_ + i]) << (8 * i);
    pos_ += 4;
    return v;
  }
  std::uint64_t u64(const char* what) {
    need(8, what);
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(p_[pos_ + i]) << (8 * i);
    pos_ += 8;
    return v;
  }
  // A length-prefixed string. No checkpoint holds a control byte in one (the meta's lines
  // end in '\n'; one_line() keeps the others out of its values): one there is damage, and printed in a
  // message it would cut it short (NUL) or reach the terminal (ESC).
  std::string str(std::size_t max_len, const char* what, bool lines = false) {
    const std::uint32_t n = u32(what);
    if (n > max_len) malformed(std::string(what) + " length " + std::to_string(n) + " is over the limit");
    need(n, what);
    std::string s(reinterpret_cast<const char*>(p_ + pos_), n);
    for (std::size_t i = 0; i < s.size(); ++i) {
      const auto c = static_cast<unsigned char>(s[i]);
      if ((c < 0x20 && !(lines && c == '\n')) || c == 0x7f) {
        char b[24];
        std::snprintf(b, sizeof b, "0x%02x", c);
        malformed(std::string(what) + " holds the control byte " + b + " at its byte " + std::to_string(i) +
                  " (a damaged file)");
      }
    }
    pos_ += n;
    return s;
  }
  void skip(std::size_t n, const char* what) {
    need(n, what);
    pos_ += n;
  }

 private:
  const std::uint8_t* p_;
  std::size_t size_, pos_ = 0;
  const std::string& name_;
};

std::int64_t parse_int(const Reader& r, const std::string& key, const std::string& v) {
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno == ERANGE) r.malformed("meta '" + key + "' is not a whole number: '" + v + "'");
  return x;
}
double parse_double(const Reader& r, const std::string& key, const std::string& v) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0') r.malformed("meta '" + key + "' is not a number: '" + v + "'");
  return x;
}

CheckpointMeta decode_meta(const Reader& r, const std::string& text) {
  CheckpointMeta m;
  std::set<std::string> seen;
  std::istringstream is(text);
  std::string line;
  while (std::getline(is, line)) {
    if (line.empty()) continue;
    const auto eq = line.find('=');
    if (eq == std::string::npos) r.malformed("meta line without '=': '" + line.substr(0, 60) + "'");
    const std::string key = line.substr(0, eq), v = line.substr(eq + 1);
    if (key == "history") {
      std::istringstream hs(v);
      std::string f[8];
      for (auto& s : f) hs >> s;
      std::string extra;
      if (f[7].empty() || (hs >> extra)) r.malformed("meta 'history' needs 8 fields: '" + v.substr(0, 80) + "'");
      EpochLog e;
      const std::int64_t ep = parse_int(r, key, f[0]);
      if (ep < 0 || ep > 1000000) r.malformed("meta 'history' epoch out of range");
      e.epoch = static_cast<int>(ep);
      // The values go into plots, the metrics JSON and the resumed run's history. A value
      // that training cannot produce (a loss is a mean of float cross-entropies: not negative,
      // at most the largest float; an accuracy is a fraction; a time is finite) is read as
      // NaN, "not known", which the plot leaves out and the JSON writes as null. A history
      // is a record, not the model: a file from an older version whose run diverged still
      // loads, with its weights, rather than being refused whole.
      const auto field = [&](int i, double hi) {
        const double x = parse_double(r, key, f[i]);
        return x >= 0 && x <= hi ? x : std::nan("");
      };
      const double kMaxLoss = std::numeric_limits<float>::max();
      e.loss = field(1, kMaxLoss);
      e.accuracy = field(2, 1);
      e.val_loss = field(3, kMaxLoss);
      e.val_accuracy = field(4, 1);
      e.train_seconds = field(5, std::numeric_limits<double>::max());
      e.steps = parse_int(r, key, f[6]);
      e.samples = parse_int(r, key, f[7]);
      if (e.steps < 0 || e.samples < 0)
        r.malformed("meta 'history' of epoch " + std::to_string(ep + 1) + ": a negative count of steps or samples");
      m.history.push_back(e);
      continue;
    }
    if (!seen.insert(key).second) r.malformed("meta key '" + key + "' appears twice");
    if (key == "epoch") {
      const std::int64_t e = parse_int(r, key, v);
      if (e < 0 || e > 1000000) r.malformed("meta 'epoch' out of range: " + v);
      m.epoch = static_cast<int>(e);
    } else if (key == "partial_epoch") {
      m.partial_epoch = parse_int(r, key, v) != 0;
    } else if (key == "seed") {
      const std::int64_t s = parse_int(r, key, v);
      if (s < 0) r.malformed("meta 'seed' is negative");
      m.seed = static_cast<std::uint64_t>(s);
    } else if (key == "batch_size") {
      m.batch_size = parse_int(r, key, v);
      if (m.batch_size < 0) r.malformed("meta 'batch_size' is negative");
    } else if (key == "fp16") {
      m.fp16 = parse_int(r, key, v) != 0;
    } else if (key == "optimizer") {
      m.optimizer = v;
    } else if (key == "optimizer_config") {
      m.optimizer_config = v;
    } else if (key == "lr") {
      m.lr = parse_double(r, key, v);
    } else if (key == "momentum") {
      m.momentum = parse_double(r, key, v);
    } else if (key == "validation_split") {
      m.validation_split = parse_double(r, key, v);
    } else if (key == "limit_train") {
      m.limit_train = parse_int(r, key, v);
    } else if (key == "iterations") {
      m.iterations = parse_int(r, key, v);
    } else if (key == "device") {
      m.device = v;
    } else if (key == "created") {
      m.created = v;
    }  // unknown keys: written by a newer build, ignored
  }
  for (const char* k : {"epoch", "seed", "batch_size"})
    if (!seen.count(k)) r.malformed(std::string("meta has no '") + k + "'");
  return m;
}

bool valid_dtype(std::uint8_t d) { return d <= static_cast<std::uint8_t>(DType::kI32); }

}  // namespace

namespace detail {

std::string dims_str(const std::vector<std::int64_t>& d) { return Shape(d).str(); }

}  // namespace detail

// Throws CheckpointError unless `bytes` start as a checkpoint does (as far as there are any).
static void check_magic(const std::uint8_t* bytes, std::size_t size, const std::string& name) {
  if (size == 0) throw CheckpointError(name, "empty file (0 bytes), not a checkpoint");
  const std::size_t m = size < sizeof kMagic ? size : sizeof kMagic;
  if (std::memcmp(bytes, kMagic, m) != 0)
    throw CheckpointError(name, "not a microflow checkpoint (the file does not start with \"MFCKPT\")");
}

CheckpointContents parse_checkpoint(const std::uint8_t* bytes, std::size_t size, const std::string& name,
                                    bool verify_checksum) {
  check_magic(bytes, size, name);
  if (size < kHeaderBytes)
    throw CheckpointError(name, "truncated: only " + std::to_string(size) + " bytes, not even a header");
  Reader r(bytes, size, name);
  r.skip(sizeof kMagic, "magic");
  const std::uint32_t version = r.u32("version");
  if (version != kCheckpointVersion)
    throw CheckpointError(name, "checkpoint format version " + std::to_string(version) + ", this build reads version " +
                                    std::to_string(kCheckpointVersion));
  r.u32("reserved");
  const std::uint64_t file_size = r.u64("file size");
  // A size no checkpoint can have is a damaged header, not a file cut short.
  if (file_size > size && file_size > kMaxCheckpointBytes)
    throw CheckpointError(name, "corrupted header: it gives the file's size as " + std::to_string(file_size) +
                                    " bytes, more than any checkpoint has (" +
                                    std::to_string(kMaxCheckpointBytes >> 20) + " MiB at most); the file has " +
                                    std::to_string(size));
  if (file_size > size)
    throw CheckpointError(name, "truncated: " + std::to_string(size) + " of " + std::to_string(file_size) +
                                    " bytes (an interrupted copy or download?)");
  if (file_size < size)
    throw CheckpointError(name, "has " + std::to_string(size) + " bytes but its header says " +
                                    std::to_string(file_size) + " (extra bytes after the end, or a corrupted header)");
  if (size < kMinBytes) throw CheckpointError(name, "truncated: only " + std::to_string(size) + " bytes");
  const std::size_t body = size - 4;
  std::uint32_t stored = 0;
  for (int i = 0; i < 4; ++i) stored |= static_cast<std::uint32_t>(bytes[body + i]) << (8 * i);
  if (verify_checksum) {
    const auto crc = static_cast<std::uint32_t>(crc32_z(0L, bytes, body));
    if (crc != stored) {
      char b[96];
      std::snprintf(b, sizeof b, "corrupted: checksum mismatch (stored %08x, computed %08x)", stored, crc);
      throw CheckpointError(name, b);
    }
  }

  Reader body_r(bytes, body, name);
  body_r.skip(kHeaderBytes, "header");
  CheckpointContents c;
  c.architecture = body_r.str(kMaxArchitecture, "architecture");
  c.meta = decode_meta(body_r, body_r.str(kMaxMeta, "meta", /*lines=*/true));
  const std::uint32_t count = body_r.u32("tensor count");
  if (count > body_r.left() / kMinRecord)
    body_r.malformed("tensor count " + std::to_string(count) + " cannot fit in " + std::to_string(body_r.left()) +
                     " bytes");
  std::set<std::string> names;
  c.tensors.reserve(count);
  for (std::uint32_t i = 0; i < count; ++i) {
    CheckpointTensor t;
    t.name = body_r.str(kMaxName, "tensor name");
    if (t.name.empty()) body_r.malformed("a tensor has an empty name");
    if (!names.insert(t.name).second) body_r.malformed("tensor '" + t.name + "' appears twice");
    const std::uint8_t dt = body_r.u8("dtype");
    if (!valid_dtype(dt)) body_r.malformed("tensor '" + t.name + "' has unknown dtype " + std::to_string(dt));
    t.dtype = static_cast<DType>(dt);
    const int rank = body_r.u8("rank");
    if (rank > kMaxRank) body_r.malformed("tensor '" + t.name + "' has rank " + std::to_string(rank));
    // The product of the non-zero dimensions is bounded by the bytes the file has left at
    // every step, so it never overflows (not even in a Shape made from these dimensions
    // later, whatever zeros come with them) and never exceeds what the file holds.
    std::uint64_t nonzero = 1;
    bool has_zero = false;
    for (int d = 0; d < rank; ++d) {
      const std::uint64_t dim = body_r.u64("dimension");
      t.dims.push_back(static_cast<std::int64_t>(dim & 0x7fffffffffffffffu));
      if (dim == 0) {
        has_zero = true;
        continue;
      }
      if (nonzero > (body_r.left() + 1) / dim)
        body_r.malformed("tensor '" + t.name + "' has dimensions " + std::to_string(dim) + " and more: larger than the file");
      nonzero *= dim;
    }
    const std::uint64_t numel = has_zero ? 0 : nonzero;
    const std::uint64_t nbytes = body_r.u64("data size");
    if (numel > body_r.left() || nbytes != numel * dtype_size(t.dtype))
      body_r.malformed("tensor '" + t.name + "' " + dims_str(t.dims) + " " + dtype_name(t.dtype) + " does not match " +
                       std::to_string(nbytes) + " data bytes");
    t.offset = body_r.pos();
    t.nbytes = static_cast<std::size_t>(nbytes);
    body_r.skip(t.nbytes, "tensor data");
    c.tensors.push_back(std::move(t));
  }
  if (body_r.left() != 0) body_r.malformed(std::to_string(body_r.left()) + " unread bytes before the checksum");
  return c;
}

bool is_checkpoint_file(const std::string& path) {
  std::error_code ec;
  if (path.empty() || !std::filesystem::is_regular_file(path, ec)) return false;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  char head[sizeof kMagic];
  const bool whole = std::fread(head, 1, sizeof head, f) == sizeof head;
  std::fclose(f);
  return whole && std::memcmp(head, kMagic, sizeof kMagic) == 0;
}

CheckpointFile read_checkpoint(const std::string& path) {
  CheckpointFile f;
  f.path = path;
  // The magic is checked on the first bytes read, so a device or a pipe that is not a
  // checkpoint (/dev/zero, /dev/urandom) is refused at once instead of being read to the
  // size limit.
  const HeadCheck magic = [&](const std::string& head) {
    check_magic(reinterpret_cast<const std::uint8_t*>(head.data()), head.size(), path);
  };
  try {
    f.bytes = read_file_bytes(path, kMaxCheckpointBytes, magic);
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::runtime_error& e) {
    throw CheckpointError(path, without_path(path, e.what()));
  }
  f.contents = parse_checkpoint(reinterpret_cast<const std::uint8_t*>(f.bytes.data()), f.bytes.size(), path);
  return f;
}

}  // namespace mf::io
