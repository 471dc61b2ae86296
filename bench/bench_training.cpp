// bench_training.cpp: the whole training step and epoch, the article's claims about them:
//   claim 2  seconds per epoch on the CPU (batch 64, all threads and one) vs the GPU
//   claim 3  the three input pipelines (resident / prefetch / naive) on the GPU
//   claim 4  time per step, per image and per epoch by batch size 8..1024, CPU and GPU
//   claim 5  FP16 vs FP32 step time (the GPU sweep runs both)
//   claim 6  the step replayed as a CUDA graph vs launched eagerly
//   claim 9  how busy the GPU is during an epoch
// An epoch is 48,000 synthetic images (bench_common.h: timings do not depend on pixel values;
// MF_BENCH_EPOCH_IMAGES makes it smaller for smoke runs).
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "data/batching.h"

#if MF_WITH_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda_check.h"
#include "runtime/cuda_raii.h"
#include "runtime/gpu_context.h"
#endif

namespace mf::bench {
namespace {

const data::Dataset& epoch_data() {
  static const data::Dataset d = synthetic_mnist(epoch_images(), 7);
  return d;
}

double steps_per_epoch(std::int64_t batch) {
  return static_cast<double>(data::num_batches(epoch_images(), batch));
}

// Per-step, per-image and per-epoch counters from the time of one step (the benchmark's
// iteration). kInvert turns "steps per second" into seconds: epoch_s = step time x steps.
void set_step_counters(benchmark::State& state, std::int64_t batch) {
  using C = benchmark::Counter;
  state.counters["images/s"] = C(static_cast<double>(batch), C::kIsIterationInvariantRate);
  state.counters["FLOP/s"] = C(train_flops_per_image() * static_cast<double>(batch), C::kIsIterationInvariantRate);
  state.counters["epoch_s"] = C(1.0 / steps_per_epoch(batch), C::kIsIterationInvariantRate | C::kInvert);
}

// ---- CPU: one step (forward, loss, backward, Adam) of a fixed batch, as fit_cpu runs it ----
void BM_TrainStepCpu(benchmark::State& state, std::int64_t batch, int threads) {
  use_threads(threads);
  Sequential model = make_model(Device::kCpu, DType::kF32);
  time_cpu_steps(state, model, batch);
  set_step_counters(state, batch);
  state.counters["threads"] = threads;
}

// ---- Sequential::fit for one epoch; the time is EpochLog::train_seconds ----
// A warm-up fit of kWarmSteps full batches plus the epoch's partial last batch (when there
// is one) first meets both batch shapes: cuDNN's algorithm search, the workspace, the
// buffers and the first CUDA graph capture happen there, not in the timed epoch. In FP16
// it also lets the dynamic loss scale settle: from 2^16 the first steps overflow and are
// skipped while the scale halves, and a fit whose every step was skipped is an error. The
// timed fit then still runs its first step eagerly and captures the second (graphs are
// per fit); that costs a step or two of the epoch.
constexpr std::int64_t kWarmSteps = 24;

EpochLog timed_epoch(Sequential& model, const FitOptions& base) {
  const data::Dataset& train = epoch_data();
  FitOptions o = base;
  o.epochs = 1;
  o.seed = 11;
  const std::int64_t rest = epoch_images() % o.batch_size;
  const data::Dataset warm =
      data::subset(train, 0, std::min(epoch_images(), kWarmSteps * o.batch_size + rest));
  model.fit(warm, nullptr, o);
  const History h = model.fit(train, nullptr, o);
  return h.epochs.back();
}

void BM_EpochCpu(benchmark::State& state, std::int64_t batch, int threads) {
  use_threads(threads);
  Sequential model = make_model(Device::kCpu, DType::kF32);
  FitOptions o;
  o.batch_size = batch;
  for (auto _ : state) state.SetIterationTime(timed_epoch(model, o).train_seconds);
  state.counters["threads"] = threads;
  state.counters["images/s"] =
      benchmark::Counter(static_cast<double>(epoch_images()), benchmark::Counter::kIsIterationInvariantRate);
}

struct GpuConfig {
  std::int64_t batch;
  DType dtype;
  bool graph;
  Pipeline pipeline;
};

void set_epoch_counters(benchmark::State& state, std::int64_t batch) {
  using C = benchmark::Counter;
  state.counters["images/s"] = C(static_cast<double>(epoch_images()), C::kIsIterationInvariantRate);
  // Mean step time: epoch time / steps.
  state.counters["step_us"] = C(1e-6 * steps_per_epoch(batch), C::kIsIterationInvariantRate | C::kInvert);
}

void BM_EpochGpu(benchmark::State& state, GpuConfig cfg) {
  MF_BENCH_REQUIRE_GPU(state);
  Sequential model = make_model(Device::kGpu, cfg.dtype);
  FitOptions o;
  o.batch_size = cfg.batch;
  o.use_graph = cfg.graph;
  o.pipeline = cfg.pipeline;
  for (auto _ : state) state.SetIterationTime(timed_epoch(model, o).train_seconds);
  set_epoch_counters(state, cfg.batch);
  state.SetLabel(model.gpu_training_info());
}

// ---- claim 9: how busy the GPU is during an epoch ----
// Without a profiler (CUPTI) the kernels' own time cannot be summed directly, so it is
// bounded from the other side: the device time of one step when the GPU never waits for
// the host. That step (forward, loss, backward, Adam of the same model and batch) is
// captured into a CUDA graph and replayed kReplays times back to back; the host enqueues
// replays far faster than they run, so the events around them measure the GPU's own time,
// including the ~1 us gaps between a graph's kernels (so the fraction leans high by those).
// Then busy = (device time per step x steps) / the wall time of a real epoch of fit() in
// the configuration under test. The step has no batch gather (a few us): that leans low.
// At most as many replays as the epoch has steps (an epoch made small for a smoke run).
constexpr int kReplays = 200;

void BM_BusyGpu(benchmark::State& state, GpuConfig cfg) {
  MF_BENCH_REQUIRE_GPU(state);
#if MF_WITH_CUDA
  GpuStepRunner runner(cfg.batch, cfg.dtype);
  const cudaStream_t s = GpuContext::current().stream();
  for (int i = 0; i < 3; ++i) runner.step();  // algorithms, workspace, buffers
  MF_GPU_CHECK(cudaStreamSynchronize(s));
  MF_GPU_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t raw = nullptr;
  try {
    runner.step();
  } catch (...) {
    (void)cudaStreamEndCapture(s, &raw);  // leave the stream usable for the benchmarks that follow
    if (raw) (void)cudaGraphDestroy(raw);
    (void)cudaGetLastError();
    throw;
  }
  MF_GPU_CHECK(cudaStreamEndCapture(s, &raw));
  const Graph graph(raw);
  std::size_t nodes = 0;
  MF_GPU_CHECK(cudaGraphGetNodes(raw, nullptr, &nodes));
  cudaGraphExec_t exec_raw = nullptr;
  MF_GPU_CHECK(cudaGraphInstantiate(&exec_raw, raw, 0));
  const GraphExec exec(exec_raw);
  MF_GPU_CHECK(cudaGraphLaunch(exec.get(), s));
  MF_GPU_CHECK(cudaStreamSynchronize(s));
  EventTimer timer(s);
  timer.start();
  const int replays = static_cast<int>(std::min<double>(kReplays, steps_per_epoch(cfg.batch)));
  for (int i = 0; i < replays; ++i) MF_GPU_CHECK(cudaGraphLaunch(exec.get(), s));
  const double device_step = timer.stop_seconds() / replays;

  FitOptions o;
  o.batch_size = cfg.batch;
  o.use_graph = cfg.graph;
  o.pipeline = cfg.pipeline;
  double busy = 0, wall_step = 0;
  for (auto _ : state) {
    const EpochLog log = timed_epoch(runner.model(), o);
    state.SetIterationTime(log.train_seconds);
    wall_step = log.train_seconds / static_cast<double>(log.steps);
    busy = device_step / wall_step;
  }
  state.counters["busy"] = busy;
  state.counters["device_step_us"] = device_step * 1e6;
  state.counters["wall_step_us"] = wall_step * 1e6;
  state.counters["graph_nodes"] = static_cast<double>(nodes);
  state.SetLabel(runner.model().gpu_training_info());
#else
  (void)cfg;
#endif
}

const char* pipe_name(Pipeline p) { return pipeline_name(p); }

std::string gpu_name(const char* group, const GpuConfig& c) {
  return std::string(group) + "/dev:" + (c.dtype == DType::kF16 ? "gpu_fp16" : "gpu_fp32") +
         "/mode:" + (c.graph ? "graph" : "eager") + "/pipeline:" + pipe_name(c.pipeline) +
         "/batch:" + std::to_string(c.batch);
}

void register_all() {
  const std::vector<std::int64_t> batches = {8, 16, 32, 64, 128, 256, 512, 1024};
  std::vector<std::pair<std::string, int>> cpu_devs = {{"cpu_1t", 1}};
  if (max_threads() > 1) cpu_devs.push_back({"cpu_mt", max_threads()});

  // Claim 4 (CPU): one step by batch size; epoch time projected from it.
  for (const auto& [dev, threads] : cpu_devs)
    for (std::int64_t b : batches)
      register_guarded("step/dev:" + dev + "/batch:" + std::to_string(b), BM_TrainStepCpu, b, threads)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();

  // Claim 2 (CPU): a real epoch at the article's batch 64. About 3 s on all threads of the
  // 2-core development machine; once is enough.
  for (const auto& [dev, threads] : cpu_devs)
    register_guarded("epoch/dev:" + dev + "/batch:64", BM_EpochCpu, 64, threads)
        ->Unit(benchmark::kMillisecond)
        ->UseManualTime()
        ->Iterations(1);

  // Claims 2, 4, 5, 6 (GPU): an epoch by batch size, FP32/FP16, graph/eager, data resident.
  for (DType dt : {DType::kF32, DType::kF16})
    for (bool graph : {true, false})
      for (std::int64_t b : batches) {
        const GpuConfig c{b, dt, graph, Pipeline::kResident};
        register_guarded(gpu_name("epoch", c), BM_EpochGpu, c)
            ->Unit(benchmark::kMillisecond)
            ->UseManualTime()
            ->Iterations(2);
      }

  // Claim 3: the pipelines (the resident ones are in the sweep above).
  for (Pipeline p : {Pipeline::kPrefetch, Pipeline::kNaive})
    for (bool graph : {true, false})
      for (std::int64_t b : {64, 1024}) {
        const GpuConfig c{b, DType::kF32, graph, p};
        register_guarded(gpu_name("epoch", c), BM_EpochGpu, c)
            ->Unit(benchmark::kMillisecond)
            ->UseManualTime()
            ->Iterations(2);
      }

  // Claim 9: busy fraction.
  std::vector<GpuConfig> busy;
  for (std::int64_t b : {64, 1024})
    for (DType dt : {DType::kF32, DType::kF16})
      for (bool graph : {true, false}) busy.push_back({b, dt, graph, Pipeline::kResident});
  for (Pipeline p : {Pipeline::kPrefetch, Pipeline::kNaive}) busy.push_back({64, DType::kF32, true, p});
  for (const GpuConfig& c : busy)
    register_guarded(gpu_name("busy", c), BM_BusyGpu, c)
        ->Unit(benchmark::kMillisecond)
        ->UseManualTime()
        ->Iterations(1);
}

}  // namespace
}  // namespace mf::bench

int main(int argc, char** argv) { return mf::bench::run_benchmarks(argc, argv, mf::bench::register_all); }
