// progress.cpp: the Keras-style progress lines of progress.h.
#include "apps/progress.h"

#include <sys/ioctl.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdlib>
#include <string>

namespace mf::apps {

namespace {
// printf into a std::string of whatever length the text needs.
__attribute__((format(printf, 1, 2))) std::string printed(const char* format, ...) {
  std::va_list args, again;
  va_start(args, format);
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, format, args);
  va_end(args);
  std::string out(n > 0 ? static_cast<std::size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, format, again);
  va_end(again);
  return out;
}

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

int terminal_columns(std::FILE* out) {
  struct winsize ws {};
  if (::ioctl(fileno(out), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  if (const char* c = std::getenv("COLUMNS"); c && *c) {
    char* end = nullptr;
    const long v = std::strtol(c, &end, 10);
    if (*end == '\0' && v > 0 && v <= 100000) return static_cast<int>(v);
  }
  return 80;
}

void ProgressPrinter::end_live_line(std::size_t length, std::size_t columns) {
  // Spaces over what is left of a longer earlier line: an erase-line escape would need a
  // terminal that knows it (TERM=dumb shows it as "^[[K").
  const std::size_t wipe = std::min(last_live_length_, columns);
  if (length < wipe) std::fprintf(out_, "%*s", static_cast<int>(wipe - length), "");
  last_live_length_ = length;
}

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
  const std::string full = printed("%lld/%lld %s - ETA: %s - loss: %.4f - accuracy: %.4f",
                                   static_cast<long long>(p.step), static_cast<long long>(p.steps),
                                   bar(p.step, p.steps).c_str(), duration(eta).c_str(), p.loss, p.accuracy);
  // A line wider than the terminal wraps, and '\r' then returns to its last row only: every
  // update would leave a row behind (the full line is 84 characters, wider than the usual
  // 80). So it is cut to the width, less one column for terminals that wrap at the last.
  const std::size_t columns = static_cast<std::size_t>(std::max(1, terminal_columns(out_)) - 1);
  const std::string line = full.substr(0, columns);
  std::fprintf(out_, "\r%s", line.c_str());
  end_live_line(line.size(), columns);
  std::fflush(out_);
}

void ProgressPrinter::epoch_end(const EpochLog& e) {
  header(e.epoch);
  std::string line = printed("%lld/%lld %s - %s %s - loss: %.4f - accuracy: %.4f", static_cast<long long>(e.steps),
                              static_cast<long long>(e.steps), bar(1, 1).c_str(), duration(e.train_seconds).c_str(),
                              per_step(e.train_seconds, e.steps).c_str(), e.loss, e.accuracy);
  if (std::isfinite(e.val_loss))
    line += printed(" - val_loss: %.4f - val_accuracy: %.4f", e.val_loss, e.val_accuracy);
  if (e.skipped_steps > 0 || e.loss_scale != 1.0)
    line += printed(" - loss_scale: %g - skipped: %lld", e.loss_scale, static_cast<long long>(e.skipped_steps));
  if (live_) {  // over the live line; printed whole, as it stays
    std::fprintf(out_, "\r%s", line.c_str());
    end_live_line(line.size(), static_cast<std::size_t>(std::max(1, terminal_columns(out_)) - 1));
    last_live_length_ = 0;
  } else {
    std::fputs(line.c_str(), out_);
  }
  std::fputc('\n', out_);
  if (e.train_seconds > 0)
    std::fprintf(out_, "  (training %.3f s, %.0f images/s)\n", e.train_seconds,
                 static_cast<double>(e.samples) / e.train_seconds);
  std::fflush(out_);
}

}  // namespace mf::apps
