// parallel.cpp: the spinning-then-sleeping thread pool of parallel.h.
#include "tensor/parallel.h"

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MF_CPU_RELAX() _mm_pause()
#else
#define MF_CPU_RELAX() ((void)0)
#endif

namespace mf {

namespace {
constexpr int kSpinIterations = 20000;  // ~50-100 us of polling before a worker sleeps

// Flush-to-zero and denormals-are-zero for this thread. Adam's second moments and tiny
// gradients drift into the denormal range, where each operation costs ~100 cycles
// instead of one; values below 1e-38 do not matter to training.
void flush_denormals() {
#if defined(__SSE__) || defined(__x86_64__)
  _mm_setcsr(_mm_getcsr() | 0x8040);  // FTZ (bit 15) | DAZ (bit 6)
#endif
}
}

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker(int index) {
  flush_denormals();
  std::uint64_t seen = 0;
  for (;;) {
    std::uint64_t g = generation_.load(std::memory_order_acquire);
    for (int spin = 0; g == seen && spin < kSpinIterations; ++spin) {
      MF_CPU_RELAX();
      g = generation_.load(std::memory_order_acquire);
    }
    if (g == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      g = generation_.load(std::memory_order_acquire);
    }
    seen = g;
    if (stop_.load()) return;
    if (index < tasks_) (*task_)(index);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::dispatch(int tasks, const std::function<void(int)>& task) {
  flush_denormals();  // the calling thread takes part too
  if (num_threads_ == 1 || tasks <= 1) {
    for (int i = 0; i < tasks; ++i) task(i);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    task_ = &task;
    tasks_ = tasks;
    pending_.store(num_threads_ - 1, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  cv_.notify_all();
  task(0);
  while (pending_.load(std::memory_order_acquire) != 0) MF_CPU_RELAX();
}

void ThreadPool::parallel_for(std::int64_t n, const std::function<void(std::int64_t, std::int64_t, int)>& fn,
                              std::int64_t grain) {
  if (n <= 0) return;
  const int tasks = static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(num_threads_, n / std::max<std::int64_t>(1, grain))));
  dispatch(tasks, [&](int t) {
    const std::int64_t begin = n * t / tasks, end = n * (t + 1) / tasks;
    fn(begin, end, t);
  });
}

void ThreadPool::run_on_all(const std::function<void(int)>& fn) { dispatch(num_threads_, fn); }

namespace {
std::unique_ptr<ThreadPool>& pool_slot() {
  static std::unique_ptr<ThreadPool> pool;
  return pool;
}
int default_threads() {
  const unsigned hc = std::thread::hardware_concurrency();
  return hc == 0 ? 1 : static_cast<int>(hc);
}
}  // namespace

ThreadPool& cpu_pool() {
  auto& p = pool_slot();
  if (!p) p = std::make_unique<ThreadPool>(default_threads());
  return *p;
}

void set_num_threads(int n) {
  if (n < 1 || n > 1024) throw std::invalid_argument("thread count must be 1..1024, got " + std::to_string(n));
  pool_slot() = std::make_unique<ThreadPool>(n);
}

int num_threads() { return cpu_pool().num_threads(); }

}  // namespace mf
