// conv2d_cpu.cpp: Conv2D on the CPU. Every path computes the same three products. With the
// kernel stored (K, k, k, C) as a K x kkC matrix W, and "col" the matrix whose row p holds
// output pixel p's kkC inputs (its receptive field):
//
//   forward          Y  (P x K)   = col (P x kkC) * W^T            P = output pixels
//   weight gradient  dW (K x kkC) += dZ^T (K x P) * col (P x kkC)  dZ = dY masked by ReLU
//   data gradient    dcol (P x kkC) = dZ (P x K) * W, scattered back (col2im)
//
// Which code computes them depends on the rung of the kernel ladder (kernel_options.h):
// - naive (kernels/cpu/naive.h): the six loops of the definition, threads over images;
// - library: im2col + Eigen GEMMs for every shape, as Caffe lowers a convolution;
// - tuned (the default), fastest first (kernels/cpu/conv2d.h):
// - implicit GEMM (K a multiple of the vector width; the model's second layer): register
//   tiles read the receptive fields straight from x, and the gradients skip dZ's zeros when
//   most of it is zero, as behind max-pooling;
// - direct (few inputs per output: the first layer, 1 channel x 3x3 = 9);
// - im2col + Eigen GEMMs (anything else).
// Weight and bias gradients are summed per thread, then reduced.
#include "kernels/kernel_options.h"
#include "kernels/cpu/conv2d.h"
#include "kernels/cpu/conv2d_cpu_kernels.h"
#include "kernels/cpu/naive.h"
#include "layers/conv2d.h"

namespace mf {

namespace {
cpu::ConvGeom geometry(const Tensor& x, std::int64_t k, std::int64_t filters) {
  return cpu::conv_geometry(x.dim(0), x.dim(1), x.dim(2), x.dim(3), k, filters);
}
}  // namespace

void Conv2D::forward_cpu(const Tensor& x, Tensor& y) {
  const cpu::ConvGeom g = geometry(x, k_, filters_);
  const float* w = weight_.value.data<float>();
  const float* b = bias_.value.data<float>();
  const bool relu = act_ == Activation::kRelu;
  const KernelRung r = rung();
  if (r == KernelRung::kNaive) {
    cpu_.forward = "naive loops";
    cpu::conv_forward_naive(naive_sizes(x), x.data<float>(), w, b, relu, y.data<float>());
  } else if (r == KernelRung::kLibrary) {
    cpu_.forward = "im2col + Eigen GEMM";
    cpu::conv_forward_im2col(cpu_, g, x.data<float>(), w, b, relu, y.data<float>());
  } else if (k_ * k_ * in_channels_ <= cpu::kMaxDirectInputs && filters_ <= 1024) {
    cpu_.forward = "direct";
    cpu::conv_forward_direct(cpu_, g, x.data<float>(), w, b, relu, y.data<float>());
  } else if (filters_ % cpu::kLanes == 0) {
    cpu_.forward = "implicit GEMM (register tiles)";
    cpu::conv_forward_implicit(cpu_, g, x.data<float>(), w, b, relu, y.data<float>());
  } else {
    cpu_.forward = "im2col + Eigen GEMM";
    cpu::conv_forward_im2col(cpu_, g, x.data<float>(), w, b, relu, y.data<float>());
  }
}

void Conv2D::backward_cpu(const Tensor& dy, Tensor& dx) {
  const cpu::ConvGeom g = geometry(x_, k_, filters_);
  const float* x = x_.data<float>();
  const float* y = y_.data<float>();
  const float* w = weight_.value.data<float>();
  float* dw = weight_.grad.data<float>();
  float* db = bias_.grad.data<float>();
  float* dxp = dx.defined() ? dx.data<float>() : nullptr;
  const bool relu = act_ == Activation::kRelu;
  const KernelRung r = rung();
  if (r == KernelRung::kNaive) {
    cpu_.backward = "naive loops";
    cpu::conv_backward_naive(naive_sizes(x_), x, y, dy.data<float>(), w, relu, dw, db, dxp);
  } else if (r == KernelRung::kLibrary) {
    cpu_.backward = "im2col + Eigen GEMM";
    cpu::conv_backward_im2col(cpu_, g, x, y, dy.data<float>(), w, relu, dw, db, dxp);
  } else if (!dxp && g.k == 3 && g.c == 1 && g.filters == 32) {
    cpu_.backward = "direct (weight gradient only: the first layer needs no dx)";
    cpu::conv_backward_direct_3x3x1(cpu_, g, x, y, dy.data<float>(), relu, dw, db);
  } else if (g.filters % cpu::kLanes == 0 && (!dxp || (g.k * g.c) % cpu::kLanes == 0)) {
    // kernels_.cpu_sparse_below: below this fraction of nonzero dZ entries the
    // gradients skip the zeros (--dense-grad sets 0: never).
    cpu::conv_backward_implicit(cpu_, g, x, y, dy.data<float>(), w, relu, kernels_.cpu_sparse_below, dw, db,
                                dxp);
  } else {
    cpu_.backward = "im2col + Eigen GEMM";
    cpu::conv_backward_im2col(cpu_, g, x, y, dy.data<float>(), w, relu, dw, db, dxp);
  }
}

std::string Conv2D::cpu_config() const { return cpu::describe(cpu_); }

}  // namespace mf
