// errors.cpp: formatting for the error types of errors.h and cuda_check.h.
#include "runtime/errors.h"

#include <cstdio>
#include <string>

namespace mf {

std::string format_bytes(std::size_t bytes) {
  char buf[64];
  const double b = static_cast<double>(bytes);
  if (bytes < 1024) std::snprintf(buf, sizeof buf, "%zu B", bytes);
  else if (b < 1024.0 * 1024) std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024);
  else if (b < 1024.0 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1024 * 1024));
  else std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  return buf;
}

namespace detail {

[[noreturn]] void throw_gpu_error(const char* msg, const char* expr, const char* file, int line) {
  const std::string where = std::string(file) + ":" + std::to_string(line);
  throw GpuError(std::string(msg) + " in `" + expr + "` at " + where, expr, where);
}

void warn_gpu_error(const char* msg, const char* expr, const char* file, int line) {
  std::fprintf(stderr, "warning: %s in `%s` at %s:%d\n", msg, expr, file, line);
}

}  // namespace detail
std::string one_line(const std::string& s) {
  std::string r = s;
  for (char& c : r)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';  // \n, \r, \t, \v, \f, ESC, ...
  return r;
}

}  // namespace mf
