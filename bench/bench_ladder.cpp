// bench_ladder.cpp: the kernel ladder, measured. One training step of the article's model
// (forward, loss, backward, Adam on a fixed batch) at every rung of kernels/kernel_options.h,
// at batch 64 (the article's) and 1024:
//   CPU naive, library, tuned    at 1 thread and at all threads (cpu_1t, cpu_mt)
//   GPU naive, library, fused    FP32 and FP16
// Names: "ladder/rung:<rung>/dev:<cpu_1t|cpu_mt|gpu_fp32|gpu_fp16>/batch:<n>". Counters:
// images/s and steps (how many steps the figure is the mean of; for the GPU, of one epoch:
// its time per step is the epoch's over its steps, graph capture included). The report
// (scripts/bench_report.py) divides every rung's images/s by CPU naive's on one thread: how
// far each step up the ladder goes, on each device.
//
// The naive CPU rung takes about a second a step at batch 64 on one thread of the 2-core
// development machine, so each configuration runs a fixed number of steps after a warm-up
// step (kSteps below) rather than Google Benchmark's open-ended iterations; the fast rungs
// run for --benchmark_min_time.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "data/mnist.h"
#include "kernels/kernel_options.h"
#include "runtime/gpu_runtime.h"

namespace mf::bench {
namespace {

KernelOptions at(KernelRung rung) {
  KernelOptions k;
  k.rung = rung;
  return k;
}

void set_counters(benchmark::State& state, std::int64_t batch) {
  using C = benchmark::Counter;
  state.counters["images/s"] = C(static_cast<double>(batch), C::kIsIterationInvariantRate);
  state.counters["steps"] = static_cast<double>(state.iterations());
}

// ---- CPU: the step fit_cpu runs (bench_training's BM_TrainStepCpu) at one rung ----
void BM_LadderCpu(benchmark::State& state, KernelRung rung, std::int64_t batch, int threads) {
  use_threads(threads);
  Sequential model = make_model(Device::kCpu, DType::kF32);
  model.set_kernel_options(at(rung));
  time_cpu_steps(state, model, batch);
  set_counters(state, batch);
  state.counters["threads"] = threads;
  state.SetLabel(model.layers()[2]->cpu_config());  // conv2d_1, the costly layer: what it ran
}

// ---- GPU: a whole epoch of Sequential::fit at one rung, EpochLog::train_seconds ----
// The step the rung really runs (the fused rung's is not a chain of layer calls): data
// resident, the step replayed as a CUDA graph. A warm-up fit of 2 steps first meets the
// shapes (cuDNN's algorithm search, the buffers). The timed epoch includes its one graph
// capture. An epoch is 48,000 synthetic images (MF_BENCH_EPOCH_IMAGES for smoke runs).
void BM_LadderGpu(benchmark::State& state, KernelRung rung, std::int64_t batch, DType dtype) {
  MF_BENCH_REQUIRE_GPU(state);
  static const data::Dataset epoch = synthetic_mnist(epoch_images(), 7);
  Sequential model = make_model(Device::kGpu, dtype);
  model.set_kernel_options(at(rung));
  FitOptions o;
  o.epochs = 1;
  o.batch_size = batch;
  o.seed = 11;
  model.fit(data::subset(epoch, 0, std::min<std::int64_t>(epoch.count, 2 * batch)), nullptr, o);
  std::int64_t steps = 0;
  for (auto _ : state) {
    const History h = model.fit(epoch, nullptr, o);
    state.SetIterationTime(h.epochs.back().train_seconds);
    steps = h.epochs.back().steps;
  }
  using C = benchmark::Counter;
  state.counters["images/s"] = C(static_cast<double>(epoch.count), C::kIsIterationInvariantRate);
  state.counters["steps"] = static_cast<double>(steps);
  state.SetLabel(model.gpu_training_info());
}

// Steps each configuration is timed over: enough that the figure moves by a few percent at
// most from run to run (the naive rung's steps take 0.3-20 s here, and vary little).
int cpu_steps(KernelRung rung, std::int64_t batch) {
  if (rung != KernelRung::kNaive) return 0;  // 0: Google Benchmark's --benchmark_min_time
  return batch >= 1024 ? 2 : 5;
}

void register_all() {
  std::vector<std::pair<std::string, int>> cpu_devs = {{"cpu_1t", 1}};
  if (max_threads() > 1) cpu_devs.push_back({"cpu_mt", max_threads()});
  for (std::int64_t batch : {64, 1024})
    for (KernelRung rung : {KernelRung::kNaive, KernelRung::kLibrary, KernelRung::kTuned})
      for (const auto& [dev, threads] : cpu_devs) {
        auto* b = register_guarded(std::string("ladder/rung:") + rung_name(rung) + "/dev:" + dev + "/batch:" +
                                       std::to_string(batch),
                                   BM_LadderCpu, rung, batch, threads)
                      ->Unit(benchmark::kMillisecond)
                      ->UseRealTime();
        if (const int steps = cpu_steps(rung, batch)) b->Iterations(steps);
      }
  for (std::int64_t batch : {64, 1024})
    for (KernelRung rung : {KernelRung::kNaive, KernelRung::kLibrary, KernelRung::kFused})
      for (DType dt : {DType::kF32, DType::kF16})
        register_guarded(std::string("ladder/rung:") + rung_name(rung) + "/dev:" +
                             (dt == DType::kF16 ? "gpu_fp16" : "gpu_fp32") + "/batch:" + std::to_string(batch),
                         BM_LadderGpu, rung, batch, dt)
            ->Unit(benchmark::kMillisecond)
            ->UseManualTime()
            ->Iterations(2);
}

}  // namespace
}  // namespace mf::bench

int main(int argc, char** argv) { return mf::bench::run_benchmarks(argc, argv, mf::bench::register_all); }
