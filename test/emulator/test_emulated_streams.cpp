// test_emulated_streams.cpp: the orders in which the CPU emulation of CUDA runs the work of
// streams (streams.h), on the races they are there to show: each test makes the mistake a
// program can make with streams, and checks which order turns it into wrong data and that
// the correct program gets the right data in every order. Runs only on the emulation: on a
// GPU these races give whatever the hardware's timing gives.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "test/emulator/streams.h"

namespace {

using mf::emulator::Order;

constexpr Order kOrders[] = {Order::kDeferred, Order::kOthersFirst, Order::kImmediate};

const char* order_name(Order o) {
  switch (o) {
    case Order::kDeferred: return "deferred";
    case Order::kOthersFirst: return "others-first";
    case Order::kImmediate: return "immediate";
  }
  return "?";
}

// Sets the order for one test, and puts back the run's own (MF_EMULATED_STREAMS) after it.
class OrderGuard {
 public:
  explicit OrderGuard(Order o) : old_(mf::emulator::set_order(o)) {}
  ~OrderGuard() { mf::emulator::set_order(old_); }
  OrderGuard(const OrderGuard&) = delete;
  OrderGuard& operator=(const OrderGuard&) = delete;

 private:
  Order old_;
};

// The objects one test uses: two non-blocking streams (as microflow makes them), an event,
// two device buffers and a pinned host buffer of kBytes each, freed at the end.
constexpr std::size_t kBytes = 64;
struct Device {
  cudaStream_t a = nullptr, b = nullptr;
  cudaEvent_t e = nullptr;
  unsigned char *x = nullptr, *y = nullptr, *pinned = nullptr;
  Device() {
    EXPECT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&x), kBytes), cudaSuccess);
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&y), kBytes), cudaSuccess);
    EXPECT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned), kBytes), cudaSuccess);
  }
  ~Device() {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
    EXPECT_EQ(cudaFree(y), cudaSuccess);
    EXPECT_EQ(cudaFree(x), cudaSuccess);
    EXPECT_EQ(cudaEventDestroy(e), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(b), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(a), cudaSuccess);
  }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  // The first byte of device buffer p, read back after all the work has run.
  int read(const unsigned char* p) {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    unsigned char v = 0;
    EXPECT_EQ(cudaMemcpy(&v, p, 1, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
};

// Stream a fills x; stream b copies x to y, and the host waits for b only. Without b waiting
// for a's event, y gets x's old bytes where a's work has not run yet: in the deferred order.
int producer_then_consumer(bool wait) {
  Device d;
  EXPECT_EQ(cudaMemsetAsync(d.x, 1, kBytes, d.b), cudaSuccess);  // x's old bytes
  EXPECT_EQ(cudaStreamSynchronize(d.b), cudaSuccess);
  EXPECT_EQ(cudaMemsetAsync(d.x, 7, kBytes, d.a), cudaSuccess);
  EXPECT_EQ(cudaEventRecord(d.e, d.a), cudaSuccess);
  if (wait) {
    EXPECT_EQ(cudaStreamWaitEvent(d.b, d.e, 0), cudaSuccess);
  }
  EXPECT_EQ(cudaMemcpyAsync(d.y, d.x, kBytes, cudaMemcpyDeviceToDevice, d.b), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(d.b), cudaSuccess);
  return d.read(d.y);
}

// Runs a racy program with its wait and without, in every order: with the wait it gives
// `right` in all of them; without it, `wrong` in the order that shows the race, and `right`
// in the others (which is how the race goes unseen there).
void check_race(int (*program)(bool wait), int right, int wrong, Order shows) {
  for (Order o : kOrders) {
    SCOPED_TRACE(order_name(o));
    OrderGuard order(o);
    EXPECT_EQ(program(/*wait=*/true), right);
    EXPECT_EQ(program(/*wait=*/false), o == shows ? wrong : right);
  }
}

TEST(EmulatedStreams, DeferredShowsAConsumerThatDoesNotWaitForItsProducer) {
  check_race(producer_then_consumer, /*right=*/7, /*wrong=*/1, Order::kDeferred);
}

// Stream b copies x to y (the consumer, queued first); stream a then refills x. Without a
// waiting for b's event, a may run first and y gets the new bytes: in the others-first order,
// where the host's wait for b runs a's work before b's.
int consumer_then_refill(bool wait) {
  Device d;
  EXPECT_EQ(cudaMemsetAsync(d.x, 1, kBytes, d.b), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(d.b), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(d.y, d.x, kBytes, cudaMemcpyDeviceToDevice, d.b), cudaSuccess);
  EXPECT_EQ(cudaEventRecord(d.e, d.b), cudaSuccess);
  if (wait) {
    EXPECT_EQ(cudaStreamWaitEvent(d.a, d.e, 0), cudaSuccess);
  }
  EXPECT_EQ(cudaMemsetAsync(d.x, 9, kBytes, d.a), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(d.b), cudaSuccess);
  return d.read(d.y);
}

TEST(EmulatedStreams, OthersFirstShowsARefillThatDoesNotWaitForTheConsumer) {
  check_race(consumer_then_refill, /*right=*/1, /*wrong=*/9, Order::kOthersFirst);
}

// A copy into pinned host memory lands when its stream gets to it: the host reads the old
// bytes until it synchronises.
TEST(EmulatedStreams, PinnedMemoryReceivesACopyOnlyWhenItsStreamRuns) {
  OrderGuard order(Order::kDeferred);
  Device d;
  std::memset(d.pinned, 0, kBytes);
  ASSERT_EQ(cudaMemsetAsync(d.x, 5, kBytes, d.a), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(d.pinned, d.x, kBytes, cudaMemcpyDeviceToHost, d.a), cudaSuccess);
  EXPECT_EQ(d.pinned[0], 0) << "read before the stream was synchronised";
  ASSERT_EQ(cudaStreamSynchronize(d.a), cudaSuccess);
  EXPECT_EQ(d.pinned[kBytes - 1], 5);
}

// Copies a pinned buffer of 2s into x and a pageable one into y with `copy`, refills both
// sources with 3s as soon as the calls return, and gives what x and y received.
std::pair<int, int> copies_from_refilled_sources(Device& d,
                                                 const std::function<cudaError_t(void*, const void*)>& copy) {
  std::memset(d.pinned, 2, kBytes);
  std::vector<unsigned char> pageable(kBytes, 2);
  EXPECT_EQ(copy(d.x, d.pinned), cudaSuccess);
  EXPECT_EQ(copy(d.y, pageable.data()), cudaSuccess);
  std::memset(d.pinned, 3, kBytes);
  std::fill(pageable.begin(), pageable.end(), 3);
  return {d.read(d.x), d.read(d.y)};
}

// An asynchronous copy from pinned memory reads it when its stream gets to it, so refilling
// the buffer before that changes what arrives; pageable memory is read (staged) at the call.
TEST(EmulatedStreams, PinnedSourceIsReadWhenItsStreamRunsPageableAtTheCall) {
  OrderGuard order(Order::kDeferred);
  Device d;
  const auto got = copies_from_refilled_sources(d, [&](void* dst, const void* src) {
    return cudaMemcpyAsync(dst, src, kBytes, cudaMemcpyHostToDevice, d.a);
  });
  EXPECT_EQ(got.first, 3) << "pinned";
  EXPECT_EQ(got.second, 2) << "pageable";
}

// A blocking copy from the host has read its source when it returns: from pinned memory it
// is done, from pageable memory staged.
TEST(EmulatedStreams, BlockingCopyFromTheHostHasReadItsSourceOnReturn) {
  OrderGuard order(Order::kDeferred);
  Device d;
  const auto got = copies_from_refilled_sources(
      d, [](void* dst, const void* src) { return cudaMemcpy(dst, src, kBytes, cudaMemcpyHostToDevice); });
  EXPECT_EQ(got.first, 2) << "pinned";
  EXPECT_EQ(got.second, 2) << "pageable";
}

// cudaMemcpy goes on the legacy default stream, which does not wait for the work of
// non-blocking streams.
TEST(EmulatedStreams, BlockingCopyDoesNotWaitForNonBlockingStreams) {
  OrderGuard order(Order::kDeferred);
  Device d;
  ASSERT_EQ(cudaMemsetAsync(d.x, 4, kBytes, d.a), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(d.a), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(d.x, 6, kBytes, d.a), cudaSuccess);
  unsigned char v = 0;
  ASSERT_EQ(cudaMemcpy(&v, d.x, 1, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(v, 4);
  ASSERT_EQ(cudaStreamSynchronize(d.a), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(&v, d.x, 1, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(v, 6);
}

// An event's time is known once its stream has got to it: asking before that is
// cudaErrorNotReady, as on a GPU.
TEST(EmulatedStreams, ElapsedTimeNeedsTheStopEventReached) {
  OrderGuard order(Order::kDeferred);
  Device d;
  cudaEvent_t start = nullptr, stop = nullptr;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&stop), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(start, d.a), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(d.x, 0, kBytes, d.a), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(stop, d.a), cudaSuccess);
  float ms = -1;
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, stop), cudaErrorNotReady);
  EXPECT_EQ(cudaGetLastError(), cudaErrorNotReady);
  ASSERT_EQ(cudaEventSynchronize(stop), cudaSuccess);
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, stop), cudaSuccess);
  EXPECT_GE(ms, 0.0f);
  EXPECT_EQ(cudaEventDestroy(stop), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(start), cudaSuccess);
}

// The work of a destroyed stream still runs, and an event recorded on it can still be waited
// for.
TEST(EmulatedStreams, DestroyedStreamsWorkStillRuns) {
  OrderGuard order(Order::kDeferred);
  Device d;
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(d.x, 8, kBytes, s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(d.e, s), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(d.b, d.e, 0), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(d.y, d.x, kBytes, cudaMemcpyDeviceToDevice, d.b), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(d.b), cudaSuccess);
  unsigned char v = 0;
  ASSERT_EQ(cudaMemcpy(&v, d.y, 1, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(v, 8);
}

// Two host threads drive two streams, as the prefetch pipeline does: one fills slot k of a
// pinned buffer and copies it to the device on its stream, the other waits for that copy on
// its own stream and reads the slot back; events in both directions keep a slot from being
// refilled before it is read. Every batch must arrive whole, in every order, and (under
// ThreadSanitizer) the emulation's own locking must hold with two threads queuing and
// running work at once.
TEST(EmulatedStreams, TwoThreadsHandingOffBatchesThroughEvents) {
  constexpr int kSlots = 2, kBatches = 40;
  for (Order o : kOrders) {
    SCOPED_TRACE(order_name(o));
    OrderGuard order(o);
    cudaStream_t copy = nullptr, compute = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), cudaSuccess);
    cudaEvent_t copied[kSlots], consumed[kSlots];
    unsigned char *pinned = nullptr, *staging = nullptr, *out = nullptr;
    for (int k = 0; k < kSlots; ++k) {
      ASSERT_EQ(cudaEventCreateWithFlags(&copied[k], cudaEventDisableTiming), cudaSuccess);
      ASSERT_EQ(cudaEventCreateWithFlags(&consumed[k], cudaEventDisableTiming), cudaSuccess);
    }
    ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned), kSlots * kBytes), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&staging), kSlots * kBytes), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&out), kBatches * kBytes), cudaSuccess);
    std::mutex mu;
    std::condition_variable cv;
    int produced = 0, taken = 0;  // batches whose copy, and whose read, is queued
    const auto wait_until = [&](int& counter, int at_least) {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return counter >= at_least; });
    };
    const auto publish = [&](int& counter, int value) {
      {
        std::lock_guard<std::mutex> lock(mu);
        counter = value;
      }
      cv.notify_all();
    };
    std::thread producer([&] {
      for (int i = 0; i < kBatches; ++i) {
        const int k = i % kSlots;
        wait_until(taken, i - kSlots + 1);  // the slot's last batch has been queued for reading
        EXPECT_EQ(cudaEventSynchronize(copied[k]), cudaSuccess);  // the slot's last copy has read it
        std::memset(pinned + k * kBytes, i + 1, kBytes);
        EXPECT_EQ(cudaStreamWaitEvent(copy, consumed[k], 0), cudaSuccess);  // and its last read is done
        EXPECT_EQ(cudaMemcpyAsync(staging + k * kBytes, pinned + k * kBytes, kBytes, cudaMemcpyHostToDevice, copy),
                  cudaSuccess);
        EXPECT_EQ(cudaEventRecord(copied[k], copy), cudaSuccess);
        publish(produced, i + 1);
      }
    });
    for (int i = 0; i < kBatches; ++i) {
      const int k = i % kSlots;
      wait_until(produced, i + 1);
      EXPECT_EQ(cudaStreamWaitEvent(compute, copied[k], 0), cudaSuccess);
      EXPECT_EQ(cudaMemcpyAsync(out + i * kBytes, staging + k * kBytes, kBytes, cudaMemcpyDeviceToDevice, compute),
                cudaSuccess);
      EXPECT_EQ(cudaEventRecord(consumed[k], compute), cudaSuccess);
      publish(taken, i + 1);
      if (i % 7 == 3) {  // now and then, as the progress report does
        EXPECT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
      }
    }
    producer.join();
    ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
    std::vector<unsigned char> got(kBatches * kBytes);
    ASSERT_EQ(cudaMemcpy(got.data(), out, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    for (int i = 0; i < kBatches; ++i)
      for (std::size_t j = 0; j < kBytes; j += kBytes - 1)
        ASSERT_EQ(got[i * kBytes + j], i + 1) << "batch " << i << ", byte " << j;
    EXPECT_EQ(cudaFree(out), cudaSuccess);
    EXPECT_EQ(cudaFree(staging), cudaSuccess);
    EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
    for (int k = 0; k < kSlots; ++k) {
      EXPECT_EQ(cudaEventDestroy(copied[k]), cudaSuccess);
      EXPECT_EQ(cudaEventDestroy(consumed[k]), cudaSuccess);
    }
    EXPECT_EQ(cudaStreamDestroy(compute), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(copy), cudaSuccess);
  }
}

}  // namespace
