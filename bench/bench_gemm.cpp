// bench_gemm.cpp: claim 1, "a large matrix product is 50-100x faster on the GPU": C = A B
// for square sizes 16..4096 and for the GEMMs inside the MNIST model, on the CPU (Eigen, one
// thread and all threads) and on the GPU (cuBLAS FP32, TF32 and FP16 with FP32 accumulation).
//
// The GPU numbers are the product alone, timed with CUDA events on data already in device
// memory; "gpu_fp32_copies" adds copying A and B in and C out over PCIe (pinned memory),
// which is what a one-off product really costs when its operands live on the host.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <Eigen/Core>

#include "bench/bench_common.h"
#include "runtime/parallel.h"

#if MF_WITH_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "runtime/cuda_check.h"
#include "runtime/cuda_raii.h"
#endif

namespace mf::bench {
namespace {

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Map = Eigen::Map<RowMajor>;
using ConstMap = Eigen::Map<const RowMajor>;

double gemm_flops(std::int64_t m, std::int64_t n, std::int64_t k) { return 2.0 * m * n * k; }

std::vector<float> random_vector(std::int64_t n, std::uint64_t seed) {
  const Tensor t = uniform_tensor(Shape{n}, -1.0f, 1.0f, seed);
  return std::vector<float>(t.data<float>(), t.data<float>() + n);
}

// C (m x n) = A (m x k) B (k x n), row-major. Eigen runs single-threaded here (no OpenMP),
// so the multi-threaded version splits C's rows into blocks, one per thread of
// mf::cpu_pool(); each thread multiplies its rows of A by all of B. A block gets at least
// kMinBlockFlops of work: handing a thread less costs more in wake-up and cache traffic
// than it saves, so the smallest products run on the calling thread alone (as BLAS
// libraries also do).
constexpr double kMinBlockFlops = 2e6;

void BM_GemmCpu(benchmark::State& state, std::int64_t m, std::int64_t n, std::int64_t k, int threads) {
  use_threads(threads);
  const std::vector<float> a = random_vector(m * k, 1), b = random_vector(k * n, 2);
  std::vector<float> c(static_cast<std::size_t>(m * n));
  const ConstMap A(a.data(), m, k), B(b.data(), k, n);
  Map C(c.data(), m, n);
  const std::int64_t blocks = std::clamp<std::int64_t>(static_cast<std::int64_t>(gemm_flops(m, n, k) / kMinBlockFlops),
                                                       1, std::min<std::int64_t>(threads, m));
  for (auto _ : state) {
    if (blocks == 1) {
      C.noalias() = A * B;
    } else {
      cpu_pool().parallel_for(blocks, [&](std::int64_t b0, std::int64_t b1, int) {
        const std::int64_t r0 = b0 * m / blocks, r1 = b1 * m / blocks;
        C.middleRows(r0, r1 - r0).noalias() = A.middleRows(r0, r1 - r0) * B;
      });
    }
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  state.counters["FLOP/s"] = benchmark::Counter(gemm_flops(m, n, k), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = threads;
}

enum class GpuMode { kFp32, kTf32, kFp16, kFp32Copies };

const char* mode_name(GpuMode mode) {
  switch (mode) {
    case GpuMode::kFp32: return "gpu_fp32";
    case GpuMode::kTf32: return "gpu_tf32";
    case GpuMode::kFp16: return "gpu_fp16";
    case GpuMode::kFp32Copies: return "gpu_fp32_copies";
  }
  return "?";
}

void BM_GemmGpu(benchmark::State& state, std::int64_t m, std::int64_t n, std::int64_t k, GpuMode mode) {
  MF_BENCH_REQUIRE_GPU(state);
#if MF_WITH_CUDA
  // A handle and stream of our own: the math mode set here must not leak into the layers'.
  const Stream stream = make_stream();
  cublasHandle_t raw = nullptr;
  MF_GPU_CHECK(cublasCreate(&raw));
  const CublasHandle handle(raw);
  MF_GPU_CHECK(cublasSetStream(raw, stream.get()));
  // CUBLAS_DEFAULT_MATH keeps FP32 products in FP32 (no TF32) unless NVIDIA_TF32_OVERRIDE
  // says otherwise; TF32 rounds the inputs to 10 mantissa bits and runs on Tensor Cores.
  MF_GPU_CHECK(cublasSetMathMode(raw, mode == GpuMode::kTf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));

  const bool half = mode == GpuMode::kFp16;
  const DType dt = half ? DType::kF16 : DType::kF32;
  Tensor a = uniform_tensor(Shape{m, k}, -1.0f, 1.0f, 1), b = uniform_tensor(Shape{k, n}, -1.0f, 1.0f, 2);
  Tensor da = a.to(dt).to(Device::kGpu), db = b.to(dt).to(Device::kGpu);
  Tensor dc = Tensor::zeros(Shape{m, n}, dt, Device::kGpu);

  // Row-major C = A B is column-major C^T = B^T A^T: cuBLAS gets B first, with n rows.
  const float alpha = 1.0f, beta = 0.0f;
  auto gemm = [&] {
    if (half) {
      MF_GPU_CHECK(cublasGemmEx(raw, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                                static_cast<int>(k), &alpha, db.raw(), CUDA_R_16F, static_cast<int>(n), da.raw(),
                                CUDA_R_16F, static_cast<int>(k), &beta, dc.raw(), CUDA_R_16F, static_cast<int>(n),
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    } else {
      MF_GPU_CHECK(cublasSgemm(raw, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                               static_cast<int>(k), &alpha, db.data<float>(), static_cast<int>(n), da.data<float>(),
                               static_cast<int>(k), &beta, dc.data<float>(), static_cast<int>(n)));
    }
  };

  // With copies: the operands start in pinned host memory and C goes back there.
  struct Pinned {
    void* p;
    explicit Pinned(std::size_t bytes) : p(pinned_alloc(bytes)) {}
    ~Pinned() { pinned_free(p); }
  };
  const bool copies = mode == GpuMode::kFp32Copies;
  const std::size_t a_bytes = a.nbytes(), b_bytes = b.nbytes(), c_bytes = dc.nbytes();
  std::unique_ptr<Pinned> ha, hb, hc;
  if (copies) {
    ha = std::make_unique<Pinned>(a_bytes);
    hb = std::make_unique<Pinned>(b_bytes);
    hc = std::make_unique<Pinned>(c_bytes);
    std::copy_n(static_cast<const char*>(a.raw()), a_bytes, static_cast<char*>(ha->p));
    std::copy_n(static_cast<const char*>(b.raw()), b_bytes, static_cast<char*>(hb->p));
  }
  auto one = [&] {
    if (copies) {
      MF_GPU_CHECK(cudaMemcpyAsync(da.raw(), ha->p, a_bytes, cudaMemcpyHostToDevice, stream.get()));
      MF_GPU_CHECK(cudaMemcpyAsync(db.raw(), hb->p, b_bytes, cudaMemcpyHostToDevice, stream.get()));
    }
    gemm();
    if (copies) MF_GPU_CHECK(cudaMemcpyAsync(hc->p, dc.raw(), c_bytes, cudaMemcpyDeviceToHost, stream.get()));
  };

  one();  // warm-up: cuBLAS picks its kernel and loads it
  MF_GPU_CHECK(cudaStreamSynchronize(stream.get()));
  // Small products take microseconds: each timed batch enqueues `inner` of them back to back
  // (about a millisecond of work) so that event resolution and launch gaps do not dominate.
  // KeepRunningBatch counts each product as one iteration, so the time per iteration is per
  // product and the run stops after --benchmark_min_time of products (timing each batch as
  // one iteration of time/inner would run `inner` times longer than that).
  const int inner = static_cast<int>(std::clamp(1e9 / gemm_flops(m, n, k), 1.0, 100.0));
  EventTimer timer(stream.get());
  while (state.KeepRunningBatch(inner)) {
    timer.start();
    for (int i = 0; i < inner; ++i) one();
    state.SetIterationTime(timer.stop_seconds());
  }
  state.counters["FLOP/s"] = benchmark::Counter(gemm_flops(m, n, k), benchmark::Counter::kIsIterationInvariantRate);
#else
  (void)m, (void)n, (void)k, (void)mode;
#endif
}

std::string gemm_name(const char* group, const std::string& dev, std::int64_t m, std::int64_t n, std::int64_t k,
                      const std::string& shape = "") {
  std::string s = std::string(group) + "/dev:" + dev;
  if (!shape.empty()) s += "/shape:" + shape;
  return s + "/m:" + std::to_string(m) + "/n:" + std::to_string(n) + "/k:" + std::to_string(k);
}

void register_gemm(const char* group, std::int64_t m, std::int64_t n, std::int64_t k, const std::string& shape,
                   bool cpu_1t, bool cpu_mt) {
  const double flops = gemm_flops(m, n, k);
  if (cpu_1t)
    register_guarded(gemm_name(group, "cpu_1t", m, n, k, shape), BM_GemmCpu, m, n, k, 1)
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime();
  if (cpu_mt && max_threads() > 1)
    register_guarded(gemm_name(group, "cpu_mt", m, n, k, shape), BM_GemmCpu, m, n, k, max_threads())
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime();
  for (GpuMode mode : {GpuMode::kFp32, GpuMode::kTf32, GpuMode::kFp16, GpuMode::kFp32Copies}) {
    auto* b = register_guarded(gemm_name(group, mode_name(mode), m, n, k, shape), BM_GemmGpu, m, n, k, mode);
    b->Unit(benchmark::kMicrosecond)->UseManualTime();
    if (flops > 1e11) b->Iterations(5);  // 4096: a few ms each; enough for a stable mean
  }
}

void register_all() {
  // Square sizes. The CPU stops at 2048 on one thread and 4096 on all (one 4096 product
  // is ~137 GFLOP: about a second on a 2-core machine).
  for (std::int64_t s = 16; s <= 4096; s *= 2) register_gemm("gemm", s, s, s, "", s <= 2048, true);
  // The model's GEMMs (convolutions as im2col GEMMs: rows = output pixels of the batch,
  // columns = filters, depth = kernel window x input channels), at batch 64 and 1024.
  for (std::int64_t batch : {64, 1024}) {
    const std::string b = "_b" + std::to_string(batch);
    register_gemm("gemm_model", batch * 26 * 26, 32, 9, "conv2d" + b, true, true);
    register_gemm("gemm_model", batch * 11 * 11, 64, 288, "conv2d_1" + b, true, true);
    register_gemm("gemm_model", batch, 64, 1600, "dense" + b, true, true);
    register_gemm("gemm_model", batch, 10, 64, "dense_1" + b, true, true);
  }
}

}  // namespace
}  // namespace mf::bench

int main(int argc, char** argv) { return mf::bench::run_benchmarks(argc, argv, mf::bench::register_all); }
