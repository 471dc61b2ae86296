// cuda_emulator.h: a CPU stand-in for the part of CUDA that kernels/*.cu use, so their tests
// (test_kernels_gpu.cpp) also run on a machine without a GPU. translate_launches rewrites
// each `kernel<<<blocks, threads, 0, stream>>>(args)` into `mf::emulator::launch(...)`; this
// header supplies everything else the kernels name.
//
// How a launch runs: its blocks in a shuffled order, several at once (launch, below); the
// threads of a block as real threads, so __syncthreads() is a real barrier and a warp
// shuffle really exchanges values between the 32 threads of a warp. Between two barriers
// one warp of a block runs at a time, the warps in a shuffled order (Block). Each block has
// its own __shared__ variables (translate_launches rewrites their declarations), filled
// with poison when the block starts. When no thread of the first block synchronised (an
// element-wise kernel), the later blocks' threads run one after another instead: the same
// results without a thread switch per emulated thread. A launch is queued on its stream
// (streams.h): it runs when the stream gets to it (in test_kernels_emulated, at once), or
// when the CUDA graph it was captured into is launched.
//
// What it checks: indexing, grid-stride loops, reductions, barriers (a missing one lets a
// warp read poison), reductions across blocks (one that trusts the order blocks run or
// finish in, or the order atomics land in, gets other bits or wrong sums), shuffles, the
// f16 conversions bit for bit (round to nearest even, NaNs made canonical as the hardware
// does), and, under AddressSanitizer, every access against the exact bytes allocated.
// What it cannot: speed, the memory model (threads here see each other's writes sooner
// than a GPU guarantees: a missing __threadfence cannot show, see __threadfence below), fused multiply-adds the GPU compiler may form (tolerances in the
// tests allow for them). cuDNN and cuBLAS are fake_cudnn.cpp and fake_cublas.cpp.
#pragma once
#include <pthread.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <new>
#include <random>
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
// __shared__ declarations are rewritten by translate_launches (block_shared, below); one
// left over would be shared by concurrent blocks, so it does not compile.
#define __shared__ __shared___not_translated_by_translate_launches

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

// ---- the schedule: which block runs when, which warp runs first ----
// A GPU runs a grid's blocks in no promised order, several at once, and a block's warps in
// any order between two barriers. The emulation picks one such schedule per launch from a
// seed: MF_EMULATED_SEED (a number) repeats a run's schedules; unset, each run draws its own
// and says which on its first launch. MF_EMULATED_BLOCKS (default 4) blocks run at once.
inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// A number from the environment variable `name`, `fallback` when unset; anything else that
// is not a whole number in [lo, hi] stops the program (a typo would test nothing).
inline std::uint64_t env_number(const char* name, std::uint64_t fallback, std::uint64_t lo, std::uint64_t hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  errno = 0;
  const unsigned long long x = std::strtoull(v, &end, 10);
  if (errno || *end || *v == '-' || x < lo || x > hi) {
    std::fprintf(stderr, "cuda emulator: %s=%s is not a whole number from %llu to %llu\n", name, v,
                 static_cast<unsigned long long>(lo), static_cast<unsigned long long>(hi));
    std::abort();
  }
  return x;
}
inline std::uint64_t schedule_seed() {
  static const std::uint64_t seed = [] {
    const std::uint64_t drawn = (static_cast<std::uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
    const bool given = std::getenv("MF_EMULATED_SEED") && *std::getenv("MF_EMULATED_SEED");
    const std::uint64_t s = env_number("MF_EMULATED_SEED", drawn % 1000000007ull, 0, ~0ull);
    if (!given)
      std::fprintf(stderr, "cuda emulator: blocks and warps run in shuffled orders, seed %llu "
                           "(MF_EMULATED_SEED=%llu runs the same orders again)\n",
                   static_cast<unsigned long long>(s), static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}
inline int concurrent_blocks() {
  static const int n = static_cast<int>(env_number("MF_EMULATED_BLOCKS", 4, 1, 64));
  return n;
}
// Launch k of the program gets its own seed: the schedules differ from launch to launch.
inline std::uint64_t next_launch_seed() {
  static std::atomic<std::uint64_t> launches{0};
  return splitmix64(schedule_seed() ^ splitmix64(launches.fetch_add(1)));
}
// Fisher-Yates with a splitmix stream.
inline void shuffle(std::vector<int>& v, std::uint64_t seed) {
  for (std::size_t i = v.size(); i > 1; --i) {
    seed = splitmix64(seed);
    std::swap(v[i - 1], v[static_cast<std::size_t>(seed % i)]);
  }
}

// What the threads of one block share: its __shared__ variables, the turns its warps take,
// one barrier and one exchange slot per lane for each warp (shuffles), and the flag of
// __syncthreads_or.
//
// Warps take turns: between two __syncthreads() only one warp of the block runs (its 32
// threads at once, so shuffles work), the warps in a shuffled order that is drawn again at
// every barrier. A GPU may schedule a block so, which makes a missing __syncthreads() show:
// the warp that reads what another writes may run first and read the poison that fresh
// __shared__ memory is filled with (0xff bytes: NaN in f32 and f16, -1 in integers).
struct Block {
  Block(int n, bool run_sequentially, std::uint64_t block_seed)
      : threads(n), warps((n + kWarp - 1) / kWarp), sequential(run_sequentially), seed(block_seed),
        live(warps), arrived(warps, 0), turns(warps), warp_barriers(warps), slots(warps) {
    for (int w = 0; w < warps; ++w) {
      live[w] = std::min(kWarp, n - kWarp * w);
      pthread_barrier_init(&warp_barriers[w], nullptr, static_cast<unsigned>(live[w]));
    }
    new_phase();
  }
  ~Block() {
    for (auto& b : warp_barriers) pthread_barrier_destroy(&b);
  }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;

  // The storage of the __shared__ variable `key` (one per declaration, see block_shared),
  // made and poisoned by the first thread that asks.
  // At least 16-byte aligned, as a float4 or uint4 in shared memory needs, more where the
  // type asks (a wmma tile's 32 bytes); exactly `bytes` long, so that AddressSanitizer sees
  // an access past the variable's end.
  void* shared_memory(const void* key, std::size_t bytes, std::size_t align) {
    std::lock_guard<std::mutex> lock(shared_mu);
    for (auto& [k, mem] : shared)
      if (k == key) return mem.get();
    const std::align_val_t a{std::max<std::size_t>(align, 16)};
    SharedBytes mem(::operator new(bytes, a), [a](void* m) { ::operator delete(m, a); });
    std::memset(mem.get(), 0xff, bytes);
    shared.emplace_back(key, std::move(mem));
    return shared.back().second.get();
  }

  // ---- warp turns (threaded blocks only) ----
  // A thread starts when its warp's turn comes.
  void enter(int warp) {
    std::unique_lock<std::mutex> lock(mu);
    turns[warp].wait(lock, [&] { return order[turn] == warp; });
  }
  // __syncthreads(): the warp's turn ends when all its live threads are here; the barrier
  // opens when every warp's has.
  void barrier(int warp) {
    std::unique_lock<std::mutex> lock(mu);
    const long at = phase;
    if (++arrived[warp] == live[warp]) pass_turn();
    turns[warp].wait(lock, [&] { return phase != at && order[turn] == warp; });
  }
  // A thread that returns no longer holds up its warp or the barrier (as on sm_70 and later).
  void exit(int warp) {
    std::unique_lock<std::mutex> lock(mu);
    if (--live[warp] == arrived[warp]) pass_turn();
  }

  int threads, warps;
  bool sequential;                        // threads run one after another: no barrier can work
  std::atomic<bool> synchronised{false};  // a thread reached a barrier or a shuffle
  std::uint64_t seed;
  std::mutex mu;
  std::vector<int> live, arrived, order;  // per warp: threads not returned, at the barrier; turn order
  std::size_t turn = 0;
  long phase = 0;
  std::vector<std::condition_variable> turns;
  std::vector<pthread_barrier_t> warp_barriers;
  std::vector<std::array<std::uint64_t, kWarp>> slots;
  std::atomic<int> or_flag{0};
  std::mutex shared_mu;
  using SharedBytes = std::unique_ptr<void, std::function<void(void*)>>;
  std::vector<std::pair<const void*, SharedBytes>> shared;

 private:
  // Under mu: the next warp that still has live threads, or the next phase.
  void pass_turn() {
    for (++turn; turn < order.size() && live[order[turn]] == 0; ++turn) {
    }
    if (turn == order.size()) {
      ++phase;
      new_phase();
      if (order.empty()) return;  // every thread has returned
    }
    turns[order[turn]].notify_all();
  }
  void new_phase() {
    order.clear();
    for (int w = 0; w < warps; ++w)
      if (live[w] > 0) order.push_back(w);
    std::fill(arrived.begin(), arrived.end(), 0);
    shuffle(order, splitmix64(seed + static_cast<std::uint64_t>(phase)));
    turn = 0;
  }
};
inline thread_local Block* this_block = nullptr;
inline thread_local int this_thread = 0;  // linear index in the block
inline std::mutex& atomics_mutex() {
  static std::mutex m;
  return m;
}

// __shared__ T name; becomes `auto& name = block_shared<T>([] {});` (translate_launches):
// the lambda's type, unique to the declaration (and to each instantiation of a template
// kernel), gives the variable its key; each block has its own copy.
template <class T, class Tag>
T& block_shared(Tag) {
  static const char key = 0;
  return *static_cast<T*>(this_block->shared_memory(&key, sizeof(T), alignof(T)));
}

// Runs job(0) .. job(n - 1) on n threads at once, returning when all have. Worker t runs
// job(t) of every call; workers are created when first needed and live until the program
// ends. One caller at a time per pool.
class ThreadPool {
 public:
  ThreadPool() = default;
  void run(int n, const std::function<void(int)>& job) {
    while (static_cast<int>(workers_.size()) < n) {
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
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      ++generation_;
    }
    start_.notify_all();
    for (auto& w : workers_) w.join();
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

 private:
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
// The threads of the block in slot s (pools()[s]) and the slots' drivers; launches come
// from one host thread at a time.
struct Pools {
  std::vector<std::unique_ptr<ThreadPool>> blocks;
  ThreadPool drivers;
};
inline Pools& pools() {
  static Pools p;
  while (static_cast<int>(p.blocks.size()) < concurrent_blocks()) p.blocks.push_back(std::make_unique<ThreadPool>());
  return p;
}

// Runs block `b` (linear index) of a launch on block slot `slot`: as real threads taking warp
// turns, or, for a kernel that does not synchronise, one thread after another.
template <class F>
bool run_block(long b, dim3 grid, dim3 block, long n, bool threaded, std::uint64_t seed, int slot,
               const F& kernel_call) {
  const dim3 at(static_cast<unsigned>(b % grid.x), static_cast<unsigned>((b / grid.x) % grid.y),
                static_cast<unsigned>(b / (static_cast<long>(grid.x) * grid.y)));
  Block shared(static_cast<int>(n), !threaded, splitmix64(seed ^ static_cast<std::uint64_t>(b)));
  const std::function<void(int)> job = [&](int t) {
    threadIdx = dim3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
    blockIdx = at;
    blockDim = block;
    gridDim = grid;
    this_block = &shared;
    this_thread = t;
    if (threaded) shared.enter(t / kWarp);
    kernel_call();
    if (threaded) shared.exit(t / kWarp);
  };
  if (threaded) pools().blocks[static_cast<std::size_t>(slot)]->run(static_cast<int>(n), job);
  else
    for (int t = 0; t < n; ++t) job(t);
  return shared.synchronised.load();
}

// kernel<<<grid, block, 0, stream>>>(args), with `kernel_call` = [=] { kernel(args); }. A
// configuration the GPU would refuse throws here, where the real launch would fail at
// cudaGetLastError(). The blocks run when the stream runs the launch (streams.h), or when
// the graph it was captured into is launched: in a shuffled order, concurrent_blocks() at a
// time, so that atomics land in a different order at every launch and a block cannot count
// on another having finished, or on finishing last because its index is the largest.
template <class F>
void launch(cudaStream_t stream, dim3 grid, dim3 block, F kernel_call) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)
    throw std::runtime_error("emulated launch: invalid grid " + std::to_string(grid.x) + "x" +
                             std::to_string(grid.y) + "x" + std::to_string(grid.z));
  const long n = static_cast<long>(block.x) * block.y * block.z;
  if (n <= 0 || n > kMaxThreads || block.z > 64)
    throw std::runtime_error("emulated launch: invalid block of " + std::to_string(n) + " threads");
  // The first block (in the shuffled order) runs alone as real threads. If none of them
  // synchronised (no barrier, no shuffle: an element-wise kernel), the other blocks run
  // their threads one after another, which is what makes the emulation fast enough to train
  // with; a kernel that synchronises in other blocks but not in the first fails loudly
  // there (see sync_point).
  const auto run = [=] {
    const std::uint64_t seed = next_launch_seed();
    const long blocks = static_cast<long>(grid.x) * grid.y * grid.z;
    std::vector<int> order;
    if (blocks > 1) {
      order.resize(static_cast<std::size_t>(blocks));
      for (long b = 0; b < blocks; ++b) order[static_cast<std::size_t>(b)] = static_cast<int>(b);
      shuffle(order, seed);
    }
    const auto block_at = [&](long i) { return blocks > 1 ? order[static_cast<std::size_t>(i)] : 0L; };
    const bool threaded = run_block(block_at(0), grid, block, n, true, seed, 0, kernel_call);
    if (blocks == 1) return;
    std::atomic<long> next{1};
    const int slots = static_cast<int>(std::min<long>(concurrent_blocks(), blocks - 1));
    std::mutex error_mu;
    std::exception_ptr error;  // the first block that threw, rethrown here once all stopped
    const std::function<void(int)> drive = [&](int slot) {
      try {
        for (long i; (i = next.fetch_add(1)) < blocks;)
          run_block(block_at(i), grid, block, n, threaded, seed, slot, kernel_call);
      } catch (...) {
        next.store(blocks);
        std::lock_guard<std::mutex> lock(error_mu);
        if (!error) error = std::current_exception();
      }
    };
    if (slots == 1) drive(0);
    else pools().drivers.run(slots, drive);
    if (error) std::rethrow_exception(error);
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
    throw std::logic_error("emulated kernel synchronises in a later block but not in the first: "
                           "the emulation cannot run it (cuda_emulator.h, launch)");
  b.synchronised.store(true);
  return b;
}
}  // namespace mf::emulator
inline void __syncthreads() {
  mf::emulator::sync_point().barrier(mf::emulator::this_thread / mf::emulator::kWarp);
}
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
// Host stores become visible to other threads in program order (x86-TSO), and every
// emulated atomic takes a lock, itself a full fence: a missing __threadfence() before a
// plain store is published through an atomic cannot show here. It is still compiled as one.
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
// __syncwarp(): the warp's lanes wait for each other, and see each other's writes to
// shared memory from before it. Full warps only, as the shuffles below.
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  using namespace mf::emulator;
  if (mask != 0xffffffffu) throw std::runtime_error("emulated __syncwarp: only full-warp masks are emulated");
  sync_point();
  pthread_barrier_wait(&this_block->warp_barriers[this_thread / kWarp]);
}
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
