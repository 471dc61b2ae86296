// bench_fused.cpp: each launch of the fused training step (kernels/gpu/fused.h, run by
// train/fused_step.cu) timed on its own, at batch 64 and 1024, FP32 and FP16: the measured
// column beside scripts/fused_model.py's predicted one (docs/fused_step.md).
// Names: "fused/kernel:<k>/dev:<gpu_fp32|gpu_fp16>/batch:<n>", k one of
//   conv1_fwd    kernel 1: the batch from the u8 data set + conv1 + bias + ReLU + pool
//   conv2_fwd    kernel 2: conv2 + bias + ReLU + pool
//   head         kernels 3a and 3b: the head forward and backward, its weight gradients
//   conv2_dgrad  kernel 4: conv2's data gradient over the pooling winners, launched alone
//   conv2_wgrad  kernel 5: conv2's weight and bias gradients, partial sums per 4 images, alone
//   conv2_bwd    kernels 4 and 5 in the one launch the step runs
//   conv1_wgrad  kernel 6: conv1's
//   wgrad_sums   kernel 7: both layers' partial sums added up (and the batch cursor moved)
// Each is enqueued kInner times back to back on the compute stream, with the buffers a step
// of the article's model leaves (its weights from the seed, the winners and gradients of one
// step run first), and timed by CUDA events: the time per launch, graph-node costs not
// included (the model adds those).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "kernels/gpu/fused.h"
#include "kernels/gpu/launchers.h"
#include "layers/softmax_xent.h"
#include "runtime/gpu_runtime.h"

#if MF_WITH_CUDA
#include "runtime/cuda_raii.h"
#endif

namespace mf::bench {
namespace {

constexpr int kInner = 20;

// The fused step's buffers for one batch of the article's model, and its launches.
class FusedLaunches {
 public:
  FusedLaunches(std::int64_t batch, DType dtype)
      : model_(make_model(Device::kGpu, dtype)), half_(dtype == DType::kF16), s_(compute_stream()) {
    const data::Dataset d = synthetic_mnist(batch, 5);
    images_ = device_bytes(d.images);
    labels_u8_ = device_bytes(d.labels);
    const Shape p1{batch, 13, 13, 32}, p2{batch, 5, 5, 64};
    pooled1_ = Tensor::zeros(p1, dtype, Device::kGpu);
    dpool1_ = Tensor::zeros(p1, dtype, Device::kGpu);
    pooled2_ = Tensor::zeros(p2, dtype, Device::kGpu);
    dpool2_ = Tensor::zeros(p2, dtype, Device::kGpu);
    winners1_ = Tensor::zeros(Shape{pooled1_.numel()}, DType::kU8, Device::kGpu);
    winners2_ = Tensor::zeros(Shape{pooled2_.numel()}, DType::kU8, Device::kGpu);
    labels_ = Tensor::zeros(Shape{batch}, DType::kI32, Device::kGpu);
    stats_ = Tensor::zeros(Shape{kNumStats}, DType::kF32, Device::kGpu);
    g1_ = {batch, 28, 28, 1, 32};
    g2_ = {batch, 13, 13, 32, 64};
    gh_ = {batch, 1600, 64, 10};
    scratch1_ = bytes(fused_conv_scratch_bytes(g1_));
    scratch2_ = bytes(fused_conv_scratch_bytes(g2_));
    head_scratch_ = bytes(fused_head_scratch_bytes(gh_, half_));
    for (const auto& k : kernels()) k.second();  // one step: winners, gradients, statistics
    gpu_synchronize();
  }

  // (name, enqueue) in the step's order.
  std::vector<std::pair<std::string, std::function<void()>>> kernels() {
    const FusedBatch batch{images_.data<std::uint8_t>(), labels_u8_.data<std::uint8_t>(), nullptr, nullptr};
    auto* w1 = static_cast<std::uint8_t*>(winners1_.raw());
    auto* w2 = static_cast<std::uint8_t*>(winners2_.raw());
    std::int32_t* labels = labels_.data<std::int32_t>();
    return {
        {"conv1_fwd",
         [=] { launch_fused_conv1_forward(g1_, batch, w(0, 0), w(0, 1), pooled1_.raw(), w1, labels, half_, s_); }},
        {"conv2_fwd",
         [=] {
           launch_fused_conv_forward(g2_, pooled1_.raw(), w(2, 0), w(2, 1), pooled2_.raw(), w2, half_, false, s_);
         }},
        // What the step runs unless exact FP32 is asked for: the products on Tensor Cores.
        {"conv2_fwd_tc",
         [=] {
           launch_fused_conv_forward(g2_, pooled1_.raw(), w(2, 0), w(2, 1), pooled2_.raw(), w2, half_, true, s_);
         }},
        {"head",
         [=] {
           launch_fused_head(gh_, pooled2_.raw(), w(5, 0), w(5, 1), w(6, 0), w(6, 1), labels,
                             1.0f / static_cast<float>(gh_.n), nullptr,
                             fused_head_scratch(head_scratch_.raw(), gh_, half_), dpool2_.raw(), grad(5, 0), grad(5, 1),
                             grad(6, 0), grad(6, 1), stats_.data<float>(), half_, s_);
         }},
        {"conv2_dgrad",
         [=] { launch_fused_conv_dgrad(g2_, dpool2_.raw(), pooled2_.raw(), w2, w(2, 0), dpool1_.raw(), half_, s_); }},
        {"conv2_wgrad",
         [=] {
           launch_fused_conv_wgrad_partials(g2_, pooled1_.raw(), dpool2_.raw(), pooled2_.raw(), w2,
                                            static_cast<float*>(scratch2_.raw()), half_, s_);
         }},
        {"conv2_bwd",
         [=] {
           launch_fused_conv_backward(g2_, pooled1_.raw(), dpool2_.raw(), pooled2_.raw(), w2, w(2, 0), dpool1_.raw(),
                                      static_cast<float*>(scratch2_.raw()), half_, s_);
         }},
        {"conv1_wgrad",
         [=] {
           launch_fused_conv1_wgrad_partials(g1_, batch, dpool1_.raw(), pooled1_.raw(), w1,
                                             static_cast<float*>(scratch1_.raw()), half_, s_);
         }},
        {"wgrad_sums",
         [=] {
           const FusedWgradSum sums[] = {{g2_, static_cast<float*>(scratch2_.raw()), grad(2, 0), grad(2, 1)},
                                         {g1_, static_cast<float*>(scratch1_.raw()), grad(0, 0), grad(0, 1)}};
           launch_fused_conv_wgrad_sums(sums, 2, nullptr, 0, nullptr, half_, s_);
         }},
    };
  }

  GpuStream stream() const { return s_; }

 private:
  static Tensor bytes(std::size_t n) {
    return Tensor::zeros(Shape{static_cast<std::int64_t>(n)}, DType::kU8, Device::kGpu);
  }
  static Tensor device_bytes(const std::vector<std::uint8_t>& v) {
    Tensor t = bytes(v.size());
    gpu_copy_async(t.raw(), v.data(), v.size(), CopyKind::kHostToDevice, compute_stream());
    gpu_synchronize();
    return t;
  }
  // Parameter p of layer i in the compute dtype, and its gradient (as train/fused_step.cu).
  const void* w(std::size_t i, std::size_t p) {
    Parameter* q = model_.layers()[i]->parameters()[p];
    return half_ ? q->half.raw() : q->value.raw();
  }
  void* grad(std::size_t i, std::size_t p) { return model_.layers()[i]->parameters()[p]->grad.raw(); }

  Sequential model_;
  bool half_;
  GpuStream s_;
  FusedConvSizes g1_{}, g2_{};
  FusedHeadSizes gh_{};
  Tensor images_, labels_u8_, pooled1_, dpool1_, pooled2_, dpool2_, winners1_, winners2_, labels_, stats_;
  Tensor scratch1_, scratch2_, head_scratch_;
};

void BM_FusedKernel(benchmark::State& state, std::string kernel, std::int64_t batch, DType dtype) {
  MF_BENCH_REQUIRE_GPU(state);
#if MF_WITH_CUDA
  FusedLaunches f(batch, dtype);
  std::function<void()> launch;
  for (auto& [name, fn] : f.kernels())
    if (name == kernel) launch = fn;
  EventTimer timer(f.stream());
  while (state.KeepRunningBatch(kInner)) {
    timer.start();
    for (int i = 0; i < kInner; ++i) launch();
    state.SetIterationTime(timer.stop_seconds());
  }
  using C = benchmark::Counter;
  state.counters["images/s"] = C(static_cast<double>(batch), C::kIsIterationInvariantRate);
#else
  (void)kernel, (void)batch, (void)dtype;
#endif
}

void register_all() {
  for (std::int64_t batch : {64, 1024})
    for (DType dt : {DType::kF32, DType::kF16})
      for (const char* k : {"conv1_fwd", "conv2_fwd", "head", "conv2_dgrad", "conv2_wgrad", "conv2_bwd",
                            "conv1_wgrad", "wgrad_sums"})
        register_guarded(std::string("fused/kernel:") + k + "/dev:" + (dt == DType::kF16 ? "gpu_fp16" : "gpu_fp32") +
                             "/batch:" + std::to_string(batch),
                         BM_FusedKernel, std::string(k), batch, dt)
            ->Unit(benchmark::kMicrosecond)
            ->UseManualTime();
}

}  // namespace
}  // namespace mf::bench

int main(int argc, char** argv) { return mf::bench::run_benchmarks(argc, argv, mf::bench::register_all); }
