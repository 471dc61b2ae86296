// cast.h: the dtype conversion kernels on the GPU (Tensor::to(dtype) and mixed precision's
// f16 copies). Like the launchers of kernels/gpu/launchers.h: asynchronous on `stream`,
// device pointers; in a CPU-only build they throw NoGpuError.
#pragma once
#include <cstdint>

#include "runtime/gpu_runtime.h"
#include "tensor/half.h"

namespace mf {

// ---- casts ----
void launch_cast_f32_to_f16(const float* x, Half* y, std::int64_t n, GpuStream stream);
void launch_cast_f16_to_f32(const Half* x, float* y, std::int64_t n, GpuStream stream);
// y = x * scale
void launch_cast_u8_to_f32(const std::uint8_t* x, float* y, std::int64_t n, float scale, GpuStream stream);
// y[i] = (half)((float)y[i] + x[i]): an f32 result accumulated into f16 storage, rounded once.
void launch_add_f32_to_f16(const float* x, Half* y, std::int64_t n, GpuStream stream);

}  // namespace mf
