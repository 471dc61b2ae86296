// fused_step.cu: the fused rung's training step (fused_step.h).
#include "train/fused_step.h"

#include <stdexcept>
#include <string>

#include "kernels/gpu/fused.h"
#include "layers/conv2d.h"
#include "layers/dense.h"
#include "train/gpu_trainer.h"

namespace mf {

namespace {

[[noreturn]] void not_the_model(const std::string& why) {
  throw std::invalid_argument("--kernels fused runs the article's model only (Conv2D 3x3 ReLU, MaxPooling2D, "
                              "Conv2D 3x3 ReLU, MaxPooling2D, Flatten, Dense ReLU, Dense): " + why);
}

const Conv2D& conv_at(const FusedStep::Layers& layers, std::size_t i) {
  const auto* c = dynamic_cast<const Conv2D*>(layers[i].get());
  if (!c) not_the_model("layer " + std::to_string(i + 1) + " is a " + layers[i]->type());
  if (c->kernel_size() != 3 || c->activation() != Activation::kRelu)
    not_the_model(c->label() + " is not a 3x3 convolution with ReLU");
  return *c;
}

const Dense& dense_at(const FusedStep::Layers& layers, std::size_t i) {
  const auto* d = dynamic_cast<const Dense*>(layers[i].get());
  if (!d) not_the_model("layer " + std::to_string(i + 1) + " is a " + layers[i]->type());
  return *d;
}

// Parameter p of layer i: its weights in the compute dtype, and its gradient.
const void* weights(FusedStep::Layers& layers, std::size_t i, int p, bool half) {
  Parameter* q = layers[i]->parameters()[static_cast<std::size_t>(p)];
  return half ? q->half.raw() : q->value.raw();
}
void* grad(FusedStep::Layers& layers, std::size_t i, int p) {
  return layers[i]->parameters()[static_cast<std::size_t>(p)]->grad.raw();
}

}  // namespace

void FusedStep::check_model(const Layers& layers) {
  if (layers.size() != 7) not_the_model("this model has " + std::to_string(layers.size()) + " layers");
  conv_at(layers, 0);
  conv_at(layers, 2);
  for (std::size_t i : {1u, 3u})
    if (layers[i]->type() != "MaxPooling2D") not_the_model("layer " + std::to_string(i + 1) + " is a " + layers[i]->type());
  if (layers[4]->type() != "Flatten") not_the_model("layer 5 is a " + layers[4]->type());
  const Dense& hidden = dense_at(layers, 5);
  const Dense& out = dense_at(layers, 6);
  if (hidden.activation() != Activation::kRelu || out.activation() != Activation::kNone)
    not_the_model("the dense layers are not ReLU then linear");
  if (hidden.units() > kFusedHeadMaxHidden || out.units() > kFusedHeadMaxClasses)
    not_the_model("its head is wider than the fused kernels hold (" + std::to_string(kFusedHeadMaxHidden) +
                  " units, " + std::to_string(kFusedHeadMaxClasses) + " classes)");
}

void FusedStep::size(const Layers& layers, std::int64_t batch, std::int64_t h, std::int64_t w, std::int64_t c,
                     bool half) {
  check_model(layers);
  h_ = h, w_ = w, c_ = c;
  const DType dt = half ? DType::kF16 : DType::kF32;
  const auto& conv1 = conv_at(layers, 0);
  const auto& conv2 = conv_at(layers, 2);
  const std::int64_t h1 = (h - 2) / 2, w1 = (w - 2) / 2, h2 = (h1 - 2) / 2, w2 = (w1 - 2) / 2;
  const FusedConvSizes g1{batch, h, w, c, conv1.filters()}, g2{batch, h1, w1, conv1.filters(), conv2.filters()};
  ensure(pooled1_, Shape{batch, h1, w1, g1.filters}, dt, Device::kGpu);
  ensure(winners1_, Shape{pooled1_.numel()}, DType::kU8, Device::kGpu);
  ensure(dpool1_, pooled1_.shape(), dt, Device::kGpu);
  ensure(pooled2_, Shape{batch, h2, w2, g2.filters}, dt, Device::kGpu);
  ensure(winners2_, Shape{pooled2_.numel()}, DType::kU8, Device::kGpu);
  ensure(dpool2_, pooled2_.shape(), dt, Device::kGpu);
  const auto bytes = [](std::size_t n) { return Shape{static_cast<std::int64_t>(n)}; };
  ensure(conv1_scratch_, bytes(fused_conv_scratch_bytes(g1)), DType::kU8, Device::kGpu);
  ensure(conv2_scratch_, bytes(fused_conv_scratch_bytes(g2)), DType::kU8, Device::kGpu);
  const FusedHeadSizes gh{batch, h2 * w2 * g2.filters, dense_at(layers, 5).units(), dense_at(layers, 6).units()};
  ensure(head_scratch_, bytes(fused_head_scratch_bytes(gh, half)), DType::kU8, Device::kGpu);
}

void FusedStep::enqueue(GpuTrainer& t, Layers& layers, Optimizer& opt, std::int64_t nb, cudaStream_t s,
                        std::vector<const void*>& addrs) {
  const bool half = t.half;
  const std::int64_t h1 = pooled1_.dim(1), w1 = pooled1_.dim(2), h2 = pooled2_.dim(1), w2 = pooled2_.dim(2);
  const FusedConvSizes g1{nb, h_, w_, c_, pooled1_.dim(3)}, g2{nb, h1, w1, pooled1_.dim(3), pooled2_.dim(3)};
  const FusedHeadSizes gh{nb, h2 * w2 * g2.filters, dense_at(layers, 5).units(), dense_at(layers, 6).units()};
  const FusedBatch batch{t.fit_data->images.data<std::uint8_t>(), t.fit_data->labels.data<std::uint8_t>(),
                         t.perm.data<std::int32_t>(), t.cursor_ptr()};
  auto* win1 = static_cast<std::uint8_t*>(winners1_.raw());
  auto* win2 = static_cast<std::uint8_t*>(winners2_.raw());
  std::int32_t* labels = t.labels.data<std::int32_t>();

  // Forward: the two convolutions, each with its bias, ReLU and pooling.
  launch_fused_conv1_forward(g1, batch, weights(layers, 0, 0, half), weights(layers, 0, 1, half), pooled1_.raw(),
                             win1, labels, half, s);
  // Conv2's products on Tensor Cores (TF32 in FP32) unless the model asks for exact FP32
  // arithmetic (KernelOptions::fma_math_only, as the library rung's cuDNN math mode).
  const bool tensor_cores = !conv_at(layers, 2).kernel_options().fma_math_only;
  launch_fused_conv_forward(g2, pooled1_.raw(), weights(layers, 2, 0, half), weights(layers, 2, 1, half),
                            pooled2_.raw(), win2, half, tensor_cores, s);
  // The head, forward and backward; the loss statistics; dpool2 = the gradient at conv2's
  // pooled output (the flattened input of dense).
  launch_fused_head(gh, pooled2_.raw(), weights(layers, 5, 0, half), weights(layers, 5, 1, half),
                    weights(layers, 6, 0, half), weights(layers, 6, 1, half), labels, 1.0f / static_cast<float>(nb),
                    opt.device_loss_scale(), fused_head_scratch(head_scratch_.raw(), gh, half), dpool2_.raw(),
                    grad(layers, 5, 0), grad(layers, 5, 1), grad(layers, 6, 0), grad(layers, 6, 1),
                    t.stats.data<float>(), half, s);
  // Back through conv2 (its input gradient and its parameters' partial sums, one launch)
  // and conv1 (partial sums only), then both layers' sums in one launch, which also moves
  // the batch cursor on: conv1's partials were the step's last reader of it.
  auto* scratch2 = static_cast<float*>(conv2_scratch_.raw());
  auto* scratch1 = static_cast<float*>(conv1_scratch_.raw());
  launch_fused_conv_backward(g2, pooled1_.raw(), dpool2_.raw(), pooled2_.raw(), win2, weights(layers, 2, 0, half),
                             dpool1_.raw(), scratch2, half, s);
  launch_fused_conv1_wgrad_partials(g1, batch, dpool1_.raw(), pooled1_.raw(), win1, scratch1, half, s);
  const FusedWgradSum sums[] = {{g2, scratch2, grad(layers, 2, 0), grad(layers, 2, 1)},
                                {g1, scratch1, grad(layers, 0, 0), grad(layers, 0, 1)}};
  // The sums' launch also moves the optimizer's update count on where it can (FP32 Adam),
  // which spares Adam its one-thread finish launch.
  std::int32_t* count = opt.device_step_count();
  launch_fused_conv_wgrad_sums(sums, 2, t.cursor_ptr(), nb, count, half, s);
  for (const Tensor* b : {&pooled1_, &winners1_, &pooled2_, &winners2_, &dpool2_, &dpool1_}) addrs.push_back(b->raw());
  if (count) opt.step_after_count_moved();
  else opt.step();
}

}  // namespace mf
