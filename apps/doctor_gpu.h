// doctor_gpu.h: the CUDA-specific checks of doctor, implemented in doctor_gpu.cu (compiled
// only when MF_WITH_CUDA). Host-only declarations: doctor.cpp includes no CUDA header.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

namespace mf::apps {

// Versions as the libraries encode them: CUDA 13000 = 13.0; cuDNN and cuBLAS
// major * 10000 + minor * 100 + patch. "compiled" is what the headers said at build time,
// "loaded" what the shared library in use reports now.
struct CudaVersions {
  int driver = 0;   // cudaDriverGetVersion: newest CUDA the driver supports; 0: no driver
  int runtime = 0;  // cudaRuntimeGetVersion: the CUDA runtime this program uses
  int cudnn_compiled = 0, cudnn_loaded = 0;
  int cudnn_cudart = 0;  // cudnnGetCudartVersion: the CUDA runtime the loaded cuDNN was built for
  int cublas_compiled = 0, cublas_loaded = 0;
  std::string error;     // a query that failed, if any
};
CudaVersions cuda_versions();

struct BurnOptions {
  double seconds = 10;
  int n = 8192;           // square matrices n x n
  bool fp16 = false;      // f16 operands on the Tensor Cores (f32 accumulation) instead of SGEMM
  int cpu_samples = 64;   // elements of the first product recomputed on the CPU
  int device = 0;
};

struct BurnResult {
  int n = 0;
  bool fp16 = false;
  std::int64_t iterations = 0;      // products computed and compared (the first excluded)
  double seconds = 0;               // GPU time of those (events)
  double tflops = 0;                // 2 n^3 iterations / seconds / 1e12
  std::int64_t mismatched = 0;      // elements differing bitwise from the first product, summed
  std::int64_t bad_iterations = 0;  // products with at least one such element
  int cpu_checked = 0, cpu_failed = 0;
  double cpu_worst = 0;             // largest |gpu - cpu| / tolerance among the samples (<= 1: pass)
};

// gpu-burn style: repeats one large GEMM with cuBLAS for `seconds`, comparing every result
// bitwise with the first (cuBLAS is deterministic for a fixed problem, handle and stream on
// one GPU, so any difference is a hardware or driver fault), and checks sampled elements of
// the first result against a double-precision CPU dot product within
// 2^-12 * sum_k |a_ik b_kj| (f32 accumulation error of an n-term dot product is far below).
// `progress` is called about once a second. Shrinks n if the device lacks memory. Throws
// GpuError / NoGpuError.
BurnResult gpu_burn(const BurnOptions& options,
                    const std::function<void(double elapsed_s, std::int64_t iterations, std::int64_t mismatched)>&
                        progress);

}  // namespace mf::apps
