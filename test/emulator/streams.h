// streams.h: how the CPU emulation of CUDA runs work queued on a stream. Kernel launches
// (cuda_emulator.h), copies and memsets (fake_cudart.cpp), GEMMs (fake_cublas.cpp) and
// convolutions (fake_cudnn.cpp) all go through enqueue(). On a stream being captured into a
// CUDA graph the work is recorded and runs when the graph is launched; otherwise it runs in
// one of the orders a GPU may run it in, chosen by MF_EMULATED_STREAMS (below).
//
// A GPU promises only this: the work of a stream runs in the order it was queued, after
// whatever the events the stream waits on stand for, and before a synchronisation with it
// returns. Anything else is up to the hardware: another stream's work may run long before,
// or long after. Each order below is one that a GPU may choose, and each makes a different
// missing wait visible as wrong data:
// - kDeferred (the default): work runs as late as it may, when a synchronisation, a blocking
//   copy or a waiting stream needs it. A consumer that does not wait for its producer (a
//   kernel reading what a copy on another stream writes, the host reading pinned memory that
//   a copy fills) runs before the producer and reads old data.
// - kOthersFirst: as kDeferred, but each synchronisation first runs everything queued on the
//   other streams. A producer that does not wait for the consumer of the data it replaces (a
//   copy refilling a buffer a kernel on another stream still reads) then runs before that
//   consumer.
// - kImmediate: work runs when it is queued, on the calling thread: every wait is met
//   already, so no missing one shows. The order the emulation first had, kept for comparison.
// MF_EMULATED_STREAMS=deferred|others-first|immediate picks one for a whole run.
#pragma once
#include <cstddef>
#include <functional>

struct CUstream_st;  // cudaStream_t is CUstream_st*, in the real headers and in cuda_emulator.h

namespace mf::emulator {

// The order of a run is MF_EMULATED_STREAMS, or kDeferred when it is not set; a value that is
// not one of the three stops the program with a message (a typo would test nothing).
enum class Order { kDeferred, kOthersFirst, kImmediate };
// For tests of the emulation itself: sets the order, returning the one it replaces. The work
// queued until then runs first.
Order set_order(Order o);

// The SM count the emulated device reports (cudaDeviceGetAttribute, cudaGetDeviceProperties).
// The kernels size some grids by it; 8 keeps the emulation quick while still giving
// multi-block reductions several blocks to combine.
constexpr int kMultiProcessorCount = 8;

// Runs `work` now, or appends it to the graph `stream` is being captured into. False when
// that capture has been invalidated (the work is dropped, as CUDA drops it).
bool enqueue(CUstream_st* stream, std::function<void()> work);

// True while `stream` is being captured (also after the capture was invalidated, until it
// is ended), as cudaStreamIsCapturing reports.
bool capturing(CUstream_st* stream);

// For a call that waits for the work on `stream` (cudnnFind*, a blocking copy): runs that
// work and returns true when it may. False when the stream is being captured, which CUDA
// forbids: the capture is then invalidated, as CUDA does.
bool may_synchronize(CUstream_st* stream);

// The error of the last emulated runtime call that failed on this thread, taken and reset
// to 0 as cudaGetLastError takes it. The kernels' launch checks (cuda_emulator.h) read it
// too, so an error that a failed call left behind surfaces at the next launch, as on a GPU.
int take_last_error();

// True when [p, p + bytes) lies inside one allocation of the emulated device memory: what
// a kernel may read or write. cuBLAS's and cuDNN's fakes check their operands with it: on a
// GPU their kernels read and write an operand that runs past its allocation (a leading
// dimension or a size too large, operands swapped) or lies in host memory anyway, and get
// another tensor's data, garbage or a fault.
bool device_span(const void* p, std::size_t bytes);

// For tests of how our code meets a refusal: the next cudaGraphInstantiate fails with
// cudaErrorInvalidValue (and leaves that error behind), as the real one may for a graph it
// cannot run.
void fail_next_graph_instantiate();

}  // namespace mf::emulator
