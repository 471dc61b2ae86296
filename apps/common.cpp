// common.cpp: shared app helpers (see common.h).
#include "apps/common.h"

#include "apps/atomic_file.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/device_allocator.h"
#include "kernels/errors.h"
#include "kernels/gpu_runtime.h"
#include "tensor/parallel.h"

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
    os << cpu_model_name() << ", " << mf::num_threads() << " threads";
  }
  return os.str();
}

void check_output_path(const char* flag, const std::string& path) {
  if (path.empty()) return;
  const std::string what = std::string("--") + flag + " " + path;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    throw std::invalid_argument(what + ": is a folder, not a file");
  if (path.back() == '/') throw std::invalid_argument(what + ": ends in '/': names a folder, not a file");
  const std::string dir = parent_dir(path);
  if (::stat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode))  // access() alone passes a file
    throw std::invalid_argument(what + ": " + dir + " is a file, not a folder");
  if (::access(dir.c_str(), W_OK) != 0)
    throw std::invalid_argument(what + ": folder " + dir + " does not exist or is not writable");
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

int exit_status_after_stdout(const char* program, int status) {
  if (std::fflush(stdout) == 0 && !std::ferror(stdout)) return status;
  const int err = errno;
  std::fprintf(stderr, "%s: error: could not write the output (standard output): %s\n", program,
               err ? std::strerror(err) : "write error");
  return status == 0 ? 1 : status;
}

std::string one_line(const std::string& s) {
  std::string r = s;
  for (char& c : r)
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  return r;
}

void write_file_atomic(const std::string& path, const std::string& text) {
  write_bytes_atomic(path, text.data(), text.size());
}

namespace {
std::string num(double v) {
  if (!std::isfinite(v)) return "null";
  char b[64];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}
std::string quote(const std::string& s) {
  std::string r = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') r += '\\', r += c;
    else if (static_cast<unsigned char>(c) < 0x20) r += ' ';
    else r += c;
  }
  return r + "\"";
}
std::string utc_now() {
  char b[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return b;
}
}  // namespace

void write_metrics_json(const std::string& path, const RunInfo& info, const History& h, const EvalResult& test,
                        Sequential& model) {
  std::ostringstream os;
  os << "{\n  \"date\": " << quote(utc_now()) << ",\n  \"device\": " << quote(device_name(info.device))
     << ",\n  \"hardware\": " << quote(info.hardware) << ",\n  \"precision\": " << quote(info.fp16 ? "fp16" : "fp32")
     << ",\n  \"batch_size\": " << info.batch_size << ",\n  \"threads\": " << info.threads
     << ",\n  \"seed\": " << info.seed << ",\n  \"params\": " << model.num_params()
     << ",\n  \"data\": " << quote(info.data_dir) << ",\n  \"interrupted\": " << (h.interrupted ? "true" : "false")
     << ",\n  \"epochs\": [";
  for (std::size_t i = 0; i < h.epochs.size(); ++i) {
    const EpochLog& e = h.epochs[i];
    os << (i ? "," : "") << "\n    {\"epoch\": " << e.epoch + 1 << ", \"loss\": " << num(e.loss)
       << ", \"accuracy\": " << num(e.accuracy) << ", \"val_loss\": " << num(e.val_loss)
       << ", \"val_accuracy\": " << num(e.val_accuracy) << ", \"train_seconds\": " << num(e.train_seconds)
       << ", \"steps\": " << e.steps << ", \"ms_per_step\": " << num(e.steps ? 1000.0 * e.train_seconds / e.steps : NAN);
    if (info.fp16) os << ", \"loss_scale\": " << num(e.loss_scale) << ", \"skipped_steps\": " << e.skipped_steps;
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
  std::printf("CPU layers (%d threads):\n", cpu_pool().num_threads());
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
