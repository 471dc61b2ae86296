// tensor.cpp: storage allocation, copies, conversions and views.
#include "tensor/tensor.h"

#include <cstdint>
#include <cstdlib>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <cstring>
#include <sstream>

#include "runtime/device_allocator.h"
#include "runtime/errors.h"
#include "tensor/cast.h"

namespace mf {

namespace {
constexpr std::size_t kHostAlign = 64;  // one cache line; one AVX-512 register

// glibc returns every freed block above 128 KiB to the kernel (munmap) and maps fresh,
// zero-filled pages for the next one. A training step frees and allocates multi-MB
// buffers (Eigen's GEMM packing, batch scratch), so by default each step pays thousands
// of page faults. Raising the thresholds once keeps those blocks in the process.
void configure_host_malloc() {
  static const bool done = [] {
#if defined(__GLIBC__)
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
    return true;
  }();
  (void)done;
}
}

Storage::Storage(std::size_t bytes, Device device) : bytes_(bytes), device_(device) {
  if (device == Device::kCpu) {
    configure_host_malloc();
    // aligned_alloc wants a multiple of the alignment. Rounding up a size within 63 bytes of
    // SIZE_MAX would wrap to 0 and hand out a 64-byte block for it; no allocator can give
    // that much anyway, so it is refused as out of memory.
    if (bytes > SIZE_MAX - (kHostAlign - 1))
      throw OutOfMemoryError("host memory request of " + format_bytes(bytes) + " is larger than any machine",
                             bytes, 0, 0);
    const std::size_t padded = (bytes + kHostAlign - 1) / kHostAlign * kHostAlign;
    data_ = std::aligned_alloc(kHostAlign, padded == 0 ? kHostAlign : padded);
    // A failed allocation is an OutOfMemoryError, as on the GPU, so that the apps report it
    // in one line with the tensor's size (Tensor::empty adds it) rather than "std::bad_alloc".
    if (!data_)
      throw OutOfMemoryError("host allocation of " + format_bytes(padded) + " failed", padded, 0, 0);
  } else {
    data_ = DeviceAllocator::instance().allocate(bytes);
  }
}

Storage::~Storage() {
  if (device_ == Device::kCpu) std::free(data_);
  else DeviceAllocator::instance().deallocate(data_);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = device;
  const std::size_t bytes = t.nbytes();  // throws std::overflow_error past size_t
  try {
    t.storage_ = std::make_shared<Storage>(bytes, device);
  } catch (const OutOfMemoryError& e) {
    // One line naming the tensor, its size and where memory ran out, with what to try.
    if (device == Device::kCpu)
      throw OutOfMemoryError("out of host memory allocating " + describe(shape, dtype, device) + " (" +
                                 format_bytes(bytes) + ")",
                             e.requested(), e.in_use(), e.limit());
    throw OutOfMemoryError("out of GPU memory allocating " + describe(shape, dtype, device) + " (" +
                               format_bytes(bytes) + "): " + e.what() +
                               ". Try a smaller --batch-size or --fp16.",
                           e.requested(), e.in_use(), e.limit());
  }
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_zero();
  return t;
}

Tensor Tensor::from_vector(const Shape& shape, const std::vector<float>& values) {
  if (static_cast<std::int64_t>(values.size()) != shape.numel())
    throw std::invalid_argument("from_vector: " + std::to_string(values.size()) +
                                " values for shape " + shape.str());
  Tensor t = empty(shape, DType::kF32, Device::kCpu);
  if (!values.empty()) std::memcpy(t.raw(), values.data(), values.size() * sizeof(float));
  return t;
}

void Tensor::check_type(DType want) const {
  if (want != dtype_)
    throw std::invalid_argument(std::string("tensor holds ") + dtype_name(dtype_) +
                                ", accessed as " + dtype_name(want));
}

std::string Tensor::describe(const Shape& shape, DType dtype, Device device) {
  return std::string(dtype_name(dtype)) + " " + shape.str() + " on " + device_name(device);
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined tensor";
  return describe(shape_, dtype_, device_);
}

Tensor Tensor::clone() const { return to(device_); }

Tensor Tensor::to(Device device) const {
  if (!defined()) throw std::invalid_argument("to(): undefined tensor");
  Tensor t = empty(shape_, dtype_, device);
  t.copy_from(*this);
  return t;
}

namespace {
// An undefined tensor has shape () and so counts one element, like a scalar: without this
// check it would pass the shape comparison and be copied through its null pointer.
void check_defined_for_copy(const char* caller, const Tensor& dst, const Tensor& src) {
  if (!dst.defined() || !src.defined())
    throw std::invalid_argument(std::string(caller) + ": " + src.describe() + " into " + dst.describe() +
                                ": both tensors must be defined (allocated)");
}
}  // namespace

void Tensor::copy_from(const Tensor& src) {
  check_defined_for_copy("copy_from", *this, src);
  if (src.shape_ != shape_ || src.dtype_ != dtype_)
    throw std::invalid_argument("copy_from: " + src.describe() + " into " + describe());
  if (nbytes() == 0) return;
  if (is_cpu() && src.is_cpu()) {
    std::memmove(raw(), src.raw(), nbytes());
    return;
  }
  // On the compute stream, so the copy comes after the kernels that wrote src.
  copy_from_async(src, compute_stream());
  gpu_stream_synchronize(compute_stream());
}

void Tensor::copy_from_async(const Tensor& src, GpuStream stream) {
  check_defined_for_copy("copy_from_async", *this, src);
  if (src.shape_ != shape_ || src.dtype_ != dtype_)
    throw std::invalid_argument("copy_from_async: " + src.describe() + " into " + describe());
  if (is_cpu() && src.is_cpu()) {
    std::memmove(raw(), src.raw(), nbytes());
    return;
  }
  // On the device a copy has memcpy's contract: overlapping ranges give undefined results
  // (memmove above covers the host). Views of one buffer that overlap (a slice shifted by a
  // row) go through a temporary; a copy onto itself changes nothing.
  if (overlaps(src)) {
    if (raw() == src.raw()) return;
    const Tensor staged = empty(shape_, dtype_, device_);
    gpu_copy_async(staged.raw(), src.raw(), nbytes(), CopyKind::kDeviceToDevice, stream);
    gpu_copy_async(raw(), staged.raw(), nbytes(), CopyKind::kDeviceToDevice, stream);
    gpu_stream_synchronize(stream);  // staged is freed on return
    return;
  }
  const CopyKind kind = is_gpu() ? (src.is_gpu() ? CopyKind::kDeviceToDevice : CopyKind::kHostToDevice)
                                 : CopyKind::kDeviceToHost;
  gpu_copy_async(raw(), src.raw(), nbytes(), kind, stream);
}

void Tensor::fill_zero() {
  if (!defined() || nbytes() == 0) return;
  if (is_cpu()) {
    std::memset(raw(), 0, nbytes());
    return;
  }
  gpu_memset_async(raw(), 0, nbytes(), compute_stream());
  gpu_stream_synchronize(compute_stream());
}

void Tensor::fill_zero_async(GpuStream stream) {
  if (!defined() || nbytes() == 0) return;
  if (is_cpu()) std::memset(raw(), 0, nbytes());
  else gpu_memset_async(raw(), 0, nbytes(), stream);
}

Tensor Tensor::to(DType dtype) const {
  if (!defined()) throw std::invalid_argument("to(): undefined tensor");
  if (dtype == dtype_) return clone();
  Tensor t = empty(shape_, dtype, device_);
  const std::int64_t n = numel();
  const bool ok = (dtype_ == DType::kF32 && dtype == DType::kF16) ||
                  (dtype_ == DType::kF16 && dtype == DType::kF32) ||
                  (dtype_ == DType::kU8 && dtype == DType::kF32);
  if (!ok)
    throw std::invalid_argument(std::string("no conversion from ") + dtype_name(dtype_) + " to " +
                                dtype_name(dtype));
  if (is_cpu()) {
    if (dtype_ == DType::kF32) {
      const float* s = data<float>();
      Half* d = t.data<Half>();
      for (std::int64_t i = 0; i < n; ++i) d[i] = float_to_half(s[i]);
    } else if (dtype_ == DType::kF16) {
      const Half* s = data<Half>();
      float* d = t.data<float>();
      for (std::int64_t i = 0; i < n; ++i) d[i] = half_to_float(s[i]);
    } else {
      const std::uint8_t* s = data<std::uint8_t>();
      float* d = t.data<float>();
      for (std::int64_t i = 0; i < n; ++i) d[i] = static_cast<float>(s[i]);
    }
    return t;
  }
  const GpuStream s = compute_stream();
  if (dtype_ == DType::kF32) launch_cast_f32_to_f16(data<float>(), t.data<Half>(), n, s);
  else if (dtype_ == DType::kF16) launch_cast_f16_to_f32(data<Half>(), t.data<float>(), n, s);
  else launch_cast_u8_to_f32(data<std::uint8_t>(), t.data<float>(), n, 1.0f, s);
  gpu_stream_synchronize(s);
  return t;
}

std::vector<float> Tensor::to_vector() const {
  if (!defined()) return {};
  const Tensor host = is_cpu() ? *this : to(Device::kCpu);
  std::vector<float> v(static_cast<std::size_t>(numel()));
  const std::int64_t n = numel();
  switch (dtype_) {
    case DType::kF32: if (n) std::memcpy(v.data(), host.raw(), n * sizeof(float)); break;
    case DType::kF16: for (std::int64_t i = 0; i < n; ++i) v[i] = half_to_float(host.data<Half>()[i]); break;
    case DType::kU8: for (std::int64_t i = 0; i < n; ++i) v[i] = host.data<std::uint8_t>()[i]; break;
    case DType::kI32: for (std::int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(host.data<std::int32_t>()[i]); break;
  }
  return v;
}

Tensor Tensor::reshape(const Shape& shape) const {
  // An undefined tensor counts one element (shape ()), so a reshape to (1,) passed the check
  // and gave a tensor with a shape and no memory.
  if (!defined() || shape.numel() != numel())
    throw std::invalid_argument("reshape: " + describe() + " to " + shape.str());
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::slice(std::int64_t begin, std::int64_t end) const {
  if (rank() == 0 || begin < 0 || end < begin || end > dim(0))
    throw std::invalid_argument("slice [" + std::to_string(begin) + ", " + std::to_string(end) +
                                ") of " + describe());
  Tensor t = *this;
  t.shape_[0] = end - begin;
  t.offset_ += static_cast<std::size_t>(begin * shape_.sample_numel()) * dtype_size(dtype_);
  return t;
}

void ensure(Tensor& t, const Shape& shape, DType dtype, Device device) {
  // The byte count, checked as Tensor::nbytes() does: a wrapped product would find a small
  // old buffer "large enough".
  std::size_t need = 0;
  if (__builtin_mul_overflow(static_cast<std::size_t>(shape.numel()), dtype_size(dtype), &need))
    throw std::overflow_error("tensor of shape " + shape.str() + " has more bytes than size_t can count");
  // Already what is wanted: left as it is, also a view at an offset (a slice passed as the
  // output of softmax_xent, say), which must be written where it is.
  if (t.storage_ && t.shape_ == shape && t.dtype_ == dtype && t.device_ == device) return;
  if (t.storage_ && t.device_ == device && t.storage_->bytes() >= need) {
    t.shape_ = shape;
    t.dtype_ = dtype;
    t.offset_ = 0;
    return;
  }
  t = Tensor::empty(shape, dtype, device);
}

}  // namespace mf
