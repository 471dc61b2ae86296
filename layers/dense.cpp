// dense.cpp: Dense construction and shapes, and its CPU path (Eigen GEMMs, threads over rows).
#include "layers/dense.h"

#include <algorithm>

#include "kernels/cpu/conv2d_cpu_kernels.h"
#include "kernels/cpu/eigen_util.h"
#include "kernels/cpu/naive.h"
#include "runtime/parallel.h"
#include "tensor/rng.h"

#if !MF_WITH_CUDA
namespace mf {
struct DenseGpuState {};
Dense::~Dense() = default;
std::string Dense::gpu_config() const { return ""; }
}  // namespace mf
#endif

namespace mf {

Dense::Dense(std::int64_t in_features, std::int64_t units, Activation act, Rng& rng)
    : in_(in_features), units_(units), act_(act) {
  if (in_features < 1 || units < 1) throw std::invalid_argument("Dense: sizes must be positive");
  weight_.name = "kernel";
  weight_.value = Tensor::empty({in_features, units});
  glorot_uniform(weight_.value, in_features, units, rng);
  weight_.grad = Tensor::zeros(weight_.value.shape());
  bias_.name = "bias";
  bias_.value = Tensor::zeros({units});
  bias_.grad = Tensor::zeros({units});
}

Shape Dense::output_shape(const Shape& in) const {
  check_input(in, {-1, in_});
  return Shape{in[0], units_};
}

namespace {
// Rows per thread below which a GEMM stays on one thread: a hand-off costs a few
// microseconds, about what 64k multiply-adds take. An empty batch has no work per row.
std::int64_t row_grain(std::int64_t work_per_row) {
  return std::max<std::int64_t>(1, 65536 / std::max<std::int64_t>(1, work_per_row));
}
}  // namespace

// The rungs: naive runs the loops of kernels/cpu/naive.h; library runs Eigen's GEMMs for
// every size. Tuned (the default): with units a multiple of the vector width the dense layer
// runs on the convolution's register-tiled kernels (conv2d_cpu_kernels.h): it is a 1x1
// convolution of a 1x1 "image" with `in` channels, and the (in, units) kernel is already the
// transposed layout those tiles read. Other sizes (the 10-way output layer) use Eigen.
void Dense::forward_cpu(const Tensor& x, Tensor& y) {
  const std::int64_t n = x.dim(0);
  const KernelRung r = rung();
  if (r == KernelRung::kNaive) {
    cpu_forward_ = "naive loops";
    cpu::dense_forward_naive(naive::Dense{n, in_, units_}, x.data<float>(), weight_.value.data<float>(),
                             bias_.value.data<float>(), act_ == Activation::kRelu, y.data<float>());
    return;
  }
  const bool tiled = r == KernelRung::kTuned && units_ % cpu::kLanes == 0;
  cpu_forward_ = tiled ? "register tiles" : "Eigen GEMM";
  if (tiled) {
    cpu::conv_forward(n, 1, 1, in_, 1, x.data<float>(), weight_.value.data<float>(), units_,
                      bias_.value.data<float>(), act_ == Activation::kRelu, y.data<float>());
    return;
  }
  const ConstMatView w = cmat(weight_.value.data<float>(), in_, units_);
  const ConstRowVecView b(bias_.value.data<float>(), units_);
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  const bool relu = act_ == Activation::kRelu;
  cpu_pool().parallel_for(n, [&](std::int64_t r0, std::int64_t r1, int) {
    MatView out = mat(yp + r0 * units_, r1 - r0, units_);
    out.noalias() = mat(xp + r0 * in_, r1 - r0, in_) * w;
    if (relu) out = (out.rowwise() + b).cwiseMax(0.0f);  // std::max(z, 0): NaN passes, as in cpu::relu
    else out.rowwise() += b;
  }, row_grain(in_ * units_));
}

void Dense::backward_cpu(const Tensor& dy, Tensor& dx) {
  const std::int64_t n = x_.dim(0);
  const KernelRung r = rung();
  if (r == KernelRung::kNaive) {
    cpu_backward_ = "naive loops";
    cpu::dense_backward_naive(naive::Dense{n, in_, units_}, x_.data<float>(), y_.data<float>(), dy.data<float>(),
                              weight_.value.data<float>(), act_ == Activation::kRelu, weight_.grad.data<float>(),
                              bias_.grad.data<float>(), dx.defined() ? dx.data<float>() : nullptr);
    return;
  }
  ensure(dz_, dy.shape(), DType::kF32, Device::kCpu);
  MatView dz = mat(dz_.data<float>(), n, units_);
  const ConstMatView dyv = cmat(dy.data<float>(), n, units_);
  if (act_ == Activation::kRelu)
    dz = (mat(y_.data<float>(), n, units_).array() > 0.0f).select(dyv, 0.0f);
  else
    dz = dyv;
  RowVecView(bias_.grad.data<float>(), units_) += dz.colwise().sum();
  const ConstMatView x = cmat(x_.data<float>(), n, in_);
  const ConstMatView w = cmat(weight_.value.data<float>(), in_, units_);
  float* dwp = weight_.grad.data<float>();
  float* dxp = dx.defined() ? dx.data<float>() : nullptr;
  const bool tiled = r == KernelRung::kTuned && units_ % cpu::kLanes == 0 && in_ % cpu::kLanes == 0;
  cpu_backward_ = tiled ? "register tiles" : "Eigen GEMM";
  if (tiled) return backward_tiled(dx);
  // Threads split dW by its rows (input features) and dx by its rows (samples): no two
  // threads write the same element, so no reduction is needed.
  cpu_pool().parallel_for(in_, [&](std::int64_t f0, std::int64_t f1, int) {
    mat(dwp + f0 * units_, f1 - f0, units_).noalias() += x.middleCols(f0, f1 - f0).transpose() * dz;
  }, row_grain(n * units_));
  if (dxp)
    cpu_pool().parallel_for(n, [&](std::int64_t r0, std::int64_t r1, int) {
      mat(dxp + r0 * in_, r1 - r0, in_).noalias() = dz.middleRows(r0, r1 - r0) * w.transpose();
    }, row_grain(in_ * units_));
}

namespace {

// dW (in, units) += sum over samples of x_i (x) dz_i, with the weight-gradient tiles of
// kVecs*16 units; threads take separate tiles of rows (input features) of dW, so nothing
// needs reducing. Samples go in chunks whose rows stay in cache while the tiles pass.
template <int kVecs>
void dense_wgrad(std::int64_t n, std::int64_t in, std::int64_t units, const float* x, const float* dz, float* dw) {
  constexpr int kRows = cpu::kTileRegs / kVecs;
  constexpr std::int64_t kChunk = 128;
  cpu_pool().parallel_for((in + kRows - 1) / kRows, [&](std::int64_t t0, std::int64_t t1, int) {
    const float* rows[kChunk];
    const float* grads[kChunk];
    for (std::int64_t c0 = 0; c0 < n; c0 += kChunk) {
      const std::int64_t np = std::min(kChunk, n - c0);
      for (std::int64_t i = 0; i < np; ++i) rows[i] = x + (c0 + i) * in, grads[i] = dz + (c0 + i) * units;
      for (std::int64_t t = t0; t < t1; ++t) {
        const std::int64_t j0 = t * kRows;
        const int r = static_cast<int>(std::min<std::int64_t>(kRows, in - j0));
        for (std::int64_t o0 = 0; o0 < units; o0 += kVecs * cpu::kLanes)
          cpu::with_rows<kVecs>(r, [&](auto rr) {
            cpu::wgrad_tile<decltype(rr)::value, kVecs>(rows, grads, np, j0, o0, dw + j0 * units, units);
          });
      }
    }
  });
}

}  // namespace

// dW += x^T dz on the tiles; dx = dz W^T with Eigen (W^T would need a transpose per step).
void Dense::backward_tiled(Tensor& dx) {
  const std::int64_t n = x_.dim(0);
  const float* dzp = dz_.data<float>();
  switch (cpu::vecs_for(units_)) {
    case 4: dense_wgrad<4>(n, in_, units_, x_.data<float>(), dzp, weight_.grad.data<float>()); break;
    case 2: dense_wgrad<2>(n, in_, units_, x_.data<float>(), dzp, weight_.grad.data<float>()); break;
    default: dense_wgrad<1>(n, in_, units_, x_.data<float>(), dzp, weight_.grad.data<float>()); break;
  }
  if (!dx.defined()) return;
  const ConstMatView dz = cmat(dzp, n, units_);
  const ConstMatView w = cmat(weight_.value.data<float>(), in_, units_);
  float* dxp = dx.data<float>();
  cpu_pool().parallel_for(n, [&](std::int64_t r0, std::int64_t r1, int) {
    mat(dxp + r0 * in_, r1 - r0, in_).noalias() = dz.middleRows(r0, r1 - r0) * w.transpose();
  }, row_grain(in_ * units_));
}


std::string Dense::cpu_config() const {
  if (!cpu_forward_) return "";
  return std::string("fwd ") + cpu_forward_ + (cpu_backward_ ? std::string("; bwd ") + cpu_backward_ : "");
}

}  // namespace mf
