// gpu_trainer.h: what a GPU fit keeps between steps and between fits: the device copies
// of the datasets, the step's buffers, its CUDA graphs, and the buffers of the three ways
// batches reach the GPU (--pipeline). For train/*.cu only (it needs the CUDA headers).
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "data/dataset_key.h"
#include "runtime/cuda_raii.h"
#include "tensor/tensor.h"
#include "train/fit.h"
#include "train/fused_step.h"
#include "train/step_graph.h"

namespace mf {

constexpr int kPrefetchSlots = 3;  // pinned + staging buffers in flight in the prefetch pipeline

// A dataset in device memory, as on the host (u8 pixels and labels; the kernels scale the
// pixels), and for evaluation in order the identity permutation.
struct DeviceData {
  data::DataKey key;
  Tensor images, labels, identity;
};

class GpuTrainer {
 public:
  GpuTrainer();
  ~GpuTrainer();  // waits for the prefetch copies that may still read the pinned buffers
  GpuTrainer(const GpuTrainer&) = delete;
  GpuTrainer& operator=(const GpuTrainer&) = delete;

  // ---- settings of the current fit ----
  Pipeline pipeline = Pipeline::kResident;
  bool half = false;
  std::int64_t batch = 0, sample = 0;  // largest batch; pixels per image
  bool fitted = false;

  // ---- device data and the step's buffers ----
  DeviceData train_data, eval_data;
  DeviceData* fit_data = nullptr;      // the resident training set (one of the two above)
  Tensor x, labels, dlogits, stats;    // batch input (compute dtype), i32 labels, d loss/d logits, stats
  Tensor perm, cursor;                 // this epoch's permutation (i32) and the batch cursor (one int64)
  Tensor eval_x, eval_labels, eval_stats, eval_cursor;
  PinnedBuffer host_stats;             // where statistics are read back to
  StepGraph graph;
  bool fused = false;   // the fit runs the fused rung's step (--kernels fused)
  FusedStep fused_step;

  std::int64_t* cursor_ptr() { return static_cast<std::int64_t*>(cursor.raw()); }
  std::int64_t* eval_cursor_ptr() { return static_cast<std::int64_t*>(eval_cursor.raw()); }

  // ---- prefetch pipeline ----
  Stream copy_stream;
  std::array<Event, kPrefetchSlots> copied, consumed;
  std::array<PinnedBuffer, kPrefetchSlots> host_images, host_labels;
  std::array<Tensor, kPrefetchSlots> staging_images, staging_labels;

  // ---- naive pipeline ----
  std::vector<float> naive_x;
  std::vector<std::int32_t> naive_y;
  Tensor naive_x32;  // FP16: the f32 batch as copied, before the cast

  // The device copy of `d`, uploaded unless one of the two cached copies already holds it.
  // An evaluation never replaces the copy the current fit trains on.
  DeviceData& device_data(const data::Dataset& d, bool for_eval, cudaStream_t s);
  // Reads [loss sum, correct, count] back: the wait for everything enqueued so far.
  StepStats read_stats(const Tensor& device_stats, cudaStream_t s);
  // Sizes the buffers of `pipeline` for batches of `batch` (prefetch and naive).
  void size_pipeline_buffers();
  // The naive pipeline, the article's slow example: the batch perm[0 .. nb) of d sliced on
  // the host into pageable float memory, copied, and waited for before the step.
  void naive_feed(const data::Dataset& d, const std::int32_t* perm, std::int64_t nb, cudaStream_t s);
  // "pipeline resident; step as a CUDA graph: ...", for --verbose; empty before a fit.
  std::string describe() const;
};

// The prefetch pipeline, the article's tf.data prefetch: a host thread gathers the next
// batches into pinned buffers and copies them on a stream of its own while the GPU trains
// (the timeline is in batch_sources.cu).
class Prefetcher {
 public:
  Prefetcher(GpuTrainer& t, const data::Dataset& d, std::vector<std::int32_t> perm, std::int64_t batch,
             std::int64_t steps);
  ~Prefetcher() { finish(); }
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // Main thread: makes batch `step` (nb samples) the step's input, on the compute stream.
  void feed(std::int64_t step, std::int64_t nb, cudaStream_t s);
  // Stops the host thread (after the last batch, or early) and joins it.
  void finish();

 private:
  void run();

  GpuTrainer& t_;
  const data::Dataset& d_;
  const std::vector<std::int32_t> perm_;
  const std::int64_t batch_, steps_;
  const int device_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::int64_t produced_ = 0;  // batches whose copy is enqueued
  std::int64_t consumed_ = 0;  // batches whose normalise is enqueued
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts after everything above is set up
};

}  // namespace mf
