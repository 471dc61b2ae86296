// errors.h: the exceptions the GPU side throws. Host-only header (no CUDA includes), so
// CPU-only code and tests can catch them.
#pragma once
#include <cstddef>
#include <stdexcept>
#include <string>

namespace mf {

// A CUDA, cuBLAS or cuDNN call failed. what(): "<library message> in `<call>` at file:line".
class GpuError : public std::runtime_error {
 public:
  GpuError(const std::string& message, std::string statement, std::string where)
      : std::runtime_error(message), statement_(std::move(statement)), where_(std::move(where)) {}
  const std::string& statement() const { return statement_; }
  const std::string& where() const { return where_; }

 private:
  std::string statement_, where_;
};

// Asking for the GPU where there is none (no device, no driver, or a CPU-only build).
class NoGpuError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Device memory could not be had: the limit set with --gpu-memory-limit would be passed,
// or cudaMalloc itself failed. The article's ResourceExhaustedError, with numbers.
class OutOfMemoryError : public std::runtime_error {
 public:
  OutOfMemoryError(const std::string& message, std::size_t requested, std::size_t in_use,
                   std::size_t limit)
      : std::runtime_error(message), requested_(requested), in_use_(in_use), limit_(limit) {}
  std::size_t requested() const { return requested_; }
  std::size_t in_use() const { return in_use_; }
  std::size_t limit() const { return limit_; }  // 0: no limit set

 private:
  std::size_t requested_, in_use_, limit_;
};

// "12.5 MiB", "512 B": sizes for messages.
std::string format_bytes(std::size_t bytes);

// Control characters (newline, tab, vertical tab, form feed, escape, ...) become spaces: errors
// print as one line, and a file name cannot move the terminal's cursor.
std::string one_line(const std::string& s);

}  // namespace mf
