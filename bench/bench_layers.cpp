// bench_layers.cpp: every layer of the model alone, forward and backward, at the model's
// shapes and batch 64 and 1024, on the CPU (one thread, all threads) and the GPU (FP32, FP16):
// where the time of a step goes (claim 2). And claim 8, "cuDNN autotuning picks faster
// convolution algorithms": the two convolutions with their algorithms chosen by timing the
// candidates (cudnnFind*, KernelOptions::find = true) against the heuristic's first choice
// (cudnnGet*_v7, find = false).
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "layers/conv2d.h"
#include "kernels/kernel_options.h"
#include "layers/dense.h"
#include "layers/maxpool2d.h"
#include "layers/softmax_xent.h"
#include "tensor/rng.h"

#if MF_WITH_CUDA
#include "runtime/cuda_raii.h"
#include "runtime/gpu_context.h"
#include "kernels/gpu/launchers.h"
#endif

namespace mf::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct LayerCase {
  std::string name;  // as Keras names the model's layers
  Shape sample;      // input shape of one image's activations
  std::function<std::unique_ptr<Layer>(Rng&)> make;
  bool input_grad;   // the first convolution computes no input gradient
  double fwd_macs;   // multiply-adds per image
  double bwd_macs;   // dense count; the CPU skips the zeros of a pooled gradient (conv2d_cpu_kernels.h)
  bool pooled = false;  // a max-pool follows in the model: its backward makes this layer's dy
};

const std::vector<LayerCase>& cases() {
  static const std::vector<LayerCase> c = {
      {"conv2d", Shape{28, 28, 1},
       [](Rng& r) { return std::make_unique<Conv2D>(1, 32, 3, Activation::kRelu, r); }, false, 26.0 * 26 * 32 * 9,
       26.0 * 26 * 32 * 9, true},
      {"max_pooling2d", Shape{26, 26, 32}, [](Rng&) { return std::make_unique<MaxPool2D>(); }, true, 0, 0},
      {"conv2d_1", Shape{13, 13, 32},
       [](Rng& r) { return std::make_unique<Conv2D>(32, 64, 3, Activation::kRelu, r); }, true,
       11.0 * 11 * 64 * 288, 2 * 11.0 * 11 * 64 * 288, true},
      {"max_pooling2d_1", Shape{11, 11, 64}, [](Rng&) { return std::make_unique<MaxPool2D>(); }, true, 0, 0},
      {"dense", Shape{1600}, [](Rng& r) { return std::make_unique<Dense>(1600, 64, Activation::kRelu, r); }, true,
       1600.0 * 64, 2 * 1600.0 * 64},
      {"dense_1", Shape{64}, [](Rng& r) { return std::make_unique<Dense>(64, 10, Activation::kNone, r); }, true,
       64.0 * 10, 2 * 64.0 * 10},
  };
  return c;
}

Shape batched(const Shape& sample, std::int64_t batch) {
  std::vector<std::int64_t> d{batch};
  for (auto v : sample.dims()) d.push_back(v);
  return Shape(d);
}

// The gradient the layer gets in training, for its output y (on the CPU): where a max-pool
// follows, that pool's backward of a random pooled gradient (three of four entries zero,
// and the rows and columns the pool drops), else random everywhere.
Tensor model_gradient(const LayerCase& c, const Tensor& y) {
  if (!c.pooled) return uniform_tensor(y.shape(), -1.0f, 1.0f, 3);
  MaxPool2D pool;
  const Shape pooled = pool.forward(y).shape();
  return pool.backward(uniform_tensor(pooled, -1.0f, 1.0f, 3)).clone();
}

void set_work_counters(benchmark::State& state, const LayerCase& c, std::int64_t batch, bool backward,
                       std::size_t elem_bytes, const Shape& out) {
  const double macs = backward ? c.bwd_macs : c.fwd_macs;
  if (macs > 0)
    state.counters["FLOP/s"] =
        benchmark::Counter(2 * macs * static_cast<double>(batch), benchmark::Counter::kIsIterationInvariantRate);
  // Bytes of activations read and written (pooling is bound by them, not by arithmetic).
  const double bytes = static_cast<double>((batched(c.sample, batch).numel() + out.numel()) * elem_bytes);
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes * static_cast<double>(state.iterations())));
}

// dense_grad: the convolution's backward multiplies the zeros of its gradient too
// (train_mnist --dense-grad), for comparison with the sparse kernels it uses by default.
void BM_LayerCpu(benchmark::State& state, const LayerCase* c, std::int64_t batch, bool backward, int threads,
                 bool dense_grad) {
  use_threads(threads);
  KernelOptions options;
  if (dense_grad) options.cpu_sparse_below = 0.0;
  Rng rng(1);
  std::unique_ptr<Layer> layer = c->make(rng);
  layer->set_kernel_options(options);
  layer->set_needs_input_grad(c->input_grad);
  const Tensor x = uniform_tensor(batched(c->sample, batch), -1.0f, 1.0f, 2);
  const Tensor y = layer->forward(x).clone();
  const Shape out = y.shape();
  const Tensor dy = model_gradient(*c, y);
  if (backward) layer->backward(dy);  // warm-up: buffers
  for (auto _ : state) {
    if (backward) benchmark::DoNotOptimize(layer->backward(dy).raw());
    else benchmark::DoNotOptimize(layer->forward(x).raw());
  }
  set_work_counters(state, *c, batch, backward, 4, out);
}

void BM_LossCpu(benchmark::State& state, std::int64_t batch, int threads) {
  use_threads(threads);
  const Tensor logits = uniform_tensor(Shape{batch, 10}, -3.0f, 3.0f, 1);
  const Tensor labels = random_labels(batch, 10, 2);
  Tensor stats = Tensor::zeros(Shape{kNumStats}), dlogits;
  for (auto _ : state) {
    softmax_xent(logits, labels, stats, &dlogits);
    benchmark::DoNotOptimize(dlogits.raw());
  }
}

#if MF_WITH_CUDA
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// Launch-sized work: each timed batch enqueues kInner calls back to back between two events,
// so a few-microsecond kernel is not lost in event resolution. KeepRunningBatch counts each
// call as one iteration: the time reported is per call, and the run lasts about
// --benchmark_min_time.
constexpr int kInner = 20;
#endif

// find: -1 keeps KernelOptions' default (timed search), 0 the heuristic, 1 timed.
void BM_LayerGpu(benchmark::State& state, const LayerCase* c, std::int64_t batch, bool backward, DType dtype,
                 int find) {
  MF_BENCH_REQUIRE_GPU(state);
#if MF_WITH_CUDA
  KernelOptions options;
  if (find >= 0) options.find = find == 1;
  Rng rng(1);
  std::unique_ptr<Layer> layer = c->make(rng);
  layer->set_kernel_options(options);
  layer->set_needs_input_grad(c->input_grad);
  layer->to(Device::kGpu);
  if (dtype == DType::kF16) layer->set_compute_dtype(DType::kF16);
  const Tensor x = uniform_tensor(batched(c->sample, batch), -1.0f, 1.0f, 2).to(dtype).to(Device::kGpu);
  // The first calls choose the cuDNN algorithms (timing them when find is on), size the
  // workspace and allocate the buffers: their wall time is the price of the choice.
  auto t0 = Clock::now();
  const Shape out = layer->forward(x).shape();
  gpu_synchronize();
  state.counters["first_fwd_ms"] = ms_since(t0);
  const Tensor dy = model_gradient(*c, layer->forward(x).to(Device::kCpu).to(DType::kF32)).to(dtype).to(Device::kGpu);
  if (backward) {
    t0 = Clock::now();
    layer->backward(dy);
    gpu_synchronize();
    state.counters["first_bwd_ms"] = ms_since(t0);
  }
  EventTimer timer(GpuContext::current().stream());
  while (state.KeepRunningBatch(kInner)) {
    timer.start();
    for (int i = 0; i < kInner; ++i) {
      if (backward) layer->backward(dy);
      else layer->forward(x);
    }
    state.SetIterationTime(timer.stop_seconds());
  }
  set_work_counters(state, *c, batch, backward, dtype_size(dtype), out);
  state.SetLabel(layer->gpu_config());
#else
  (void)c, (void)batch, (void)backward, (void)dtype, (void)find;
#endif
}

void BM_LossGpu(benchmark::State& state, std::int64_t batch, DType dtype) {
  MF_BENCH_REQUIRE_GPU(state);
#if MF_WITH_CUDA
  const Tensor logits = uniform_tensor(Shape{batch, 10}, -3.0f, 3.0f, 1).to(dtype).to(Device::kGpu);
  const Tensor labels = random_labels(batch, 10, 2).to(Device::kGpu);
  Tensor stats = Tensor::zeros(Shape{kNumStats}, DType::kF32, Device::kGpu);
  Tensor dlogits = Tensor::empty(logits.shape(), dtype, Device::kGpu);
  const cudaStream_t s = GpuContext::current().stream();
  auto run = [&] {
    launch_softmax_xent(logits.raw(), dtype == DType::kF16, labels.data<std::int32_t>(), batch, 10, dlogits.raw(),
                        1.0f / static_cast<float>(batch), nullptr, stats.data<float>(),
                        GpuContext::current().reduction_scratch(reduction_scratch_bytes()), s);
  };
  run();
  EventTimer timer(s);
  while (state.KeepRunningBatch(kInner)) {
    timer.start();
    for (int i = 0; i < kInner; ++i) run();
    state.SetIterationTime(timer.stop_seconds());
  }
#else
  (void)batch, (void)dtype;
#endif
}

const char* dir_name(bool backward) { return backward ? "bwd" : "fwd"; }
const char* gpu_dev(DType d) { return d == DType::kF16 ? "gpu_fp16" : "gpu_fp32"; }

void register_all() {
  const std::vector<std::int64_t> batches = {64, 1024};
  std::vector<std::pair<std::string, int>> cpu_devs = {{"cpu_1t", 1}};
  if (max_threads() > 1) cpu_devs.push_back({"cpu_mt", max_threads()});
  // Claim 2: each layer, CPU and GPU.
  for (const LayerCase& c : cases()) {
    for (bool backward : {false, true}) {
      for (std::int64_t batch : batches) {
        const std::string base =
            "layer/layer:" + c.name + "/dir:" + dir_name(backward) + "/batch:" + std::to_string(batch) + "/dev:";
        for (const auto& [dev, threads] : cpu_devs) {
          register_guarded(base + dev, BM_LayerCpu, &c, batch, backward, threads, false)
              ->Unit(benchmark::kMicrosecond)
              ->UseRealTime();
          if (backward && c.pooled && c.input_grad)  // the sparse backward vs the dense tiles
            register_guarded(base + dev + "_dense_grad", BM_LayerCpu, &c, batch, backward, threads, true)
                ->Unit(benchmark::kMicrosecond)
                ->UseRealTime();
        }
        for (DType dt : {DType::kF32, DType::kF16})
          register_guarded(base + gpu_dev(dt), BM_LayerGpu, &c, batch, backward, dt, -1)
              ->Unit(benchmark::kMicrosecond)
              ->UseManualTime();
      }
    }
  }
  for (std::int64_t batch : batches) {
    const std::string base = "layer/layer:loss/dir:fwd_bwd/batch:" + std::to_string(batch) + "/dev:";
    for (const auto& [dev, threads] : cpu_devs)
      register_guarded(base + dev, BM_LossCpu, batch, threads)
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime();
    for (DType dt : {DType::kF32, DType::kF16})
      register_guarded(base + gpu_dev(dt), BM_LossGpu, batch, dt)
          ->Unit(benchmark::kMicrosecond)
          ->UseManualTime();
  }
  // Claim 8: the convolutions with the heuristic's choice vs the timed search.
  for (const LayerCase& c : cases()) {
    if (c.name.rfind("conv2d", 0) != 0) continue;
    for (bool backward : {false, true})
      for (std::int64_t batch : batches)
        for (DType dt : {DType::kF32, DType::kF16})
          for (int find : {0, 1}) {
            const std::string name = "cudnn/layer:" + c.name + "/dir:" + dir_name(backward) +
                                     "/batch:" + std::to_string(batch) + "/dev:" + gpu_dev(dt) +
                                     "/algo:" + (find ? "timed" : "heuristic");
            register_guarded(name, BM_LayerGpu, &c, batch, backward, dt, find)
                ->Unit(benchmark::kMicrosecond)
                ->UseManualTime();
          }
  }
}

}  // namespace
}  // namespace mf::bench

int main(int argc, char** argv) { return mf::bench::run_benchmarks(argc, argv, mf::bench::register_all); }
