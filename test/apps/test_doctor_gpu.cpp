// test_doctor_gpu.cpp: doctor --burn's GEMM stress test in-process, small: every product
// equals the first bit for bit, and the first agrees with a CPU dot product on sampled
// elements (which a swapped operand or a transposed result fails). On a GPU and on the CUDA
// emulation (as Emulated.DoctorGpu.*); test_doctor.cpp runs the doctor program itself.
#include <gtest/gtest.h>

#include <cstdint>

#include "test/test_util.h"
#if MF_WITH_CUDA
#include "apps/doctor_gpu.h"
#endif

namespace {

#if MF_WITH_CUDA
void check_short_burn(bool fp16) {
  mf::apps::BurnOptions o;
  o.seconds = 0;  // one round of products
  o.n = 256;      // the smallest size the burn takes
  o.fp16 = fp16;
  o.cpu_samples = 48;
  int progress_calls = 0;
  const mf::apps::BurnResult r =
      mf::apps::gpu_burn(o, [&](double, std::int64_t, std::int64_t) { ++progress_calls; });
  EXPECT_EQ(r.n, 256);
  EXPECT_EQ(r.fp16, fp16);
  EXPECT_EQ(r.iterations, 8);  // one round of eight products between host checks
  EXPECT_EQ(r.mismatched, 0);
  EXPECT_EQ(r.bad_iterations, 0);
  EXPECT_EQ(r.cpu_checked, 48);
  EXPECT_EQ(r.cpu_failed, 0) << "worst error " << r.cpu_worst << " of the tolerance";
  EXPECT_LE(r.cpu_worst, 1.0);
  EXPECT_GT(r.seconds, 0.0);
  EXPECT_GT(r.tflops, 0.0);
  EXPECT_LE(progress_calls, 1);  // called about once a second; this round takes less on a GPU
}
#endif

TEST(DoctorGpu, BurnProductsMatchTheCpuFp32) {
  MF_SKIP_WITHOUT_GPU();
#if MF_WITH_CUDA
  check_short_burn(/*fp16=*/false);
#endif
}

TEST(DoctorGpu, BurnProductsMatchTheCpuFp16) {
  MF_SKIP_WITHOUT_GPU();
#if MF_WITH_CUDA
  check_short_burn(/*fp16=*/true);
#endif
}

}  // namespace
