// progress.h: Keras-style epoch lines, with a live bar and ETA when printing to a terminal:
//   Epoch 1/5
//   750/750 [==============================] - 9s 12ms/step - loss: 0.1523 - accuracy: 0.9541 - val_loss: ...
#pragma once
#include <cstdio>

#include "layers/sequential.h"

namespace mf::apps {

class ProgressPrinter {
 public:
  ProgressPrinter(std::FILE* out, bool live, int epochs) : out_(out), live_(live), epochs_(epochs) {}
  void update(const Progress& p);
  void epoch_end(const EpochLog& e);

 private:
  void header(int epoch);
  std::FILE* out_;
  bool live_;
  int epochs_;
  int header_for_ = -1;
  Progress last_{};
};

}  // namespace mf::apps
