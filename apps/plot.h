// plot.h: a small RGB canvas (antialiased lines, rectangles, stb_easy_font text) and the
// training-curve plot of train_mnist --plot: loss and accuracy per epoch, train and
// validation, as one PNG.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "train/sequential.h"

namespace mf::apps {

struct Rgb {
  std::uint8_t r = 0, g = 0, b = 0;
};

class Canvas {
 public:
  Canvas(int width, int height, Rgb background = {255, 255, 255});
  int width() const { return width_; }
  int height() const { return height_; }
  const std::vector<std::uint8_t>& pixels() const { return rgb_; }  // RGB, row-major

  // Blends `c` into pixel (x, y) with coverage `alpha` in [0, 1]; outside the canvas: ignored.
  void blend(int x, int y, Rgb c, float alpha = 1.0f);
  void fill_rect(int x0, int y0, int x1, int y1, Rgb c);  // [x0, x1) x [y0, y1)
  void rect_outline(int x0, int y0, int x1, int y1, Rgb c);  // 1 px border of [x0, x1) x [y0, y1)
  // A segment `width` px wide with antialiased edges: each pixel is covered by how far its
  // centre lies inside the stroke (distance to the segment vs width / 2, a 1 px ramp).
  void line(double x0, double y0, double x1, double y1, Rgb c, double width = 1.0);
  void dot(double x, double y, double radius, Rgb c);
  // Text with stb_easy_font (ASCII 32..126; the UTF-8 arrow "→" is drawn as a glyph of its
  // own), top-left at (x, y), every font pixel drawn as scale x scale pixels.
  void text(int x, int y, const std::string& s, Rgb c, int scale = 1);
  static int text_width(const std::string& s, int scale = 1);
  static int text_height(int scale = 1);  // of one line of capitals and digits
  // Writes a PNG atomically. Throws std::runtime_error "<path>: ...".
  void write_png(const std::string& path) const;
  std::string encode_png() const;

 private:
  int width_, height_;
  std::vector<std::uint8_t> rgb_;
};

// Two panels side by side, loss (left) and accuracy (right) against the epoch (1-based),
// training and validation curves, tick labels, legends. Epochs whose validation values are
// NaN (no validation set) leave the validation curve out. Writes the PNG atomically;
// throws std::invalid_argument for an empty history.
Canvas render_training_plot(const std::vector<EpochLog>& history, const std::string& title = "");
void write_training_plot(const std::string& path, const std::vector<EpochLog>& history,
                         const std::string& title = "");

}  // namespace mf::apps
