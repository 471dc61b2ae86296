// plot.cpp: the canvas and the training-curve plot (see plot.h).
#include "apps/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "io/image.h"

#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wsign-compare"
#endif
#include <stb_easy_font.h>
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

namespace mf::apps {

namespace {

const std::string kArrow = "\xe2\x86\x92";  // U+2192, UTF-8
constexpr int kArrowWidth = 9;              // at scale 1, spacing included

// Splits text into runs of plain ASCII and arrows.
template <class Fn> void for_runs(const std::string& s, Fn fn) {
  std::size_t start = 0;
  while (start <= s.size()) {
    const std::size_t a = s.find(kArrow, start);
    fn(s.substr(start, a == std::string::npos ? std::string::npos : a - start), a != std::string::npos);
    if (a == std::string::npos) break;
    start = a + kArrow.size();
  }
}

int ascii_width(const std::string& s) {
  if (s.empty()) return 0;
  std::string buf = s;
  return stb_easy_font_width(&buf[0]);
}

}  // namespace

Canvas::Canvas(int width, int height, Rgb bg) : width_(width), height_(height) {
  if (width <= 0 || height <= 0) throw std::invalid_argument("Canvas: size must be positive");
  rgb_.resize(static_cast<std::size_t>(width) * height * 3);
  for (std::size_t i = 0; i < rgb_.size(); i += 3) rgb_[i] = bg.r, rgb_[i + 1] = bg.g, rgb_[i + 2] = bg.b;
}

void Canvas::blend(int x, int y, Rgb c, float alpha) {
  if (x < 0 || y < 0 || x >= width_ || y >= height_ || !(alpha > 0)) return;
  alpha = std::min(alpha, 1.0f);
  std::uint8_t* p = &rgb_[(static_cast<std::size_t>(y) * width_ + x) * 3];
  const std::uint8_t src[3] = {c.r, c.g, c.b};
  for (int k = 0; k < 3; ++k) p[k] = static_cast<std::uint8_t>(std::lround(p[k] + (src[k] - p[k]) * alpha));
}

void Canvas::fill_rect(int x0, int y0, int x1, int y1, Rgb c) {
  for (int y = std::max(0, y0); y < std::min(height_, y1); ++y)
    for (int x = std::max(0, x0); x < std::min(width_, x1); ++x) blend(x, y, c);
}

void Canvas::rect_outline(int x0, int y0, int x1, int y1, Rgb c) {
  fill_rect(x0, y0, x1, y0 + 1, c);
  fill_rect(x0, y1 - 1, x1, y1, c);
  fill_rect(x0, y0, x0 + 1, y1, c);
  fill_rect(x1 - 1, y0, x1, y1, c);
}

void Canvas::line(double x0, double y0, double x1, double y1, Rgb c, double width) {
  const double r = width / 2;
  const int bx0 = static_cast<int>(std::floor(std::min(x0, x1) - r - 1)), bx1 = static_cast<int>(std::ceil(std::max(x0, x1) + r + 1));
  const int by0 = static_cast<int>(std::floor(std::min(y0, y1) - r - 1)), by1 = static_cast<int>(std::ceil(std::max(y0, y1) + r + 1));
  const double dx = x1 - x0, dy = y1 - y0, len2 = dx * dx + dy * dy;
  for (int y = std::max(0, by0); y <= std::min(height_ - 1, by1); ++y)
    for (int x = std::max(0, bx0); x <= std::min(width_ - 1, bx1); ++x) {
      const double px = x + 0.5 - x0, py = y + 0.5 - y0;
      const double t = len2 > 0 ? std::clamp((px * dx + py * dy) / len2, 0.0, 1.0) : 0.0;
      const double ex = px - t * dx, ey = py - t * dy;
      const double d = std::sqrt(ex * ex + ey * ey);
      blend(x, y, c, static_cast<float>(std::clamp(r + 0.5 - d, 0.0, 1.0)));
    }
}

void Canvas::dot(double x, double y, double radius, Rgb c) { line(x, y, x, y, c, 2 * radius); }

void Canvas::text(int x, int y, const std::string& s, Rgb c, int scale) {
  // stb_easy_font emits quads (4 vertices of x, y, z floats + 4 colour bytes) in font pixels.
  static thread_local std::vector<char> quads(1 << 16);
  int pen = x;
  for_runs(s, [&](const std::string& run, bool arrow_after) {
    if (!run.empty()) {
      std::string buf = run;
      unsigned char col[4] = {c.r, c.g, c.b, 255};
      const int n = stb_easy_font_print(0, 0, &buf[0], col, quads.data(), static_cast<int>(quads.size()));
      for (int q = 0; q < n; ++q) {
        const float* v0 = reinterpret_cast<const float*>(quads.data() + q * 64);
        const float* v2 = reinterpret_cast<const float*>(quads.data() + q * 64 + 32);
        fill_rect(pen + static_cast<int>(v0[0]) * scale, y + static_cast<int>(v0[1]) * scale,
                  pen + static_cast<int>(v2[0]) * scale, y + static_cast<int>(v2[1]) * scale, c);
      }
      pen += ascii_width(run) * scale;
    }
    if (arrow_after) {  // a shaft at mid cap height and a two-stroke head
      const int mid = y + 3 * scale;
      fill_rect(pen + 1 * scale, mid, pen + 7 * scale, mid + scale, c);
      for (int k = 1; k <= 3; ++k) {
        fill_rect(pen + (7 - k) * scale, mid - k * scale, pen + (8 - k) * scale, mid - (k - 1) * scale, c);
        fill_rect(pen + (7 - k) * scale, mid + k * scale, pen + (8 - k) * scale, mid + (k + 1) * scale, c);
      }
      pen += kArrowWidth * scale;
    }
  });
}

int Canvas::text_width(const std::string& s, int scale) {
  int w = 0;
  for_runs(s, [&](const std::string& run, bool arrow_after) { w += ascii_width(run) + (arrow_after ? kArrowWidth : 0); });
  return w * scale;
}

int Canvas::text_height(int scale) { return 7 * scale; }

std::string Canvas::encode_png() const { return io::encode_png(width_, height_, 3, rgb_.data()); }

void Canvas::write_png(const std::string& path) const { io::write_png(path, width_, height_, 3, rgb_.data()); }

// ---- the training plot ----

namespace {

const Rgb kInk{30, 30, 30}, kAxis{90, 90, 90}, kGrid{228, 228, 228};
const Rgb kTrain{31, 119, 180}, kValidation{255, 127, 14};  // matplotlib's first two colours

// A step of 1, 2 or 5 times a power of ten giving about `target` intervals over `range`.
double nice_step(double range, int target) {
  const double raw = range / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double r = raw / mag;
  return (r <= 1 ? 1 : r <= 2 ? 2 : r <= 5 ? 5 : 10) * mag;
}

std::string tick_label(double v, double step) {
  char b[32];
  if (std::fabs(v) < step * 1e-6) v = 0;
  // Huge values (a diverged loss) in exponent form: "%f" would spell out 300 digits.
  if (std::fabs(v) >= 1e9) {
    std::snprintf(b, sizeof b, "%.3g", v);
    return b;
  }
  const int decimals = std::clamp(static_cast<int>(-std::floor(std::log10(step) + 1e-9)), 0, 12);
  std::snprintf(b, sizeof b, "%.*f", decimals, v);
  return b;
}

// A panel's y axis: [lo, hi] with a tick every `step`, starting at lo.
struct YAxis {
  double lo, hi, step;
};
constexpr int kMaxYTicks = 12;  // nice_step aims at 5 intervals; anything past this is wrong

// The y axis for values in [lo, hi] (lo > hi: no finite values), rounded out to whole
// steps; the loss axis starts at 0, the accuracy axis stays within [0, 1]. Whatever the
// numbers (near the largest double, all equal, none), the result has finite ends, lo < hi,
// a finite positive step and at most kMaxYTicks + 1 ticks; when the values allow no such
// axis it is [0, 1].
YAxis y_axis(double lo, double hi, bool is_accuracy) {
  const YAxis fallback{0, 1, 0.2};
  if (!(std::isfinite(lo) && std::isfinite(hi) && lo <= hi)) return fallback;
  if (!is_accuracy) lo = std::min(0.0, lo);
  // A flat curve: open the range around it, by 5 % of its height (0.05 at least).
  if (hi - lo < 1e-9 * std::max(1.0, std::fabs(hi))) {
    const double pad = std::max(0.05, 0.05 * std::fabs(hi));
    lo -= pad, hi += pad;
  }
  YAxis a{lo, hi, nice_step(hi - lo, 5)};
  // Round the ends out to whole steps, unless that overflows (hi near the largest double).
  const double rlo = std::floor(lo / a.step + 1e-9) * a.step, rhi = std::ceil(hi / a.step - 1e-9) * a.step;
  if (std::isfinite(rlo)) a.lo = rlo;
  if (std::isfinite(rhi)) a.hi = rhi;
  if (is_accuracy) {
    a.lo = std::max(0.0, a.lo), a.hi = std::min(1.0, a.hi);
    // Values far past 1 gave a step larger than what is left of the axis.
    if (a.hi > a.lo && a.step > a.hi - a.lo) a.step = nice_step(a.hi - a.lo, 5);
  }
  if (a.hi <= a.lo) a.hi = a.lo + a.step;
  // hi - lo past the largest double, a step of 0 or inf, or too many ticks: no usable axis.
  const bool usable = std::isfinite(a.lo) && std::isfinite(a.hi) && a.lo < a.hi && std::isfinite(a.step) &&
                      a.step > 0 && std::isfinite(a.hi - a.lo) && (a.hi - a.lo) / a.step <= kMaxYTicks;
  return usable ? a : fallback;
}

struct Curve {
  std::string label;
  std::vector<double> y;  // NaN: no point
  Rgb color;
};

bool any_finite(const std::vector<double>& v) {
  return std::any_of(v.begin(), v.end(), [](double x) { return std::isfinite(x); });
}

// One panel in the box [px, px + pw) x [py, py + ph).
void draw_panel(Canvas& cv, int px, int py, int pw, int ph, const std::string& title, const std::vector<double>& xs,
                const std::vector<Curve>& curves, bool is_accuracy) {
  const int left = px + 64, right = px + pw - 18, top = py + 34, bottom = py + ph - 46;
  cv.text(px + pw / 2 - Canvas::text_width(title, 2) / 2, py + 8, title, kInk, 2);

  // y range from the finite values; loss from 0, accuracy within [0, 1].
  double vmin = INFINITY, vmax = -INFINITY;
  for (const Curve& c : curves)
    for (double v : c.y)
      if (std::isfinite(v)) vmin = std::min(vmin, v), vmax = std::max(vmax, v);
  const YAxis axis = y_axis(vmin, vmax, is_accuracy);  // no finite values: [0, 1]
  const double lo = axis.lo, hi = axis.hi, ystep = axis.step;

  // x range: the epochs, padded so the end markers are not cut.
  const double xmin = xs.front(), xmax = xs.back();
  const double xpad = xmax > xmin ? 0.04 * (xmax - xmin) : 0.5;
  const double x_lo = xmin - xpad, x_hi = xmax + xpad;
  auto sx = [&](double x) { return left + (x - x_lo) / (x_hi - x_lo) * (right - left); };
  // A value off the axis (an accuracy outside [0, 1], or any value when y_axis fell back to
  // [0, 1]) is drawn just outside the panel, where the canvas clips it, not at a coordinate
  // too large for an int.
  auto sy = [&](double y) {
    return std::clamp(bottom - (y - lo) / (hi - lo) * (bottom - top), top - 2.0 * ph, bottom + 2.0 * ph);
  };

  // Grid and y ticks.
  for (int i = 0; i <= kMaxYTicks; ++i) {
    const double v = lo + i * ystep;
    if (v > hi + ystep * 1e-6) break;
    const int y = static_cast<int>(std::lround(sy(v)));
    cv.fill_rect(left, y, right, y + 1, kGrid);
    cv.fill_rect(left - 5, y, left, y + 1, kAxis);
    const std::string l = tick_label(v, ystep);
    cv.text(left - 8 - Canvas::text_width(l), y - 3, l, kInk);
  }
  // x ticks: whole epochs, about 10 at most.
  const double xstep = std::max(1.0, std::ceil(nice_step(std::max(1.0, xmax - xmin), 8)));
  int x_ticks = 0;
  for (double e = std::ceil(xmin / xstep) * xstep; e <= xmax + 1e-9 && x_ticks < 20; e += xstep, ++x_ticks) {
    const int x = static_cast<int>(std::lround(sx(e)));
    cv.fill_rect(x, bottom, x + 1, bottom + 5, kAxis);
    const std::string l = tick_label(e, 1);
    cv.text(x - Canvas::text_width(l) / 2, bottom + 9, l, kInk);
  }
  const std::string xl = "epoch";
  cv.text((left + right) / 2 - Canvas::text_width(xl) / 2, bottom + 26, xl, kInk);
  cv.rect_outline(left, top, right + 1, bottom + 1, kAxis);

  // Curves: lines between consecutive finite points, a dot on each point.
  for (const Curve& c : curves) {
    for (std::size_t i = 0; i + 1 < c.y.size(); ++i)
      if (std::isfinite(c.y[i]) && std::isfinite(c.y[i + 1]))
        cv.line(sx(xs[i]), sy(c.y[i]), sx(xs[i + 1]), sy(c.y[i + 1]), c.color, 2.0);
    for (std::size_t i = 0; i < c.y.size(); ++i)
      if (std::isfinite(c.y[i])) cv.dot(sx(xs[i]), sy(c.y[i]), 3.0, c.color);
  }

  // Legend in the corner the curves leave free: top right for loss (it falls), bottom
  // right for accuracy (it rises).
  int label_w = 0;
  for (const Curve& c : curves) label_w = std::max(label_w, Canvas::text_width(c.label));
  const int lw = 38 + label_w, lh = 8 + 14 * static_cast<int>(curves.size());
  const int lx = right - lw - 8, ly = is_accuracy ? bottom - lh - 8 : top + 8;
  cv.fill_rect(lx, ly, lx + lw, ly + lh, {255, 255, 255});
  cv.rect_outline(lx, ly, lx + lw, ly + lh, kGrid);
  for (std::size_t i = 0; i < curves.size(); ++i) {
    const int cy = ly + 11 + 14 * static_cast<int>(i);
    cv.line(lx + 6, cy, lx + 26, cy, curves[i].color, 2.0);
    cv.dot(lx + 16, cy, 3.0, curves[i].color);
    cv.text(lx + 32, cy - 3, curves[i].label, kInk);
  }
}

}  // namespace

Canvas render_training_plot(const std::vector<EpochLog>& history, const std::string& title) {
  if (history.empty()) throw std::invalid_argument("training plot: no epochs to plot");
  std::vector<double> xs;
  Curve loss{"train", {}, kTrain}, val_loss{"validation", {}, kValidation};
  Curve acc{"train", {}, kTrain}, val_acc{"validation", {}, kValidation};
  for (const EpochLog& e : history) {
    xs.push_back(e.epoch + 1);
    loss.y.push_back(e.loss);
    acc.y.push_back(e.accuracy);
    val_loss.y.push_back(e.val_loss);
    val_acc.y.push_back(e.val_accuracy);
  }
  std::vector<Curve> loss_curves{loss}, acc_curves{acc};
  if (any_finite(val_loss.y)) loss_curves.push_back(val_loss);
  if (any_finite(val_acc.y)) acc_curves.push_back(val_acc);

  const int w = 1000, panel_h = 420, title_h = title.empty() ? 0 : 30;
  Canvas cv(w, panel_h + title_h);
  if (!title.empty()) cv.text(w / 2 - Canvas::text_width(title, 2) / 2, 10, title, kInk, 2);
  draw_panel(cv, 0, title_h, w / 2, panel_h, "Loss", xs, loss_curves, false);
  draw_panel(cv, w / 2, title_h, w / 2, panel_h, "Accuracy", xs, acc_curves, true);
  return cv;
}

void write_training_plot(const std::string& path, const std::vector<EpochLog>& history, const std::string& title) {
  render_training_plot(history, title).write_png(path);
}

}  // namespace mf::apps
