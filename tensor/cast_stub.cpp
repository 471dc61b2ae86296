// cast_stub.cpp: the casts of cast.h in a CPU-only build: each says that this build has no
// GPU (nothing calls them unless a tensor is on the GPU, which such a build cannot make).
#include <string>

#include "runtime/errors.h"
#include "tensor/cast.h"

namespace mf {

namespace {
[[noreturn]] void no_gpu(const char* what) {
  throw NoGpuError(std::string(what) + ": microflow was built without CUDA (CPU-only build)");
}
}  // namespace

void launch_cast_f32_to_f16(const float*, Half*, std::int64_t, GpuStream) { no_gpu("cast"); }
void launch_cast_f16_to_f32(const Half*, float*, std::int64_t, GpuStream) { no_gpu("cast"); }
void launch_cast_u8_to_f32(const std::uint8_t*, float*, std::int64_t, float, GpuStream) { no_gpu("cast"); }
void launch_add_f32_to_f16(const float*, Half*, std::int64_t, GpuStream) { no_gpu("add_f32_to_f16"); }

}  // namespace mf
