// launchers_stub.cpp: the launchers of launchers.h in a CPU-only build: each one says that
// this build has no GPU. (Nothing calls them unless a tensor is on the GPU, which a
// CPU-only build cannot make, so these are a safety net, not a code path.)
#include "runtime/errors.h"
#include "kernels/gpu/fused.h"
#include "kernels/gpu/launchers.h"

namespace mf {

namespace {
[[noreturn]] void no_gpu(const char* what) {
  throw NoGpuError(std::string(what) + ": microflow was built without CUDA (CPU-only build)");
}
}  // namespace

void launch_bias_act_forward(void*, const void*, bool, std::int64_t, std::int64_t, bool, GpuStream) {
  no_gpu("bias_act_forward");
}
void launch_bias_act_backward(const void*, const void*, void*, void*, void*, bool, std::int64_t, std::int64_t,
                              bool, GpuStream) {
  no_gpu("bias_act_backward");
}
void launch_conv_forward_naive(const naive::Conv&, const void*, const void*, const void*, bool, void*, bool,
                               GpuStream) {
  no_gpu("conv_forward_naive");
}
void launch_conv_backward_naive(const naive::Conv&, const void*, const void*, const void*, const void*, bool, void*,
                                void*, void*, bool, GpuStream) {
  no_gpu("conv_backward_naive");
}
void launch_dense_forward_naive(const naive::Dense&, const void*, const void*, const void*, bool, void*, bool,
                                GpuStream) {
  no_gpu("dense_forward_naive");
}
void launch_dense_backward_naive(const naive::Dense&, const void*, const void*, const void*, const void*, bool,
                                 void*, void*, void*, bool, GpuStream) {
  no_gpu("dense_backward_naive");
}
void launch_maxpool2x2_forward(const void*, void*, std::uint8_t*, bool, std::int64_t, std::int64_t, std::int64_t,
                               std::int64_t, GpuStream) {
  no_gpu("maxpool2x2_forward");
}
void launch_maxpool2x2_backward(const void*, const std::uint8_t*, void*, bool, std::int64_t, std::int64_t,
                                std::int64_t, std::int64_t, GpuStream) {
  no_gpu("maxpool2x2_backward");
}
void launch_softmax_xent(const void*, bool, const std::int32_t*, std::int64_t, std::int64_t, void*, float,
                         const float*, float*, void*, GpuStream) {
  no_gpu("softmax_xent");
}
std::size_t reduction_scratch_bytes() { no_gpu("reduction_scratch_bytes"); }
std::size_t bias_act_backward_scratch_bytes() { no_gpu("bias_act_backward_scratch_bytes"); }
std::size_t softmax_xent_scratch_bytes() { no_gpu("softmax_xent_scratch_bytes"); }
void launch_gather_batch(const std::uint8_t*, const std::uint8_t*, const std::int32_t*, const std::int64_t*,
                         std::int64_t, std::int64_t, void*, bool, std::int32_t*, GpuStream) {
  no_gpu("gather_batch");
}
void launch_advance_cursor(std::int64_t*, std::int64_t, GpuStream) { no_gpu("advance_cursor"); }
void launch_normalize_batch(const std::uint8_t*, const std::uint8_t*, std::int64_t, std::int64_t, void*, bool,
                            std::int32_t*, GpuStream) {
  no_gpu("normalize_batch");
}
void launch_adam_step(float*, float*, float*, float*, std::int64_t, float, float, float, float, const std::int32_t*,
                      GpuStream, bool) {
  no_gpu("adam_step");
}
void launch_sgd_step(float*, float*, float*, std::int64_t, float, float, GpuStream) { no_gpu("sgd_step"); }
void launch_finish_step(std::int32_t*, GpuStream) { no_gpu("finish_step"); }
void launch_unscale_check(const Half*, std::int64_t, LossScaleState*, GpuStream) { no_gpu("unscale_check"); }
void launch_adam_step_mixed(float*, Half*, Half*, float*, float*, std::int64_t, float, float, float, float,
                            const std::int32_t*, const LossScaleState*, GpuStream) {
  no_gpu("adam_step_mixed");
}
void launch_finish_step_mixed(std::int32_t*, LossScaleState*, std::int32_t, float, float, GpuStream) {
  no_gpu("finish_step_mixed");
}

void launch_count_mismatch(const std::uint32_t*, const std::uint32_t*, std::int64_t, unsigned long long*,
                           GpuStream) {
  no_gpu("count_mismatch");
}

std::size_t fused_head_scratch_bytes(const FusedHeadSizes&, bool) { no_gpu("fused_head_scratch_bytes"); }
FusedHeadScratch fused_head_scratch(void*, const FusedHeadSizes&, bool) { no_gpu("fused_head_scratch"); }
std::size_t fused_conv_scratch_bytes(const FusedConvSizes&) { no_gpu("fused_conv_scratch_bytes"); }
void launch_fused_conv1_forward(const FusedConvSizes&, const FusedBatch&, const void*, const void*, void*,
                                std::uint8_t*, std::int32_t*, bool, GpuStream) {
  no_gpu("fused_conv1_forward");
}
void launch_fused_conv1_wgrad_partials(const FusedConvSizes&, const FusedBatch&, const void*, const void*,
                                       const std::uint8_t*, float*, bool, GpuStream) {
  no_gpu("fused_conv1_wgrad_partials");
}
bool fused_conv_takes_tensor_cores(const FusedConvSizes&, const void*, bool) {
  no_gpu("fused_conv_takes_tensor_cores");
}
void launch_fused_conv_forward(const FusedConvSizes&, const void*, const void*, const void*, void*, std::uint8_t*,
                               bool, bool, GpuStream) {
  no_gpu("fused_conv_forward");
}
void launch_fused_conv_wgrad_partials(const FusedConvSizes&, const void*, const void*, const void*, const std::uint8_t*,
                                      float*, bool, GpuStream) {
  no_gpu("fused_conv_wgrad_partials");
}
void launch_fused_conv_wgrad_sums(const FusedWgradSum*, int, std::int64_t*, std::int64_t, std::int32_t*, bool,
                                  GpuStream) {
  no_gpu("fused_conv_wgrad_sums");
}
void launch_fused_conv_dgrad(const FusedConvSizes&, const void*, const void*, const std::uint8_t*, const void*, void*,
                             bool, GpuStream) {
  no_gpu("fused_conv_dgrad");
}
void launch_fused_conv_backward(const FusedConvSizes&, const void*, const void*, const void*, const std::uint8_t*,
                                const void*, void*, float*, bool, GpuStream) {
  no_gpu("fused_conv_backward");
}
void launch_fused_head(const FusedHeadSizes&, const void*, const void*, const void*, const void*, const void*,
                       const std::int32_t*, float, const float*, const FusedHeadScratch&, void*, void*, void*, void*,
                       void*, float*, bool, GpuStream) {
  no_gpu("fused_head");
}

}  // namespace mf
