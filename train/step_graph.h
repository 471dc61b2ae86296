// step_graph.h: a training step replayed as a CUDA graph, one graph per batch size.
//
// The first step of a batch size runs eagerly (it chooses the cuDNN algorithms, sizes the
// workspace and allocates every buffer the step uses); the second is captured, then
// launched; later ones replay it. The partial last batch of an epoch follows the same rule:
// eager in the first epoch, captured in the second, replayed after. A graph holds raw
// addresses, so the graphs are dropped (and the rule starts again) whenever a buffer they
// use may have moved: a new fit, the shared cuDNN workspace growing, a forward or backward
// outside a step that grew a layer's buffer, or a new learning rate (a kernel argument
// baked into the graph).
//
// A graph may also hold k steps back to back (run's `k`): its launch costs about 9 us on the
// H200 however many nodes it has, so an epoch of 750 steps as 47 graphs of 16 saves about
// 6 ms. Only steps that read their batch on the device can be grouped: the resident
// pipeline's, whose batch cursor advances on the GPU.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "runtime/cuda_raii.h"

namespace mf {

class StepGraph {
 public:
  // A new fit: graphs dropped, counts zeroed; `enabled` false runs every step eagerly
  // (--no-graph).
  void begin_fit(bool enabled);
  // k steps of nb samples on stream s: eager, captured then launched, or a replay (one
  // graph per nb and k). `body` enqueues one step on s and records, in addrs(), every
  // buffer it writes (layer outputs, input gradients and the layers' step buffers). `lr`:
  // the learning rate the step's optimizer kernel takes as an argument.
  void run(std::int64_t nb, cudaStream_t s, float lr, const std::function<void()>& body, int k = 1);
  // Where the step body records its buffers.
  std::vector<const void*>& addrs() { return step_addrs_; }
  void drop();
  // After layers ran outside a step: `addrs` are the buffers they wrote, from the step's
  // position `first`, and `own` the layers' step buffers, which the step records from
  // position `own_first`. Drops the graphs when any differs from what they saw.
  void drop_if_moved(const std::vector<const void*>& addrs, std::size_t first, const std::vector<const void*>& own,
                     std::size_t own_first);
  // "step as a CUDA graph: batch 64 -> 31 nodes; 1 captures, 937 replays, 1 eager steps"
  // ("batch 64 x16 -> 192 nodes" for a graph of 16 steps),
  // or how the steps ran without one.
  std::string describe() const;

 private:
  bool enabled_ = true;
  using Key = std::pair<std::int64_t, int>;  // batch size, steps per graph
  std::map<Key, GraphExec> graphs_;
  std::set<std::int64_t> warm_;             // batch sizes run eagerly since the graphs were last dropped
  std::vector<const void*> step_addrs_;     // the buffers of the last step body
  std::vector<const void*> graph_addrs_;    // the same, as the graphs in graphs_ saw them
  const void* graph_workspace_ = nullptr;   // the shared cuDNN workspace the graphs use
  float graph_lr_ = 0;                      // the learning rate baked into the graphs
  std::int64_t captures_ = 0, replays_ = 0, eager_steps_ = 0;
  std::map<Key, std::size_t> nodes_;           // nodes of the last graph captured for each key
  std::string capture_error_;                  // why graphs were given up on in this fit, if they were
};

}  // namespace mf
