// doctor_gpu.cu: CUDA, cuDNN and cuBLAS versions and the GEMM stress test of doctor --burn.
#include "apps/doctor_gpu.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "runtime/cuda_check.h"
#include "runtime/cuda_raii.h"
#include "kernels/gpu/launchers.h"
#include "tensor/half.h"
#include "tensor/rng.h"

namespace mf::apps {

CudaVersions cuda_versions() {
  CudaVersions v;
  // Both work without a GPU: the driver query answers 0 when no driver is installed.
  if (cudaDriverGetVersion(&v.driver) != cudaSuccess) v.error = "cudaDriverGetVersion failed";
  if (cudaRuntimeGetVersion(&v.runtime) != cudaSuccess) v.error = "cudaRuntimeGetVersion failed";
  cudaGetLastError();
  v.cudnn_compiled = CUDNN_VERSION;
  v.cudnn_loaded = static_cast<int>(cudnnGetVersion());
  v.cudnn_cudart = static_cast<int>(cudnnGetCudartVersion());
  v.cublas_compiled = CUBLAS_VER_MAJOR * 10000 + CUBLAS_VER_MINOR * 100 + CUBLAS_VER_PATCH;
  int major = 0, minor = 0, patch = 0;
  if (cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS)
    v.cublas_loaded = major * 10000 + minor * 100 + patch;
  else
    v.error = "cublasGetProperty failed";
  return v;
}

namespace {

// Row-major C = A B for n x n matrices. cuBLAS is column-major, where row-major C is C^T,
// so it computes C^T = B^T A^T: the operands are passed swapped, neither transposed.
void gemm(cublasHandle_t h, bool fp16, const void* a, const void* b, float* c, int n) {
  const float one = 1.0f, zero = 0.0f;
  if (fp16)
    MF_GPU_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, b, CUDA_R_16F, n, a, CUDA_R_16F, n, &zero,
                              c, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  else
    MF_GPU_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, static_cast<const float*>(b), n,
                             static_cast<const float*>(a), n, &zero, c, n));
}

}  // namespace

BurnResult gpu_burn(const BurnOptions& o,
                    const std::function<void(double, std::int64_t, std::int64_t)>& progress) {
  MF_GPU_CHECK(cudaSetDevice(o.device));
  std::size_t free_b = 0, total_b = 0;
  MF_GPU_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const std::size_t in_bytes = o.fp16 ? 2 : 4;
  int n = std::max(256, o.n);
  // A, B, C and the reference C, leaving a quarter of the free memory alone.
  while (n > 256 && static_cast<double>(n) * n * (2 * in_bytes + 8) > 0.75 * static_cast<double>(free_b)) n /= 2;
  const std::size_t nn = static_cast<std::size_t>(n) * n;

  BurnResult r;
  r.n = n;
  r.fp16 = o.fp16;

  // Operands on the host, uniform in [-1, 1); in f16 mode rounded to f16 first so that the
  // CPU reference uses exactly the values the GPU multiplies.
  std::vector<float> a(nn), b(nn);
  Rng rng(12345);
  for (auto& x : a) x = rng.uniform(-1.0f, 1.0f);
  for (auto& x : b) x = rng.uniform(-1.0f, 1.0f);
  DeviceBuffer<unsigned char> da(nn * in_bytes), db(nn * in_bytes);
  if (o.fp16) {
    std::vector<Half> ha(nn), hb(nn);
    for (std::size_t i = 0; i < nn; ++i) {
      ha[i] = float_to_half(a[i]), a[i] = half_to_float(ha[i]);
      hb[i] = float_to_half(b[i]), b[i] = half_to_float(hb[i]);
    }
    MF_GPU_CHECK(cudaMemcpy(da.get(), ha.data(), nn * 2, cudaMemcpyHostToDevice));
    MF_GPU_CHECK(cudaMemcpy(db.get(), hb.data(), nn * 2, cudaMemcpyHostToDevice));
  } else {
    MF_GPU_CHECK(cudaMemcpy(da.get(), a.data(), nn * 4, cudaMemcpyHostToDevice));
    MF_GPU_CHECK(cudaMemcpy(db.get(), b.data(), nn * 4, cudaMemcpyHostToDevice));
  }
  // A copy from pageable memory may return before its DMA has landed, and the products below
  // run on a non-blocking stream that does not wait for it: wait here.
  MF_GPU_CHECK(cudaDeviceSynchronize());
  DeviceBuffer<float> c(nn), c_ref(nn);
  constexpr int kBatch = 8;  // products between host checks
  DeviceBuffer<unsigned long long> counts(kBatch);

  Stream stream = make_stream();
  cublasHandle_t raw = nullptr;
  MF_GPU_CHECK(cublasCreate(&raw));
  CublasHandle handle(raw);
  MF_GPU_CHECK(cublasSetStream(handle.get(), stream.get()));
  // No TF32 for the f32 product: the default math mode keeps SGEMM in full f32.
  MF_GPU_CHECK(cublasSetMathMode(handle.get(), CUBLAS_DEFAULT_MATH));

  gemm(handle.get(), o.fp16, da.get(), db.get(), c_ref.get(), n);
  MF_GPU_CHECK(cudaStreamSynchronize(stream.get()));

  // The reference itself against the CPU, on sampled elements.
  const double tol_factor = std::ldexp(1.0, -12);
  for (int s = 0; s < o.cpu_samples; ++s) {
    const std::size_t i = rng.below(static_cast<std::uint64_t>(n)), j = rng.below(static_cast<std::uint64_t>(n));
    double ref = 0, bound = 0;
    for (int k = 0; k < n; ++k) {
      const double p = static_cast<double>(a[i * n + k]) * b[static_cast<std::size_t>(k) * n + j];
      ref += p, bound += std::fabs(p);
    }
    float got = 0;
    MF_GPU_CHECK(cudaMemcpy(&got, c_ref.get() + i * n + j, 4, cudaMemcpyDeviceToHost));
    const double tol = tol_factor * bound + 1e-6;
    const double err = std::fabs(got - ref) / tol;
    r.cpu_worst = std::max(r.cpu_worst, std::isfinite(err) ? err : INFINITY);
    ++r.cpu_checked;
    if (!(err <= 1.0)) ++r.cpu_failed;
  }

  EventTimer timer(stream.get());
  const auto t0 = std::chrono::steady_clock::now();
  auto last_report = t0;
  std::vector<unsigned long long> host_counts(kBatch);
  for (;;) {
    MF_GPU_CHECK(cudaMemsetAsync(counts.get(), 0, kBatch * sizeof(unsigned long long), stream.get()));
    timer.start();
    for (int k = 0; k < kBatch; ++k) {
      gemm(handle.get(), o.fp16, da.get(), db.get(), c.get(), n);
      launch_count_mismatch(reinterpret_cast<const std::uint32_t*>(c.get()),
                            reinterpret_cast<const std::uint32_t*>(c_ref.get()), static_cast<std::int64_t>(nn),
                            counts.get() + k, stream.get());
    }
    r.seconds += timer.stop_seconds();
    MF_GPU_CHECK(cudaMemcpy(host_counts.data(), counts.get(), kBatch * sizeof(unsigned long long),
                            cudaMemcpyDeviceToHost));
    for (unsigned long long m : host_counts) {
      r.mismatched += static_cast<std::int64_t>(m);
      r.bad_iterations += m != 0;
    }
    r.iterations += kBatch;
    const auto now = std::chrono::steady_clock::now();
    const double elapsed = std::chrono::duration<double>(now - t0).count();
    if (progress && std::chrono::duration<double>(now - last_report).count() >= 1.0) {
      progress(elapsed, r.iterations, r.mismatched);
      last_report = now;
    }
    if (elapsed >= o.seconds) break;
  }
  r.tflops = 2.0 * n * static_cast<double>(n) * n * static_cast<double>(r.iterations) / r.seconds / 1e12;
  return r;
}

}  // namespace mf::apps
