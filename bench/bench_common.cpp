// bench_common.cpp: shared helpers of the benchmark suites (see bench_common.h).
#include "bench/bench_common.h"

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/gpu_runtime.h"
#include "kernels/gpu/launchers.h"
#include "layers/softmax_xent.h"
#include "optim/adam.h"
#include "runtime/parallel.h"
#include "tensor/rng.h"

namespace mf::bench {

std::int64_t epoch_images() {
  static const std::int64_t n = [] {
    const char* v = std::getenv("MF_BENCH_EPOCH_IMAGES");
    if (!v || !*v) return std::int64_t{48000};
    char* end = nullptr;
    errno = 0;
    const long long parsed = std::strtoll(v, &end, 10);
    if (errno != 0 || *end != '\0' || parsed < 1 || parsed > 10000000)
      throw std::invalid_argument(std::string("MF_BENCH_EPOCH_IMAGES=") + v +
                                  ": expected a number of images from 1 to 10000000");
    return static_cast<std::int64_t>(parsed);
  }();
  return n;
}

int max_threads() {
  static const int n = available_cpus();
  return n;
}

void use_threads(int n) {
  if (num_threads() != n) set_num_threads(n);
}

data::Dataset synthetic_mnist(std::int64_t count, std::uint64_t seed) {
  data::Dataset d;
  d.count = count;
  d.rows = d.cols = 28;
  d.num_classes = 10;
  d.images.resize(static_cast<std::size_t>(count * 28 * 28));
  d.labels.resize(static_cast<std::size_t>(count));
  Rng rng(seed);
  for (auto& p : d.images) p = rng.uniform01() < 0.8f ? 0 : static_cast<std::uint8_t>(1 + rng.below(255));
  for (auto& l : d.labels) l = static_cast<std::uint8_t>(rng.below(10));
  return d;
}

Tensor uniform_tensor(const Shape& shape, float lo, float hi, std::uint64_t seed) {
  Tensor t = Tensor::empty(shape);
  Rng rng(seed);
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = rng.uniform(lo, hi);
  return t;
}

Tensor random_labels(std::int64_t n, int classes, std::uint64_t seed) {
  Tensor t = Tensor::empty(Shape{n}, DType::kI32);
  Rng rng(seed);
  std::int32_t* p = t.data<std::int32_t>();
  for (std::int64_t i = 0; i < n; ++i) p[i] = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(classes)));
  return t;
}

namespace {
constexpr double kMacsConv1 = 26.0 * 26 * 32 * 9;
constexpr double kMacsConv2 = 11.0 * 11 * 64 * 288;
constexpr double kMacsDense1 = 1600.0 * 64;
constexpr double kMacsDense2 = 64.0 * 10;
}  // namespace

double forward_flops_per_image() { return 2 * (kMacsConv1 + kMacsConv2 + kMacsDense1 + kMacsDense2); }

double train_flops_per_image() {
  const double backward = 2 * (kMacsConv1 + 2 * (kMacsConv2 + kMacsDense1 + kMacsDense2));
  return forward_flops_per_image() + backward;
}

Sequential make_model(Device device, DType dtype, std::uint64_t seed) {
  Rng rng(seed);
  Sequential m = Sequential::mnist_cnn(rng);
  m.to(device);
  if (dtype != DType::kF32) m.set_compute_dtype(dtype);
  m.compile(std::make_unique<Adam>());
  return m;
}

void time_cpu_steps(benchmark::State& state, Sequential& model, std::int64_t batch) {
  const Tensor x = uniform_tensor(Shape{batch, 28, 28, 1}, 0.0f, 1.0f, 2);
  const Tensor y = random_labels(batch, 10, 3);
  Tensor stats = Tensor::zeros(Shape{kNumStats}), dlogits;
  auto step = [&] {
    softmax_xent(model.forward(x), y, stats, &dlogits);
    model.backward(dlogits);
    model.optimizer()->step();
  };
  step();
  for (auto _ : state) step();
}

GpuStepRunner::GpuStepRunner(std::int64_t batch, DType dtype, std::uint64_t seed)
    : model_(make_model(Device::kGpu, dtype, seed)), batch_(batch), half_(dtype == DType::kF16) {
  x_ = uniform_tensor(Shape{batch, 28, 28, 1}, 0.0f, 1.0f, seed + 1).to(Device::kGpu);
  if (half_) x_ = x_.to(DType::kF16);
  labels_ = random_labels(batch, 10, seed + 2).to(Device::kGpu);
  stats_ = Tensor::zeros(Shape{kNumStats}, DType::kF32, Device::kGpu);
  scratch_ = Tensor::zeros(Shape{static_cast<std::int64_t>(reduction_scratch_bytes())}, DType::kU8, Device::kGpu);
}

void GpuStepRunner::step() {
  const Tensor& logits = model_.forward(x_);
  ensure(dlogits_, logits.shape(), logits.dtype(), Device::kGpu);
  // The launcher, not softmax_xent(): that one enqueues on the legacy default stream, and
  // the whole step must stay on the compute stream (to be captured into a graph).
  launch_softmax_xent(logits.raw(), half_, labels_.data<std::int32_t>(), batch_, logits.dim(1), dlogits_.raw(),
                      1.0f / static_cast<float>(batch_), model_.optimizer()->device_loss_scale(),
                      stats_.data<float>(), scratch_.raw(), compute_stream());
  model_.backward(dlogits_);
  model_.optimizer()->step();
}

namespace {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  }
  return "unknown";
}

}  // namespace

int run_benchmarks(int argc, char** argv, void (*register_fn)()) {
  register_fn();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("mf_cpu_model", cpu_model());
  benchmark::AddCustomContext("mf_threads", std::to_string(max_threads()));
  benchmark::AddCustomContext("mf_build", MF_WITH_CUDA ? "cuda" : "cpu-only");
  if (gpu_available()) {
    const GpuDeviceInfo info = gpu_device_info(current_gpu());
    benchmark::AddCustomContext("mf_gpu", info.name + " (sm_" + std::to_string(info.major) +
                                              std::to_string(info.minor) + ", " +
                                              std::to_string(info.multiprocessors) + " SMs)");
  } else {
    benchmark::AddCustomContext("mf_gpu", "none: " + gpu_status().reason);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace mf::bench
