// parallel.h: the CPU path's thread pool. parallel_for splits [0, n) into one contiguous
// chunk per thread; the calling thread takes chunk 0. Workers spin briefly before they
// sleep, because a training step hands them ~20 small jobs of tens of microseconds each,
// and waking a sleeping thread costs about as much as the job.
//
// The pool's threads, and any thread that calls parallel_for/run_on_all, run with
// denormals flushed to zero (FTZ/DAZ): see parallel.cpp for why.
//
// Any thread may call parallel_for: while the pool works for one caller, another (a second
// model used from another thread) or a task calling it again (nested) runs its chunks
// itself, in order, with the same chunk numbers. One model must still be used from one
// thread at a time (its layers keep the forward pass for the backward pass).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mf {

class ThreadPool {
 public:
  // num_threads < 1 means 1. Throws std::runtime_error when the system cannot start that
  // many threads (a process or memory limit).
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end, thread) for num_threads() contiguous chunks of [0, n), in parallel,
  // and returns when all are done; fewer chunks when n is small: each chunk gets at least
  // `grain` items, so work too small to pay for a thread hand-off stays on the caller.
  // If fn throws, the other chunks still finish; then the first exception is rethrown here.
  void parallel_for(std::int64_t n, const std::function<void(std::int64_t, std::int64_t, int)>& fn,
                    std::int64_t grain = 1);

  // Runs fn(thread) once on each of the num_threads() threads.
  void run_on_all(const std::function<void(int)>& fn);

 private:
  void worker(int index);
  void stop_workers();  // wakes the workers to return and joins them
  void dispatch(int tasks, const std::function<void(int)>& task);
  void run_task(int index);  // (*task_)(index), keeping its exception for dispatch

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> busy_{false};  // a dispatch holds the task slots below
  const std::function<void(int)>* task_ = nullptr;
  int tasks_ = 0;
  std::mutex error_mu_;
  std::exception_ptr error_;  // the first exception a task of this dispatch threw
};

// The CPUs this process may run on: those of its affinity mask (taskset, a cpuset), fewer
// when a cgroup CPU quota allows less (a container's --cpus); at least 1.
int available_cpus();

// The process's CPU pool, sized by set_num_threads (default: available_cpus()).
ThreadPool& cpu_pool();
void set_num_threads(int n);  // re-creates the pool; call before training starts, never while
                              // another thread uses the pool. When the threads cannot be
                              // started, throws (ThreadPool's error) and keeps the old pool
int num_threads();

}  // namespace mf
