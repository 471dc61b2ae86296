// batch_sources.cu: how batches reach the GPU (--pipeline), the article's tf.data lesson
// three ways: resident (the whole u8 dataset on the device, a device-side permutation and
// cursor pick each batch: gpu_steps.cu's step), prefetch (a host thread and a copy stream,
// below) and naive (a pageable copy each step, waited for). Also the device copies of the
// datasets and the statistics read back.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "data/batching.h"
#include "kernels/gpu/launchers.h"
#include "layers/softmax_xent.h"
#include "runtime/cuda_check.h"
#include "runtime/gpu_runtime.h"
#include "train/gpu_trainer.h"

namespace mf {

GpuTrainer::GpuTrainer() : host_stats(kNumStats * sizeof(float)) {}

GpuTrainer::~GpuTrainer() {
  // Copies of the prefetch pipeline may still read the pinned buffers freed below.
  if (copy_stream) MF_GPU_WARN(cudaStreamSynchronize(copy_stream.get()));
}

DeviceData& GpuTrainer::device_data(const data::Dataset& d, bool for_eval, cudaStream_t s) {
  const data::DataKey key = data::data_key(d);
  DeviceData* dd = train_data.key == key ? &train_data : eval_data.key == key ? &eval_data : nullptr;
  if (!dd) {
    dd = !for_eval ? &train_data : fit_data == &eval_data ? &train_data : &eval_data;
    dd->key = data::DataKey{};  // not valid until the copy is done
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

StepStats GpuTrainer::read_stats(const Tensor& device_stats, cudaStream_t s) {
  gpu_copy_async(host_stats.as<float>(), device_stats.raw(), kNumStats * sizeof(float), CopyKind::kDeviceToHost, s);
  gpu_stream_synchronize(s);
  const float* h = host_stats.as<float>();
  return {h[kStatLossSum], h[kStatCorrect], h[kStatCount]};
}

std::string GpuTrainer::describe() const {
  if (!fitted) return "";
  return std::string("pipeline ") + pipeline_name(pipeline) + "; " + graph.describe();
}

void GpuTrainer::size_pipeline_buffers() {
  if (pipeline == Pipeline::kPrefetch) {
    if (!copy_stream) {
      copy_stream = make_stream();
      for (int k = 0; k < kPrefetchSlots; ++k) {
        copied[k] = make_event(false);
        consumed[k] = make_event(false);
      }
    }
    // No copy of an earlier fit still reads the buffers below, and no kernel still reads the
    // staging buffers (a fit that ended by an exception may leave work queued): a block freed
    // here can go straight to a buffer the copy stream writes, outside the compute stream's order.
    MF_GPU_CHECK(cudaStreamSynchronize(copy_stream.get()));
    MF_GPU_CHECK(cudaStreamSynchronize(compute_stream()));
    for (int k = 0; k < kPrefetchSlots; ++k) {
      const std::size_t bytes = static_cast<std::size_t>(batch * sample);
      if (host_images[k].bytes() < bytes) host_images[k] = PinnedBuffer(bytes);
      if (host_labels[k].bytes() < static_cast<std::size_t>(batch))
        host_labels[k] = PinnedBuffer(static_cast<std::size_t>(batch));
      ensure(staging_images[k], Shape{batch * sample}, DType::kU8, Device::kGpu);
      ensure(staging_labels[k], Shape{batch}, DType::kU8, Device::kGpu);
    }
  }
  if (pipeline == Pipeline::kNaive) {
    naive_x.resize(static_cast<std::size_t>(batch * sample));
    naive_y.resize(static_cast<std::size_t>(batch));
    if (half) ensure(naive_x32, Shape{batch * sample}, DType::kF32, Device::kGpu);
  }
}

// The naive pipeline: the copy goes on the compute stream and is waited for there (a legacy
// cudaMemcpy would not wait for the previous step, which may still read the input buffer,
// on this non-blocking stream).
void GpuTrainer::naive_feed(const data::Dataset& d, const std::int32_t* idx, std::int64_t nb, cudaStream_t s) {
  data::gather_batch(d, idx, nb, naive_x.data(), naive_y.data());
  const std::int64_t n = nb * sample;
  if (half) {
    gpu_copy_async(naive_x32.raw(), naive_x.data(), static_cast<std::size_t>(n) * sizeof(float),
                   CopyKind::kHostToDevice, s);
    launch_cast_f32_to_f16(naive_x32.data<float>(), x.data<Half>(), n, s);
  } else {
    gpu_copy_async(x.raw(), naive_x.data(), static_cast<std::size_t>(n) * sizeof(float), CopyKind::kHostToDevice,
                   s);
  }
  gpu_copy_async(labels.raw(), naive_y.data(), static_cast<std::size_t>(nb) * sizeof(std::int32_t),
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
Prefetcher::Prefetcher(GpuTrainer& t, const data::Dataset& d, std::vector<std::int32_t> perm, std::int64_t batch,
                       std::int64_t steps)
    : t_(t), d_(d), perm_(std::move(perm)), batch_(batch), steps_(steps), device_(current_gpu()) {
  thread_ = std::thread([this] { run(); });
}

void Prefetcher::feed(std::int64_t step, std::int64_t nb, cudaStream_t s) {
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

void Prefetcher::finish() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}


void Prefetcher::run() {
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

}  // namespace mf
