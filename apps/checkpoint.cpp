// checkpoint.cpp: the checkpoint file format of checkpoint.h: writing, checking, restoring.
#include "apps/checkpoint.h"

#include <zlib.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "apps/atomic_file.h"
#include "apps/common.h"
#include "kernels/gpu_runtime.h"

namespace mf::apps {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "checkpoint tensor data are stored as the host's bytes, which must be little-endian");

namespace {

constexpr char kMagic[8] = {'M', 'F', 'C', 'K', 'P', 'T', '\0', '\1'};
constexpr std::size_t kHeaderBytes = 8 + 4 + 4 + 8;  // magic, version, reserved, file_size
constexpr std::size_t kMinBytes = kHeaderBytes + 4 + 4 + 4 + 4;  // + arch, meta, count, crc
constexpr std::size_t kMaxArchitecture = 64 << 10;
constexpr std::size_t kMaxMeta = 16 << 20;
constexpr std::size_t kMaxName = 4096;
constexpr int kMaxRank = 8;
constexpr std::size_t kMinRecord = 4 + 1 + 1 + 8;  // empty name, dtype, rank 0, nbytes
constexpr const char* kOptimizerPrefix = "optimizer/";

// ---- writing ----

void put_u8(std::string& out, std::uint8_t v) { out.push_back(static_cast<char>(v)); }
void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_u64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_str(std::string& out, const std::string& s) {
  put_u32(out, static_cast<std::uint32_t>(s.size()));
  out += s;
}

std::string num(double v) {
  char b[40];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}
std::string utc_now() {
  char b[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return b;
}

std::string encode_meta(const CheckpointMeta& m) {
  std::ostringstream os;
  os << "epoch=" << m.epoch << "\npartial_epoch=" << (m.partial_epoch ? 1 : 0) << "\nseed=" << m.seed
     << "\nbatch_size=" << m.batch_size << "\nfp16=" << (m.fp16 ? 1 : 0) << "\noptimizer=" << one_line(m.optimizer)
     << "\noptimizer_config=" << one_line(m.optimizer_config) << "\nlr=" << num(m.lr) << "\nmomentum=" << num(m.momentum)
     << "\nvalidation_split=" << num(m.validation_split) << "\nlimit_train=" << m.limit_train
     << "\niterations=" << m.iterations << "\ndevice=" << one_line(m.device) << "\ncreated=" << one_line(m.created) << "\n";
  // One line per epoch: epoch loss accuracy val_loss val_accuracy train_seconds steps samples.
  for (const EpochLog& e : m.history)
    os << "history=" << e.epoch << " " << num(e.loss) << " " << num(e.accuracy) << " " << num(e.val_loss) << " "
       << num(e.val_accuracy) << " " << num(e.train_seconds) << " " << e.steps << " " << e.samples << "\n";
  return os.str();
}

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

std::string dims_str(const std::vector<std::int64_t>& d) { return Shape(d).str(); }

// Host tensor holding a record's bytes.
Tensor host_tensor(const CheckpointTensor& t, const std::uint8_t* bytes) {
  Tensor h = Tensor::empty(Shape(t.dims), t.dtype, Device::kCpu);
  if (t.nbytes) std::memcpy(h.raw(), bytes + t.offset, t.nbytes);
  return h;
}

}  // namespace

std::string serialize_checkpoint(Sequential& model, Optimizer* optimizer, const CheckpointMeta& meta_in) {
  CheckpointMeta meta = meta_in;
  if (optimizer) {
    meta.optimizer = optimizer->name();
    meta.optimizer_config = optimizer->describe();
    meta.iterations = optimizer->iterations();
  } else {
    meta.optimizer.clear();
  }
  if (meta.created.empty()) meta.created = utc_now();

  // Everything queued on the compute stream (the last update) must be done before the
  // copies below, which run on another stream.
  if (model.device() == Device::kGpu) gpu_synchronize();
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& layer : model.layers())
    for (Parameter* p : layer->parameters()) tensors.emplace_back(layer->name() + "/" + p->name, p->value);
  if (optimizer)
    for (auto& [name, t] : optimizer->state()) tensors.emplace_back(kOptimizerPrefix + name, t);

  std::string out;
  out.append(kMagic, sizeof kMagic);
  put_u32(out, kCheckpointVersion);
  put_u32(out, 0);
  put_u64(out, 0);  // file_size, filled in below
  put_str(out, model.architecture());
  put_str(out, encode_meta(meta));
  put_u32(out, static_cast<std::uint32_t>(tensors.size()));
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) throw std::logic_error("checkpoint: tensor " + name + " is undefined");
    const Tensor h = t.is_cpu() ? t : t.to(Device::kCpu);
    put_str(out, name);
    put_u8(out, static_cast<std::uint8_t>(h.dtype()));
    put_u8(out, static_cast<std::uint8_t>(h.rank()));
    for (int i = 0; i < h.rank(); ++i) put_u64(out, static_cast<std::uint64_t>(h.dim(i)));
    put_u64(out, h.nbytes());
    out.append(static_cast<const char*>(h.raw()), h.nbytes());
  }
  const std::uint64_t total = out.size() + 4;
  for (int i = 0; i < 8; ++i) out[16 + i] = static_cast<char>((total >> (8 * i)) & 0xff);
  const uLong crc = crc32_z(0L, reinterpret_cast<const Bytef*>(out.data()), out.size());
  put_u32(out, static_cast<std::uint32_t>(crc));
  return out;
}

// Throws CheckpointError unless `bytes` start as a checkpoint does (as far as there are any).
static void check_magic(const std::uint8_t* bytes, std::size_t size, const std::string& name) {
  if (size == 0) throw CheckpointError(name, "empty file (0 bytes), not a checkpoint");
  const std::size_t m = size < sizeof kMagic ? size : sizeof kMagic;
  if (std::memcmp(bytes, kMagic, m) != 0)
    throw CheckpointError(name, "not a microflow checkpoint (the file does not start with \"MFCKPT\")");
}

// Throws CheckpointError unless the values of `t` are sane: floats finite (a NaN weight
// would predict "nan%" for every class), counts not negative (a negative step count would
// give Adam a bias correction of the wrong sign), a loss scale finite and positive.
static void check_values(const CheckpointTensor& t, const std::uint8_t* bytes, const std::string& name) {
  const Tensor h = host_tensor(t, bytes);
  const bool state = t.name.rfind(kOptimizerPrefix, 0) == 0;
  const std::string what = std::string(state ? "optimizer state '" : "weight tensor '") + t.name + "'";
  if (h.dtype() == DType::kI32) {
    // Counts, except the loss scaler's first word: its scale, a float (kernels/launchers.h).
    const std::int32_t* v = h.data<std::int32_t>();
    const bool scaler = t.name.size() >= 11 && t.name.compare(t.name.size() - 11, 11, "loss_scaler") == 0;
    for (std::int64_t i = 0; i < h.numel(); ++i) {
      if (scaler && i == 0) {
        float scale = 0;
        std::memcpy(&scale, v, sizeof scale);
        if (!(std::isfinite(scale) && scale > 0))
          throw CheckpointError(name, what + " holds a loss scale of " + std::to_string(scale));
      } else if (v[i] < 0) {
        throw CheckpointError(name, what + " holds a negative count (" + std::to_string(v[i]) + ")");
      }
    }
  } else if (h.dtype() == DType::kF32 || h.dtype() == DType::kF16) {
    const Tensor f = h.dtype() == DType::kF32 ? h : h.to(DType::kF32);
    const float* v = f.data<float>();
    // Adam's second moment is a running mean of squares: a negative one would make the
    // step's square root NaN, which the run would report as a diverging learning rate.
    const bool squares = t.name == std::string(kOptimizerPrefix) + "adam.v";
    for (std::int64_t i = 0; i < f.numel(); ++i) {
      if (!std::isfinite(v[i]))
        throw CheckpointError(name, what + " holds a non-finite value (" + std::to_string(v[i]) + " at element " +
                                        std::to_string(i) + ")");
      if (squares && v[i] < 0)
        throw CheckpointError(name, what + " holds a negative value (" + std::to_string(v[i]) + " at element " +
                                        std::to_string(i) + "), which a mean of squares cannot be");
    }
  }
}

void save_checkpoint(const std::string& path, Sequential& model, Optimizer* optimizer, const CheckpointMeta& meta) {
  const std::string bytes = serialize_checkpoint(model, optimizer, meta);
  // Never replace a checkpoint with one that would be refused on loading (weights gone to
  // NaN in a step that diverged): the last good one stays. The bytes about to be written
  // get the checks of loading, metadata included.
  const auto* data = reinterpret_cast<const std::uint8_t*>(bytes.data());
  try {
    for (const CheckpointTensor& t : parse_checkpoint(data, bytes.size(), path, /*verify_checksum=*/false).tensors)
      check_values(t, data, path);
  } catch (const CheckpointError& e) {
    throw CheckpointError(path, "not saved, the file on disk is kept: " + without_path(path, e.what()));
  }
  try {
    write_bytes_atomic(path, bytes.data(), bytes.size());
  } catch (const std::runtime_error& e) {
    throw CheckpointError(path, "cannot save checkpoint: " + without_path(path, e.what()));
  }
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

void restore_checkpoint(const CheckpointContents& c, const std::uint8_t* bytes, const std::string& name,
                        Sequential& model, Optimizer* optimizer) {
  const std::string arch = model.architecture();
  if (c.architecture != arch) {
    // The same layers for other images (a run on other data, or resumed with another
    // --data) is said in those words; any other difference shows both architectures.
    // An architecture reads "input(28, 28, 1)|Conv2D->(1, 26, 26, 32)|...".
    const auto input_of = [](const std::string& a) {
      return a.rfind("input(", 0) == 0 && a.find('|') != std::string::npos ? a.substr(5, a.find('|') - 5) : "";
    };
    const auto layer_types = [](const std::string& a) {
      std::string types;
      for (std::size_t at = a.find('|'); at != std::string::npos; at = a.find('|', at + 1))
        types += a.substr(at, a.find("->", at) - at);
      return types;
    };
    const std::string saved_input = input_of(c.architecture), input = input_of(arch);
    if (!saved_input.empty() && !input.empty() && saved_input != input &&
        layer_types(c.architecture) == layer_types(arch)) {
      throw CheckpointError(name, "saved for a model of " + saved_input +
                                      " images (rows, cols, channels); this one takes " + input +
                                      ": the checkpoint comes from other data");
    }
    throw CheckpointError(name, "saved for another model: checkpoint " + c.architecture + " vs this model " + arch);
  }

  std::map<std::string, const CheckpointTensor*> by_name;
  for (const auto& t : c.tensors) by_name[t.name] = &t;

  // Every destination, paired with its record; nothing is written until all are found.
  struct Target {
    Tensor dst;
    const CheckpointTensor* src;
    Parameter* param;  // weights: the f16 copy to refresh; null for optimizer state
  };
  std::vector<Target> targets;
  auto find = [&](const std::string& key, const Tensor& dst, const char* what) {
    const auto it = by_name.find(key);
    if (it == by_name.end())
      throw CheckpointError(name, std::string("has no ") + what + " '" + key + "'");
    const CheckpointTensor& t = *it->second;
    if (t.dtype != dst.dtype() || Shape(t.dims) != dst.shape())
      throw CheckpointError(name, std::string(what) + " '" + key + "' is " + dtype_name(t.dtype) + " " +
                                      dims_str(t.dims) + ", the model needs " + dtype_name(dst.dtype()) + " " +
                                      dst.shape().str());
    by_name.erase(it);
    return &t;
  };
  for (const auto& layer : model.layers())
    for (Parameter* p : layer->parameters()) {
      const std::string key = layer->name() + "/" + p->name;
      targets.push_back({p->value, find(key, p->value, "weight tensor"), p});
    }
  if (optimizer) {
    if (c.meta.optimizer.empty())
      throw CheckpointError(name, "holds weights only (no optimizer state): it can be used to predict, not to resume");
    if (c.meta.optimizer != optimizer->name())
      throw CheckpointError(name, "was trained with " + c.meta.optimizer + ", this run uses " + optimizer->name());
    for (auto& [sname, t] : optimizer->state())
      targets.push_back({t, find(kOptimizerPrefix + sname, t, "optimizer state"), nullptr});
  }
  for (const auto& [key, t] : by_name) {
    if (!optimizer && key.rfind(kOptimizerPrefix, 0) == 0) continue;  // predict ignores optimizer state
    throw CheckpointError(name, "has a tensor '" + key + "' this model and optimizer do not have" +
                                    (key.find("loss_scaler") != std::string::npos
                                         ? " (saved with --fp16: resume it with --fp16)"
                                         : ""));
  }

  // The values: the checksum proves the file is whole, not that what was saved is sane.
  for (const auto& t : targets) check_values(*t.src, bytes, name);

  // All checked: copy. The compute stream may still be using these buffers.
  bool any_gpu = false;
  for (const auto& t : targets) any_gpu = any_gpu || t.dst.is_gpu();
  if (any_gpu) gpu_synchronize();
  for (auto& t : targets) {
    const Tensor h = host_tensor(*t.src, bytes);
    t.dst.copy_from(h);
    // Mixed precision: the f16 copy the layers compute with must match the new master
    // (round to nearest even, as the optimizer's own refresh does).
    if (t.param && t.param->half.defined()) t.param->half.copy_from(h.to(DType::kF16));
  }
  if (any_gpu) gpu_synchronize();
  // The restored loss scaler carries the skipped steps of earlier runs: take them now, so
  // the first resumed epoch reports only its own.
  if (optimizer) optimizer->take_skipped_steps();
}

CheckpointMeta load_checkpoint(const std::string& path, Sequential& model, Optimizer* optimizer) {
  const CheckpointFile f = read_checkpoint(path);
  restore_checkpoint(f.contents, reinterpret_cast<const std::uint8_t*>(f.bytes.data()), path, model, optimizer);
  return f.contents.meta;
}

}  // namespace mf::apps
