// param_pack.cpp: packing parameters into flat buffers.
#include "optim/param_pack.h"

#include <stdexcept>

namespace mf {

namespace {
constexpr std::int64_t kAlignElems = 64;  // 256 bytes of f32, 128 bytes of f16
std::int64_t align_up(std::int64_t n) { return (n + kAlignElems - 1) / kAlignElems * kAlignElems; }
}  // namespace

ParamPack::ParamPack(const std::vector<Parameter*>& params) {
  if (params.empty()) throw std::invalid_argument("optimizer: the model has no parameters");
  const Device dev = params[0]->value.device();
  const bool mixed = params[0]->half.defined();
  const DType grad_type = params[0]->grad.dtype();
  std::int64_t total = 0;
  for (Parameter* p : params) {
    if (p->value.device() != dev || p->half.defined() != mixed || p->grad.dtype() != grad_type)
      throw std::invalid_argument("optimizer: parameters on different devices or precisions");
    total += align_up(p->value.numel());
  }
  values_ = Tensor::zeros(Shape{total}, DType::kF32, dev);
  grads_ = Tensor::zeros(Shape{total}, grad_type, dev);
  if (mixed) halves_ = Tensor::zeros(Shape{total}, DType::kF16, dev);
  std::int64_t off = 0;
  for (Parameter* p : params) {
    const std::int64_t n = p->value.numel();
    const Shape shape = p->value.shape();
    Tensor v = values_.slice(off, off + n).reshape(shape);
    v.copy_from(p->value);
    p->value = v;
    Tensor g = grads_.slice(off, off + n).reshape(shape);
    g.copy_from(p->grad);
    p->grad = g;
    if (mixed) {
      // Made from the master (as the optimizer's steps remake it), not copied from the old
      // half: a value loaded with copy_from() since set_compute_dtype() is in the master only.
      Tensor h = halves_.slice(off, off + n).reshape(shape);
      h.copy_from(v.to(DType::kF16));
      p->half = h;
    }
    off += align_up(n);
  }
}

}  // namespace mf
