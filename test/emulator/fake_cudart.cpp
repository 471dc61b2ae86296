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
// - Streams and events: work runs when it is queued (streams.h says why that is a valid
//   order), so synchronising returns at once.
// - Graph capture, with CUDA's rules: the work queued on a capturing stream is recorded, not
//   run, and runs when the instantiated graph is launched. A call that may not be made while
//   the calling thread captures (cudaMalloc, cudaFree, cudaMemcpy, synchronising with the
//   capturing stream or the device) fails with cudaErrorStreamCaptureUnsupported and
//   invalidates the capture, so that cudaStreamEndCapture then fails with
//   cudaErrorStreamCaptureInvalidated. Waiting, inside a capture, on an event recorded
//   outside it fails with cudaErrorStreamCaptureIsolation.
// What it does not: concurrency between streams (a missing wait is not seen), timings (an
// event's time is the host clock), more than one device.
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
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

}  // namespace

struct CUstream_st {
  unsigned flags = 0;
  std::shared_ptr<Capture> capture;  // set while the stream takes part in a capture
};
struct CUevent_st {
  unsigned flags = 0;
  bool recorded = false;
  std::chrono::steady_clock::time_point time;
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
std::set<void*>& pinned() {
  static std::set<void*> s;
  return s;
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
int device_range(const void* p, std::size_t bytes) {
  const char* q = static_cast<const char*>(p);
  auto it = allocations().upper_bound(q);
  if (it == allocations().begin()) return 0;
  --it;
  if (q >= it->first + it->second) return 0;
  return q + bytes <= it->first + it->second ? 1 : -1;
}

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

bool enqueue(CUstream_st* stream, std::function<void()> work) {
  {
    std::lock_guard<std::mutex> lock(mu());
    if (stream && stream->capture) {
      if (stream->capture->invalidated) return false;
      stream->capture->work.push_back(std::move(work));
      return true;
    }
  }
  work();
  return true;
}

bool capturing(CUstream_st* stream) {
  std::lock_guard<std::mutex> lock(mu());
  return stream && stream->capture;
}

bool may_synchronize(CUstream_st* stream) {
  std::lock_guard<std::mutex> lock(mu());
  if (stream && stream->capture) {
    stream->capture->invalidated = true;
    return false;
  }
  return !refuse_unsafe_call();
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
  std::lock_guard<std::mutex> lock(mu());
  if (refuse_unsafe_call()) return fail(cudaErrorStreamCaptureUnsupported);
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
cudaError_t cudaFree(void* p) {
  std::lock_guard<std::mutex> lock(mu());
  if (refuse_unsafe_call()) return fail(cudaErrorStreamCaptureUnsupported);
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
  pinned().insert(q);
  *p = q;
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* p) {
  std::lock_guard<std::mutex> lock(mu());
  if (refuse_unsafe_call()) return fail(cudaErrorStreamCaptureUnsupported);
  if (!p) return cudaSuccess;
  if (!pinned().erase(p)) return fail(cudaErrorInvalidValue);
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  {
    std::lock_guard<std::mutex> lock(mu());
    if (refuse_unsafe_call()) return fail(cudaErrorStreamCaptureUnsupported);
    if (!copy_allowed(dst, src, bytes, kind)) return fail(cudaErrorInvalidValue);
  }
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  {
    std::lock_guard<std::mutex> lock(mu());
    if (!copy_allowed(dst, src, bytes, kind)) return fail(cudaErrorInvalidValue);
  }
  if (!mf::emulator::enqueue(s, [=] {
        if (bytes) std::memmove(dst, src, bytes);
      }))
    return fail(cudaErrorStreamCaptureInvalidated);
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
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(mu());
  if (s->capture) return fail(cudaErrorStreamCaptureUnsupported);
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  std::lock_guard<std::mutex> lock(mu());
  if (s && s->capture) {
    s->capture->invalidated = true;
    return fail(cudaErrorStreamCaptureUnsupported);
  }
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
  std::lock_guard<std::mutex> lock(mu());
  if (s && s->capture) {
    if (s->capture->invalidated) return fail(cudaErrorStreamCaptureInvalidated);
    e->capture = s->capture;  // a node of the graph: waiting on it joins that capture
    e->recorded = true;
    return cudaSuccess;
  }
  e->capture.reset();
  e->recorded = true;
  e->time = std::chrono::steady_clock::now();  // all work queued before it has run
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(mu());
  if (e->capture) return fail(cudaErrorCapturedEvent);
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!start || !end) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(mu());
  if ((start->flags | end->flags) & cudaEventDisableTiming) return fail(cudaErrorInvalidResourceHandle);
  if (!start->recorded || !end->recorded) return fail(cudaErrorInvalidResourceHandle);
  if (start->capture || end->capture) return fail(cudaErrorCapturedEvent);
  *ms = std::chrono::duration<float, std::milli>(end->time - start->time).count();
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
  // An event recorded outside any capture: nothing to wait for here (its work has run), but
  // a capturing stream may not depend on uncaptured work.
  if (s_captures && e->recorded) {
    s->capture->invalidated = true;
    return fail(cudaErrorStreamCaptureIsolation);
  }
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
