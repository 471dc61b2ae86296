// cuda_check.h: the one error-check idiom for CUDA, cuBLAS and cuDNN calls.
//
//   MF_GPU_CHECK(cudaMalloc(&p, n));        // throws mf::GpuError naming the call and file:line
//   MF_GPU_CHECK(cublasSgemm(...));         // the status type picks the right decoder, so a
//   MF_GPU_CHECK(cudnnConvolutionForward(...));  // cuBLAS code is never read as a CUDA error
//   MF_GPU_WARN(cudaFree(p));               // destructors: prints, never throws
//   MF_CHECK_LAUNCH();                      // after every kernel launch
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include "runtime/errors.h"

namespace mf::detail {

inline bool failed(cudaError_t s) { return s != cudaSuccess; }
inline bool failed(cublasStatus_t s) { return s != CUBLAS_STATUS_SUCCESS; }
inline bool failed(cudnnStatus_t s) { return s != CUDNN_STATUS_SUCCESS; }
inline const char* describe(cudaError_t s) { return cudaGetErrorString(s); }
inline const char* describe(cublasStatus_t s) { return cublasGetStatusString(s); }
inline const char* describe(cudnnStatus_t s) { return cudnnGetErrorString(s); }

[[noreturn]] void throw_gpu_error(const char* msg, const char* expr, const char* file, int line);
void warn_gpu_error(const char* msg, const char* expr, const char* file, int line);

}  // namespace mf::detail

#define MF_GPU_CHECK(expr)                                                                    \
  do {                                                                                        \
    const auto mf_s_ = (expr);                                                                \
    if (::mf::detail::failed(mf_s_))                                                          \
      ::mf::detail::throw_gpu_error(::mf::detail::describe(mf_s_), #expr, __FILE__, __LINE__); \
  } while (0)

#define MF_GPU_WARN(expr)                                                                    \
  do {                                                                                       \
    const auto mf_s_ = (expr);                                                               \
    if (::mf::detail::failed(mf_s_))                                                         \
      ::mf::detail::warn_gpu_error(::mf::detail::describe(mf_s_), #expr, __FILE__, __LINE__); \
  } while (0)

// A launch error (bad configuration, no kernel image for this GPU) shows up here, at the
// launch; an error inside the kernel shows up at the next synchronising call.
#define MF_CHECK_LAUNCH() MF_GPU_CHECK(cudaGetLastError())
