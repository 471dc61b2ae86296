// step_graph.cu: capture, replay and drop of the training step's CUDA graphs.
#include "train/step_graph.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>

#include "runtime/cuda_check.h"
#include "runtime/errors.h"
#include "runtime/gpu_context.h"

namespace mf {

namespace {
// Ends a capture that failed part-way, so that the stream can be used again.
void abandon_capture(cudaStream_t s) {
  cudaGraph_t partial = nullptr;
  (void)cudaStreamEndCapture(s, &partial);  // reports the error that broke the capture, if any
  if (partial) (void)cudaGraphDestroy(partial);
  (void)cudaGetLastError();
}
}  // namespace

void StepGraph::begin_fit(bool enabled) {
  drop();
  enabled_ = enabled;
  captures_ = replays_ = eager_steps_ = 0;
  nodes_.clear();
  capture_error_.clear();
}

void StepGraph::drop() {
  graphs_.clear();
  warm_.clear();
  graph_addrs_.clear();
}

void StepGraph::run(std::int64_t nb, cudaStream_t s, float lr, const std::function<void()>& body, int k) {
  if (k < 1) throw std::logic_error("StepGraph::run: k = " + std::to_string(k) + " steps, at least 1");
  const auto eager = [&] {
    for (int i = 0; i < k; ++i) body();
    eager_steps_ += k;
  };
  if (!enabled_) return eager();
  const void* workspace = GpuContext::current().workspace(0);
  if (!graphs_.empty() && (workspace != graph_workspace_ || lr != graph_lr_)) drop();
  const Key key{nb, k};
  const auto found = graphs_.find(key);
  if (found != graphs_.end()) {
    MF_GPU_CHECK(cudaGraphLaunch(found->second.get(), s));
    ++replays_;
    return;
  }
  if (!warm_.count(nb)) {  // first steps of this size: eager (algorithms, workspace, buffers)
    eager();
    if (!graphs_.empty() && step_addrs_ != graph_addrs_) drop();  // buffers moved
    warm_.insert(nb);
    return;
  }
  // Capture in thread-local mode: the prefetch thread may go on using the CUDA API (its
  // copy stream, events) meanwhile, which the global mode would forbid. A capture the CUDA
  // runtime refuses (some library call that cannot be captured) recorded work but ran none
  // of it, so the step then runs eagerly, and so does the rest of the fit (describe() says why).
  GraphExec owned;
  std::size_t nodes = 0;
  try {
    MF_GPU_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    try {
      for (int i = 0; i < k; ++i) body();
    } catch (...) {
      abandon_capture(s);
      throw;
    }
    cudaGraph_t raw = nullptr;
    MF_GPU_CHECK(cudaStreamEndCapture(s, &raw));
    const Graph graph(raw);
    MF_GPU_CHECK(cudaGraphGetNodes(raw, nullptr, &nodes));
    cudaGraphExec_t exec = nullptr;
    MF_GPU_CHECK(cudaGraphInstantiate(&exec, raw, 0));
    owned.reset(exec);
  } catch (const GpuError& e) {
    // The failed call also left its error for the next cudaGetLastError, which would be
    // the launch check of the eager step's first kernel: take it now, it is handled.
    (void)cudaGetLastError();
    capture_error_ = e.what();
    std::fprintf(stderr, "microflow: warning: the training step could not be captured as a CUDA graph (%s); "
                         "running it eagerly\n", e.what());
    enabled_ = false;
    drop();
    return eager();
  }
  // The step is dozens of kernels; an empty graph means its work went to another stream
  // (and ran once, during capture, instead of being recorded).
  if (nodes == 0)
    throw std::logic_error("the captured training step has no nodes: its work was not enqueued on the compute stream");
  if (!graphs_.empty() && step_addrs_ != graph_addrs_) drop();  // they saw other buffers
  graph_addrs_ = step_addrs_;
  graph_workspace_ = GpuContext::current().workspace(0);
  graph_lr_ = lr;
  warm_.insert(nb);
  GraphExec& g = graphs_[key];
  g = std::move(owned);
  nodes_[key] = nodes;
  ++captures_;
  MF_GPU_CHECK(cudaGraphLaunch(g.get(), s));  // the captured step has not run yet
  ++replays_;
}

void StepGraph::drop_if_moved(const std::vector<const void*>& addrs, std::size_t first,
                              const std::vector<const void*>& own, std::size_t own_first) {
  if (graphs_.empty()) return;
  if (graph_addrs_.size() < first + addrs.size() ||
      !std::equal(addrs.begin(), addrs.end(), graph_addrs_.begin() + first) ||
      graph_addrs_.size() != own_first + own.size() ||
      !std::equal(own.begin(), own.end(), graph_addrs_.begin() + own_first))
    drop();
}

std::string StepGraph::describe() const {
  if (!capture_error_.empty())
    return "CUDA graph capture failed (" + capture_error_ + "), so steps ran eagerly: " + std::to_string(replays_) +
           " replays, " + std::to_string(eager_steps_) + " eager steps";
  if (!enabled_) return "eager steps (no CUDA graph): " + std::to_string(eager_steps_) + " steps";
  std::string s = "step as a CUDA graph";
  if (nodes_.empty()) s += " (none captured yet)";
  bool first = true;
  for (const auto& [key, count] : nodes_) {
    s += (first ? ": batch " : ", batch ") + std::to_string(key.first) +
         (key.second > 1 ? " x" + std::to_string(key.second) : "") + " -> " + std::to_string(count) + " nodes";
    first = false;
  }
  return s + "; " + std::to_string(captures_) + " captures, " + std::to_string(replays_) + " replays, " +
         std::to_string(eager_steps_) + " eager steps";
}

}  // namespace mf
