// softmax_xent.cpp: the fused loss on the CPU, and dispatch to the GPU kernel.
#include "layers/softmax_xent.h"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "kernels/gpu/launchers.h"
#if MF_WITH_CUDA
#include "runtime/gpu_context.h"
#endif

namespace mf {

namespace {
void check_args(const Tensor& logits, const Tensor& labels, const Tensor& stats) {
  if (logits.rank() != 2 || labels.rank() != 1 || labels.dim(0) != logits.dim(0))
    throw std::invalid_argument("softmax_xent: logits " + logits.describe() + " and labels " + labels.describe() +
                                " do not match");
  // The GPU kernel reads the logits as f32 or f16 whatever they hold: u8 or i32 logits were
  // read past their end, into a loss of garbage.
  if (logits.dtype() != DType::kF32 && !(logits.dtype() == DType::kF16 && logits.is_gpu()))
    throw std::invalid_argument("softmax_xent: logits must be f32 (or f16 on the GPU), got " + logits.describe());
  if (labels.dtype() != DType::kI32) throw std::invalid_argument("softmax_xent: labels must be i32");
  if (stats.dtype() != DType::kF32 || stats.numel() != kNumStats || stats.device() != logits.device() ||
      labels.device() != logits.device())
    throw std::invalid_argument("softmax_xent: stats/labels must be on the logits' device; stats (3) f32");
}

// The gradient may not be written over the logits, labels or statistics it is computed from.
// The GPU kernel's lanes write a row's gradients while lane 0 still reads its label's logit
// (and its pointers are __restrict__), so that would be a race there; the CPU would get it
// right for dlogits == logits, but refusing it on both keeps code that runs on the CPU
// correct on the GPU.
void check_gradient_buffer(const Tensor& dlogits, const Tensor& logits, const Tensor& labels, const Tensor& stats) {
  const char* what = dlogits.overlaps(logits)   ? "logits"
                     : dlogits.overlaps(labels) ? "labels"
                     : dlogits.overlaps(stats)  ? "stats"
                                                : nullptr;
  if (what)
    throw std::invalid_argument(std::string("softmax_xent: the gradient ") + dlogits.describe() + " overlaps the " +
                                what + " it is computed from; give it a buffer of its own");
}
// The compute stream's reduction scratch (a CPU-only build has no GPU tensor to get here).
void* reduction_scratch() {
#if MF_WITH_CUDA
  return GpuContext::current().reduction_scratch(reduction_scratch_bytes());
#else
  return nullptr;
#endif
}
}  // namespace

void softmax_xent(const Tensor& logits, const Tensor& labels, Tensor& stats, Tensor* dlogits, float grad_scale,
                  const float* scale) {
  check_args(logits, labels, stats);
  const std::int64_t n = logits.dim(0), k = logits.dim(1);
  if (dlogits) {
    ensure(*dlogits, logits.shape(), logits.dtype(), logits.device());
    check_gradient_buffer(*dlogits, logits, labels, stats);
  }
  if (logits.is_gpu()) {
    launch_softmax_xent(logits.raw(), logits.dtype() == DType::kF16, labels.data<std::int32_t>(), n, k,
                        dlogits ? dlogits->raw() : nullptr, grad_scale / static_cast<float>(n), scale,
                        stats.data<float>(), reduction_scratch(), compute_stream());
    return;
  }
  const float* z = logits.data<float>();
  const std::int32_t* y = labels.data<std::int32_t>();
  float* dz = dlogits ? dlogits->data<float>() : nullptr;
  const float g = grad_scale / static_cast<float>(n);
  double loss = 0.0;
  std::int64_t correct = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const float* row = z + i * k;
    const std::int32_t label = y[i];
    if (label < 0 || label >= k)
      throw std::invalid_argument("softmax_xent: label " + std::to_string(label) + " out of range [0, " +
                                  std::to_string(k) + ")");
    // The prediction: the first index of the largest logit that is not NaN (class 0 when
    // there is none), the GPU kernel's rule. log-sum-exp around that max keeps exp() from
    // overflowing; a NaN in the row makes the loss NaN either way.
    std::int64_t arg = 0;
    float m = -std::numeric_limits<float>::infinity();
    for (std::int64_t j = 0; j < k; ++j)
      if (row[j] > m) m = row[j], arg = j;
    double sum = 0.0;
    for (std::int64_t j = 0; j < k; ++j) sum += std::exp(static_cast<double>(row[j] - m));
    const double log_sum = std::log(sum);
    loss += log_sum - static_cast<double>(row[label] - m);
    correct += arg == label;
    if (dz) {
      for (std::int64_t j = 0; j < k; ++j) {
        const double p = std::exp(static_cast<double>(row[j] - m) - log_sum);
        dz[i * k + j] = static_cast<float>(p - (j == label ? 1.0 : 0.0)) * g;
      }
    }
  }
  float* s = stats.data<float>();
  s[kStatLossSum] += static_cast<float>(loss);
  s[kStatCorrect] += static_cast<float>(correct);
  s[kStatCount] += static_cast<float>(n);
}

Tensor softmax(const Tensor& logits) {
  // (N, K) only: the loops below fill N * K values, so any other rank would leave entries
  // unwritten (rank 3) or read dimensions that are not there (rank 0 or 1).
  if (logits.rank() != 2 || (logits.dtype() != DType::kF32 && logits.dtype() != DType::kF16))
    throw std::invalid_argument("softmax: expected f32 or f16 logits of shape (N, classes), got " + logits.describe());
  const Tensor z = logits.is_cpu() && logits.dtype() == DType::kF32 ? logits : logits.to(Device::kCpu).to(DType::kF32);
  const std::int64_t n = z.dim(0), k = z.dim(1);
  Tensor p = Tensor::empty(z.shape());
  const float* zp = z.data<float>();
  float* pp = p.data<float>();
  for (std::int64_t i = 0; i < n && k > 0; ++i) {  // no classes: an empty (N, 0) result
    float m = zp[i * k];
    for (std::int64_t j = 1; j < k; ++j) m = std::max(m, zp[i * k + j]);
    double sum = 0.0;
    for (std::int64_t j = 0; j < k; ++j) sum += std::exp(static_cast<double>(zp[i * k + j] - m));
    for (std::int64_t j = 0; j < k; ++j)
      pp[i * k + j] = static_cast<float>(std::exp(static_cast<double>(zp[i * k + j] - m)) / sum);
  }
  return p;
}

}  // namespace mf
