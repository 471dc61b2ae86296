// progress.cpp: the Keras-style progress lines of progress.h.
#include "apps/progress.h"

#include <cmath>
#include <string>

namespace mf::apps {

namespace {
std::string bar(std::int64_t done, std::int64_t total) {
  constexpr int kWidth = 30;
  const int filled = total > 0 ? static_cast<int>(kWidth * done / total) : kWidth;
  std::string b(static_cast<std::size_t>(filled), '=');
  if (filled < kWidth) {
    if (!b.empty()) b.back() = '>';
    b.append(static_cast<std::size_t>(kWidth - filled), '.');
  }
  return "[" + b + "]";
}
std::string duration(double s) {
  char b[32];
  if (s >= 3600) std::snprintf(b, sizeof b, "%d:%02d:%02d", int(s / 3600), int(s / 60) % 60, int(s) % 60);
  else if (s >= 60) std::snprintf(b, sizeof b, "%d:%02d", int(s / 60), int(s) % 60);
  else std::snprintf(b, sizeof b, "%.0fs", s);
  return b;
}
std::string per_step(double seconds, std::int64_t steps) {
  char b[32];
  const double ms = steps > 0 ? 1000.0 * seconds / steps : 0.0;
  if (ms >= 1.0) std::snprintf(b, sizeof b, "%.0fms/step", ms);
  else std::snprintf(b, sizeof b, "%.0fus/step", ms * 1000.0);
  return b;
}
}  // namespace

void ProgressPrinter::header(int epoch) {
  if (header_for_ == epoch) return;
  header_for_ = epoch;
  std::fprintf(out_, "Epoch %d/%d\n", epoch + 1, epochs_);
  std::fflush(out_);
}

void ProgressPrinter::update(const Progress& p) {
  header(p.epoch);
  last_ = p;
  if (!live_) return;
  const double eta = p.step > 0 ? p.elapsed_s * static_cast<double>(p.steps - p.step) / static_cast<double>(p.step) : 0;
  std::fprintf(out_, "\r%lld/%lld %s - ETA: %s - loss: %.4f - accuracy: %.4f\033[K",
               static_cast<long long>(p.step), static_cast<long long>(p.steps), bar(p.step, p.steps).c_str(),
               duration(eta).c_str(), p.loss, p.accuracy);
  std::fflush(out_);
}

void ProgressPrinter::epoch_end(const EpochLog& e) {
  header(e.epoch);
  if (live_) std::fputc('\r', out_);
  std::fprintf(out_, "%lld/%lld %s - %s %s - loss: %.4f - accuracy: %.4f", static_cast<long long>(e.steps),
               static_cast<long long>(e.steps), bar(1, 1).c_str(), duration(e.train_seconds).c_str(),
               per_step(e.train_seconds, e.steps).c_str(), e.loss, e.accuracy);
  if (std::isfinite(e.val_loss)) std::fprintf(out_, " - val_loss: %.4f - val_accuracy: %.4f", e.val_loss, e.val_accuracy);
  if (e.skipped_steps > 0 || e.loss_scale != 1.0)
    std::fprintf(out_, " - loss_scale: %g - skipped: %lld", e.loss_scale, static_cast<long long>(e.skipped_steps));
  std::fprintf(out_, "%s\n", live_ ? "\033[K" : "");
  if (e.train_seconds > 0)
    std::fprintf(out_, "  (training %.3f s, %.0f images/s)\n", e.train_seconds,
                 static_cast<double>(e.samples) / e.train_seconds);
  std::fflush(out_);
}

}  // namespace mf::apps
