// bench_memory.cpp: GPU memory, as the caching DeviceAllocator counts it.
//   claim 5  "FP16 halves activation memory": the bytes one training step allocates beyond
//            the model and optimizer, FP32 vs FP16, next to the activations' own size.
//   claim 7  "a framework grabs memory up front; a limit keeps it to a set amount": peak and
//            reserved bytes during a training epoch by batch size (microflow grabs nothing up
//            front: it allocates what the step needs and caches it), and, under a
//            --gpu-memory-limit (DeviceAllocator::set_limit), the largest batch that trains
//            and the first that throws OutOfMemoryError, with the peak checked below the limit.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "runtime/device_allocator.h"
#include "runtime/errors.h"
#include "kernels/kernel_options.h"

#if MF_WITH_CUDA
#include "runtime/cuda_raii.h"
#include "runtime/gpu_context.h"
#endif

namespace mf::bench {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// Values each layer of the model outputs per image (what is kept for backward):
// conv2d 26*26*32, max_pooling2d 13*13*32, conv2d_1 11*11*64, max_pooling2d_1 5*5*64,
// dense 64, dense_1 10. Flatten is a view.
constexpr double kActivationsPerImage = 26 * 26 * 32 + 13 * 13 * 32 + 11 * 11 * 64 + 5 * 5 * 64 + 64 + 10;

// Bytes the device shows in use (total - free), by anyone: what nvidia-smi would report.
double device_used_mib() {
  const GpuDeviceInfo info = gpu_device_info(current_gpu());
  return static_cast<double>(info.total_memory - info.free_memory) / kMiB;
}

// Claim 5: one step's allocations. The model, the optimizer's state, the input batch and
// the shared cuDNN workspace exist before the baseline; the step then allocates every layer
// output, input gradient, pooling argmax and the loss's gradient. The workspace is grown to
// its limit (what the algorithm search uses) before the baseline: it is per process, so
// otherwise the first of these benchmarks would count up to 64 MiB of it and the others
// nothing, and FP16 / FP32 would compare different things. It is reported apart.
void BM_StepMemoryGpu(benchmark::State& state, std::int64_t batch, DType dtype) {
  MF_BENCH_REQUIRE_GPU(state);
#if MF_WITH_CUDA
  DeviceAllocator& a = DeviceAllocator::instance();
  a.release_cached();
  GpuContext::current().workspace(KernelOptions().workspace_limit);
  GpuStepRunner runner(batch, dtype);
  gpu_synchronize();
  const std::size_t base = a.in_use();
  a.reset_peak();
  runner.step();
  gpu_synchronize();
  const std::size_t step_bytes = a.peak() - base;
  EventTimer timer(GpuContext::current().stream());
  for (auto _ : state) {
    timer.start();
    runner.step();
    state.SetIterationTime(timer.stop_seconds());
  }
  state.counters["step_alloc_MiB"] = static_cast<double>(step_bytes) / kMiB;
  state.counters["activations_MiB"] =
      kActivationsPerImage * static_cast<double>(batch) * static_cast<double>(dtype_size(dtype)) / kMiB;
  state.counters["model_and_batch_MiB"] = static_cast<double>(base) / kMiB;
  state.counters["workspace_MiB"] = static_cast<double>(GpuContext::current().workspace_size()) / kMiB;
#else
  (void)batch, (void)dtype;
#endif
}

// Claim 7a: a full epoch of fit() (data resident on the device) and the allocator's numbers.
void BM_EpochMemoryGpu(benchmark::State& state, std::int64_t batch) {
  MF_BENCH_REQUIRE_GPU(state);
  DeviceAllocator& a = DeviceAllocator::instance();
  a.release_cached();
  a.reset_peak();
  const double used_before = device_used_mib();
  Sequential model = make_model(Device::kGpu, DType::kF32);
  static const data::Dataset train = synthetic_mnist(epoch_images(), 7);
  FitOptions o;
  o.epochs = 1;
  o.batch_size = batch;
  for (auto _ : state) state.SetIterationTime(model.fit(train, nullptr, o).epochs.back().train_seconds);
  state.counters["peak_MiB"] = static_cast<double>(a.peak()) / kMiB;
  state.counters["reserved_MiB"] = static_cast<double>(a.reserved()) / kMiB;
  state.counters["in_use_MiB"] = static_cast<double>(a.in_use()) / kMiB;
  state.counters["device_used_delta_MiB"] = device_used_mib() - used_before;
}

// Claim 7b: under a limit of `limit_mib`, batch sizes 32, 64, 128, ... each train a few
// steps on a fresh model (the dataset resident: 37 MB of it counts against the limit) until
// one throws OutOfMemoryError. Reports the largest batch that trained, the first that did
// not, and the largest peak seen (which must stay at or below the limit).
void BM_LimitGpu(benchmark::State& state, std::int64_t limit_mib) {
  MF_BENCH_REQUIRE_GPU(state);
  DeviceAllocator& a = DeviceAllocator::instance();
  static const data::Dataset train = synthetic_mnist(epoch_images(), 7);
  const std::size_t limit = static_cast<std::size_t>(limit_mib) << 20;
  std::int64_t ok_batch = 0, oom_batch = 0;
  std::size_t max_peak = 0;
  std::string oom_message;
  for (auto _ : state) {
    ok_batch = oom_batch = 0;
    max_peak = 0;
    for (std::int64_t batch = 32; batch <= 65536; batch *= 2) {
      // Each trial starts from an empty device, as a new train_mnist process would: without
      // this, the cuDNN workspace that earlier benchmarks grew (up to 64 MiB) would count
      // against the limit.
#if MF_WITH_CUDA
      GpuContext::current().release_workspace();
#endif
      a.release_cached();
      a.set_limit(limit);
      a.reset_peak();
      bool oom = false;
      try {
        Sequential model = make_model(Device::kGpu, DType::kF32);
        FitOptions o;
        o.epochs = 1;
        o.batch_size = batch;
        std::int64_t steps = 0;
        FitCallbacks cb;
        cb.should_stop = [&steps] { return ++steps >= 3; };  // eager, captured, replayed
        model.fit(train, nullptr, o, cb);
        gpu_synchronize();
      } catch (const OutOfMemoryError& e) {
        oom = true;
        oom_message = e.what();
      } catch (...) {
        a.set_limit(0);  // no limit left behind for the benchmarks that follow
        throw;
      }
      gpu_synchronize();
      max_peak = std::max(max_peak, a.peak());
      a.set_limit(0);
      if (oom) {
        oom_batch = batch;
        break;
      }
      ok_batch = batch;
    }
  }
  a.set_limit(0);
  a.release_cached();
  state.counters["limit_MiB"] = static_cast<double>(limit_mib);
  state.counters["max_ok_batch"] = static_cast<double>(ok_batch);
  state.counters["first_oom_batch"] = static_cast<double>(oom_batch);
  state.counters["max_peak_MiB"] = static_cast<double>(max_peak) / kMiB;
  state.counters["peak_within_limit"] = max_peak <= limit ? 1 : 0;
  state.SetLabel(oom_message);
}

void register_all() {
  for (std::int64_t b : {64, 1024, 4096})
    for (DType dt : {DType::kF32, DType::kF16}) {
      const std::string dev = dt == DType::kF16 ? "gpu_fp16" : "gpu_fp32";
      register_guarded("memory_step/dev:" + dev + "/batch:" + std::to_string(b), BM_StepMemoryGpu, b, dt)
          ->Unit(benchmark::kMicrosecond)
          ->UseManualTime();
    }
  for (std::int64_t b : {64, 256, 1024, 4096, 16384})
    register_guarded("memory_epoch/dev:gpu_fp32/batch:" + std::to_string(b), BM_EpochMemoryGpu, b)
        ->Unit(benchmark::kMillisecond)
        ->UseManualTime()
        ->Iterations(1);
  for (std::int64_t mib : {64, 128, 256, 1024})
    register_guarded("memory_limit/dev:gpu_fp32/limit_mib:" + std::to_string(mib), BM_LimitGpu, mib)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->Iterations(1);
}

}  // namespace
}  // namespace mf::bench

int main(int argc, char** argv) { return mf::bench::run_benchmarks(argc, argv, mf::bench::register_all); }
