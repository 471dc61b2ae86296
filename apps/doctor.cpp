// doctor.cpp: is this machine ready to train? The article's environment checklist in one
// command: devices, driver vs runtime, cuDNN/cuBLAS built vs loaded, CUDA_VISIBLE_DEVICES,
// the CPU side, smoke tests of a GEMM and a convolution (GPU against CPU), and --burn, a
// gpu-burn style stress test.
//
//   doctor                    # checklist; exits 0 without a GPU (says why)
//   doctor --require-gpu      # exits 1 unless a working GPU is found
//   doctor --burn 60          # plus a minute of large GEMMs, every result checked
#include <Eigen/Core>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <sstream>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "apps/common.h"
#include "apps/flags.h"
#include "kernels/errors.h"
#include "kernels/gpu_runtime.h"
#include "layers/conv2d.h"
#include "layers/conv_options.h"
#include "layers/dense.h"
#include "tensor/parallel.h"
#include "tensor/rng.h"

#if MF_WITH_CUDA
#include "apps/doctor_gpu.h"
#endif

namespace {

using namespace mf;

// ---- the checklist ----

enum class Mark { kOk, kWarn, kFail, kInfo };

class Report {
 public:
  explicit Report(bool color) : color_(color) {}
  void section(const std::string& name) { std::printf("\n%s\n", name.c_str()); }
  void add(Mark m, const std::string& text) {
    static const char* kText[] = {"  OK  ", " WARN ", " FAIL ", " info "};
    static const char* kColor[] = {"\033[32m", "\033[33m", "\033[31m", "\033[2m"};
    const int i = static_cast<int>(m);
    if (color_) std::printf("  [%s%s\033[0m] %s\n", kColor[i], kText[i], text.c_str());
    else std::printf("  [%s] %s\n", kText[i], text.c_str());
    std::fflush(stdout);
    ++counts_[i];
  }
  int count(Mark m) const { return counts_[static_cast<int>(m)]; }

 private:
  bool color_;
  int counts_[4] = {0, 0, 0, 0};
};

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char b[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(b, sizeof b, f, ap);
  va_end(ap);
  return b;
}

// ---- smoke tests ----

Tensor random_tensor(const Shape& s, Rng& rng) {
  Tensor t = Tensor::empty(s);
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = rng.uniform(-1.0f, 1.0f);
  return t;
}

// max |a - r| / max |r|: an error relative to the tensor's scale, so that entries that
// cancel to near zero do not make a tolerance meaningless.
double scaled_error(const std::vector<float>& a, const std::vector<double>& r) {
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < r.size(); ++i) {
    err = std::max(err, std::fabs(static_cast<double>(a[i]) - r[i]));
    scale = std::max(scale, std::fabs(r[i]));
  }
  return scale > 0 ? err / scale : err;
}
std::vector<double> to_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

// The naive double-precision definitions the CPU layers are checked against.
std::vector<double> dense_ref(const Tensor& x, const Tensor& w, const Tensor& b) {
  const std::int64_t n = x.dim(0), in = x.dim(1), units = w.dim(1);
  const float *xp = x.data<float>(), *wp = w.data<float>(), *bp = b.data<float>();
  std::vector<double> y(static_cast<std::size_t>(n * units));
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t u = 0; u < units; ++u) {
      double s = bp[u];
      for (std::int64_t k = 0; k < in; ++k) s += static_cast<double>(xp[i * in + k]) * wp[k * units + u];
      y[i * units + u] = std::max(0.0, s);
    }
  return y;
}
// x (N,H,W,C), w (K,R,S,C) "OHWI", valid padding, ReLU.
std::vector<double> conv_ref(const Tensor& x, const Tensor& w, const Tensor& b) {
  const std::int64_t n = x.dim(0), h = x.dim(1), wd = x.dim(2), c = x.dim(3);
  const std::int64_t k = w.dim(0), r = w.dim(1), s = w.dim(2);
  const std::int64_t oh = h - r + 1, ow = wd - s + 1;
  const float *xp = x.data<float>(), *wp = w.data<float>(), *bp = b.data<float>();
  std::vector<double> y(static_cast<std::size_t>(n * oh * ow * k));
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t oy = 0; oy < oh; ++oy)
      for (std::int64_t ox = 0; ox < ow; ++ox)
        for (std::int64_t f = 0; f < k; ++f) {
          double acc = bp[f];
          for (std::int64_t dy = 0; dy < r; ++dy)
            for (std::int64_t dx = 0; dx < s; ++dx)
              for (std::int64_t ci = 0; ci < c; ++ci)
                acc += static_cast<double>(xp[((i * h + oy + dy) * wd + ox + dx) * c + ci]) *
                       wp[((f * r + dy) * s + dx) * c + ci];
          y[((i * oh + oy) * ow + ox) * k + f] = std::max(0.0, acc);
        }
  return y;
}

struct LayerRun {
  std::vector<float> y, dx, dw, db;
};

// forward + backward of `layer` on `device`; gradients zeroed first.
LayerRun run_layer(Layer& layer, const Tensor& x, const Tensor& dy, Device device) {
  layer.to(device);
  for (Parameter* p : layer.parameters()) p->grad.fill_zero();
  const Tensor xd = x.to(device), dyd = dy.to(device);
  LayerRun r;
  const Tensor& y = layer.forward(xd);
  const Tensor& dx = layer.backward(dyd);
  if (device == Device::kGpu) gpu_synchronize();  // the layers ran on the compute stream
  r.y = y.to_vector();
  r.dx = dx.to_vector();
  r.dw = layer.parameters()[0]->grad.to_vector();
  r.db = layer.parameters()[1]->grad.to_vector();
  return r;
}

constexpr double kCpuTol = 1e-5;  // f32 vs double: rounding and summation order only
constexpr double kGpuTol = 1e-4;  // GPU vs CPU, both f32 (no TF32): summation order only

// One smoke test: CPU forward against the double reference, then (with a GPU) the whole
// forward and backward on the GPU against the CPU.
void smoke(Report& rep, const std::string& what, Layer& layer, const Tensor& x, const Tensor& dy,
           const std::vector<double>& ref, bool gpu) {
  const LayerRun cpu = run_layer(layer, x, dy, Device::kCpu);
  const double e = scaled_error(cpu.y, ref);
  rep.add(e <= kCpuTol ? Mark::kOk : Mark::kFail,
          fmt("CPU %s forward vs a double-precision reference: error %.1e (tolerance %.0e of the output's scale)",
              what.c_str(), e, kCpuTol));
  if (!gpu) return;
  try {
    const LayerRun g = run_layer(layer, x, dy, Device::kGpu);
    const double ey = scaled_error(g.y, to_double(cpu.y)), edx = scaled_error(g.dx, to_double(cpu.dx));
    const double edw = scaled_error(g.dw, to_double(cpu.dw)), edb = scaled_error(g.db, to_double(cpu.db));
    const double worst = std::max({ey, edx, edw, edb});
    rep.add(worst <= kGpuTol ? Mark::kOk : Mark::kFail,
            fmt("GPU %s vs CPU: forward %.1e, dx %.1e, dW %.1e, db %.1e (tolerance %.0e, FP32 without TF32)",
                what.c_str(), ey, edx, edw, edb, kGpuTol));
  } catch (const std::exception& ex) {
    rep.add(Mark::kFail, "GPU " + what + ": " + apps::one_line(ex.what()));
  }
}

void smoke_tests(Report& rep, bool gpu) {
  conv_options().fma_math_only = true;  // compare FP32 with FP32, not TF32
  Rng rng(7);
  {
    Dense dense(256, 128, Activation::kRelu, rng);
    const Tensor x = random_tensor(Shape{16, 256}, rng), dy = random_tensor(Shape{16, 128}, rng);
    const auto ref = dense_ref(x, dense.parameters()[0]->value, dense.parameters()[1]->value);
    smoke(rep, "GEMM (Dense 256->128, batch 16)", dense, x, dy, ref, gpu);
  }
  {
    Conv2D conv(8, 32, 3, Activation::kRelu, rng);
    const Tensor x = random_tensor(Shape{4, 14, 14, 8}, rng), dy = random_tensor(Shape{4, 12, 12, 32}, rng);
    const auto ref = conv_ref(x, conv.parameters()[0]->value, conv.parameters()[1]->value);
    smoke(rep, "convolution (Conv2D 8->32, 3x3, batch 4)", conv, x, dy, ref, gpu);
  }
}

// CPU GEMM throughput through the Dense layer (Eigen, the training path's own code).
double cpu_gemm_gflops(int n) {
  Rng rng(3);
  Dense d(n, n, Activation::kNone, rng);
  d.set_training(false);
  const Tensor x = random_tensor(Shape{n, n}, rng);
  d.forward(x);  // warm-up
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    d.forward(x);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * n * n * static_cast<double>(n) / best / 1e9;
}

// ---- CPU ----

void cpu_checks(Report& rep) {
  rep.section("CPU");
  const unsigned hw = std::thread::hardware_concurrency();
  rep.add(Mark::kOk, fmt("%s, %u hardware threads, %d of them available to this process; microflow's pool uses %d",
                         apps::cpu_model_name().c_str(), hw, available_cpus(), num_threads()));
  rep.add(Mark::kInfo, fmt("Eigen %d.%d.%d, SIMD instruction sets in use: %s", EIGEN_WORLD_VERSION,
                           EIGEN_MAJOR_VERSION, EIGEN_MINOR_VERSION, Eigen::SimdInstructionSetsInUse()));
  // What this CPU has vs what the binary was compiled to use (-march, MF_CPU_ARCH).
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool has512 = __builtin_cpu_supports("avx512f"), has2 = __builtin_cpu_supports("avx2");
#if defined(__AVX512F__)
  const bool uses512 = true;
#else
  const bool uses512 = false;
#endif
#if defined(__AVX2__)
  const bool uses2 = true;
#else
  const bool uses2 = false;
#endif
  if ((has512 && !uses512) || (has2 && !uses2))
    rep.add(Mark::kWarn, std::string("this CPU has ") + (has512 ? "AVX-512" : "AVX2") +
                             " but this build does not use it: rebuild with -DMF_CPU_ARCH=native for a faster CPU path");
  else
    rep.add(Mark::kOk, std::string("the build uses the CPU's widest vectors (") +
                           (uses512 ? "AVX-512" : uses2 ? "AVX2" : "SSE") + ")");
#endif
}

// ---- CUDA ----

#if MF_WITH_CUDA
std::string cuda_ver(int v) { return fmt("%d.%d", v / 1000, (v % 1000) / 10); }
std::string lib_ver(int v) { return fmt("%d.%d.%d", v / 10000, (v / 100) % 100, v % 100); }

// "90-real,90-virtual": machine code (SASS) runs on the same major and a minor at least its
// own; PTX is compiled by the driver at first launch for any newer device.
Mark arch_verdict(int major, int minor, std::string* text) {
  const int sm = major * 10 + minor;
  bool sass = false, ptx = false;
  std::stringstream ss(MF_CUDA_ARCHITECTURES);
  std::string tok;
  while (std::getline(ss, tok, ',')) {
    const int a = std::atoi(tok.c_str());
    const bool real = tok.find("-virtual") == std::string::npos, virt = tok.find("-real") == std::string::npos;
    if (real && a / 10 == major && a % 10 <= minor) sass = true;
    if (virt && a <= sm) ptx = true;
  }
  if (sass) {
    *text = fmt("built with machine code for sm_%d (archs %s)", sm, MF_CUDA_ARCHITECTURES);
    return Mark::kOk;
  }
  if (ptx) {
    *text = fmt("no machine code for sm_%d in this build (archs %s): the driver JIT-compiles the PTX at the first "
                "launch (slow start); add %d-real to MF_CUDA_ARCHITECTURES",
                sm, MF_CUDA_ARCHITECTURES, sm);
    return Mark::kWarn;
  }
  *text = fmt("no code for sm_%d in this build (archs %s): kernels cannot run; rebuild with "
              "-DMF_CUDA_ARCHITECTURES=%d",
              sm, MF_CUDA_ARCHITECTURES, sm);
  return Mark::kFail;
}
#endif

// Returns true when the GPU is usable.
bool cuda_checks(Report& rep, bool require_gpu) {
  rep.section("CUDA");
  const Mark missing = require_gpu ? Mark::kFail : Mark::kWarn;
#if !MF_WITH_CUDA
  rep.add(missing, "no usable CUDA device: " + gpu_status().reason +
                       " (configured with -DMF_WITH_CUDA=OFF, or no CUDA toolkit or cuDNN was found)");
  return false;
#else
  const apps::CudaVersions v = apps::cuda_versions();
  if (v.driver == 0)
    rep.add(missing, "no NVIDIA driver is installed (cudaDriverGetVersion says 0); CUDA runtime " +
                         cuda_ver(v.runtime));
  else if (v.driver >= v.runtime)
    rep.add(Mark::kOk, "driver supports CUDA " + cuda_ver(v.driver) + ", runtime is " + cuda_ver(v.runtime) +
                           ": compatible");
  else if (v.driver / 1000 == v.runtime / 1000)
    rep.add(Mark::kWarn, "driver supports CUDA " + cuda_ver(v.driver) + ", runtime is " + cuda_ver(v.runtime) +
                             ": same major version, runs under minor version compatibility (PTX JIT and the newest "
                             "features need a newer driver)");
  else
    rep.add(Mark::kFail, "driver supports CUDA " + cuda_ver(v.driver) + " only, this runtime needs " +
                             cuda_ver(v.runtime) + ": update the NVIDIA driver");

  // cuDNN: within a major version a newer library runs older builds; an older one than the
  // build's headers may lack what they declare.
  const std::string dnn = "cuDNN built against " + lib_ver(v.cudnn_compiled) + ", loaded " + lib_ver(v.cudnn_loaded) +
                          " (for CUDA " + cuda_ver(v.cudnn_cudart) + ")";
  if (v.cudnn_loaded / 10000 != v.cudnn_compiled / 10000)
    rep.add(Mark::kFail, dnn + ": major versions differ, install cuDNN " + std::to_string(v.cudnn_compiled / 10000));
  else if (v.cudnn_loaded < v.cudnn_compiled)
    rep.add(Mark::kWarn, dnn + ": the loaded library is older than the headers (works for the calls microflow makes, "
                               "but is not a supported combination)");
  else
    rep.add(Mark::kOk, dnn);
  if (v.cudnn_cudart / 1000 != v.runtime / 1000)
    rep.add(Mark::kWarn, "the loaded cuDNN was built for CUDA " + cuda_ver(v.cudnn_cudart) + ", this program uses " +
                             cuda_ver(v.runtime));
  const std::string blas = "cuBLAS built against " + lib_ver(v.cublas_compiled) + ", loaded " + lib_ver(v.cublas_loaded);
  if (v.cublas_loaded / 10000 != v.cublas_compiled / 10000)
    rep.add(Mark::kFail, blas + ": major versions differ");
  else if (v.cublas_loaded < v.cublas_compiled)
    rep.add(Mark::kWarn, blas + ": the loaded library is older than the headers");
  else
    rep.add(Mark::kOk, blas);
  if (!v.error.empty()) rep.add(Mark::kWarn, v.error);

  if (const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES")) {
    if (*cvd == '\0' || std::string(cvd) == "-1")
      rep.add(Mark::kWarn, std::string("CUDA_VISIBLE_DEVICES='") + cvd + "' hides every GPU");
    else
      rep.add(Mark::kInfo, std::string("CUDA_VISIBLE_DEVICES=") + cvd + " (devices are numbered within this list)");
  } else {
    rep.add(Mark::kInfo, "CUDA_VISIBLE_DEVICES is not set: every GPU is visible");
  }

  rep.section("GPU");
  if (!gpu_available()) {
    rep.add(missing, gpu_status().reason);
    return false;
  }
  bool usable = true;
  for (int i = 0; i < gpu_status().device_count; ++i) {
    try {
      select_gpu(i);
      const GpuDeviceInfo d = gpu_device_info(i);
      rep.add(Mark::kOk, fmt("GPU %d: %s, compute capability %d.%d, %d SMs, %s memory (%s free)", i, d.name.c_str(),
                             d.major, d.minor, d.multiprocessors, format_bytes(d.total_memory).c_str(),
                             format_bytes(d.free_memory).c_str()));
      std::string text;
      const Mark m = arch_verdict(d.major, d.minor, &text);
      rep.add(m, text);
      if (m == Mark::kFail && i == 0) usable = false;
      if (i == 0)
        rep.add(d.major >= 7 ? Mark::kOk : Mark::kWarn,
                d.major >= 7 ? "Tensor Cores: FP16 mixed precision (--fp16) is fast here"
                             : "no Tensor Cores (compute capability < 7.0): --fp16 saves memory but is not faster");
    } catch (const std::exception& e) {
      rep.add(Mark::kFail, fmt("GPU %d: ", i) + apps::one_line(e.what()));
      if (i == 0) usable = false;
    }
  }
  select_gpu(0);
  return usable;
#endif
}

}  // namespace

static int run_main(int argc, char** argv) {
  double burn_seconds = 0;
  std::int64_t burn_size = 8192, threads = 0;
  bool require_gpu = false, burn_fp16 = false, no_color = false;
  apps::Flags flags("doctor", "[flags]\n\nChecks that this machine can train microflow's MNIST CNN: CPU, CUDA driver and\n"
                              "runtime, cuDNN and cuBLAS versions, GPUs, and smoke tests of a GEMM and a convolution\n"
                              "(GPU against CPU). Exit status: 0 no check FAILed (without a GPU it says why: that is\n"
                              "a WARN unless --require-gpu); 1 a check FAILed; 2 a bad flag.");
  flags.add_bool("require-gpu", &require_gpu, "a missing or unusable GPU is a failure (exit 1)");
  flags.add_double("burn", &burn_seconds, 0, 86400,
                   "stress test: repeat large GEMMs on GPU 0 for this many seconds, checking every result");
  flags.add_int("burn-size", &burn_size, 256, 65536, "stress test: matrix size n (n x n x n products)");
  flags.add_bool("burn-fp16", &burn_fp16, "stress test: FP16 operands on the Tensor Cores instead of FP32 SGEMM");
  flags.add_int("threads", &threads, 0, 1024, "CPU threads (0: every CPU this process may use)");
  flags.add_bool("no-color", &no_color, "no colours even on a terminal");
  try {
    if (!flags.parse(argc, argv)) return 0;
  } catch (const apps::FlagError& e) {
    std::fprintf(stderr, "doctor: error: %s\n", e.what());
    return 2;
  }
  try {
    if (threads > 0) set_num_threads(static_cast<int>(threads));
    Report rep(!no_color && isatty(STDOUT_FILENO));
    std::printf("microflow doctor: is this machine ready to train the MNIST CNN?\n");
    rep.section("Build");
#if defined(__clang__)
    const char* compiler = "clang";
#elif defined(__GNUC__)
    const char* compiler = "GCC";
#else
    const char* compiler = "compiler";
#endif
    rep.add(Mark::kInfo, fmt("%s %s, GPU path %s", compiler, __VERSION__,
                             MF_WITH_CUDA ? "compiled in" : "NOT compiled in (CPU-only build)"));
    cpu_checks(rep);
    const bool gpu = cuda_checks(rep, require_gpu);

    rep.section("Smoke tests");
    smoke_tests(rep, gpu);
    rep.add(Mark::kInfo, fmt("CPU GEMM 512x512x512 through the Dense layer: %.1f GFLOP/s", cpu_gemm_gflops(512)));

    if (burn_seconds > 0) {
      rep.section("Stress test");
#if MF_WITH_CUDA
      if (!gpu) {
        rep.add(require_gpu ? Mark::kFail : Mark::kWarn, "--burn skipped: no usable GPU");
      } else {
        apps::BurnOptions bo;
        bo.seconds = burn_seconds;
        bo.n = static_cast<int>(burn_size);
        bo.fp16 = burn_fp16;
        try {
          const apps::BurnResult r = apps::gpu_burn(bo, [](double t, std::int64_t it, std::int64_t bad) {
            std::printf("    %5.0f s: %lld products, %lld mismatched elements\n", t, static_cast<long long>(it),
                        static_cast<long long>(bad));
            std::fflush(stdout);
          });
          const char* kind = r.fp16 ? "FP16 Tensor Core GEMMs (f32 accumulation)" : "FP32 SGEMMs";
          rep.add(r.mismatched == 0 ? Mark::kOk : Mark::kFail,
                  fmt("%lld %s of %dx%dx%d in %.1f s GPU time: %.1f TFLOP/s; %lld of them differ from the first "
                      "result (%lld elements)",
                      static_cast<long long>(r.iterations), kind, r.n, r.n, r.n, r.seconds, r.tflops,
                      static_cast<long long>(r.bad_iterations), static_cast<long long>(r.mismatched)));
          rep.add(r.cpu_failed == 0 ? Mark::kOk : Mark::kFail,
                  fmt("%d of %d sampled elements of the first result agree with a double-precision CPU dot product "
                      "(worst error %.2f of the tolerance 2^-12 * sum |a b|)",
                      r.cpu_checked - r.cpu_failed, r.cpu_checked, r.cpu_worst));
        } catch (const std::bad_alloc&) {
          // The inputs are filled on the host first: two n x n matrices (and their f16 copies
          // with --burn-fp16).
          rep.add(Mark::kFail, fmt("stress test: out of host memory for the two %lldx%lld input matrices: "
                                   "try a smaller --burn-size",
                                   static_cast<long long>(burn_size), static_cast<long long>(burn_size)));
        } catch (const std::exception& e) {
          rep.add(Mark::kFail, "stress test: " + apps::one_line(e.what()));
        }
      }
#else
      rep.add(require_gpu ? Mark::kFail : Mark::kWarn, "--burn skipped: " + gpu_status().reason);
#endif
    }

    std::printf("\nSummary: %d OK, %d WARN, %d FAIL. ", rep.count(Mark::kOk), rep.count(Mark::kWarn),
                rep.count(Mark::kFail));
    if (rep.count(Mark::kFail) > 0)
      std::printf("Not ready: fix the FAIL lines above.\n");
    else if (gpu)
      std::printf("Ready to train on the GPU (train_mnist --device gpu).\n");
    else
      std::printf("Ready to train on the CPU only: %s.\n", gpu_status().reason.c_str());
    return rep.count(Mark::kFail) > 0 ? 1 : 0;
  } catch (const std::bad_alloc&) {
    // The C++ library's own message is just "std::bad_alloc"; the checks need only a few MB.
    std::fprintf(stderr, "doctor: error: out of host memory running the checks; free some memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "doctor: error: %s\n", apps::one_line(e.what()).c_str());
    return 1;
  }
}

int main(int argc, char** argv) {
  mf::apps::reserve_standard_fds();
  return mf::apps::exit_status_after_stdout("doctor", run_main(argc, argv));
}
