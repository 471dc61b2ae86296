// test_tensor.cpp: Tensor (shapes, views, buffers, conversions), host half precision, the CPU
// thread pool and the random generator.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>
#endif

#include "runtime/errors.h"
#include "runtime/gpu_runtime.h"
#include "tensor/half.h"
#include "runtime/parallel.h"
#include "tensor/rng.h"
#include "tensor/tensor.h"
#include "test/test_util.h"

// AddressSanitizer (scripts/test.sh --sanitize) aborts on an allocation larger than it
// supports instead of returning null; the out-of-memory tests below need the null that the
// plain allocator returns. The environment's ASAN_OPTIONS still take precedence.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MF_TEST_UNDER_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(MF_TEST_UNDER_ASAN)
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }
#endif
// ThreadSanitizer (test.sh --sanitize, build-tsan) likewise.
#if defined(__SANITIZE_THREAD__)
extern "C" const char* __tsan_default_options() { return "allocator_may_return_null=1"; }
#endif

namespace {

using mf::DType;
using mf::Half;
using mf::Shape;
using mf::Tensor;
using mf::testing::bits_of_float;
using mf::testing::float_from_bits;

Half half_of(std::uint16_t bits) {
  Half h;
  h.bits = bits;
  return h;
}
bool is_half_nan(std::uint16_t b) { return (b & 0x7c00u) == 0x7c00u && (b & 0x3ffu) != 0; }

// The value of a half bit pattern computed independently of half_to_float: subnormals are
// mant * 2^-24, normals (1024 + mant) * 2^(exp - 25).
double half_value(std::uint16_t b) {
  const int exp = (b >> 10) & 0x1f, mant = b & 0x3ff;
  const double sign = (b & 0x8000u) ? -1.0 : 1.0;
  if (exp == 31) return mant ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  return sign * std::ldexp(1024 + mant, exp - 25);
}

// ---- Shape and Tensor basics ----------------------------------------------------------------

TEST(Shape, NumelRankStrAndValidation) {
  const Shape s{64, 32, 26, 26};
  EXPECT_EQ(s.rank(), 4);
  EXPECT_EQ(s.numel(), 64 * 32 * 26 * 26);
  EXPECT_EQ(s.sample_numel(), 32 * 26 * 26);
  EXPECT_EQ(s.str(), "(64, 32, 26, 26)");
  EXPECT_EQ(Shape{5}.str(), "(5,)");  // Python's one-element tuple
  EXPECT_EQ(Shape{}.numel(), 1);      // a scalar
  EXPECT_EQ(Shape({3, 0, 2}).numel(), 0);
  EXPECT_EQ(s.with_batch(7), Shape({7, 32, 26, 26}));
  EXPECT_NE(s, Shape({64, 32, 26}));
  EXPECT_THROW(Shape({2, -1}), std::invalid_argument);
  EXPECT_THROW(s[4], std::out_of_range);
}

// A dimension that is not there is named with the shape; the message was libstdc++'s
// "vector::_M_range_check: __n (which is 4) >= this->size() (which is 2)".
TEST(Shape, BadIndexNamesTheDimensionAndTheShape) {
  const auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const std::out_of_range& e) {
      return std::string(e.what());
    }
    return std::string("no exception");
  };
  Shape s{3, 4};
  EXPECT_EQ(message([&] { (void)s[2]; }), "dimension 2 of shape (3, 4), which has 2 dimensions");
  EXPECT_EQ(message([&] { s[-1] = 5; }), "dimension -1 of shape (3, 4), which has 2 dimensions");
  EXPECT_EQ(message([&] { (void)Shape{7}[1]; }), "dimension 1 of shape (7,), which has 1 dimension");
  EXPECT_EQ(message([&] { (void)Shape{}.with_batch(2); }), "dimension 0 of shape (), which has 0 dimensions");
  EXPECT_EQ(message([&] { (void)Tensor::zeros({2, 2}).dim(3); }), "dimension 3 of shape (2, 2), which has 2 dimensions");
  EXPECT_EQ(s, Shape({3, 4}));
  s[1] = 5;
  EXPECT_EQ(s, Shape({3, 5}));
}

// A product of dimensions past int64 throws instead of wrapping: (2^62, 784) wrapped to 0,
// and a zero-sized tensor then passed every size check (a crafted checkpoint's batch size).
TEST(Shape, NumelThrowsOnOverflow) {
  constexpr std::int64_t kBig = std::int64_t{1} << 62;
  EXPECT_THROW(Shape({kBig, 784}).numel(), std::overflow_error);
  EXPECT_THROW(Shape({kBig, 1, 28, 28}).numel(), std::overflow_error);
  EXPECT_THROW(Shape({2, kBig, 2}).numel(), std::overflow_error);
  EXPECT_THROW(Shape({1, kBig, 784}).sample_numel(), std::overflow_error);
  EXPECT_THROW(Tensor::empty(Shape({kBig, 1, 28, 28})), std::overflow_error);
  // 2^62 elements fit in int64, but not their 2^64 bytes in size_t.
  EXPECT_THROW(Tensor::empty(Shape({kBig})), std::overflow_error);
  // The largest products that fit, and zeros wherever they stand, are fine.
  EXPECT_EQ(Shape({kBig, 1}).numel(), kBig);
  EXPECT_EQ(Shape({INT64_MAX}).numel(), INT64_MAX);
  EXPECT_EQ(Shape({3037000499, 3037000499}).numel(), std::int64_t{3037000499} * 3037000499);
  EXPECT_EQ(Shape({kBig, kBig, 0}).numel(), 0);
  EXPECT_EQ(Shape({0, kBig, kBig}).numel(), 0);
  EXPECT_EQ(Shape({kBig, kBig, 0}).sample_numel(), 0);
  EXPECT_EQ(Shape({kBig, 4, 8}).sample_numel(), 32);
  try {
    (void)Shape({kBig, 784}).numel();
  } catch (const std::overflow_error& e) {
    EXPECT_STREQ(e.what(), "shape (4611686018427387904, 784) has more elements than int64 can count");
  }
}

TEST(Tensor, EmptyZerosFromVectorAndDescribe) {
  const Tensor u;
  EXPECT_FALSE(u.defined());
  EXPECT_EQ(u.describe(), "undefined tensor");
  EXPECT_EQ(u.raw(), nullptr);
  EXPECT_TRUE(u.to_vector().empty());

  Tensor e = Tensor::empty({64, 32, 26, 26});
  EXPECT_TRUE(e.defined());
  EXPECT_EQ(e.rank(), 4);
  EXPECT_EQ(e.dim(1), 32);
  EXPECT_EQ(e.numel(), 64 * 32 * 26 * 26);
  EXPECT_EQ(e.nbytes(), static_cast<std::size_t>(e.numel()) * 4);
  EXPECT_EQ(e.dtype(), DType::kF32);
  EXPECT_TRUE(e.is_cpu());
  EXPECT_FALSE(e.is_gpu());
  EXPECT_EQ(e.describe(), "f32 (64, 32, 26, 26) on cpu");
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(e.raw()) % 64, 0u) << "host buffers are 64-byte aligned";

  const Tensor h = Tensor::empty({3}, DType::kF16);
  EXPECT_EQ(h.nbytes(), 6u);
  EXPECT_EQ(h.describe(), "f16 (3,) on cpu");
  EXPECT_EQ(Tensor::empty({2, 2}, DType::kU8).nbytes(), 4u);
  EXPECT_EQ(Tensor::empty({2, 2}, DType::kI32).describe(), "i32 (2, 2) on cpu");

  // fill_zero clears every byte of every dtype, and of a slice only the slice: the buffers
  // start as 0xff. zeros() is empty() + fill_zero(); fresh memory is often zero already,
  // so only the junk-filled buffers can show a fill_zero that misses bytes.
  const auto all_bytes = [](const Tensor& x, unsigned char b) {
    const auto* p = static_cast<const unsigned char*>(x.raw());
    return std::all_of(p, p + x.nbytes(), [b](unsigned char c) { return c == b; });
  };
  for (DType t : {DType::kF32, DType::kF16, DType::kU8, DType::kI32}) {
    SCOPED_TRACE(mf::dtype_name(t));
    Tensor junk = Tensor::empty({5, 7}, t);
    std::memset(junk.raw(), 0xff, junk.nbytes());
    junk.fill_zero();
    EXPECT_TRUE(all_bytes(junk, 0));

    Tensor whole = Tensor::empty({5, 7}, t);
    std::memset(whole.raw(), 0xff, whole.nbytes());
    Tensor rows = whole.slice(1, 3);
    rows.fill_zero();
    EXPECT_TRUE(all_bytes(rows, 0));
    EXPECT_TRUE(all_bytes(whole.slice(0, 1), 0xff));
    EXPECT_TRUE(all_bytes(whole.slice(3, 5), 0xff));

    EXPECT_TRUE(all_bytes(Tensor::zeros({5, 7}, t), 0));
  }

  const Tensor v = Tensor::from_vector({2, 3}, {1, 2, 3, 4, 5, 6.5f});
  EXPECT_EQ(v.shape(), Shape({2, 3}));
  EXPECT_EQ(v.to_vector(), (std::vector<float>{1, 2, 3, 4, 5, 6.5f}));
  EXPECT_EQ(v.data<float>()[5], 6.5f);
  EXPECT_THROW(Tensor::from_vector({2, 3}, {1, 2, 3}), std::invalid_argument);

  // zero-element tensors are legal and copy/convert without touching memory
  Tensor z0 = Tensor::zeros({0, 4});
  EXPECT_EQ(z0.numel(), 0);
  EXPECT_EQ(z0.clone().numel(), 0);
  EXPECT_EQ(z0.to(DType::kF16).numel(), 0);
}

TEST(Tensor, TypedAccessChecksTheDtype) {
  Tensor f = Tensor::zeros({4});
  EXPECT_NO_THROW(f.data<float>());
  try {
    f.data<Half>();
    FAIL() << "data<Half>() on an f32 tensor did not throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("f32"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("f16"), std::string::npos) << e.what();
  }
  EXPECT_THROW(f.data<std::int32_t>(), std::invalid_argument);
  EXPECT_THROW(f.data<std::uint8_t>(), std::invalid_argument);
  const Tensor& cf = f;
  EXPECT_THROW(cf.data<std::int32_t>(), std::invalid_argument);
  Tensor i = Tensor::zeros({4}, DType::kI32);
  EXPECT_NO_THROW(i.data<std::int32_t>());
  EXPECT_THROW(i.data<float>(), std::invalid_argument);
  Tensor h = Tensor::zeros({4}, DType::kF16);
  EXPECT_NO_THROW(h.data<Half>());
  EXPECT_THROW(h.data<float>(), std::invalid_argument);
}

TEST(Tensor, CloneIsIndependent) {
  Tensor a = Tensor::from_vector({2, 2}, {1, 2, 3, 4});
  Tensor b = a.clone();
  EXPECT_NE(a.raw(), b.raw());
  EXPECT_FALSE(a.same_buffer(b));
  EXPECT_EQ(b.shape(), a.shape());
  b.data<float>()[0] = 100;
  a.data<float>()[3] = -7;
  EXPECT_EQ(a.to_vector(), (std::vector<float>{1, 2, 3, -7}));
  EXPECT_EQ(b.to_vector(), (std::vector<float>{100, 2, 3, 4}));
  // a plain copy of the handle is NOT a clone: it shares the buffer
  Tensor c = a;
  EXPECT_TRUE(c.same_buffer(a));
  c.data<float>()[1] = 9;
  EXPECT_EQ(a.data<float>()[1], 9);
}

TEST(Tensor, ReshapeAndSliceAreViews) {
  std::vector<float> vals(24);
  for (int i = 0; i < 24; ++i) vals[i] = static_cast<float>(i);
  Tensor t = Tensor::from_vector({4, 3, 2}, vals);

  Tensor r = t.reshape({4, 6});
  EXPECT_EQ(r.shape(), Shape({4, 6}));
  EXPECT_EQ(r.raw(), t.raw());
  EXPECT_TRUE(r.same_buffer(t));
  r.data<float>()[7] = -1;
  EXPECT_EQ(t.data<float>()[7], -1);
  EXPECT_THROW(t.reshape({5, 5}), std::invalid_argument);

  Tensor s = t.slice(1, 3);  // rows 1 and 2: elements [6, 18)
  EXPECT_EQ(s.shape(), Shape({2, 3, 2}));
  EXPECT_EQ(static_cast<char*>(s.raw()) - static_cast<char*>(t.raw()), 6 * 4);
  EXPECT_FALSE(s.same_buffer(t));  // same storage, other offset
  EXPECT_EQ(s.to_vector().front(), 6.0f);
  EXPECT_EQ(s.to_vector().back(), 17.0f);
  s.data<float>()[0] = 42;
  EXPECT_EQ(t.data<float>()[6], 42);

  // a slice of a slice adds the offsets; a reshape of a slice keeps it
  Tensor ss = s.slice(1, 2);
  EXPECT_EQ(static_cast<char*>(ss.raw()) - static_cast<char*>(t.raw()), 12 * 4);
  EXPECT_EQ(ss.reshape({6}).raw(), ss.raw());
  EXPECT_EQ(ss.to_vector(), std::vector<float>(vals.begin() + 12, vals.begin() + 18));

  // empty slices are legal, out-of-range ones are not
  EXPECT_EQ(t.slice(4, 4).numel(), 0);
  EXPECT_THROW(t.slice(3, 5), std::invalid_argument);
  EXPECT_THROW(t.slice(-1, 2), std::invalid_argument);
  EXPECT_THROW(t.slice(3, 2), std::invalid_argument);

  // an undefined tensor has no view: as a scalar's one element, a reshape to (1,) gave a
  // tensor with a shape and no memory
  try {
    (void)Tensor().reshape({1});
    ADD_FAILURE() << "reshape of an undefined tensor accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "reshape: undefined tensor to (1,)");
  }
  EXPECT_THROW((void)Tensor().slice(0, 0), std::invalid_argument);

  // f16 slices count in 2-byte elements
  Tensor h = Tensor::zeros({10, 3}, DType::kF16);
  EXPECT_EQ(static_cast<char*>(h.slice(4, 10).raw()) - static_cast<char*>(h.raw()), 4 * 3 * 2);

  // a view keeps the storage alive after the original handle is gone
  Tensor survivor;
  {
    Tensor tmp = Tensor::from_vector({3}, {5, 6, 7});
    survivor = tmp.slice(2, 3);
  }
  EXPECT_EQ(survivor.to_vector(), std::vector<float>{7});
}

TEST(Tensor, CopyFromAndFillZero) {
  Tensor a = Tensor::from_vector({3}, {1, 2, 3});
  Tensor b = Tensor::zeros({3});
  b.copy_from(a);
  EXPECT_EQ(b.to_vector(), a.to_vector());
  EXPECT_NE(b.raw(), a.raw());
  EXPECT_THROW(b.copy_from(Tensor::zeros({4})), std::invalid_argument);
  EXPECT_THROW(b.copy_from(Tensor::zeros({3}, DType::kI32)), std::invalid_argument);
  // fill_zero of a slice touches only the slice
  Tensor big = Tensor::from_vector({4}, {1, 2, 3, 4});
  Tensor mid = big.slice(1, 3);
  mid.fill_zero();
  EXPECT_EQ(big.to_vector(), (std::vector<float>{1, 0, 0, 4}));
}

// An undefined tensor has shape () and counts one element, like a scalar, so it passed the
// shape check and was copied through its null pointer (a crash). Either side undefined is
// an error naming both tensors.
TEST(Tensor, CopyFromAnUndefinedTensorThrows) {
  const Tensor undefined;
  Tensor scalar = Tensor::zeros(Shape{});
  Tensor empty = Tensor::zeros({0});
  for (const bool async : {false, true}) {
    SCOPED_TRACE(async ? "copy_from_async" : "copy_from");
    auto copy = [&](Tensor dst, const Tensor& src) {
      if (async) dst.copy_from_async(src, mf::GpuStream{});  // host tensors: the stream is not used
      else dst.copy_from(src);
    };
    for (const auto& [dst, src] : std::vector<std::pair<Tensor, Tensor>>{
             {undefined, undefined}, {scalar, undefined}, {undefined, scalar}, {empty, undefined}}) {
      try {
        copy(dst, src);
        ADD_FAILURE() << src.describe() << " into " << dst.describe() << " accepted";
      } catch (const std::invalid_argument& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find(src.describe() + " into " + dst.describe()), std::string::npos) << msg;
        EXPECT_NE(msg.find("defined"), std::string::npos) << msg;
      }
    }
  }
  // a defined scalar still copies
  scalar.copy_from(Tensor::from_vector(Shape{}, {2.5f}));
  EXPECT_EQ(scalar.to_vector(), std::vector<float>{2.5f});
}

// shares_storage: any two views of one storage (offsets may differ), never undefined ones.
TEST(Tensor, SharesStorageSeesViewsAtAnyOffset) {
  const Tensor a = Tensor::zeros({4, 3});
  EXPECT_TRUE(a.shares_storage(a));
  EXPECT_TRUE(a.shares_storage(a.slice(2, 4)));
  EXPECT_TRUE(a.slice(0, 1).shares_storage(a.slice(3, 4)));  // disjoint rows, same storage
  EXPECT_TRUE(a.reshape({12}).shares_storage(a));
  EXPECT_FALSE(a.shares_storage(a.clone()));
  EXPECT_FALSE(a.shares_storage(Tensor()));
  EXPECT_FALSE(Tensor().shares_storage(Tensor()));
}

// overlaps: views of one storage whose bytes intersect; disjoint or empty views do not.
TEST(Tensor, OverlapsWhenTheBytesIntersect) {
  const Tensor a = Tensor::zeros({4, 3});
  EXPECT_TRUE(a.overlaps(a));
  EXPECT_TRUE(a.slice(0, 2).overlaps(a.slice(1, 3)));
  EXPECT_TRUE(a.reshape({12}).slice(5, 6).overlaps(a.slice(1, 2)));  // element 5 is in row 1
  EXPECT_FALSE(a.slice(0, 2).overlaps(a.slice(2, 4)));                // adjacent rows
  EXPECT_FALSE(a.slice(1, 1).overlaps(a));                            // empty
  EXPECT_FALSE(a.overlaps(a.clone()));
  EXPECT_FALSE(a.overlaps(Tensor()));
}

TEST(Tensor, EnsureReusesStorageWhenLargeEnough) {
  Tensor t;
  mf::ensure(t, {8, 16}, DType::kF32, mf::Device::kCpu);
  ASSERT_TRUE(t.defined());
  void* const first = t.raw();
  EXPECT_EQ(t.shape(), Shape({8, 16}));

  // same shape: nothing changes
  mf::ensure(t, {8, 16}, DType::kF32, mf::Device::kCpu);
  EXPECT_EQ(t.raw(), first);
  // smaller (a last, partial batch): the front of the same buffer
  mf::ensure(t, {3, 16}, DType::kF32, mf::Device::kCpu);
  EXPECT_EQ(t.raw(), first);
  EXPECT_EQ(t.shape(), Shape({3, 16}));
  // back to the full size: still the same buffer (storage remembers its capacity)
  mf::ensure(t, {8, 16}, DType::kF32, mf::Device::kCpu);
  EXPECT_EQ(t.raw(), first);
  // another dtype that fits in the bytes: reused, retyped
  mf::ensure(t, {16, 16}, DType::kF16, mf::Device::kCpu);
  EXPECT_EQ(t.raw(), first);
  EXPECT_EQ(t.dtype(), DType::kF16);
  EXPECT_NO_THROW(t.data<Half>());

  // a view with an offset that has the shape asked for stays where it is (it moved to the
  // start of its storage, so an output passed as a slice was written into other rows);
  // with another shape it is reset to the start of its storage
  Tensor base = Tensor::empty({10, 4});
  Tensor view = base.slice(5, 10);
  mf::ensure(view, {5, 4}, DType::kF32, mf::Device::kCpu);
  EXPECT_TRUE(view.same_buffer(base.slice(5, 10)));
  mf::ensure(view, {2, 4}, DType::kF32, mf::Device::kCpu);
  EXPECT_EQ(view.raw(), base.raw());

  // larger than the storage: a new allocation, and the old holders keep theirs
  Tensor keep = t;
  mf::ensure(t, {9, 17}, DType::kF32, mf::Device::kCpu);
  EXPECT_NE(t.raw(), first);
  EXPECT_EQ(t.shape(), Shape({9, 17}));
  EXPECT_EQ(keep.raw(), first);
  // an undefined tensor gets allocated
  Tensor fresh;
  mf::ensure(fresh, {2}, DType::kI32, mf::Device::kCpu);
  EXPECT_TRUE(fresh.defined());
  EXPECT_EQ(fresh.dtype(), DType::kI32);
}

// A shape whose byte count wraps size_t must not find an old buffer "large enough": (2^62,)
// f32 is 2^64 bytes, which wrapped to 0.
TEST(Tensor, EnsureThrowsWhenTheByteCountOverflows) {
  Tensor t;
  mf::ensure(t, {4}, DType::kF32, mf::Device::kCpu);
  void* const first = t.raw();
  EXPECT_THROW(mf::ensure(t, Shape({std::int64_t{1} << 62}), DType::kF32, mf::Device::kCpu), std::overflow_error);
  EXPECT_EQ(t.shape(), Shape({4}));  // left as it was
  EXPECT_EQ(t.raw(), first);
}

// Host memory that cannot be had is an OutOfMemoryError, as device memory is, with one line
// naming the tensor and its size. The request below (about 5.3 PiB) is larger than the
// address space, so the allocator refuses it at once without touching any memory.
TEST(Tensor, HostOutOfMemoryNamesTheTensor) {
  const Shape huge{std::int64_t{1} << 36, 26, 26, 32};
  try {
    (void)Tensor::empty(huge, DType::kF32, mf::Device::kCpu);
    ADD_FAILURE() << "expected an OutOfMemoryError";
  } catch (const mf::OutOfMemoryError& e) {
    const std::size_t bytes = (std::size_t{1} << 36) * 26 * 26 * 32 * 4;
    EXPECT_EQ(std::string(e.what()), "out of host memory allocating f32 (68719476736, 26, 26, 32) on cpu (" +
                                         mf::format_bytes(bytes) + ")");
    EXPECT_GE(e.requested(), bytes);
  }
  // Storage on its own: a size within the alignment of SIZE_MAX used to wrap to a 64-byte
  // block when rounded up; it is refused as out of memory instead.
  EXPECT_THROW(mf::Storage(SIZE_MAX - 10, mf::Device::kCpu), mf::OutOfMemoryError);
  EXPECT_THROW(mf::Storage(std::size_t{1} << 60, mf::Device::kCpu), mf::OutOfMemoryError);
  // A small tensor is still fine afterwards.
  EXPECT_EQ(Tensor::zeros({3}).to_vector(), std::vector<float>(3, 0.0f));
}

// ---- half precision -------------------------------------------------------------------------

// Every half bit pattern but NaN survives half -> float -> half unchanged, and half -> float
// gives exactly the value the IEEE definition says.
TEST(Half, ExhaustiveRoundTripOfAllBitPatterns) {
  int checked = 0, nans = 0;
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float f = mf::half_to_float(half_of(bits));
    if (is_half_nan(bits)) {
      ++nans;
      EXPECT_TRUE(std::isnan(f)) << std::hex << b;
      EXPECT_TRUE(is_half_nan(mf::float_to_half(f).bits)) << std::hex << b;
      EXPECT_EQ(std::signbit(f), (bits & 0x8000u) != 0) << std::hex << b;
      continue;
    }
    ++checked;
    ASSERT_EQ(static_cast<double>(f), half_value(bits)) << "half_to_float of 0x" << std::hex << b;
    ASSERT_EQ(mf::float_to_half(f).bits, bits) << "round trip of 0x" << std::hex << b;
  }
  EXPECT_EQ(nans, 2 * 1023);
  EXPECT_EQ(checked, 65536 - 2 * 1023);
}

// Rounding of floats that are not halves: at every midpoint between two neighbouring
// positive halves the even one wins, and one float ulp either side goes to the nearer one.
TEST(Half, RoundsToNearestTiesToEvenEverywhere) {
  for (std::uint32_t b = 0; b < 0x7bff; ++b) {  // up to the largest finite half, 65504
    const double lo = half_value(static_cast<std::uint16_t>(b)), hi = half_value(static_cast<std::uint16_t>(b + 1));
    const auto mid = static_cast<float>((lo + hi) / 2);  // exact: halves have 11 significant bits
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    const std::uint16_t even = (b & 1u) ? static_cast<std::uint16_t>(b + 1) : static_cast<std::uint16_t>(b);
    ASSERT_EQ(mf::float_to_half(mid).bits, even) << "midpoint above 0x" << std::hex << b;
    ASSERT_EQ(mf::float_to_half(std::nextafter(mid, 0.0f)).bits, b) << "just below the midpoint above 0x" << std::hex << b;
    ASSERT_EQ(mf::float_to_half(std::nextafter(mid, INFINITY)).bits, b + 1) << "just above the midpoint above 0x" << std::hex << b;
    ASSERT_EQ(mf::float_to_half(-mid).bits, even | 0x8000u) << "negative midpoint above 0x" << std::hex << b;
  }
}

TEST(Half, KnownValues) {
  auto h = [](float f) { return mf::float_to_half(f).bits; };
  EXPECT_EQ(mf::round_to_half(1.0f / 3.0f), 0.333251953125f);  // 0x3555
  EXPECT_EQ(h(1.0f / 3.0f), 0x3555);
  EXPECT_EQ(h(1.0f), 0x3c00);
  EXPECT_EQ(h(-2.0f), 0xc000);
  EXPECT_EQ(mf::round_to_half(65504.0f), 65504.0f);  // the largest half
  EXPECT_EQ(mf::round_to_half(65519.0f), 65504.0f);  // below the 65520 midpoint
  EXPECT_EQ(mf::round_to_half(std::nextafter(65520.0f, 0.0f)), 65504.0f);
  EXPECT_EQ(h(65520.0f), 0x7c00);  // the midpoint to 2^16 rounds to even: overflow to inf
  EXPECT_TRUE(std::isinf(mf::round_to_half(65520.0f)));
  EXPECT_EQ(h(-65520.0f), 0xfc00);
  EXPECT_EQ(h(1e10f), 0x7c00);
  EXPECT_EQ(h(INFINITY), 0x7c00);
  EXPECT_EQ(h(-INFINITY), 0xfc00);
  EXPECT_EQ(h(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(h(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(h(std::ldexp(1.0f, -25)), 0x0000);  // half of it: a tie, to even (zero)
  EXPECT_EQ(h(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(h(std::ldexp(1.0f, -26)), 0x0000);
  EXPECT_EQ(h(1.5f * std::ldexp(1.0f, -24)), 0x0002);  // tie between 1 and 2 units: even, 2^-23
  EXPECT_EQ(mf::round_to_half(1.5f * std::ldexp(1.0f, -24)), std::ldexp(1.0f, -23));
  EXPECT_EQ(h(2.5f * std::ldexp(1.0f, -24)), 0x0002);  // tie between 2 and 3: 2
  EXPECT_EQ(h(1e-30f), 0x0000);
  EXPECT_EQ(h(-1e-30f), 0x8000);  // underflow keeps the sign
  EXPECT_EQ(h(std::numeric_limits<float>::denorm_min()), 0x0000);
  // 1 + 2^-11 is the midpoint between 1 and 1 + 2^-10: ties to even (1)
  EXPECT_EQ(h(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(h(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  // negative zero
  EXPECT_EQ(h(-0.0f), 0x8000);
  const float nz = mf::half_to_float(half_of(0x8000));
  EXPECT_EQ(nz, 0.0f);
  EXPECT_TRUE(std::signbit(nz));
  // NaN stays NaN both ways (and never becomes inf)
  const std::uint16_t hn = h(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(is_half_nan(hn)) << std::hex << hn;
  EXPECT_TRUE(is_half_nan(h(-std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(is_half_nan(h(float_from_bits(0x7f800001u)))) << "a signalling NaN with only a low payload bit";
  EXPECT_TRUE(std::isnan(mf::half_to_float(half_of(0x7e00))));
  EXPECT_TRUE(std::isnan(mf::round_to_half(std::numeric_limits<float>::quiet_NaN())));
  // the float bit pattern of a known half: 0x3555 -> 0x3eaaa000
  EXPECT_EQ(bits_of_float(mf::half_to_float(half_of(0x3555))), 0x3eaaa000u);
}

TEST(Tensor, ConvertsF32ToF16AndBack) {
  const std::vector<float> v{1.0f / 3, 65519.0f, 65520.0f, std::ldexp(1.0f, -25), 1.5f * std::ldexp(1.0f, -24),
                             -0.0f, -2.5f, 1e-3f};
  const Tensor f = Tensor::from_vector({2, 4}, v);
  const Tensor h = f.to(DType::kF16);
  EXPECT_EQ(h.dtype(), DType::kF16);
  EXPECT_EQ(h.shape(), f.shape());
  for (std::size_t i = 0; i < v.size(); ++i) EXPECT_EQ(h.data<Half>()[i].bits, mf::float_to_half(v[i]).bits) << i;
  const Tensor back = h.to(DType::kF32);
  const std::vector<float> bv = back.to_vector();
  for (std::size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(bits_of_float(bv[i]), bits_of_float(mf::round_to_half(v[i]))) << i;  // -0 keeps its sign
  }
  EXPECT_EQ(bv[0], 0.333251953125f);
  EXPECT_EQ(bv[1], 65504.0f);
  EXPECT_TRUE(std::isinf(bv[2]));
  EXPECT_EQ(bv[3], 0.0f);
  EXPECT_EQ(bv[4], std::ldexp(1.0f, -23));
  EXPECT_TRUE(std::signbit(bv[5]));
  // to_vector of an f16 tensor widens the same way
  EXPECT_EQ(h.to_vector(), bv);
  // converting to the same dtype is a clone
  const Tensor same = f.to(DType::kF32);
  EXPECT_NE(same.raw(), f.raw());
  EXPECT_EQ(same.to_vector(), f.to_vector());
}

TEST(Tensor, ConvertsU8ToF32AndRejectsOtherConversions) {
  Tensor u = Tensor::empty({2, 3}, DType::kU8);
  const std::uint8_t bytes[6] = {0, 1, 2, 127, 128, 255};
  std::memcpy(u.raw(), bytes, 6);
  const Tensor f = u.to(DType::kF32);
  EXPECT_EQ(f.dtype(), DType::kF32);
  EXPECT_EQ(f.to_vector(), (std::vector<float>{0, 1, 2, 127, 128, 255}));  // no /255 here
  EXPECT_EQ(u.to_vector(), f.to_vector());
  EXPECT_THROW(f.to(DType::kU8), std::invalid_argument);
  EXPECT_THROW(f.to(DType::kI32), std::invalid_argument);
  EXPECT_THROW(Tensor::zeros({2}, DType::kI32).to(DType::kF32), std::invalid_argument);
  EXPECT_THROW(u.to(DType::kF16), std::invalid_argument);
  EXPECT_THROW(Tensor().to(DType::kF32), std::invalid_argument);
  EXPECT_THROW(Tensor().to(mf::Device::kCpu), std::invalid_argument);
}

TEST(Tensor, MovingToTheDeviceWithoutOneThrowsWithTheReason) {
  if (mf::gpu_available()) GTEST_SKIP() << "a GPU is present: this checks the no-GPU path";
  const std::string reason = mf::gpu_status().reason;
  EXPECT_FALSE(reason.empty());
  const Tensor t = Tensor::from_vector({2}, {1, 2});
  try {
    (void)t.to(mf::Device::kGpu);
    FAIL() << "to(kGpu) did not throw";
  } catch (const mf::NoGpuError& e) {
    EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << "message: " << e.what() << "; reason: " << reason;
  }
  EXPECT_THROW(Tensor::empty({4}, DType::kF32, mf::Device::kGpu), mf::NoGpuError);
  EXPECT_THROW(mf::compute_stream(), mf::NoGpuError);
}

// ---- thread pool ----------------------------------------------------------------------------

TEST(ThreadPool, ParallelForCoversTheRangeExactlyOnce) {
  for (int threads : {1, 2, 3, 8}) {
    mf::ThreadPool pool(threads);
    ASSERT_EQ(pool.num_threads(), threads);
    for (std::int64_t n : {0, 1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 100, 1001}) {
      SCOPED_TRACE("threads " + std::to_string(threads) + ", n " + std::to_string(n));
      std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
      std::vector<std::atomic<int>> chunk_of_thread(static_cast<std::size_t>(threads));
      std::atomic<int> calls{0};
      std::atomic<bool> bad_range{false};
      pool.parallel_for(n, [&](std::int64_t b, std::int64_t e, int t) {
        ++calls;
        if (b < 0 || e > n || b >= e || t < 0 || t >= threads) bad_range = true;
        else ++chunk_of_thread[t];
        for (std::int64_t i = b; i < e && i >= 0 && i < n; ++i) ++hits[i];
      });
      EXPECT_FALSE(bad_range);
      EXPECT_EQ(calls.load(), static_cast<int>(std::min<std::int64_t>(n, threads)));  // no empty chunks
      for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "index " << i;
      for (int t = 0; t < threads; ++t) EXPECT_LE(chunk_of_thread[t].load(), 1) << "thread index " << t;
    }
  }
}

TEST(ThreadPool, ChunksAreContiguousAndBalanced) {
  mf::ThreadPool pool(3);
  std::mutex mu;
  std::vector<std::pair<std::int64_t, std::int64_t>> chunks(3, {-1, -1});
  pool.parallel_for(10, [&](std::int64_t b, std::int64_t e, int t) {
    std::lock_guard<std::mutex> lock(mu);
    chunks[t] = {b, e};
  });
  // chunk t is [n*t/T, n*(t+1)/T): the calling thread takes chunk 0
  EXPECT_EQ(chunks[0], std::make_pair(std::int64_t{0}, std::int64_t{3}));
  EXPECT_EQ(chunks[1], std::make_pair(std::int64_t{3}, std::int64_t{6}));
  EXPECT_EQ(chunks[2], std::make_pair(std::int64_t{6}, std::int64_t{10}));
}

TEST(ThreadPool, RunOnAllRunsOncePerThreadOnDistinctThreads) {
  for (int threads : {1, 2, 3, 8}) {
    mf::ThreadPool pool(threads);
    std::vector<std::atomic<int>> ran(static_cast<std::size_t>(threads));
    std::mutex mu;
    std::set<std::thread::id> ids;
    pool.run_on_all([&](int t) {
      ++ran[t];
      std::lock_guard<std::mutex> lock(mu);
      ids.insert(std::this_thread::get_id());
    });
    for (int t = 0; t < threads; ++t) EXPECT_EQ(ran[t].load(), 1) << "threads " << threads << ", index " << t;
    EXPECT_EQ(static_cast<int>(ids.size()), threads);
    EXPECT_EQ(ids.count(std::this_thread::get_id()), 1u) << "the caller takes part";
  }
}

// Many back-to-back jobs (a training step hands the pool ~20 small ones), some after the
// workers have gone to sleep: every job runs completely before parallel_for returns.
TEST(ThreadPool, ManySmallJobsInARowAllComplete) {
  for (int threads : {2, 3}) {
    mf::ThreadPool pool(threads);
    std::vector<std::int64_t> out(64);
    std::int64_t expected = 0;
    for (int round = 0; round < 600; ++round) {
      pool.parallel_for(64, [&](std::int64_t b, std::int64_t e, int) {
        for (std::int64_t i = b; i < e; ++i) out[i] = round + i;
      });
      std::int64_t s = 0;
      for (std::int64_t v : out) s += v;
      expected = 64LL * round + 63 * 64 / 2;
      ASSERT_EQ(s, expected) << "round " << round << ", threads " << threads;
      if (round % 200 == 199) std::this_thread::sleep_for(std::chrono::milliseconds(5));  // let workers sleep
    }
  }
}

TEST(ThreadPool, ZeroThreadsMeansOne) {
  mf::ThreadPool pool(0);
  EXPECT_EQ(pool.num_threads(), 1);
  int calls = 0;
  pool.parallel_for(5, [&](std::int64_t b, std::int64_t e, int t) {
    ++calls;
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, 5);
    EXPECT_EQ(t, 0);
  });
  EXPECT_EQ(calls, 1);
}

// In a child process: limits the address space to what it uses plus 32 MiB, room for a
// few thread stacks only, then asks for a pool of 1024 threads. Exits 0 when that throws
// std::runtime_error (printing its message), 2 when it does not, 3 when the limit cannot be set.
void start_pool_under_address_limit() {
  alarm(20);  // a hang ends the child by SIGALRM
  long pages = 0;
  if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
    std::fclose(f);
  }
  const rlim_t limit = static_cast<rlim_t>(pages) * static_cast<rlim_t>(sysconf(_SC_PAGESIZE)) + (32u << 20);
  const rlimit r{limit, limit};
  if (pages == 0 || setrlimit(RLIMIT_AS, &r) != 0) std::_Exit(3);
  try {
    mf::ThreadPool pool(1024);  // 1024 stacks of at least 2 MiB each
    std::_Exit(2);
  } catch (const std::runtime_error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::_Exit(0);
  }
}

// A pool whose threads the system will not all start is an error naming the thread that
// failed. The threads already started were left waiting on the pool's condition variable,
// whose destruction then waited for them: the constructor hung.
TEST(ThreadPoolDeathTest, ThreadsTheSystemCannotStartAreAnError) {
  EXPECT_EXIT(start_pool_under_address_limit(), ::testing::ExitedWithCode(0), "could not start thread [0-9]+ of 1024");
}

TEST(ThreadPool, SetNumThreadsValidatesAndResizesTheProcessPool) {
  const int before = mf::num_threads();
  EXPECT_GE(before, 1);
  for (int bad : {0, -1, 1025}) {
    try {
      mf::set_num_threads(bad);
      FAIL() << "set_num_threads(" << bad << ") did not throw";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(bad)), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(mf::num_threads(), before) << "a rejected value leaves the pool alone";
  mf::set_num_threads(3);
  EXPECT_EQ(mf::num_threads(), 3);
  EXPECT_EQ(mf::cpu_pool().num_threads(), 3);
  mf::set_num_threads(1);
  EXPECT_EQ(mf::num_threads(), 1);
  mf::set_num_threads(before);
  EXPECT_EQ(mf::num_threads(), before);
}

// A chunk that throws: parallel_for still waits for every other chunk (they use the
// caller's frame), then rethrows the first exception; the pool stays usable.
TEST(ThreadPool, AnExceptionInAChunkIsRethrownAfterEveryChunkFinished) {
  for (int thrower : {0, 2}) {  // 0: the calling thread's own chunk
    SCOPED_TRACE("chunk " + std::to_string(thrower) + " throws");
    mf::ThreadPool pool(4);
    std::vector<std::atomic<int>> finished(4);
    try {
      pool.parallel_for(4, [&](std::int64_t b, std::int64_t, int) {
        if (b == thrower) throw std::runtime_error("chunk " + std::to_string(b));
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        ++finished[static_cast<std::size_t>(b)];
      });
      FAIL() << "parallel_for did not rethrow";
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()), "chunk " + std::to_string(thrower));
      for (int c = 0; c < 4; ++c)
        EXPECT_EQ(finished[static_cast<std::size_t>(c)].load(), c == thrower ? 0 : 1) << "chunk " << c;
    }
    std::atomic<std::int64_t> sum{0};
    pool.parallel_for(100, [&](std::int64_t b, std::int64_t e, int) {
      for (std::int64_t i = b; i < e; ++i) sum += i;
    });
    EXPECT_EQ(sum.load(), 4950) << "the pool works after the exception";
  }
}

// The same when the chunks run one after the other on the calling thread: a parallel_for
// from inside a task of the same pool (nested) runs its chunks itself, every one of them,
// then rethrows the first exception.
TEST(ThreadPool, AnExceptionInANestedCallsChunkIsRethrownAfterEveryChunkRan) {
  mf::ThreadPool pool(4);
  std::vector<std::vector<int>> ran(4);  // per outer chunk: the inner chunks that finished
  std::vector<std::string> caught(4);
  pool.parallel_for(4, [&](std::int64_t outer, std::int64_t, int) {
    try {
      pool.parallel_for(4, [&](std::int64_t b, std::int64_t, int) {
        if (b == 1 || b == 2) throw std::runtime_error("inner chunk " + std::to_string(b));
        ran[static_cast<std::size_t>(outer)].push_back(static_cast<int>(b));
      });
    } catch (const std::runtime_error& e) {
      caught[static_cast<std::size_t>(outer)] = e.what();
    }
  });
  for (int o = 0; o < 4; ++o) {
    EXPECT_EQ(caught[static_cast<std::size_t>(o)], "inner chunk 1") << "outer chunk " << o;
    EXPECT_EQ(ran[static_cast<std::size_t>(o)], std::vector<int>({0, 3})) << "outer chunk " << o;
  }
}

// Two threads using one pool at once (two models, one per thread), and a task that calls
// parallel_for on its own pool: every chunk of every call runs once, with the right bounds.
// The pool used to take the second caller's task in place of the first's: wrong sums, or a
// worker calling a function whose frame was gone.
TEST(ThreadPool, TwoCallersAtOnceAndNestedCallsEachGetTheirOwnResults) {
  mf::ThreadPool pool(3);
  auto sum_to = [&](std::int64_t n) {
    std::vector<std::int64_t> part(3, 0);
    pool.parallel_for(n, [&](std::int64_t b, std::int64_t e, int t) {
      for (std::int64_t i = b; i < e; ++i) part[static_cast<std::size_t>(t)] += i;
    });
    return part[0] + part[1] + part[2];
  };
  std::atomic<int> wrong{0};
  auto caller = [&](std::int64_t n) {
    for (int rep = 0; rep < 2000; ++rep)
      if (sum_to(n) != n * (n - 1) / 2) ++wrong;
  };
  std::thread a(caller, 3000), b(caller, 7001);
  a.join();
  b.join();
  EXPECT_EQ(wrong.load(), 0);

  // Nested: each outer chunk sums its own range with an inner parallel_for.
  std::vector<std::int64_t> outer(3, 0);
  pool.parallel_for(3, [&](std::int64_t b, std::int64_t, int) {
    std::vector<std::int64_t> inner(3, 0);
    pool.parallel_for(1000, [&](std::int64_t ib, std::int64_t ie, int t) {
      for (std::int64_t i = ib; i < ie; ++i) inner[static_cast<std::size_t>(t)] += i * (b + 1);
    });
    outer[static_cast<std::size_t>(b)] = inner[0] + inner[1] + inner[2];
  });
  for (std::int64_t b = 0; b < 3; ++b) EXPECT_EQ(outer[static_cast<std::size_t>(b)], 499500 * (b + 1)) << b;
}

#if defined(__linux__)
// The default pool size follows the CPUs this process may use (taskset, cpusets), not the
// machine's: with the calling thread pinned to one CPU, available_cpus() is 1.
TEST(ThreadPool, AvailableCpusFollowsTheAffinityMask) {
  cpu_set_t saved;
  ASSERT_EQ(sched_getaffinity(0, sizeof saved, &saved), 0);
  const int all = mf::available_cpus();
  EXPECT_GE(all, 1);
  EXPECT_LE(all, CPU_COUNT(&saved));
  int first = 0;
  while (!CPU_ISSET(first, &saved)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  const int pinned = mf::available_cpus();
  ASSERT_EQ(sched_setaffinity(0, sizeof saved, &saved), 0);
  EXPECT_EQ(pinned, 1);
}
#endif

// ---- random numbers -------------------------------------------------------------------------

// An independent implementation of SplitMix64-seeded xoshiro256** (Blackman & Vigna's
// reference code), so the generator is known to be the published one, not merely
// self-consistent.
struct ReferenceXoshiro {
  std::uint64_t s[4];
  explicit ReferenceXoshiro(std::uint64_t seed) {
    std::uint64_t x = seed;
    for (auto& v : s) {
      std::uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
      v = z ^ (z >> 31);
    }
  }
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::uint64_t next() {
    const std::uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0], s[3] ^= s[1], s[1] ^= s[2], s[0] ^= s[3], s[2] ^= t, s[3] = rotl(s[3], 45);
    return result;
  }
};

TEST(Rng, MatchesTheReferenceGeneratorAndIsDeterministic) {
  // SplitMix64's first output for seed 0 is the published 0xe220a8397b1dcdaf
  ReferenceXoshiro probe(0);
  EXPECT_EQ(probe.s[0], 0xe220a8397b1dcdafULL);
  for (std::uint64_t seed : {0ULL, 1ULL, 42ULL, 0xdeadbeefULL}) {
    mf::Rng a(seed), b(seed);
    ReferenceXoshiro ref(seed);
    for (int i = 0; i < 1000; ++i) {
      const std::uint64_t va = a.next_u64();
      ASSERT_EQ(va, ref.next()) << "seed " << seed << ", draw " << i;
      ASSERT_EQ(va, b.next_u64());
    }
  }
  mf::Rng c(1), d(2);
  int same = 0;
  for (int i = 0; i < 100; ++i) same += c.next_u64() == d.next_u64();
  EXPECT_EQ(same, 0);
}

TEST(Rng, UniformIsOnA24BitGridInTheHalfOpenRange) {
  mf::Rng rng(7);
  double sum = 0;
  constexpr int kDraws = 100000;
  for (int i = 0; i < kDraws; ++i) {
    const float u = rng.uniform01();
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    const float scaled = u * 16777216.0f;
    ASSERT_EQ(scaled, std::floor(scaled));
    sum += u;
    const float x = rng.uniform(-3.0f, 5.0f);
    ASSERT_GE(x, -3.0f);
    ASSERT_LT(x, 5.0f);
  }
  // mean of 1e5 U(0,1): standard error 0.29/sqrt(1e5) = 9e-4, so 0.005 is > 5 sigma
  EXPECT_NEAR(sum / kDraws, 0.5, 0.005);
}

TEST(Rng, BelowStaysInRangeAndIsUnbiased) {
  mf::Rng rng(123);
  for (std::uint64_t n : {1ULL, 2ULL, 3ULL, 7ULL, 10ULL, 1000ULL, (1ULL << 32) + 1, (1ULL << 63) + 1, ~0ULL}) {
    for (int i = 0; i < 2000; ++i) ASSERT_LT(rng.below(n), n) << "n " << n;
  }
  for (int i = 0; i < 100; ++i) ASSERT_EQ(rng.below(1), 0u);
  // chi-square over 10 buckets, 100000 draws: 9 degrees of freedom, P(chi2 > 27.9) = 0.001.
  // With a fixed seed this is deterministic; it fails only if below() is badly biased.
  std::vector<int> count(10, 0);
  constexpr int kDraws = 100000;
  for (int i = 0; i < kDraws; ++i) ++count[rng.below(10)];
  double chi2 = 0;
  for (int c : count) chi2 += (c - kDraws / 10.0) * (c - kDraws / 10.0) / (kDraws / 10.0);
  EXPECT_LT(chi2, 27.9);
  // A range near 2^64, where a plain "x % n" is badly biased: with n = 3 * 2^62 the values
  // [0, 2^62) would get probability 1/2 instead of 1/3.
  const std::uint64_t big = 3ULL << 62;
  int low = 0;
  for (int i = 0; i < 30000; ++i) low += rng.below(big) < (1ULL << 62);
  EXPECT_NEAR(low / 30000.0, 1.0 / 3.0, 0.015);  // 5.5 standard errors (0.0027)
}

}  // namespace
