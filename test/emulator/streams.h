// streams.h: how the CPU emulation of CUDA runs work queued on a stream. Kernel launches
// (cuda_emulator.h), copies and memsets (fake_cudart.cpp), GEMMs (fake_cublas.cpp) and
// convolutions (fake_cudnn.cpp) all go through enqueue(): the work runs at once, on the
// calling thread, unless the stream is being captured into a CUDA graph, in which case it is
// recorded and runs when the graph is launched.
//
// Running at once is one of the orders a GPU may run the work in: everything queued on a
// stream earlier has finished, and so has everything an event that the stream waits on
// stands for. What it cannot show is a missing wait between two streams: here the work of
// the other stream has always finished already.
#pragma once
#include <cstddef>
#include <functional>

struct CUstream_st;  // cudaStream_t is CUstream_st*, in the real headers and in cuda_emulator.h

namespace mf::emulator {

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

// For a call that waits for the work on `stream` (cudnnFind*, a blocking copy): true when
// it may. False when the stream is being captured, which CUDA forbids: the capture is then
// invalidated, as CUDA does.
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
