// bench_common.h: what the benchmark suites share: thread settings, synthetic MNIST-sized
// data, the model's FLOP counts, a GPU training step driven through the public layer API,
// and the main() that records the machine in the JSON context.
//
// Benchmark names follow one scheme so that scripts/bench_report.py can read them back:
// "<group>/<key>:<value>/<key>:<value>...", e.g. "gemm/dev:cpu_mt/m:1024/n:1024/k:1024".
// Google Benchmark appends "/iterations:N" or "/manual_time"; the report ignores those.
#pragma once
#include <benchmark/benchmark.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <string>

#include "data/mnist.h"
#include "train/sequential.h"
#include "tensor/tensor.h"

namespace mf::bench {

// The article's epoch: 60,000 training images minus Keras's 20 % validation split, unless
// MF_BENCH_EPOCH_IMAGES gives another count (the smoke runs on the CUDA emulation use 128:
// 48,000 would take hours there). A value that is not a positive count throws, which the
// benchmark reports as its error.
std::int64_t epoch_images();

// The CPUs this process may use, when it started (mf::available_cpus(), the default size of
// mf::cpu_pool()).
int max_threads();
// Resizes mf::cpu_pool() to n threads (re-creating it only when the size changes).
void use_threads(int n);

// `count` random 28x28 images and labels. The pixels are zero with probability 0.8 and
// uniform in 1..255 otherwise, roughly MNIST's ink density; timings do not depend on the
// values (no data-dependent branches; denormals are flushed on the CPU path), so random
// data stands in for the real set and the suites need no download.
data::Dataset synthetic_mnist(std::int64_t count, std::uint64_t seed = 1);

// Host tensors with uniform values in [lo, hi).
Tensor uniform_tensor(const Shape& shape, float lo, float hi, std::uint64_t seed);
Tensor random_labels(std::int64_t n, int classes, std::uint64_t seed);  // i32 (n)

// Multiply-adds of one image through the article's model, per layer (forward):
//   conv2d   26*26*32 * 3*3*1   =   194,688
//   conv2d_1 11*11*64 * 3*3*32  = 2,230,272
//   dense    1600*64            =   102,400
//   dense_1  64*10              =       640    (total 2.53 M, the article's "2.5 M")
// A training step costs forward (1x) + backward (2x: input and weight gradients), except
// that the first convolution needs no input gradient: ~14.8 MFLOP per image.
double forward_flops_per_image();
double train_flops_per_image();

// The article's model (Glorot weights from `seed`) on `device` in `dtype`, compiled with
// Adam (lr 1e-3, Keras's defaults).
Sequential make_model(Device device, DType dtype, std::uint64_t seed = 1);

// Times `model`'s CPU training step (forward, loss, backward, Adam) on a fixed batch of
// uniform pixels, as fit_cpu runs it, once per benchmark iteration after a warm-up step
// (which allocates every buffer).
void time_cpu_steps(benchmark::State& state, Sequential& model, std::int64_t batch);

// One training step (forward, loss, backward, Adam) of a fixed batch, enqueued through the
// layers' public API on the compute stream, as Sequential::fit's GPU step does it, minus
// the batch gather. The batch, its labels and the loss's buffers stay on the device.
// Constructing it on a machine without a GPU throws NoGpuError.
class GpuStepRunner {
 public:
  GpuStepRunner(std::int64_t batch, DType dtype, std::uint64_t seed = 1);
  void step();  // enqueues; nothing waits
  Sequential& model() { return model_; }
  std::int64_t batch() const { return batch_; }
  bool half() const { return half_; }

 private:
  Sequential model_;
  std::int64_t batch_;
  bool half_;
  Tensor x_, labels_, dlogits_, stats_;
  Tensor scratch_;  // the reductions' scratch (launchers.h)
};

// Registers fn(state, args...) under `name`. An exception (a GPU error, an unexpected
// OutOfMemoryError) marks that benchmark as failed with its message instead of ending the
// whole suite: a run on a borrowed GPU machine should lose one number, not all of them.
template <class F, class... Args>
benchmark::internal::Benchmark* register_guarded(const std::string& name, F fn, Args... args) {
  return benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& state) {
    try {
      fn(state, args...);
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
    }
  });
}

// Registers the suite's benchmarks (via `register_fn`), adds the machine to the JSON
// context (cpu_model, threads, gpu, build) and runs them. Returns main()'s exit code.
int run_benchmarks(int argc, char** argv, void (*register_fn)());

// The first statement of every GPU benchmark: without a usable GPU it marks the benchmark
// skipped, with the reason (no driver, no device, CPU-only build), and returns.
#define MF_BENCH_REQUIRE_GPU(state)                                                   \
  do {                                                                                \
    if (!::mf::gpu_available())                                                       \
      return (state).SkipWithError(("no GPU: " + ::mf::gpu_status().reason).c_str()); \
  } while (0)

}  // namespace mf::bench
