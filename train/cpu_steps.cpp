// cpu_steps.cpp: one training step on the CPU is four calls: the batch gathered from the
// dataset, the model's forward, the loss with its gradient, backward, and the optimizer.
#include "train/cpu_steps.h"

#include <cmath>
#include <string>

#include "data/batching.h"
#include "layers/network.h"
#include "layers/softmax_xent.h"

namespace mf {

namespace {

class CpuSteps : public StepRunner {
 public:
  CpuSteps(Network& model, Optimizer& optimizer, const data::Dataset& train, std::int64_t batch)
      : model_(model),
        optimizer_(optimizer),
        train_(train),
        x_(Tensor::empty(model.batch_shape(batch))),
        y_(Tensor::empty(Shape{batch}, DType::kI32)),
        stats_(Tensor::zeros(Shape{kNumStats})) {}

  void begin_epoch(int, const std::vector<std::int32_t>& perm) override {
    perm_ = &perm;
    stats_.fill_zero();
  }

  void step(int epoch, std::int64_t step, std::int64_t b0, std::int64_t nb) override {
    Tensor xb = x_.slice(0, nb), yb = y_.slice(0, nb);
    data::gather_batch(train_, perm_->data() + b0, nb, xb.data<float>(), yb.data<std::int32_t>());
    const Tensor& logits = model_.forward(xb);
    const float before = stats_.data<float>()[kStatLossSum];
    softmax_xent(logits, yb, stats_, &dlogits_);
    const float after = stats_.data<float>()[kStatLossSum];
    if (!std::isfinite(after - before))
      throw NonFiniteLossError("the training loss became " + std::string(std::isnan(after) ? "NaN" : "infinite") +
                               " at epoch " + std::to_string(epoch + 1) + ", step " + std::to_string(step + 1) +
                               ": lower the learning rate (--lr)");
    model_.backward(dlogits_);
    optimizer_.step();
  }

  StepStats progress(int, std::int64_t) override {
    const float* s = stats_.data<float>();
    return {s[kStatLossSum], s[kStatCorrect], s[kStatCount]};
  }

  void end_epoch(int epoch, std::int64_t steps_done, bool, EpochLog& log) override {
    const StepStats st = progress(epoch, steps_done);
    log.samples = static_cast<std::int64_t>(st.count);
    log.loss = st.loss_sum / st.count;
    log.accuracy = st.correct / st.count;
    log.loss_scale = 1.0;
  }

 private:
  Network& model_;
  Optimizer& optimizer_;
  const data::Dataset& train_;
  const std::vector<std::int32_t>* perm_ = nullptr;
  Tensor x_, y_, stats_, dlogits_;  // the batch buffers, [loss sum, correct, count], d loss / d logits
};

}  // namespace

std::unique_ptr<StepRunner> make_cpu_steps(Network& model, Optimizer& optimizer, const data::Dataset& train,
                                           std::int64_t batch) {
  return std::make_unique<CpuSteps>(model, optimizer, train, batch);
}

}  // namespace mf
