// param_pack.h: all of a model's parameters in one flat buffer (and their gradients and
// f16 copies in two more), so that one kernel launch updates them all.
#pragma once
#include <vector>

#include "layers/layer.h"

namespace mf {

class ParamPack {
 public:
  // Copies each parameter's value into the flat buffer on the parameters' device and
  // re-points Parameter::value/grad/half at views of it. Each parameter starts on a
  // 256-byte boundary (what cuBLAS and cuDNN like); the gaps are zero and stay zero.
  explicit ParamPack(const std::vector<Parameter*>& params);

  Tensor& values() { return values_; }  // f32 (total)
  Tensor& grads() { return grads_; }    // f32, or f16 in mixed precision
  Tensor& halves() { return halves_; }  // f16 copies (mixed precision), else undefined
  std::int64_t total() const { return values_.numel(); }  // including alignment gaps
  Device device() const { return values_.device(); }
  bool mixed() const { return halves_.defined(); }

 private:
  Tensor values_, grads_, halves_;
};

}  // namespace mf
