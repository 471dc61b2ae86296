// sequential_gpu.cu: the GPU training loop. Batches come from the dataset kept on the
// device (or from a prefetching or a naive host pipeline), the whole step is replayed as a
// CUDA graph, and the loss statistics are summed on the device and read back only at
// progress points and at the end of an epoch: those reads are the loop's only host waits.
//
// A step is: [gather the batch] -> forward -> softmax cross-entropy -> backward ->
// optimizer update -> [advance the batch cursor], all enqueued on the compute stream.
// Nothing in it takes a host argument that changes from step to step (the batch position
// is a cursor in device memory, the Adam step count and the loss scale live on the device),
// so one captured graph per batch size replays every step of that size.
//
// When a graph is captured: the first step of a batch size runs eagerly (it chooses the
// cuDNN algorithms, sizes the workspace and allocates every buffer the step uses); the
// second is captured, then launched; later ones replay it. The partial last batch of an
// epoch follows the same rule: eager in the first epoch, captured in the second, replayed
// after. A graph holds raw addresses, so graphs are dropped (and the rule starts again)
// whenever a buffer they use may have moved: a new fit, the shared cuDNN workspace
// growing, a validation pass (or a forward, backward or predict called from a callback)
// that grew a layer's buffer, or a new learning rate (a kernel argument baked into the
// graph).
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "data/batching.h"
#include "kernels/cuda_check.h"
#include "kernels/cuda_raii.h"
#include "kernels/errors.h"
#include "kernels/gpu_context.h"
#include "kernels/gpu_runtime.h"
#include "kernels/launchers.h"
#include "layers/sequential.h"
#include "layers/softmax_xent.h"

namespace mf {

namespace {

using Clock = std::chrono::steady_clock;
using Layers = std::vector<std::unique_ptr<Layer>>;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

constexpr int kPrefetchSlots = 3;  // pinned + staging buffers in flight in the prefetch pipeline

// Page-locked host memory (a copy from it is truly asynchronous), freed with its owner.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t bytes) : p_(bytes ? pinned_alloc(bytes) : nullptr), bytes_(bytes) {}
  ~PinnedBuffer() { pinned_free(p_); }
  PinnedBuffer(PinnedBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    if (this != &o) {
      pinned_free(p_);
      p_ = std::exchange(o.p_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  template <class T> T* as() const { return static_cast<T*>(p_); }
  std::size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
};

// What identifies a dataset: where its bytes are, its sizes, and a hash of every label and
// every pixel. Another dataset, or the same vectors refilled or edited in place (one pixel
// is enough), changes it, and the device copy is then made again. The hash reads the bytes
// at memory speed (a few ms for MNIST's 47 MB, about the upload's own time); a sample of the
// pixels missed edits that fell between the samples, and the GPU trained on the old images.
struct DataKey {
  const void* images = nullptr;
  const void* labels = nullptr;
  std::int64_t count = -1, rows = 0, cols = 0, channels = 0;
  std::uint64_t hash = 0;
  bool operator==(const DataKey& o) const {
    return images == o.images && labels == o.labels && count == o.count && rows == o.rows && cols == o.cols &&
           channels == o.channels && hash == o.hash;
  }
};

// A 64-bit hash of n bytes, four 8-byte words at a time in four independent lanes (so the
// multiplies overlap). Each step, (lane ^ word) * odd, is one-to-one in the lane for a given
// word: a lane that differs stays different, so any single changed word changes the result.
std::uint64_t hash_bytes(const std::uint8_t* p, std::size_t n, std::uint64_t seed) {
  constexpr std::uint64_t kOdd = 0x9E3779B97F4A7C15ull;
  std::uint64_t lane[4] = {seed ^ n, seed + 1, seed + 2, seed + 3};
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int j = 0; j < 4; ++j) {
      std::uint64_t w;
      std::memcpy(&w, p + i + 8 * j, 8);
      lane[j] = (lane[j] ^ w) * kOdd;
    }
  for (; i < n; ++i) lane[0] = (lane[0] ^ p[i]) * kOdd;
  std::uint64_t h = lane[0];
  for (int j = 1; j < 4; ++j) h = (h * kOdd) ^ lane[j];
  return h;
}

DataKey data_key(const data::Dataset& d) {
  DataKey k;
  k.images = d.images.data();
  k.labels = d.labels.data();
  k.count = d.count, k.rows = d.rows, k.cols = d.cols, k.channels = d.channels;
  k.hash = hash_bytes(d.images.data(), d.images.size(), hash_bytes(d.labels.data(), d.labels.size(), 0));
  return k;
}

// A dataset in device memory, as on the host (u8 pixels and labels; the kernels scale the
// pixels), and for evaluation in order the identity permutation.
struct DeviceData {
  DataKey key;
  Tensor images, labels, identity;
};

struct Stats {
  double loss_sum = 0, correct = 0, count = 0;
};

}  // namespace

class GpuTrainer {
 public:
  GpuTrainer() : host_stats(kNumStats * sizeof(float)) {}
  ~GpuTrainer() {
    // Copies of the prefetch pipeline may still read the pinned buffers freed below.
    if (copy_stream) MF_GPU_WARN(cudaStreamSynchronize(copy_stream.get()));
  }
  GpuTrainer(const GpuTrainer&) = delete;
  GpuTrainer& operator=(const GpuTrainer&) = delete;

  // ---- settings of the current fit ----
  Pipeline pipeline = Pipeline::kResident;
  bool use_graph = true, half = false;
  std::int64_t batch = 0, sample = 0;  // largest batch; pixels per image
  bool fitted = false;

  // ---- device data and the step's buffers ----
  DeviceData train_data, eval_data;
  DeviceData* fit_data = nullptr;      // the resident training set (one of the two above)
  Tensor x, labels, dlogits, stats;    // batch input (compute dtype), i32 labels, d loss/d logits, stats
  Tensor perm, cursor;                 // this epoch's permutation (i32) and the batch cursor (one int64)
  Tensor eval_x, eval_labels, eval_stats, eval_cursor;
  PinnedBuffer host_stats;             // where statistics are read back to

  std::int64_t* cursor_ptr() { return static_cast<std::int64_t*>(cursor.raw()); }
  std::int64_t* eval_cursor_ptr() { return static_cast<std::int64_t*>(eval_cursor.raw()); }

  // ---- CUDA graphs, one per batch size ----
  std::map<std::int64_t, GraphExec> graphs;
  std::set<std::int64_t> warm;               // batch sizes run eagerly since graphs were last dropped
  std::vector<const void*> step_addrs;       // layer outputs, input gradients and step_buffers of the last step body
  std::vector<const void*> graph_addrs;      // the same, as the graphs in `graphs` saw them
  const void* graph_workspace = nullptr;     // the shared cuDNN workspace the graphs use
  float graph_lr = 0;                        // the learning rate baked into the graphs
  std::int64_t captures = 0, replays = 0, eager_steps = 0;
  std::map<std::int64_t, std::size_t> nodes;  // batch size -> nodes of its last captured graph (for describe)
  std::string capture_error;                  // why graphs were given up on in this fit, if they were

  void drop_graphs() {
    graphs.clear();
    warm.clear();
    graph_addrs.clear();
  }

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
  DeviceData& device_data(const data::Dataset& d, bool for_eval, cudaStream_t s) {
    const DataKey key = data_key(d);
    DeviceData* dd = train_data.key == key ? &train_data : eval_data.key == key ? &eval_data : nullptr;
    if (!dd) {
      dd = !for_eval ? &train_data : fit_data == &eval_data ? &train_data : &eval_data;
      dd->key = DataKey{};  // not valid until the copy is done
      dd->identity = Tensor();
      ensure(dd->images, Shape{d.count, d.sample_size()}, DType::kU8, Device::kGpu);
      ensure(dd->labels, Shape{d.count}, DType::kU8, Device::kGpu);
      gpu_copy_async(dd->images.raw(), d.images.data(), d.images.size(), CopyKind::kHostToDevice, s);
      gpu_copy_async(dd->labels.raw(), d.labels.data(), d.labels.size(), CopyKind::kHostToDevice, s);
      gpu_stream_synchronize(s);  // the source is pageable host memory the caller may change
      dd->key = key;
    }
    if (for_eval && !dd->identity.defined()) {
      std::vector<std::int32_t> iota(static_cast<std::size_t>(d.count));
      for (std::int64_t i = 0; i < d.count; ++i) iota[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
      dd->identity = Tensor::empty(Shape{d.count}, DType::kI32, Device::kGpu);
      gpu_copy_async(dd->identity.raw(), iota.data(), iota.size() * sizeof(std::int32_t), CopyKind::kHostToDevice,
                     s);
      gpu_stream_synchronize(s);
    }
    return *dd;
  }

  // Reads [loss sum, correct, count] back: the wait for everything enqueued so far.
  Stats read_stats(const Tensor& device_stats, cudaStream_t s) {
    gpu_copy_async(host_stats.as<float>(), device_stats.raw(), kNumStats * sizeof(float), CopyKind::kDeviceToHost, s);
    gpu_stream_synchronize(s);
    const float* h = host_stats.as<float>();
    return {h[kStatLossSum], h[kStatCorrect], h[kStatCount]};
  }

  std::string describe() const {
    if (!fitted) return "";
    std::string s = std::string("pipeline ") + pipeline_name(pipeline) + "; ";
    if (!capture_error.empty())
      return s + "CUDA graph capture failed (" + capture_error + "), so steps ran eagerly: " +
             std::to_string(replays) + " replays, " + std::to_string(eager_steps) + " eager steps";
    if (!use_graph) return s + "eager steps (no CUDA graph): " + std::to_string(eager_steps) + " steps";
    s += "step as a CUDA graph";
    if (nodes.empty()) s += " (none captured yet)";
    bool first = true;
    for (const auto& [size, count] : nodes) {
      s += (first ? ": batch " : ", batch ") + std::to_string(size) + " -> " + std::to_string(count) + " nodes";
      first = false;
    }
    return s + "; " + std::to_string(captures) + " captures, " + std::to_string(replays) + " replays, " +
           std::to_string(eager_steps) + " eager steps";
  }
};

namespace {

using TrainerPtr = std::unique_ptr<GpuTrainer, void (*)(GpuTrainer*)>;
void destroy_trainer(GpuTrainer* t) { delete t; }

GpuTrainer& trainer_of(TrainerPtr& p) {
  if (!p) p = TrainerPtr(new GpuTrainer, &destroy_trainer);
  return *p;
}


// Sizes the step's buffers for a fit (reusing what an earlier fit left) and drops the
// graphs: anything may have run on the model since.
void begin_fit(GpuTrainer& t, const FitOptions& o, DType dtype, const data::Dataset& train) {
  t.drop_graphs();
  t.captures = t.replays = t.eager_steps = 0;
  t.nodes.clear();
  t.capture_error.clear();
  t.fit_data = nullptr;
  t.pipeline = o.pipeline == Pipeline::kAuto ? Pipeline::kResident : o.pipeline;
  t.use_graph = o.use_graph;
  t.half = dtype == DType::kF16;
  t.batch = std::min(o.batch_size, train.count);
  t.sample = train.sample_size();
  t.fitted = true;
  ensure(t.x, Shape{t.batch, train.rows, train.cols, train.channels}, dtype, Device::kGpu);
  ensure(t.labels, Shape{t.batch}, DType::kI32, Device::kGpu);
  ensure(t.stats, Shape{kNumStats}, DType::kF32, Device::kGpu);
  ensure(t.cursor, Shape{2}, DType::kI32, Device::kGpu);  // 8 bytes: one int64
  if (t.pipeline == Pipeline::kResident) ensure(t.perm, Shape{train.count}, DType::kI32, Device::kGpu);
  if (t.pipeline == Pipeline::kPrefetch) {
    if (!t.copy_stream) {
      t.copy_stream = make_stream();
      for (int k = 0; k < kPrefetchSlots; ++k) {
        t.copied[k] = make_event(false);
        t.consumed[k] = make_event(false);
      }
    }
    // No copy of an earlier fit still reads the buffers below, and no kernel still reads the
    // staging buffers (a fit that ended by an exception may leave work queued): a block freed
    // here can go straight to a buffer the copy stream writes, outside the compute stream's order.
    MF_GPU_CHECK(cudaStreamSynchronize(t.copy_stream.get()));
    MF_GPU_CHECK(cudaStreamSynchronize(compute_stream()));
    for (int k = 0; k < kPrefetchSlots; ++k) {
      const std::size_t bytes = static_cast<std::size_t>(t.batch * t.sample);
      if (t.host_images[k].bytes() < bytes) t.host_images[k] = PinnedBuffer(bytes);
      if (t.host_labels[k].bytes() < static_cast<std::size_t>(t.batch))
        t.host_labels[k] = PinnedBuffer(static_cast<std::size_t>(t.batch));
      ensure(t.staging_images[k], Shape{t.batch * t.sample}, DType::kU8, Device::kGpu);
      ensure(t.staging_labels[k], Shape{t.batch}, DType::kU8, Device::kGpu);
    }
  }
  if (t.pipeline == Pipeline::kNaive) {
    t.naive_x.resize(static_cast<std::size_t>(t.batch * t.sample));
    t.naive_y.resize(static_cast<std::size_t>(t.batch));
    if (t.half) ensure(t.naive_x32, Shape{t.batch * t.sample}, DType::kF32, Device::kGpu);
  }
}

// Enqueues one training step of nb samples on the compute stream (eagerly, or into a graph
// being captured), and records where every layer's output, input gradient and other step
// buffers (Layer::step_buffers) live.
void step_body(GpuTrainer& t, Layers& layers, Optimizer& opt, std::int64_t nb, cudaStream_t s) {
  if (t.pipeline == Pipeline::kResident)
    launch_gather_batch(t.fit_data->images.data<std::uint8_t>(), t.fit_data->labels.data<std::uint8_t>(),
                        t.perm.data<std::int32_t>(), t.cursor_ptr(), nb, t.sample, t.x.raw(), t.half,
                        t.labels.data<std::int32_t>(), s);
  const Tensor xb = t.x.slice(0, nb);
  const Tensor yb = t.labels.slice(0, nb);
  t.step_addrs.clear();
  const Tensor* h = &xb;
  for (auto& l : layers) {
    h = &l->forward(*h);
    t.step_addrs.push_back(h->raw());
  }
  ensure(t.dlogits, h->shape(), h->dtype(), Device::kGpu);
  // The launcher is called on `s`, the stream this step is enqueued (or captured) on, rather
  // than through softmax_xent(), which picks compute_stream() itself. grad_scale 1/nb: the
  // batch's mean loss; the loss scale (FP16) is read on the device at every replay.
  launch_softmax_xent(h->raw(), t.half, yb.data<std::int32_t>(), nb, h->dim(1), t.dlogits.raw(),
                      1.0f / static_cast<float>(nb), opt.device_loss_scale(), t.stats.data<float>(),
                      GpuContext::current().reduction_scratch(), s);
  const Tensor* g = &t.dlogits;
  for (auto it = layers.rbegin(); it != layers.rend(); ++it) {
    g = &(*it)->backward(*g);
    t.step_addrs.push_back(g->raw());
  }
  for (auto& l : layers) l->step_buffers(t.step_addrs);
  opt.step();
  if (t.pipeline == Pipeline::kResident) launch_advance_cursor(t.cursor_ptr(), nb, s);
}

// Ends a capture that failed part-way, so that the stream can be used again.
void abandon_capture(cudaStream_t s) {
  cudaGraph_t partial = nullptr;
  (void)cudaStreamEndCapture(s, &partial);  // reports the error that broke the capture, if any
  if (partial) (void)cudaGraphDestroy(partial);
  (void)cudaGetLastError();
}

// One training step: eager, captured then launched, or a replay (see the file comment).
void run_step(GpuTrainer& t, Layers& layers, Optimizer& opt, std::int64_t nb, cudaStream_t s) {
  if (!t.use_graph) {
    step_body(t, layers, opt, nb, s);
    ++t.eager_steps;
    return;
  }
  GpuContext& ctx = GpuContext::current();
  if (!t.graphs.empty() && (ctx.workspace(0) != t.graph_workspace || opt.learning_rate() != t.graph_lr))
    t.drop_graphs();
  const auto found = t.graphs.find(nb);
  if (found != t.graphs.end()) {
    MF_GPU_CHECK(cudaGraphLaunch(found->second.get(), s));
    ++t.replays;
    return;
  }
  if (!t.warm.count(nb)) {  // first step of this size: eager (algorithms, workspace, buffers)
    step_body(t, layers, opt, nb, s);
    ++t.eager_steps;
    if (!t.graphs.empty() && t.step_addrs != t.graph_addrs) t.drop_graphs();  // buffers moved
    t.warm.insert(nb);
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
      step_body(t, layers, opt, nb, s);
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
    t.capture_error = e.what();
    std::fprintf(stderr, "microflow: warning: the training step could not be captured as a CUDA graph (%s); "
                         "running it eagerly\n", e.what());
    t.use_graph = false;
    t.drop_graphs();
    step_body(t, layers, opt, nb, s);
    ++t.eager_steps;
    return;
  }
  // The step is dozens of kernels; an empty graph means its work went to another stream
  // (and ran once, during capture, instead of being recorded).
  if (nodes == 0)
    throw std::logic_error("the captured training step has no nodes: its work was not enqueued on the compute stream");
  if (!t.graphs.empty() && t.step_addrs != t.graph_addrs) t.drop_graphs();  // they saw other buffers
  t.graph_addrs = t.step_addrs;
  t.graph_workspace = ctx.workspace(0);
  t.graph_lr = opt.learning_rate();
  t.warm.insert(nb);
  GraphExec& g = t.graphs[nb];
  g = std::move(owned);
  t.nodes[nb] = nodes;
  ++t.captures;
  MF_GPU_CHECK(cudaGraphLaunch(g.get(), s));  // the captured step has not run yet
  ++t.replays;
}

// The naive pipeline, the article's slow example: slice the batch on the host into
// pageable float memory, copy it, and wait for the copy before the step. The copy goes on
// the compute stream and is waited for there (a legacy cudaMemcpy would not wait for the
// previous step, which may still read the input buffer, on this non-blocking stream).
void naive_feed(GpuTrainer& t, const data::Dataset& d, const std::int32_t* idx, std::int64_t nb, cudaStream_t s) {
  data::gather_batch(d, idx, nb, t.naive_x.data(), t.naive_y.data());
  const std::int64_t n = nb * t.sample;
  if (t.half) {
    gpu_copy_async(t.naive_x32.raw(), t.naive_x.data(), static_cast<std::size_t>(n) * sizeof(float),
                   CopyKind::kHostToDevice, s);
    launch_cast_f32_to_f16(t.naive_x32.data<float>(), t.x.data<Half>(), n, s);
  } else {
    gpu_copy_async(t.x.raw(), t.naive_x.data(), static_cast<std::size_t>(n) * sizeof(float), CopyKind::kHostToDevice,
                   s);
  }
  gpu_copy_async(t.labels.raw(), t.naive_y.data(), static_cast<std::size_t>(nb) * sizeof(std::int32_t),
                 CopyKind::kHostToDevice, s);
  gpu_stream_synchronize(s);
}

// The prefetch pipeline, the article's tf.data prefetch: a host thread gathers the next
// batches into pinned buffers and copies them on a stream of its own while the GPU trains.
//
// Timeline, K = 3 slots, batch s in slot k = s % K:
//   host thread    | wait until the main thread has enqueued batch s-K's normalise;
//                  | cudaEventSynchronize(copied[k]): the copy of batch s-K has read pinned[k];
//                  | fill pinned[k] with batch s (u8 pixels and labels, via the permutation)
//   copy stream    | wait consumed[k] (batch s-K normalised); pinned[k] -> staging[k];
//                  | record copied[k]
//   compute stream | wait copied[k]; normalise staging[k] -> x, labels; record consumed[k];
//                  | the step (graph or eager)
// While the GPU runs step s the copy engine brings batch s+1 and the host gathers s+2.
// pinned[k] is refilled only after its last copy finished and staging[k] is overwritten
// only after the normalise that read it ran; the host thread waits for the main thread
// before it reuses a slot, so both events it waits on belong to batch s-K.
class Prefetcher {
 public:
  Prefetcher(GpuTrainer& t, const data::Dataset& d, std::vector<std::int32_t> perm, std::int64_t batch,
             std::int64_t steps)
      : t_(t), d_(d), perm_(std::move(perm)), batch_(batch), steps_(steps), device_(current_gpu()) {
    thread_ = std::thread([this] { run(); });
  }
  ~Prefetcher() { finish(); }
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // Main thread: makes batch `step` (nb samples) the step's input, on the compute stream.
  void feed(std::int64_t step, std::int64_t nb, cudaStream_t s) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return produced_ > step || error_; });
      if (produced_ <= step) std::rethrow_exception(error_);
    }
    const int k = static_cast<int>(step % kPrefetchSlots);
    MF_GPU_CHECK(cudaStreamWaitEvent(s, t_.copied[k].get(), 0));
    launch_normalize_batch(t_.staging_images[k].data<std::uint8_t>(), t_.staging_labels[k].data<std::uint8_t>(), nb,
                           t_.sample, t_.x.raw(), t_.half, t_.labels.data<std::int32_t>(), s);
    MF_GPU_CHECK(cudaEventRecord(t_.consumed[k].get(), s));
    {
      std::lock_guard<std::mutex> lock(mu_);
      consumed_ = step + 1;
    }
    cv_.notify_all();
  }

  // Stops the host thread (after the last batch, or early) and joins it.
  void finish() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run() {
    try {
      MF_GPU_CHECK(cudaSetDevice(device_));
      cudaStream_t copy = t_.copy_stream.get();
      for (std::int64_t step = 0; step < steps_; ++step) {
        const int k = static_cast<int>(step % kPrefetchSlots);
        {
          std::unique_lock<std::mutex> lock(mu_);
          cv_.wait(lock, [&] { return stop_ || consumed_ >= step - kPrefetchSlots + 1; });
          if (stop_) return;
        }
        MF_GPU_CHECK(cudaEventSynchronize(t_.copied[k].get()));
        const std::int64_t b0 = step * batch_, nb = std::min(batch_, d_.count - b0);
        auto* images = t_.host_images[k].as<std::uint8_t>();
        auto* labels = t_.host_labels[k].as<std::uint8_t>();
        for (std::int64_t b = 0; b < nb; ++b) {
          const std::int64_t i = perm_[static_cast<std::size_t>(b0 + b)];
          std::memcpy(images + b * t_.sample, d_.images.data() + i * t_.sample, static_cast<std::size_t>(t_.sample));
          labels[b] = d_.labels[static_cast<std::size_t>(i)];
        }
        MF_GPU_CHECK(cudaStreamWaitEvent(copy, t_.consumed[k].get(), 0));
        MF_GPU_CHECK(cudaMemcpyAsync(t_.staging_images[k].raw(), images, static_cast<std::size_t>(nb * t_.sample),
                                     cudaMemcpyHostToDevice, copy));
        MF_GPU_CHECK(cudaMemcpyAsync(t_.staging_labels[k].raw(), labels, static_cast<std::size_t>(nb),
                                     cudaMemcpyHostToDevice, copy));
        MF_GPU_CHECK(cudaEventRecord(t_.copied[k].get(), copy));
        {
          std::lock_guard<std::mutex> lock(mu_);
          produced_ = step + 1;
        }
        cv_.notify_all();
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = std::current_exception();
      cv_.notify_all();
    }
  }

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

[[noreturn]] void throw_non_finite(double loss_sum, bool half, int epoch, std::int64_t step_from,
                                   std::int64_t step_to) {
  const std::string what = std::isnan(loss_sum) ? "NaN" : "infinite";
  const std::string where = " at epoch " + std::to_string(epoch + 1) +
                            (step_from + 1 >= step_to ? ", step " + std::to_string(step_to)
                                                      : ", between steps " + std::to_string(step_from + 1) + " and " +
                                                            std::to_string(step_to));
  throw NonFiniteLossError("the training loss became " + what + where +
                           (half ? ": the f16 activations overflowed; lower the learning rate (--lr) or train in "
                                   "FP32 (without --fp16)"
                                 : ": lower the learning rate (--lr)"));
}

// FP16: a dynamic loss scale that keeps falling means every gradient overflows whatever the
// scale; training cannot go on (and must not go on with a model it cannot update).
void check_loss_scale(double scale, double min_scale, std::int64_t skipped, std::int64_t steps, int epoch,
                      bool epoch_end) {
  const std::string tail = ". The model diverges in FP16: lower the learning rate (--lr) or train in FP32 (without "
                           "--fp16)";
  if (epoch_end && steps > 0 && skipped >= steps)
    throw std::runtime_error("no loss scale keeps the FP16 gradients finite: all " + std::to_string(steps) +
                             " steps of epoch " + std::to_string(epoch + 1) +
                             " were skipped for inf/NaN gradients (loss scale now " + std::to_string(scale) + ")" +
                             tail);
  if (skipped > 0 && scale <= min_scale)
    throw std::runtime_error("no loss scale keeps the FP16 gradients finite: the loss scale fell to its minimum (" +
                             std::to_string(scale) + ") with " + std::to_string(skipped) + " steps of epoch " +
                             std::to_string(epoch + 1) + " skipped for inf/NaN gradients" + tail);
}

}  // namespace

std::string Sequential::gpu_training_info() const { return gpu_ ? gpu_->describe() : ""; }

History Sequential::fit_gpu(const data::Dataset& train, const data::Dataset* validation, const FitOptions& options,
                            const FitCallbacks& callbacks) {
  check_gpu_batch(options.batch_size);  // fit() has capped it at the data's size
  GpuContext& ctx = GpuContext::current();
  const cudaStream_t s = ctx.stream();
  GpuTrainer& t = trainer_of(gpu_);
  Optimizer& opt = *optimizer_;
  begin_fit(t, options, compute_dtype_, train);
  refresh_half_weights();  // weights loaded into the masters since the last step
  const bool half = t.half;
  if (t.pipeline == Pipeline::kResident) t.fit_data = &t.device_data(train, false, s);
  const std::int64_t bs = options.batch_size, steps = data::num_batches(train.count, bs);
  if (half) opt.take_skipped_steps();  // count this fit's skipped steps only

  History history;
  history.completed_epochs = options.initial_epoch;
  for (int epoch = options.initial_epoch; epoch < options.epochs; ++epoch) {
    set_training(true);
    std::vector<std::int32_t> perm = data::epoch_permutation(train.count, options.seed, epoch);
    const auto t0 = Clock::now();
    t.stats.fill_zero_async(s);
    std::unique_ptr<Prefetcher> prefetch;
    if (t.pipeline == Pipeline::kResident) {
      // One 4-byte index per image (192 KB for 48k) and a reset cursor: the epoch's only
      // host-to-device traffic. Ordered after the last epoch's steps on the same stream.
      gpu_copy_async(t.perm.raw(), perm.data(), perm.size() * sizeof(std::int32_t), CopyKind::kHostToDevice, s);
      gpu_memset_async(t.cursor.raw(), 0, sizeof(std::int64_t), s);
    } else if (t.pipeline == Pipeline::kPrefetch) {
      prefetch = std::make_unique<Prefetcher>(t, train, perm, bs, steps);
    }
    double last_progress = -1.0;
    std::int64_t checked = 0, skipped = 0, step = 0;
    for (; step < steps; ++step) {
      const std::int64_t b0 = step * bs, nb = std::min(bs, train.count - b0);
      if (prefetch) prefetch->feed(step, nb, s);
      else if (t.pipeline == Pipeline::kNaive) naive_feed(t, train, perm.data() + b0, nb, s);
      run_step(t, layers_, opt, nb, s);
      const double el = seconds_since(t0);
      if (callbacks.on_progress && (el - last_progress >= options.progress_interval_s || step + 1 == steps)) {
        last_progress = el;
        const Stats st = t.read_stats(t.stats, s);  // waits for the GPU
        if (!half && !std::isfinite(st.loss_sum)) throw_non_finite(st.loss_sum, half, epoch, checked, step + 1);
        checked = step + 1;
        if (half) {
          skipped += opt.take_skipped_steps();
          check_loss_scale(opt.loss_scale(), opt.min_loss_scale(), skipped, step + 1, epoch, false);
        }
        callbacks.on_progress({epoch, step + 1, steps, st.loss_sum / st.count, st.correct / st.count, el});
      }
      if (callbacks.should_stop && callbacks.should_stop()) {
        history.interrupted = true;
        ++step;
        break;
      }
    }
    if (prefetch) prefetch->finish();
    const Stats st = t.read_stats(t.stats, s);  // the final wait for the GPU
    EpochLog log;
    log.epoch = epoch;
    log.train_seconds = seconds_since(t0);
    log.steps = step;
    log.samples = static_cast<std::int64_t>(st.count);
    if (st.count > 0) {
      log.loss = st.loss_sum / st.count;
      log.accuracy = st.correct / st.count;
    }
    log.val_loss = log.val_accuracy = std::numeric_limits<double>::quiet_NaN();
    log.loss_scale = 1.0;
    if (half) {
      skipped += opt.take_skipped_steps();
      log.loss_scale = opt.loss_scale();
      log.skipped_steps = skipped;
      check_loss_scale(log.loss_scale, opt.min_loss_scale(), skipped, step, epoch, step == steps);
    }
    if (!std::isfinite(st.loss_sum)) throw_non_finite(st.loss_sum, half, epoch, checked, step);
    if (!finish_epoch(log, step == steps, history, validation, callbacks)) break;
  }
  set_training(true);
  return history;
}

void Sequential::drop_graphs_if_moved(const std::vector<const void*>& addrs, std::size_t first) {
  if (!gpu_) return;
  GpuTrainer& t = *gpu_;
  if (t.graphs.empty()) return;
  // The layers' own step buffers, recorded after the outputs and the input gradients: a
  // training-mode forward from a callback may have moved one (MaxPool2D's argmax_) while
  // every output still fitted.
  std::vector<const void*> own;
  for (auto& l : layers_) l->step_buffers(own);
  const std::size_t own_first = 2 * layers_.size();
  if (t.graph_addrs.size() < first + addrs.size() ||
      !std::equal(addrs.begin(), addrs.end(), t.graph_addrs.begin() + first) ||
      t.graph_addrs.size() != own_first + own.size() ||
      !std::equal(own.begin(), own.end(), t.graph_addrs.begin() + own_first))
    t.drop_graphs();
}

void Sequential::refresh_half_weights() {
  if (compute_dtype_ != DType::kF16) return;
  const cudaStream_t s = GpuContext::current().stream();
  for (Parameter* p : parameters())
    if (p->half.defined()) launch_cast_f32_to_f16(p->value.data<float>(), p->half.data<Half>(), p->value.numel(), s);
}

EvalResult Sequential::evaluate_gpu(const data::Dataset& d, std::int64_t batch_size) {
  EvalResult r;
  if (d.count == 0 || layers_.empty()) return r;
  GpuContext& ctx = GpuContext::current();
  const cudaStream_t s = ctx.stream();
  GpuTrainer& t = trainer_of(gpu_);
  const bool half = compute_dtype_ == DType::kF16;
  refresh_half_weights();
  const std::int64_t bs = gpu_inference_batch(std::min(batch_size, d.count));  // d.count >= 1 here
  const std::int64_t sample = d.sample_size();
  DeviceData& dd = t.device_data(d, true, s);
  ensure(t.eval_x, Shape{bs, d.rows, d.cols, d.channels}, compute_dtype_, Device::kGpu);
  ensure(t.eval_labels, Shape{bs}, DType::kI32, Device::kGpu);
  ensure(t.eval_stats, Shape{kNumStats}, DType::kF32, Device::kGpu);
  ensure(t.eval_cursor, Shape{2}, DType::kI32, Device::kGpu);
  t.eval_stats.fill_zero_async(s);
  gpu_memset_async(t.eval_cursor.raw(), 0, sizeof(std::int64_t), s);
  std::vector<const void*> outputs;
  {
    InferenceMode inference(*this);
    for (std::int64_t b0 = 0; b0 < d.count; b0 += bs) {
      const std::int64_t nb = std::min(bs, d.count - b0);
      // In order: the identity permutation, read at the cursor, which advances by nb.
      launch_gather_batch(dd.images.data<std::uint8_t>(), dd.labels.data<std::uint8_t>(),
                          dd.identity.data<std::int32_t>(), t.eval_cursor_ptr(), nb, sample, t.eval_x.raw(), half,
                          t.eval_labels.data<std::int32_t>(), s);
      const Tensor xb = t.eval_x.slice(0, nb);
      const Tensor* h = &xb;
      outputs.clear();
      for (auto& l : layers_) {
        h = &l->forward(*h);
        outputs.push_back(h->raw());
      }
      launch_softmax_xent(h->raw(), half, t.eval_labels.data<std::int32_t>(), nb, h->dim(1), nullptr,
                          1.0f / static_cast<float>(nb), nullptr, t.eval_stats.data<float>(),
                          ctx.reduction_scratch(), s);
      launch_advance_cursor(t.eval_cursor_ptr(), nb, s);
    }
  }
  const Stats st = t.read_stats(t.eval_stats, s);  // the one wait
  drop_graphs_if_moved(outputs, 0);
  r.count = static_cast<std::int64_t>(st.count);
  if (r.count > 0) {
    r.loss = st.loss_sum / st.count;
    r.accuracy = st.correct / st.count;
  }
  return r;
}

}  // namespace mf
