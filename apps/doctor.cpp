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
#include "apps/doctor_checks.h"
#include "apps/flags.h"
#include "runtime/errors.h"
#include "runtime/gpu_runtime.h"
#include "layers/conv2d.h"
#include "kernels/kernel_options.h"
#include "layers/dense.h"
#include "runtime/parallel.h"
#include "tensor/rng.h"

#if MF_WITH_CUDA
#include "apps/doctor_gpu.h"
#endif

namespace {

using namespace mf;
using namespace mf::apps;  // Report, fmt and the CPU checks (doctor_checks.h)

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
      rep.add(Mark::kFail, fmt("GPU %d: ", i) + mf::one_line(e.what()));
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
          rep.add(Mark::kFail, "stress test: " + mf::one_line(e.what()));
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
    std::fprintf(stderr, "doctor: error: %s\n", mf::one_line(e.what()).c_str());
    return 1;
  }
}

int main(int argc, char** argv) {
  mf::apps::reserve_standard_fds();
  return mf::apps::exit_status_after_stdout("doctor", run_main(argc, argv));
}
