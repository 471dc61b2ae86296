// cuda_emulator.h: a CPU stand-in for the part of CUDA that kernels/*.cu use, so their tests
// (test_kernels_gpu.cpp) also run on a machine without a GPU. translate_launches rewrites
// each `kernel<<<blocks, threads, 0, stream>>>(args)` into `mf::emulator::launch(...)`; this
// header supplies everything else the kernels name.
//
// How a launch runs: its blocks one after another; the threads of a block as real threads,
// all alive at once, so __syncthreads() is a real barrier (pthread_barrier_t) and a warp
// shuffle really exchanges values between the 32 threads of a warp. __shared__ becomes
// `static`: one copy per kernel instantiation, which is per block since blocks run in turn.
// When no thread of block 0 synchronised (an element-wise kernel), the later blocks' threads
// run one after another on one thread instead: the same results without a thread switch
// per emulated thread. A launch is queued on its stream (streams.h): it runs when the stream
// gets to it (in test_kernels_emulated, at once), or when the CUDA graph it was captured into
// is launched.
//
// What it checks: indexing, grid-stride loops, reductions, barriers, shuffles, the f16
// conversions bit for bit (round to nearest even, NaNs made canonical as the hardware does),
// and, under AddressSanitizer, every access against the exact bytes allocated.
// What it cannot: speed, the memory model (threads here see each other's writes sooner
// than a GPU guarantees), fused multiply-adds the GPU compiler may form (tolerances in the
// tests allow for them). cuDNN and cuBLAS are fake_cudnn.cpp and fake_cublas.cpp.
#pragma once
#include <pthread.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tensor/half.h"
#include "test/emulator/streams.h"

// ---- the runtime calls kernels/*.cu make ----
struct CUstream_st;
using cudaStream_t = CUstream_st*;
enum cudaError_t : int { cudaSuccess = 0 };
// A bad launch throws from the launch itself; what this reports is an error that an
// emulated runtime call (fake_cudart.cpp) left behind, as CUDA's does.
inline cudaError_t cudaGetLastError() { return static_cast<cudaError_t>(mf::emulator::take_last_error()); }
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount };
inline cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
// The kernels size some grids by the number of SMs (streams.h says why this many).
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr, int) {
  *value = mf::emulator::kMultiProcessorCount;
  return cudaSuccess;
}
// Queued on the stream like a launch (streams.h): it runs now, or when a captured graph runs.
inline cudaError_t cudaMemsetAsync(void* p, int value, std::size_t bytes, cudaStream_t stream) {
  if (!mf::emulator::enqueue(stream, [=] { std::memset(p, value, bytes); }))
    throw std::runtime_error("emulated memset into an invalidated graph capture");
  return cudaSuccess;
}

// ---- language ----
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
// Each emulated thread is a real thread, so these are thread_local.
inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned x, y;
};
struct alignas(4) uchar4 {
  unsigned char x, y, z, w;
};
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float __fdiv_rn(float a, float b) { return a / b; }
using std::isnan;

// ---- half precision, converting as the hardware does ----
struct __half {
  unsigned short x;
  __half() = default;
  __half(float f);
};
// 4-byte aligned, as CUDA's is: a __half2 load from an odd __half offset is misaligned there,
// and under the sanitizers here too.
struct alignas(4) __half2 {
  __half x, y;
};
static_assert(sizeof(__half2) == 4 && alignof(__half2) == 4, "__half2 is two halves, 4-byte aligned, as in CUDA");
inline __half __ushort_as_half(unsigned short u) {
  __half h;
  h.x = u;
  return h;
}
inline unsigned short __half_as_ushort(__half h) { return h.x; }
// cvt.rn.f16.f32: round to nearest even; any NaN becomes the canonical 0x7fff.
inline __half __float2half_rn(float f) {
  if (std::isnan(f)) return __ushort_as_half(0x7fff);
  return __ushort_as_half(mf::float_to_half(f).bits);
}
inline __half::__half(float f) : x(__float2half_rn(f).x) {}
// cvt.f32.f16: exact; any NaN becomes the canonical 0x7fffffff.
inline float __half2float(__half h) {
  if ((h.x & 0x7c00u) == 0x7c00u && (h.x & 0x3ffu)) return __uint_as_float(0x7fffffffu);
  mf::Half m;
  m.bits = h.x;
  return mf::half_to_float(m);
}
inline __half2 __floats2half2_rn(float a, float b) { return {__float2half_rn(a), __float2half_rn(b)}; }

namespace mf::emulator {

constexpr int kWarp = 32;
constexpr int kMaxThreads = 1024;  // per block, as on every CUDA GPU since 2010

// What the threads of the block being run share: the block barrier, one barrier and one
// exchange slot per lane for each warp (shuffles), and the flag of __syncthreads_or.
struct Block {
  Block(int n, bool run_sequentially)
      : threads(n), warps((n + kWarp - 1) / kWarp), sequential(run_sequentially), warp_barriers(warps), slots(warps) {
    pthread_barrier_init(&barrier, nullptr, static_cast<unsigned>(n));
    for (int w = 0; w < warps; ++w)
      pthread_barrier_init(&warp_barriers[w], nullptr, static_cast<unsigned>(std::min(kWarp, n - kWarp * w)));
  }
  ~Block() {
    pthread_barrier_destroy(&barrier);
    for (auto& b : warp_barriers) pthread_barrier_destroy(&b);
  }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
  int threads, warps;
  bool sequential;                     // threads run one after another: no barrier can work
  std::atomic<bool> synchronised{false};  // a thread reached a barrier or a shuffle
  pthread_barrier_t barrier;
  std::vector<pthread_barrier_t> warp_barriers;
  std::vector<std::array<std::uint64_t, kWarp>> slots;
  std::atomic<int> or_flag{0};
};
inline thread_local Block* this_block = nullptr;
inline thread_local int this_thread = 0;  // linear index in the block
inline std::mutex& atomics_mutex() {
  static std::mutex m;
  return m;
}

// Worker t runs thread t of every block. Workers are created when a block first needs
// them and live until the program ends; launches come from one host thread at a time.
class ThreadPool {
 public:
  static ThreadPool& get() {
    static ThreadPool pool;
    return pool;
  }
  // Runs job(0) .. job(n - 1) on n workers at once and returns when all have.
  void run(int n, const std::function<void(int)>& job) {
    while (static_cast<int>(workers_.size()) < n) {  // as many workers as the widest block
      const int t = static_cast<int>(workers_.size());
      workers_.emplace_back([this, t] { work(t); });
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &job;
      active_ = n;
      finished_ = 0;
      ++generation_;
    }
    start_.notify_all();
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return finished_ == active_; });
  }

 private:
  ThreadPool() = default;
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      ++generation_;
    }
    start_.notify_all();
    for (auto& w : workers_) w.join();
  }
  void work(int t) {
    long seen = 0;
    for (;;) {
      const std::function<void(int)>* job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        start_.wait(lock, [&] { return stop_ || (generation_ != seen && t < active_); });
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      (*job)(t);
      std::lock_guard<std::mutex> lock(mu_);
      if (++finished_ == active_) done_.notify_one();
    }
  }
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_, done_;
  const std::function<void(int)>* job_ = nullptr;
  long generation_ = 0;
  int active_ = 0, finished_ = 0;
  bool stop_ = false;
};

// kernel<<<grid, block, 0, stream>>>(args), with `kernel_call` = [=] { kernel(args); }. A
// configuration the GPU would refuse throws here, where the real launch would fail at
// cudaGetLastError(). The blocks run when the stream runs the launch (streams.h), or when
// the graph it was captured into is launched.
template <class F>
void launch(cudaStream_t stream, dim3 grid, dim3 block, F kernel_call) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)
    throw std::runtime_error("emulated launch: invalid grid " + std::to_string(grid.x) + "x" +
                             std::to_string(grid.y) + "x" + std::to_string(grid.z));
  const long n = static_cast<long>(block.x) * block.y * block.z;
  if (n <= 0 || n > kMaxThreads || block.z > 64)
    throw std::runtime_error("emulated launch: invalid block of " + std::to_string(n) + " threads");
  // Block 0 runs as real threads. If none of them synchronised (no barrier, no shuffle: an
  // element-wise kernel), the other blocks run their threads one after another on this
  // thread, which is what makes the emulation fast enough to train with; a kernel that
  // synchronises in other blocks but not in block 0 fails loudly there (see sync_point).
  const auto run = [=] {
    bool threaded = true;
    for (unsigned bz = 0; bz < grid.z; ++bz)
      for (unsigned by = 0; by < grid.y; ++by)
        for (unsigned bx = 0; bx < grid.x; ++bx) {
          Block shared(static_cast<int>(n), /*sequential=*/!threaded);
          const std::function<void(int)> job = [&](int t) {
            threadIdx = dim3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
            blockIdx = dim3(bx, by, bz);
            blockDim = block;
            gridDim = grid;
            this_block = &shared;
            this_thread = t;
            kernel_call();
          };
          if (threaded) {
            ThreadPool::get().run(static_cast<int>(n), job);
            threaded = shared.synchronised.load();
          } else {
            for (int t = 0; t < n; ++t) job(t);
          }
        }
  };
  if (!enqueue(stream, run)) throw std::runtime_error("emulated launch into an invalidated graph capture");
}

}  // namespace mf::emulator

// ---- barriers, shuffles, atomics ----
namespace mf::emulator {
// Every barrier and shuffle passes here: it marks the block as one that synchronises.
inline Block& sync_point() {
  Block& b = *this_block;
  if (b.sequential)
    throw std::logic_error("emulated kernel synchronises in a later block but not in block 0: "
                           "the emulation cannot run it (cuda_emulator.h, launch)");
  b.synchronised.store(true);
  return b;
}
}  // namespace mf::emulator
inline void __syncthreads() { pthread_barrier_wait(&mf::emulator::sync_point().barrier); }
inline int __syncthreads_or(int predicate) {
  auto* b = &mf::emulator::sync_point();
  __syncthreads();
  if (predicate) b->or_flag.store(1);
  __syncthreads();
  const int result = b->or_flag.load();
  __syncthreads();
  if (mf::emulator::this_thread == 0) b->or_flag.store(0);
  return result;
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
// Every lane of the warp must take part (mask 0xffffffff), as in all of our kernels.
template <class T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask) {
  using namespace mf::emulator;
  static_assert(sizeof(T) <= 8, "shuffle of a value wider than 8 bytes");
  if (mask != 0xffffffffu) throw std::runtime_error("emulated shuffle: only full-warp masks are emulated");
  sync_point();
  const int lane = this_thread % kWarp, warp = this_thread / kWarp;
  if ((lane ^ lane_mask) >= std::min(kWarp, this_block->threads - kWarp * warp))
    throw std::runtime_error("emulated shuffle: source lane outside the warp");
  auto& slots = this_block->slots[warp];
  std::memcpy(&slots[lane], &value, sizeof value);
  pthread_barrier_wait(&this_block->warp_barriers[warp]);  // every lane has written
  T result;
  std::memcpy(&result, &slots[lane ^ lane_mask], sizeof result);
  pthread_barrier_wait(&this_block->warp_barriers[warp]);  // every lane has read
  return result;
}
inline float atomicAdd(float* p, float v) {
  std::lock_guard<std::mutex> lock(mf::emulator::atomics_mutex());
  const float old = *p;
  *p = old + v;
  return old;
}
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  std::lock_guard<std::mutex> lock(mf::emulator::atomics_mutex());
  const unsigned old = *p;
  *p = old + v;
  return old;
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  std::lock_guard<std::mutex> lock(mf::emulator::atomics_mutex());
  const unsigned long long old = *p;
  *p = old + v;
  return old;
}
inline float atomicExch(float* p, float v) {
  std::lock_guard<std::mutex> lock(mf::emulator::atomics_mutex());
  const float old = *p;
  *p = v;
  return old;
}
