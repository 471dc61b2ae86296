// cpu_steps.h: the CPU's training steps for the epoch loop (train/fit.h): gather the batch
// on the host, forward, loss, backward, optimizer update, each step done when it returns.
#pragma once
#include <cstdint>
#include <memory>

#include "data/mnist.h"
#include "optim/optimizer.h"
#include "train/fit.h"

namespace mf {

class Network;

// Steps of up to `batch` images of `train` through `model`, updated by `optimizer`.
std::unique_ptr<StepRunner> make_cpu_steps(Network& model, Optimizer& optimizer, const data::Dataset& train,
                                           std::int64_t batch);

}  // namespace mf
