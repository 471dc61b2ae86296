// progress.h: Keras-style epoch lines, with a live bar and ETA when printing to a terminal:
//   Epoch 1/5
//   750/750 [==============================] - 9s 12ms/step - loss: 0.1523 - accuracy: 0.9541 - val_loss: ...
#pragma once
#include <cstddef>
#include <cstdio>

#include "train/sequential.h"

namespace mf::apps {

// The width of the terminal `out` writes to: its window's, else $COLUMNS, else 80.
int terminal_columns(std::FILE* out);

class ProgressPrinter {
 public:
  ProgressPrinter(std::FILE* out, bool live, int epochs) : out_(out), live_(live), epochs_(epochs) {}
  void update(const Progress& p);
  void epoch_end(const EpochLog& e);

 private:
  void header(int epoch);
  // Ends a live line of `length` characters: blanks the rest of a longer earlier one, up to
  // `columns`.
  void end_live_line(std::size_t length, std::size_t columns);
  std::FILE* out_;
  bool live_;
  int epochs_;
  int header_for_ = -1;
  Progress last_{};
  std::size_t last_live_length_ = 0;  // characters of the live line on screen now
};

}  // namespace mf::apps
