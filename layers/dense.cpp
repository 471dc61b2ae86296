// dense.cpp: Dense construction and shapes, and its CPU path (Eigen GEMMs, threads over rows).
#include "layers/dense.h"

#include <algorithm>

#include "layers/eigen_util.h"
#include "tensor/parallel.h"
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
// microseconds, about what 64k multiply-adds take.
std::int64_t row_grain(std::int64_t work_per_row) { return std::max<std::int64_t>(1, 65536 / work_per_row); }
}  // namespace

void Dense::forward_cpu(const Tensor& x, Tensor& y) {
  const std::int64_t n = x.dim(0);
  const ConstMatView w = cmat(weight_.value.data<float>(), in_, units_);
  const ConstRowVecView b(bias_.value.data<float>(), units_);
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  const bool relu = act_ == Activation::kRelu;
  cpu_pool().parallel_for(n, [&](std::int64_t r0, std::int64_t r1, int) {
    MatView out = mat(yp + r0 * units_, r1 - r0, units_);
    out.noalias() = mat(xp + r0 * in_, r1 - r0, in_) * w;
    if (relu) out = (out.rowwise() + b).cwiseMax(0.0f);
    else out.rowwise() += b;
  }, row_grain(in_ * units_));
}

void Dense::backward_cpu(const Tensor& dy, Tensor& dx) {
  const std::int64_t n = x_.dim(0);
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

}  // namespace mf
