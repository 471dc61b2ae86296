// common.cpp: shared app helpers (see common.h).
#include "apps/common.h"

#include "kernels/kernel_options.h"

#include "io/atomic_file.h"
#include "io/text.h"

#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/mnist.h"
#include "runtime/device_allocator.h"
#include "runtime/errors.h"
#include "runtime/gpu_runtime.h"
#include "runtime/parallel.h"

#ifndef MF_SOURCE_DIR
#define MF_SOURCE_DIR "."
#endif

namespace mf::apps {

std::string default_data_dir() {
  if (const char* d = std::getenv("MF_DATA_DIR"); d && *d) return d;
  return std::string(MF_SOURCE_DIR) + "/.cache/mnist";
}

std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto c = line.find(':');
      if (c != std::string::npos) {
        std::string s = line.substr(c + 1);
        while (!s.empty() && s.front() == ' ') s.erase(s.begin());
        return s;
      }
    }
  }
  return "unknown CPU";
}

std::string hardware_description(Device device, int gpu_index) {
  std::ostringstream os;
  if (device == Device::kGpu) {
    const GpuDeviceInfo g = gpu_device_info(gpu_index);
    os << g.name << ", sm_" << g.major << g.minor << ", " << g.multiprocessors << " SMs, "
       << format_bytes(g.total_memory);
  } else {
    const int n = mf::num_threads();
    os << cpu_model_name() << ", " << n << (n == 1 ? " thread" : " threads");
  }
  return os.str();
}

void check_output_path(const char* flag, const std::string& path) {
  if (path.empty()) return;
  try {
    io::output_target(path);  // as io::write_bytes_atomic judges it, so that what passes here is written
  } catch (const std::runtime_error& e) {
    throw std::invalid_argument(std::string("--") + flag + " " + path + ": " + io::without_path(path, e.what()));
  }
}

bool same_file(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return false;
  struct stat sa {}, sb {};
  if (::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0)
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;  // hard links and symlinks too
  // One does not exist yet: the same name once the existing folders and links are resolved.
  std::error_code ea, eb;
  const auto ca = std::filesystem::weakly_canonical(a, ea), cb = std::filesystem::weakly_canonical(b, eb);
  return !ea && !eb && ca == cb;
}

std::string same_file_among(const std::string& path, const std::vector<std::string>& files) {
  for (const std::string& f : files)
    if (same_file(path, f)) return f;
  return "";
}

std::vector<std::string> data_files_in(const std::string& data_dir) {
  try {
    const data::MnistFiles f = data::find_mnist_files(data_dir);
    return {f.train_images, f.train_labels, f.test_images, f.test_labels};
  } catch (const data::DataError&) {
    return {};
  }
}

void reserve_standard_fds() {
  for (int fd = 0; fd <= 2; ++fd)
    if (::fcntl(fd, F_GETFD) == -1 && errno == EBADF) {
      const int got = ::open("/dev/null", O_RDONLY);  // the lowest free number: fd itself
      if (got > 2) ::close(got);
    }
}

void write_failures_are_errors() {
  std::signal(SIGPIPE, SIG_IGN);
  std::signal(SIGXFSZ, SIG_IGN);
}

int exit_status_after_stdout(const char* program, int status) {
  if (std::fflush(stdout) == 0 && !std::ferror(stdout)) return status;
  const int err = errno;
  if (status != 0) return status;
  std::fprintf(stderr, "%s: error: could not write the output (standard output): %s\n", program,
               err ? std::strerror(err) : "write error");
  return 1;
}

void write_file_atomic(const std::string& path, const std::string& text) {
  io::write_bytes_atomic(path, text.data(), text.size());
}

namespace {
// The length of the well-formed UTF-8 sequence at s[i] (1 to 4), or 0 when the bytes there
// are not one; then `*bad` is how many bytes to replace with one U+FFFD: the longest start
// of a valid sequence, at least 1 (Unicode's "maximal subpart", as Python's
// decode("utf-8", "replace") does). Well-formed means RFC 3629: no overlong forms, no
// surrogates (U+D800..U+DFFF), nothing past U+10FFFF.
std::size_t utf8_sequence(const std::string& s, std::size_t i, std::size_t* bad) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char b0 = byte(i);
  *bad = 1;
  if (b0 < 0x80) return 1;
  // The length the lead byte announces and the range its second byte must lie in (the
  // narrower ranges rule out overlong forms, surrogates and code points past U+10FFFF);
  // later bytes are all continuation bytes, 0x80..0xBF.
  std::size_t len = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) len = 2;
  else if (b0 == 0xE0) len = 3, lo = 0xA0;
  else if (b0 >= 0xE1 && b0 <= 0xEC) len = 3;
  else if (b0 == 0xED) len = 3, hi = 0x9F;
  else if (b0 >= 0xEE && b0 <= 0xEF) len = 3;
  else if (b0 == 0xF0) len = 4, lo = 0x90;
  else if (b0 >= 0xF1 && b0 <= 0xF3) len = 4;
  else if (b0 == 0xF4) len = 4, hi = 0x8F;
  else return 0;  // a continuation byte on its own, C0, C1, F5..FF: never valid
  for (std::size_t k = 1; k < len; ++k) {
    if (i + k >= s.size()) return 0;  // cut short by the end of the string
    const unsigned char b = byte(i + k);
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return 0;
    *bad = k + 1;
  }
  return len;
}
}  // namespace

std::string json_string(const std::string& s) {
  std::string r = "\"";
  for (std::size_t i = 0; i < s.size();) {
    const char c = s[i];
    std::size_t bad = 1;
    const std::size_t n = utf8_sequence(s, i, &bad);
    if (n == 0) {
      r += "\xef\xbf\xbd";  // U+FFFD REPLACEMENT CHARACTER, in UTF-8
      i += bad;
      continue;
    }
    if (n > 1) r.append(s, i, n);  // a valid multi-byte character, as it is
    else if (c == '"' || c == '\\') r += '\\', r += c;
    else if (static_cast<unsigned char>(c) < 0x20) r += ' ';  // control characters: a space
    else r += c;
    i += n;
  }
  return r + "\"";
}

namespace {
// The shortest decimal that reads back as the same double, so that two runs' files compare
// equal exactly when their numbers do (six digits hid differences in the last bits).
std::string num(double v) { return std::isfinite(v) ? io::exact_decimal(v) : "null"; }  // JSON has no NaN
}  // namespace

void write_metrics_json(const std::string& path, const RunInfo& info, const History& h, const EvalResult& test,
                        Sequential& model) {
  std::ostringstream os;
  os << "{\n  \"date\": " << json_string(io::utc_now()) << ",\n  \"device\": " << json_string(device_name(info.device))
     << ",\n  \"hardware\": " << json_string(info.hardware) << ",\n  \"precision\": " << json_string(info.fp16 ? "fp16" : "fp32")
     << ",\n  \"kernels\": " << json_string(rung_name(model.rung()))
     << ",\n  \"batch_size\": " << info.batch_size << ",\n  \"threads\": " << info.threads
     << ",\n  \"seed\": " << info.seed << ",\n  \"deterministic\": " << (info.deterministic ? "true" : "false")
     << ",\n  \"params\": " << model.num_params()
     << ",\n  \"data\": " << json_string(info.data_dir) << ",\n  \"interrupted\": " << (h.interrupted ? "true" : "false")
     << ",\n  \"epochs\": [";
  for (std::size_t i = 0; i < h.epochs.size(); ++i) {
    const EpochLog& e = h.epochs[i];
    os << (i ? "," : "") << "\n    {\"epoch\": " << e.epoch + 1 << ", \"loss\": " << num(e.loss)
       << ", \"accuracy\": " << num(e.accuracy) << ", \"val_loss\": " << num(e.val_loss)
       << ", \"val_accuracy\": " << num(e.val_accuracy) << ", \"train_seconds\": " << num(e.train_seconds)
       << ", \"steps\": " << e.steps << ", \"ms_per_step\": " << num(e.steps ? 1000.0 * e.train_seconds / e.steps : NAN);
    if (info.fp16) os << ", \"loss_scale\": " << num(e.loss_scale) << ", \"skipped_steps\": " << e.skipped_steps;
    if (i + 1 == h.epochs.size() && h.ended_mid_epoch()) os << ", \"partial\": true";
    os << "}";
  }
  os << "\n  ],\n  \"test_loss\": " << num(test.loss) << ",\n  \"test_accuracy\": " << num(test.accuracy)
     << ",\n  \"test_count\": " << test.count;
  if (info.device == Device::kGpu)
    os << ",\n  \"gpu_peak_bytes\": " << DeviceAllocator::instance().peak();
  os << "\n}\n";
  write_file_atomic(path, os.str());
}

void print_cpu_report(Sequential& model) {
  const int n = cpu_pool().num_threads();
  std::printf("CPU layers (%d %s):\n", n, n == 1 ? "thread" : "threads");
  for (const auto& l : model.layers()) {
    const std::string c = l->cpu_config();
    if (!c.empty()) std::printf("  %-16s %-13s %s\n", l->name().c_str(), l->type().c_str(), c.c_str());
  }
}

void print_gpu_report(Sequential& model, bool fp16) {
  std::printf("GPU layers (%s):\n", fp16 ? "mixed precision: f16 storage, f32 accumulation" : "fp32");
  for (const auto& l : model.layers()) {
    const std::string c = l->gpu_config();
    std::printf("  %-16s %-13s %s\n", l->name().c_str(), l->type().c_str(), c.empty() ? "custom kernel" : c.c_str());
  }
  const std::string info = model.gpu_training_info();
  if (!info.empty()) std::printf("  training step: %s\n", info.c_str());
  const DeviceAllocator& a = DeviceAllocator::instance();
  std::printf("  device memory: %s in use, peak %s, reserved %s%s\n", format_bytes(a.in_use()).c_str(),
              format_bytes(a.peak()).c_str(), format_bytes(a.reserved()).c_str(),
              a.limit() ? (", limit " + format_bytes(a.limit())).c_str() : "");
}

}  // namespace mf::apps
