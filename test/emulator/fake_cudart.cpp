// fake_cudart.cpp: the CUDA runtime calls microflow makes, on the CPU, for the emulated GPU
// tests (test/emulator/CMakeLists.txt). The layers' GPU code compiles against the real
// <cuda_runtime.h> and links this file instead of libcudart; fake_cublas.cpp and
// fake_cudnn.cpp stand in for cuBLAS and cuDNN the same way, and cuda_emulator.h runs the
// kernels.
//
// What it emulates:
// - Device memory: host memory, aligned to 256 bytes, filled with garbage, from a device of
//   16 GiB. Copies and memsets are checked against the allocations they touch: a
//   "host-to-device" copy into host memory, or one that runs past the end of an allocation,
//   fails as the real call does (cudaErrorInvalidValue).
// - Streams and events, in one of the orders a GPU may run them (streams.h): by default work
//   waits on its stream until something makes it run (a synchronisation, a blocking copy, a
//   wait of another stream that needs it), so that a missing wait, between two streams or
//   between a stream and the host, reads or writes memory before the work it should follow
//   has run. Copies to and from pinned host memory run with their stream, as DMA does; a copy
//   from pageable memory reads it at the call, as the driver's staging does.
// - Graph capture, with CUDA's rules: the work queued on a capturing stream is recorded, not
//   run, and runs when the instantiated graph is launched. A call that may not be made while
//   the calling thread captures (cudaMalloc, cudaFree, cudaMemcpy, synchronising with the
//   capturing stream or the device) fails with cudaErrorStreamCaptureUnsupported and
//   invalidates the capture, so that cudaStreamEndCapture then fails with
//   cudaErrorStreamCaptureInvalidated. Waiting, inside a capture, on an event recorded
//   outside it fails with cudaErrorStreamCaptureIsolation.
// What it does not: two streams' work at the same time (an order is chosen, streams.h),
// timings (an event's time is the host clock when its stream gets to it), more than one
// device.
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "test/emulator/streams.h"

namespace {

using Work = std::vector<std::function<void()>>;

struct Capture {
  CUstream_st* origin = nullptr;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;
  std::vector<CUstream_st*> streams;  // the origin and every stream that joined it
  Work work;
  bool invalidated = false;
  bool ended = false;
};

// The work queued on one stream (or on the legacy default stream) that has not run yet.
// `queued` and `done` count the items since the stream was made: a point in the stream's
// work is a count, and it has been reached once `done` is at least that count.
struct Queue {
  std::deque<std::function<void()>> pending;
  std::uint64_t queued = 0, done = 0;
  bool running = false;  // one of its items runs now
};

// When an event's stream got to it, set by the work item its record queued.
struct Stamp {
  bool reached = false;
  std::chrono::steady_clock::time_point time;
};

}  // namespace

struct CUstream_st {
  unsigned flags = 0;
  std::shared_ptr<Capture> capture;  // set while the stream takes part in a capture
  std::shared_ptr<Queue> queue = std::make_shared<Queue>();
};
struct CUevent_st {
  unsigned flags = 0;
  bool recorded = false;
  std::shared_ptr<Queue> queue;  // where it was last recorded outside a capture, and
  std::uint64_t mark = 0;        // the point of that queue's work it stands for
  std::shared_ptr<Stamp> stamp;
  std::shared_ptr<Capture> capture;  // the capture it was last recorded in, if any
};
struct CUgraph_st {
  Work work;
};
struct CUgraphExec_st {
  Work work;
};

namespace {

constexpr std::size_t kDeviceBytes = std::size_t{16} << 30;

std::mutex& mu() {
  static std::mutex m;
  return m;
}
// Everything below is guarded by mu().
std::map<const char*, std::size_t>& allocations() {  // device pointer -> bytes
  static std::map<const char*, std::size_t> m;
  return m;
}
std::size_t allocated = 0;
std::map<const char*, std::size_t>& pinned() {  // cudaMallocHost pointer -> bytes
  static std::map<const char*, std::size_t> m;
  return m;
}
std::set<Capture*>& captures() {  // the captures in progress
  static std::set<Capture*> s;
  return s;
}

thread_local cudaError_t last_error = cudaSuccess;
thread_local int current_device = 0;

cudaError_t fail(cudaError_t e) {
  last_error = e;
  return e;
}

std::atomic<bool> fail_instantiate{false};  // fail_next_graph_instantiate()

// Where [p, p + bytes) lies among the allocations of `m` (start -> bytes): 0 outside them,
// 1 inside one, -1 starting in one and running past its end. Caller holds mu().
int range_in(const std::map<const char*, std::size_t>& m, const void* p, std::size_t bytes) {
  const char* q = static_cast<const char*>(p);
  auto it = m.upper_bound(q);
  if (it == m.begin()) return 0;
  --it;
  if (q >= it->first + it->second) return 0;
  return q + bytes <= it->first + it->second ? 1 : -1;
}
// True when [p, p + bytes) lies inside one cudaMallocHost allocation. Caller holds mu().
bool pinned_range(const void* p, std::size_t bytes) { return range_in(pinned(), p, bytes) == 1; }

// ---- the order work runs in (streams.h) ----

mf::emulator::Order order_from_environment() {
  const char* v = std::getenv("MF_EMULATED_STREAMS");
  const std::string s = v ? v : "";
  if (s.empty() || s == "deferred") return mf::emulator::Order::kDeferred;
  if (s == "others-first") return mf::emulator::Order::kOthersFirst;
  if (s == "immediate") return mf::emulator::Order::kImmediate;
  std::fprintf(stderr, "MF_EMULATED_STREAMS=%s: expected deferred, others-first or immediate\n", s.c_str());
  std::abort();
}
std::atomic<mf::emulator::Order>& current_order() {
  static std::atomic<mf::emulator::Order> o{order_from_environment()};
  return o;
}

// The legacy default stream's queue, and every queue that may hold work: those of the
// streams alive and of destroyed streams whose work has not run yet. Guarded by mu().
const std::shared_ptr<Queue>& legacy_queue() {
  static const std::shared_ptr<Queue> q = std::make_shared<Queue>();
  return q;
}
std::set<CUstream_st*>& streams_alive() {
  static std::set<CUstream_st*> s;
  return s;
}
std::vector<std::shared_ptr<Queue>>& orphans() {
  static std::vector<std::shared_ptr<Queue>> v;
  return v;
}
std::shared_ptr<Queue> queue_of(CUstream_st* s) { return s ? s->queue : legacy_queue(); }

// Every queue with its current end, to run up to (caller does not hold mu()).
std::vector<std::pair<std::shared_ptr<Queue>, std::uint64_t>> all_queues() {
  std::lock_guard<std::mutex> lock(mu());
  std::vector<std::pair<std::shared_ptr<Queue>, std::uint64_t>> v;
  v.emplace_back(legacy_queue(), legacy_queue()->queued);
  for (CUstream_st* s : streams_alive()) v.emplace_back(s->queue, s->queue->queued);
  for (const auto& q : orphans()) v.emplace_back(q, q->queued);
  return v;
}

// One thread at a time runs queued work: the device. Recursive, because an item that waits
// for another stream runs that stream's work itself.
std::recursive_mutex& device_mu() {
  static std::recursive_mutex m;
  return m;
}

// Runs q's work until `mark` items of it have run (caller does not hold mu()). An item that
// throws (an emulated kernel's own check) still counts as run.
void run_until(const std::shared_ptr<Queue>& q, std::uint64_t mark) {
  std::lock_guard<std::recursive_mutex> device(device_mu());
  for (;;) {
    std::function<void()> work;
    {
      std::lock_guard<std::mutex> lock(mu());
      if (q->done >= mark) return;
      // Only a wait for work queued after the waiting item could get here: CUDA cannot
      // express one (an event stands for work queued before it), so the emulation is wrong.
      if (q->running) throw std::logic_error("emulated streams: work waits for work queued after it");
      work = std::move(q->pending.front());
      q->pending.pop_front();
      q->running = true;
    }
    struct Ran {
      Queue& q;
      ~Ran() {
        std::lock_guard<std::mutex> lock(mu());
        q.running = false;
        ++q.done;
      }
    } ran{*q};
    work();
  }
}

// What a synchronisation with `mark` of q's work does: runs it, and in kOthersFirst first
// everything the other streams have queued (caller does not hold mu()).
void synchronize(const std::shared_ptr<Queue>& q, std::uint64_t mark) {
  if (current_order() == mf::emulator::Order::kOthersFirst)
    for (const auto& [other, end] : all_queues())
      if (other != q) run_until(other, end);
  run_until(q, mark);
}
void synchronize_all() {
  for (const auto& [q, end] : all_queues()) run_until(q, end);
  std::lock_guard<std::mutex> lock(mu());
  auto& o = orphans();
  for (auto it = o.begin(); it != o.end();) it = (*it)->done == (*it)->queued ? o.erase(it) : it + 1;
}

// A work item that waits for the first `mark` items of t.
std::function<void()> wait_for(std::shared_ptr<Queue> t, std::uint64_t mark) {
  return [t = std::move(t), mark] { run_until(t, mark); };
}

// Queues `work` on stream s (null: the legacy default stream), after the waits the legacy
// stream implies: its work follows all the work queued on blocking streams (those made
// without cudaStreamNonBlocking), and theirs follows its. Returns the point after `work`.
// Caller holds mu().
std::uint64_t push(CUstream_st* s, std::function<void()> work) {
  Queue& q = *queue_of(s);
  const auto wait_for_all_of = [&q](const std::shared_ptr<Queue>& t) {
    if (t->done == t->queued) return;  // nothing of it left to wait for
    q.pending.push_back(wait_for(t, t->queued));
    ++q.queued;
  };
  const auto blocking = [](const CUstream_st* b) { return !(b->flags & cudaStreamNonBlocking); };
  if (!s) {
    for (CUstream_st* b : streams_alive())
      if (blocking(b)) wait_for_all_of(b->queue);
  } else if (blocking(s)) {
    wait_for_all_of(legacy_queue());
  }
  q.pending.push_back(std::move(work));
  return ++q.queued;
}

// Queues `work` on s outside any capture, and in kImmediate runs it now (caller does not
// hold mu()). Returns where it stands in s's work.
std::uint64_t submit(CUstream_st* s, std::function<void()> work) {
  std::shared_ptr<Queue> q;
  std::uint64_t mark = 0;
  {
    std::lock_guard<std::mutex> lock(mu());
    q = queue_of(s);
    mark = push(s, std::move(work));
  }
  if (current_order() == mf::emulator::Order::kImmediate) run_until(q, mark);
  return mark;
}

// The work of a copy between host and device memory. Pageable host memory is read now: the
// driver stages it before the call returns. Pinned memory is read or written when the
// stream gets to the copy, as the GPU's DMA does; so is pageable memory that receives a copy
// (for that direction CUDA says only that the call "might be synchronous").
std::function<void()> copy_work(void* dst, const void* src, std::size_t bytes, bool stage_source) {
  if (stage_source) {
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                      static_cast<const char*>(src) + bytes);
    return [dst, staged] {
      if (!staged->empty()) std::memcpy(dst, staged->data(), staged->size());
    };
  }
  return [=] {
    if (bytes) std::memmove(dst, src, bytes);
  };
}

// The capture the calling thread is making in a mode that forbids it unsafe calls
// (Global or ThreadLocal: ours), or null. Caller holds mu().
Capture* strict_capture_of_this_thread() {
  for (Capture* c : captures())
    if (c->thread == std::this_thread::get_id() && c->mode != cudaStreamCaptureModeRelaxed) return c;
  return nullptr;
}
// An unsafe call made while the calling thread captures: the call fails and the capture is
// invalidated. Caller holds mu().
bool refuse_unsafe_call() {
  Capture* c = strict_capture_of_this_thread();
  if (!c) return false;
  c->invalidated = true;
  return true;
}

// Where [p, p + bytes) lies: 0 outside device memory, 1 inside one allocation, -1 starting
// in an allocation and running past its end. Caller holds mu().
int device_range(const void* p, std::size_t bytes) { return range_in(allocations(), p, bytes); }

bool copy_allowed(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  const int d = device_range(dst, bytes), s = device_range(src, bytes);
  if (d < 0 || s < 0) return false;  // runs past the end of an allocation
  // CUDA's copies have memcpy's contract, not memmove's: on the device, ranges that overlap
  // give undefined results. Refused here, so that such a copy is found.
  const char* dp = static_cast<const char*>(dst);
  const char* sp = static_cast<const char*>(src);
  if (d == 1 && s == 1 && bytes > 0 && dp < sp + bytes && sp < dp + bytes) return false;
  switch (kind) {
    case cudaMemcpyHostToDevice: return d == 1 && s == 0;
    case cudaMemcpyDeviceToHost: return d == 0 && s == 1;
    case cudaMemcpyDeviceToDevice: return d == 1 && s == 1;
    case cudaMemcpyHostToHost: return d == 0 && s == 0;
    case cudaMemcpyDefault: return true;
  }
  return false;
}

}  // namespace

namespace mf::emulator {

Order set_order(Order o) {
  synchronize_all();
  return current_order().exchange(o);
}

bool enqueue(CUstream_st* stream, std::function<void()> work) {
  {
    std::lock_guard<std::mutex> lock(mu());
    if (stream && stream->capture) {
      if (stream->capture->invalidated) return false;
      stream->capture->work.push_back(std::move(work));
      return true;
    }
  }
  submit(stream, std::move(work));
  return true;
}

bool capturing(CUstream_st* stream) {
  std::lock_guard<std::mutex> lock(mu());
  return stream && stream->capture;
}

bool may_synchronize(CUstream_st* stream) {
  std::shared_ptr<Queue> q;
  std::uint64_t end = 0;
  {
    std::lock_guard<std::mutex> lock(mu());
    if (stream && stream->capture) {
      stream->capture->invalidated = true;
      return false;
    }
    if (refuse_unsafe_call()) return false;
    q = queue_of(stream);
    end = q->queued;
  }
  synchronize(q, end);
  return true;
}

int take_last_error() { return std::exchange(last_error, cudaSuccess); }

bool device_span(const void* p, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mu());
  return device_range(p, bytes) == 1;
}

void fail_next_graph_instantiate() { fail_instantiate = true; }

}  // namespace mf::emulator

extern "C" {

// ---- errors, versions, devices ----

cudaError_t cudaGetLastError() { return static_cast<cudaError_t>(mf::emulator::take_last_error()); }
cudaError_t cudaPeekAtLastError() { return last_error; }

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureUnmatched: return "capture was not initiated in this stream";
    case cudaErrorStreamCaptureIsolation:
      return "dependency created on uncaptured work in another stream";
    case cudaErrorStreamCaptureWrongThread:
      return "attempt to terminate a thread-local capture sequence from another thread";
    case cudaErrorCapturedEvent: return "operation not permitted on an event last recorded in a capturing stream";
    default: return "unknown error (emulated CUDA runtime)";
  }
}

cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
  if (d != 0) return fail(cudaErrorInvalidDevice);
  current_device = d;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  *d = current_device;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int d) {
  if (d != 0) return fail(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::strncpy(prop->name, "CPU emulation of CUDA", sizeof prop->name - 1);
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = mf::emulator::kMultiProcessorCount;
  prop->totalGlobalMem = kDeviceBytes;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int d) {
  if (d != 0) return fail(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = mf::emulator::kMultiProcessorCount; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; return cudaSuccess;
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; return cudaSuccess;
    default: return fail(cudaErrorInvalidValue);
  }
}
cudaError_t cudaMemGetInfo(std::size_t* free_bytes, std::size_t* total_bytes) {
  std::lock_guard<std::mutex> lock(mu());
  *free_bytes = kDeviceBytes - allocated;
  *total_bytes = kDeviceBytes;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  {
    std::lock_guard<std::mutex> lock(mu());
    if (refuse_unsafe_call()) return fail(cudaErrorStreamCaptureUnsupported);
  }
  synchronize_all();
  return cudaSuccess;
}

// ---- memory ----

cudaError_t cudaMalloc(void** p, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mu());
  *p = nullptr;
  if (refuse_unsafe_call()) return fail(cudaErrorStreamCaptureUnsupported);
  if (bytes > kDeviceBytes - allocated) return fail(cudaErrorMemoryAllocation);
  void* q = nullptr;
  if (posix_memalign(&q, 256, bytes ? bytes : 1) != 0) return fail(cudaErrorMemoryAllocation);
  std::memset(q, 0xcd, bytes);  // fresh device memory holds garbage
  allocations()[static_cast<const char*>(q)] = bytes;
  allocated += bytes;
  *p = q;
  return cudaSuccess;
}
// cudaFree and cudaFreeHost wait for the device's work first, as CUDA's do.
cudaError_t cudaFree(void* p) {
  {
    std::lock_guard<std::mutex> lock(mu());
    if (refuse_unsafe_call()) return fail(cudaErrorStreamCaptureUnsupported);
  }
  if (p) synchronize_all();
  std::lock_guard<std::mutex> lock(mu());
  if (!p) return cudaSuccess;
  auto it = allocations().find(static_cast<const char*>(p));
  if (it == allocations().end()) return fail(cudaErrorInvalidValue);
  allocated -= it->second;
  allocations().erase(it);
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** p, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mu());
  *p = nullptr;
  if (refuse_unsafe_call()) return fail(cudaErrorStreamCaptureUnsupported);
  void* q = nullptr;
  if (posix_memalign(&q, 4096, bytes ? bytes : 1) != 0) return fail(cudaErrorMemoryAllocation);
  pinned()[static_cast<const char*>(q)] = bytes;
  *p = q;
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* p) {
  {
    std::lock_guard<std::mutex> lock(mu());
    if (refuse_unsafe_call()) return fail(cudaErrorStreamCaptureUnsupported);
  }
  if (p) synchronize_all();
  std::lock_guard<std::mutex> lock(mu());
  if (!p) return cudaSuccess;
  if (!pinned().erase(static_cast<const char*>(p))) return fail(cudaErrorInvalidValue);
  std::free(p);
  return cudaSuccess;
}

// A blocking copy goes on the legacy default stream, so it does not wait for the work of
// non-blocking streams (ours). As CUDA documents it: from pageable memory into the device it
// returns once the source is staged, not once the copy has landed; from pinned memory, and
// out of the device, once the copy is done; between two device buffers at once.
cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  bool host_only = false, stage = false, wait = false;
  {
    std::lock_guard<std::mutex> lock(mu());
    if (refuse_unsafe_call()) return fail(cudaErrorStreamCaptureUnsupported);
    if (!copy_allowed(dst, src, bytes, kind)) return fail(cudaErrorInvalidValue);
    const bool from_host = device_range(src, bytes) == 0, to_host = device_range(dst, bytes) == 0;
    host_only = from_host && to_host;
    stage = from_host && !pinned_range(src, bytes);
    wait = to_host || (from_host && !stage);
  }
  if (host_only) {
    if (bytes) std::memmove(dst, src, bytes);
    return cudaSuccess;
  }
  const std::uint64_t mark = submit(nullptr, copy_work(dst, src, bytes, stage));
  if (wait) synchronize(legacy_queue(), mark);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  bool host_only = false, stage = false;
  {
    std::lock_guard<std::mutex> lock(mu());
    if (!copy_allowed(dst, src, bytes, kind)) return fail(cudaErrorInvalidValue);
    host_only = device_range(dst, bytes) == 0 && device_range(src, bytes) == 0;
    // Inside a capture the copy is a node of the graph: it reads its source when replayed.
    stage = !(s && s->capture) && device_range(dst, bytes) == 1 && device_range(src, bytes) == 0 &&
            !pinned_range(src, bytes);
  }
  if (host_only) {  // fully synchronous, as CUDA's
    if (bytes) std::memmove(dst, src, bytes);
    return cudaSuccess;
  }
  if (!mf::emulator::enqueue(s, copy_work(dst, src, bytes, stage))) return fail(cudaErrorStreamCaptureInvalidated);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, std::size_t bytes, cudaStream_t s) {
  {
    std::lock_guard<std::mutex> lock(mu());
    if (device_range(p, bytes) != 1) return fail(cudaErrorInvalidValue);
  }
  if (!mf::emulator::enqueue(s, [=] { std::memset(p, value, bytes); })) return fail(cudaErrorStreamCaptureInvalidated);
  return cudaSuccess;
}

// ---- streams and events ----

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  *s = new CUstream_st;
  (*s)->flags = flags;
  std::lock_guard<std::mutex> lock(mu());
  streams_alive().insert(*s);
  return cudaSuccess;
}
// As in CUDA, the stream's work still runs after it is destroyed.
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(mu());
  if (s->capture) return fail(cudaErrorStreamCaptureUnsupported);
  streams_alive().erase(s);
  if (s->queue->done < s->queue->queued) orphans().push_back(s->queue);
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  std::shared_ptr<Queue> q;
  std::uint64_t end = 0;
  {
    std::lock_guard<std::mutex> lock(mu());
    if (s && s->capture) {
      s->capture->invalidated = true;
      return fail(cudaErrorStreamCaptureUnsupported);
    }
    q = queue_of(s);
    end = q->queued;
  }
  synchronize(q, end);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
  *e = new CUevent_st;
  (*e)->flags = flags;
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  std::shared_ptr<Queue> q;
  std::uint64_t mark = 0;
  {
    std::lock_guard<std::mutex> lock(mu());
    if (s && s->capture) {
      if (s->capture->invalidated) return fail(cudaErrorStreamCaptureInvalidated);
      e->capture = s->capture;  // a node of the graph: waiting on it joins that capture
      e->recorded = true;
      return cudaSuccess;
    }
    // The event stands for the work queued on s so far; its time is when s gets there.
    auto stamp = std::make_shared<Stamp>();
    q = queue_of(s);
    mark = push(s, [stamp] {
      std::lock_guard<std::mutex> stamp_lock(mu());
      stamp->time = std::chrono::steady_clock::now();
      stamp->reached = true;
    });
    e->capture.reset();
    e->recorded = true;
    e->queue = q;
    e->mark = mark;
    e->stamp = stamp;
  }
  if (current_order() == mf::emulator::Order::kImmediate) run_until(q, mark);
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  std::shared_ptr<Queue> q;
  std::uint64_t mark = 0;
  {
    std::lock_guard<std::mutex> lock(mu());
    if (e->capture) return fail(cudaErrorCapturedEvent);
    if (!e->recorded) return cudaSuccess;
    q = e->queue;
    mark = e->mark;
  }
  synchronize(q, mark);
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!start || !end) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(mu());
  if ((start->flags | end->flags) & cudaEventDisableTiming) return fail(cudaErrorInvalidResourceHandle);
  if (!start->recorded || !end->recorded) return fail(cudaErrorInvalidResourceHandle);
  if (start->capture || end->capture) return fail(cudaErrorCapturedEvent);
  if (!start->stamp->reached || !end->stamp->reached) return fail(cudaErrorNotReady);  // not waited for
  *ms = std::chrono::duration<float, std::milli>(end->stamp->time - start->stamp->time).count();
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(mu());
  const bool s_captures = s && s->capture;
  if (s_captures && s->capture->invalidated) return fail(cudaErrorStreamCaptureInvalidated);
  if (e->capture) {
    if (e->capture->ended) return fail(cudaErrorCapturedEvent);  // a node of a finished graph
    if (!s) return fail(cudaErrorStreamCaptureImplicit);
    if (s_captures && s->capture != e->capture) return fail(cudaErrorStreamCaptureMerge);
    if (!s_captures) e->capture->streams.push_back(s);
    s->capture = e->capture;  // a fork: s now records into the same graph
    return cudaSuccess;
  }
  if (!e->recorded) return cudaSuccess;  // a wait for nothing
  // An event recorded outside any capture: a capturing stream may not depend on uncaptured
  // work; any other stream's later work waits for what the event stands for.
  if (s_captures) {
    s->capture->invalidated = true;
    return fail(cudaErrorStreamCaptureIsolation);
  }
  if (e->queue != queue_of(s)) push(s, wait_for(e->queue, e->mark));  // a stream's own work is in order anyway
  return cudaSuccess;
}

// ---- graphs ----

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  if (!s) return fail(cudaErrorStreamCaptureUnsupported);  // the legacy stream cannot be captured
  std::lock_guard<std::mutex> lock(mu());
  if (s->capture) return fail(cudaErrorIllegalState);
  auto c = std::make_shared<Capture>();
  c->origin = s;
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->streams.push_back(s);
  s->capture = c;
  captures().insert(c.get());
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  std::lock_guard<std::mutex> lock(mu());
  if (!s || !s->capture)
    *status = cudaStreamCaptureStatusNone;
  else
    *status = s->capture->invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  *graph = nullptr;
  if (!s) return fail(cudaErrorIllegalState);
  std::lock_guard<std::mutex> lock(mu());
  if (!s->capture) return fail(cudaErrorIllegalState);
  std::shared_ptr<Capture> c = s->capture;
  if (c->origin != s) return fail(cudaErrorStreamCaptureUnmatched);
  if (c->mode != cudaStreamCaptureModeRelaxed && c->thread != std::this_thread::get_id())
    return fail(cudaErrorStreamCaptureWrongThread);
  // The capture ends on every stream that joined it. (CUDA also requires each fork to be
  // joined back; our captures never fork, so that is not checked.)
  for (CUstream_st* joined : c->streams) joined->capture.reset();
  c->ended = true;
  captures().erase(c.get());
  if (c->invalidated) return fail(cudaErrorStreamCaptureInvalidated);
  *graph = new CUgraph_st{std::move(c->work)};
  return cudaSuccess;
}
cudaError_t cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t* nodes, std::size_t* count) {
  if (!g) return fail(cudaErrorInvalidValue);
  if (nodes) return fail(cudaErrorInvalidValue);  // only the count is emulated
  *count = g->work.size();
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t g, unsigned long long) {
  if (!g || fail_instantiate.exchange(false)) return fail(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st{g->work};
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  if (!exec) return fail(cudaErrorInvalidValue);
  const Work work = exec->work;
  if (!mf::emulator::enqueue(s, [work] {
        for (const auto& w : work) w();
      }))
    return fail(cudaErrorStreamCaptureInvalidated);
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  delete g;
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t g) {
  delete g;
  return cudaSuccess;
}

}  // extern "C"
