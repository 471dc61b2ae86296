// checkpoint.cpp: the checkpoint file format of checkpoint.h: writing, checking values, restoring.
#include "io/checkpoint.h"

#include <zlib.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <sstream>

#include "io/atomic_file.h"
#include "io/checkpoint_format.h"
#include "io/text.h"
#include "runtime/errors.h"  // one_line
#include "runtime/gpu_runtime.h"

namespace mf::io {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "checkpoint tensor data are stored as the host's bytes, which must be little-endian");

namespace {

using detail::dims_str;
using detail::kMagic;

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

std::string num(double v) { return exact_decimal(v); }

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

// Throws CheckpointError unless the values of `t` are sane: floats finite (a NaN weight
// would predict "nan%" for every class), counts not negative (a negative step count would
// give Adam a bias correction of the wrong sign), a loss scale finite and positive.
static void check_values(const CheckpointTensor& t, const std::uint8_t* bytes, const std::string& name) {
  const Tensor h = host_tensor(t, bytes);
  const bool state = t.name.rfind(kOptimizerPrefix, 0) == 0;
  const std::string what = std::string(state ? "optimizer state '" : "weight tensor '") + t.name + "'";
  if (h.dtype() == DType::kI32) {
    // Counts, except the loss scaler's first word: its scale, a float (kernels/gpu/launchers.h).
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

}  // namespace mf::io
