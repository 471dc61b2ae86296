// runtime/cuda_check.h for the CPU emulation: the same macros as the real one, for the
// only status type the emulated calls return. A failed launch throws from the launch itself.
#pragma once
#include "runtime/errors.h"
#include "test/emulator/cuda_emulator.h"

namespace mf::detail {
[[noreturn]] void throw_gpu_error(const char* msg, const char* expr, const char* file, int line);
}  // namespace mf::detail

#define MF_GPU_CHECK(expr)                                                                   \
  do {                                                                                       \
    if ((expr) != cudaSuccess)                                                               \
      ::mf::detail::throw_gpu_error("emulated call failed", #expr, __FILE__, __LINE__);      \
  } while (0)
#define MF_CHECK_LAUNCH() MF_GPU_CHECK(cudaGetLastError())
