// test_doctor.cpp: the doctor tool runs everywhere: without a GPU it explains why, passes
// its CPU smoke tests and exits 0 (1 with --require-gpu).
#include <gtest/gtest.h>

#include <string>

#include "runtime/gpu_runtime.h"
#include "test/test_util.h"

namespace {

using mf::testing::RunResult;

// doctor --no-color with `args` (run_program: the path quoted, so a build folder whose
// path has a space runs too).
RunResult run_doctor(const std::string& args) {
  const mf::testing::TempDir dir;
  return mf::testing::run_program(MF_DOCTOR_BIN, "--no-color " + args, dir);
}

}  // namespace

TEST(Doctor, WithoutAGpuSaysWhyAndExitsZero) {
  if (mf::gpu_available()) GTEST_SKIP() << "this machine has a GPU";
  const RunResult r = run_doctor("");
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find(mf::gpu_status().reason), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[ WARN ] no usable CUDA device"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[  OK  ] CPU GEMM"), std::string::npos) << "CPU smoke test: " << r.out;
  EXPECT_NE(r.out.find("[  OK  ] CPU convolution"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Eigen "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("FAIL ]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Ready to train on the CPU only"), std::string::npos) << r.out;
#if MF_WITH_CUDA
  EXPECT_NE(r.out.find("cuDNN built against"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cuBLAS built against"), std::string::npos) << r.out;
#endif
}

TEST(Doctor, RequireGpuFailsWithoutOne) {
  if (mf::gpu_available()) GTEST_SKIP() << "this machine has a GPU";
  const RunResult r = run_doctor("--require-gpu --burn 1");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("[ FAIL ]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Not ready"), std::string::npos) << r.out;
}

TEST(Doctor, BadFlagExitsTwoWithOneLine) {
  const RunResult r = run_doctor("--burn abc");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "doctor: error: --burn expects a number, got 'abc'\n");
}

TEST(DoctorGpu, ChecklistAndShortBurnPass) {
  MF_SKIP_WITHOUT_GPU();
  const RunResult r = run_doctor("--require-gpu --burn 2 --burn-size 2048");
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("GPU 0: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[  OK  ] GPU GEMM"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[  OK  ] GPU convolution"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("TFLOP/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Ready to train on the GPU"), std::string::npos) << r.out;
}
