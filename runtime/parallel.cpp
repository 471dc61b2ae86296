// parallel.cpp: the spinning-then-sleeping thread pool of parallel.h.
#include "runtime/parallel.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>

#if defined(__linux__)
#include <sched.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MF_CPU_RELAX() _mm_pause()
#else
#define MF_CPU_RELAX() ((void)0)
#endif

namespace mf {

namespace {
constexpr int kSpinIterations = 20000;  // ~50-100 us of polling before a worker sleeps

// One turn of a polling loop. Mostly a pause; every 256th turn gives the core away, so that
// with more threads than cores (--threads 32 on two) the thread being waited for gets to run
// instead of waiting for the poller's time slice to end.
inline void relax(int spin) {
  if ((spin & 255) == 255) std::this_thread::yield();
  else MF_CPU_RELAX();
}

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
  workers_.reserve(static_cast<std::size_t>(num_threads_ - 1));
  try {
    for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { worker(i); });
  } catch (const std::system_error& e) {
    // The system gave no more threads (a process or memory limit). The ones started are
    // waiting on cv_: they must be stopped and joined before this object is unwound, or
    // the condition variable's destruction waits for them forever.
    const std::size_t started = workers_.size() + 1;  // the caller's thread is thread 0
    stop_workers();
    throw std::runtime_error("thread pool: could not start thread " + std::to_string(started + 1) + " of " +
                             std::to_string(num_threads_) + " (" + e.what() + "); use fewer threads");
  }
}

ThreadPool::~ThreadPool() { stop_workers(); }

void ThreadPool::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

namespace {
// The pool whose worker this thread is, if any: a task that calls parallel_for on its own
// pool runs that inner loop itself (the workers are all busy with the outer one).
thread_local const ThreadPool* t_worker_of = nullptr;
}  // namespace

void ThreadPool::worker(int index) {
  t_worker_of = this;
  flush_denormals();
  std::uint64_t seen = 0;
  for (;;) {
    std::uint64_t g = generation_.load(std::memory_order_acquire);
    for (int spin = 0; g == seen && spin < kSpinIterations; ++spin) {
      relax(spin);
      g = generation_.load(std::memory_order_acquire);
    }
    if (g == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      g = generation_.load(std::memory_order_acquire);
    }
    seen = g;
    if (stop_.load()) return;
    if (index < tasks_) run_task(index);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run_task(int index) {
  try {
    (*task_)(index);
  } catch (...) {
    std::lock_guard<std::mutex> lock(error_mu_);
    if (!error_) error_ = std::current_exception();
  }
}

void ThreadPool::dispatch(int tasks, const std::function<void(int)>& task) {
  flush_denormals();  // the calling thread takes part too
  // The pool has one set of task slots, so one caller at a time. Another thread calling
  // while it is busy (two models used from two threads), or a task calling parallel_for on
  // its own pool, runs its chunks itself, one after the other: the same results, only not
  // in parallel. (Without this the second caller overwrote the first one's task.)
  const bool nested = t_worker_of == this || busy_.exchange(true, std::memory_order_acquire);
  if (num_threads_ == 1 || tasks <= 1 || nested) {
    if (!nested) busy_.store(false, std::memory_order_release);
    std::exception_ptr first;  // as below: every chunk runs, then the first exception
    for (int i = 0; i < tasks; ++i) {
      try {
        task(i);
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    if (first) std::rethrow_exception(first);
    return;
  }
  struct Release {
    std::atomic<bool>& busy;
    ~Release() { busy.store(false, std::memory_order_release); }
  } release{busy_};
  {
    std::lock_guard<std::mutex> lock(mu_);
    task_ = &task;
    tasks_ = tasks;
    pending_.store(num_threads_ - 1, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  cv_.notify_all();
  run_task(0);
  // Every worker must be done with `task`, which lives in the caller's frame, before this
  // returns, even when a task threw: only then is the first exception passed on.
  for (int spin = 0; pending_.load(std::memory_order_acquire) != 0; ++spin) relax(spin);
  task_ = nullptr;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
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
}  // namespace

int available_cpus() {
  int n = 0;
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
  // cgroup v2 quota ("max 100000" when none): a container limited to 1.5 CPUs gets 2.
  if (std::FILE* f = std::fopen("/sys/fs/cgroup/cpu.max", "r")) {
    long long quota = 0, period = 0;
    if (std::fscanf(f, "%lld %lld", &quota, &period) == 2 && quota > 0 && period > 0) {
      const long long cpus = (quota + period - 1) / period;
      if (n == 0 || cpus < n) n = static_cast<int>(cpus);
    }
    std::fclose(f);
  }
#endif
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, n);
}

// Creating the pool on first use races when two threads start at once.
static std::mutex& pool_slot_mu() {
  static std::mutex mu;
  return mu;
}

ThreadPool& cpu_pool() {
  std::lock_guard<std::mutex> lock(pool_slot_mu());
  auto& p = pool_slot();
  if (!p) p = std::make_unique<ThreadPool>(available_cpus());
  return *p;
}

void set_num_threads(int n) {
  if (n < 1 || n > 1024) throw std::invalid_argument("thread count must be 1..1024, got " + std::to_string(n));
  std::lock_guard<std::mutex> lock(pool_slot_mu());
  pool_slot() = std::make_unique<ThreadPool>(n);
}

int num_threads() { return cpu_pool().num_threads(); }

}  // namespace mf
