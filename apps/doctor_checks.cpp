// doctor_checks.cpp: doctor's CPU checks and smoke tests (doctor_checks.h).
#include "apps/doctor_checks.h"

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
#include "runtime/errors.h"
#include "runtime/gpu_runtime.h"
#include "layers/conv2d.h"
#include "kernels/kernel_options.h"
#include "layers/dense.h"
#include "runtime/parallel.h"
#include "tensor/rng.h"


namespace mf::apps {

std::string fmt(const char* f, ...) {
  char b[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(b, sizeof b, f, ap);
  va_end(ap);
  return b;
}

namespace {

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
    rep.add(Mark::kFail, "GPU " + what + ": " + mf::one_line(ex.what()));
  }
}

}  // namespace

void smoke_tests(Report& rep, bool gpu) {
  KernelOptions fp32;
  fp32.fma_math_only = true;  // compare FP32 with FP32, not TF32
  Rng rng(7);
  {
    Dense dense(256, 128, Activation::kRelu, rng);
    dense.set_kernel_options(fp32);
    const Tensor x = random_tensor(Shape{16, 256}, rng), dy = random_tensor(Shape{16, 128}, rng);
    const auto ref = dense_ref(x, dense.parameters()[0]->value, dense.parameters()[1]->value);
    smoke(rep, "GEMM (Dense 256->128, batch 16)", dense, x, dy, ref, gpu);
  }
  {
    Conv2D conv(8, 32, 3, Activation::kRelu, rng);
    conv.set_kernel_options(fp32);
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

}  // namespace mf::apps
