// fuzz_model.h: the small model whose checkpoints seed and drive fuzz_checkpoint (the
// article's model would make every input 1.4 MB; the format is the same).
#pragma once
#include <memory>

#include "layers/dense.h"
#include "layers/flatten.h"
#include "train/sequential.h"
#include "optim/adam.h"
#include "tensor/rng.h"

namespace mf::fuzz {

// (4, 4, 1) -> Flatten -> Dense(16, 3), trained with Adam.
inline Sequential small_model(std::uint64_t seed) {
  Rng rng(seed);
  Sequential m;
  m.set_input_shape(Shape{4, 4, 1});
  m.add(std::make_unique<Flatten>()).set_name("flatten");
  m.add(std::make_unique<Dense>(16, 3, Activation::kNone, rng)).set_name("dense");
  m.compile(std::make_unique<Adam>());
  return m;
}

}  // namespace mf::fuzz
