// doctor_checks.h: doctor's report (one line per check, marked OK, WARN, FAIL or info)
// and its checks of the CPU side: the thread pool, a GEMM's speed, and the smoke tests of
// a Dense and a Conv2D layer against double-precision references (and, with a GPU, GPU
// against CPU).
#pragma once
#include <cstdio>
#include <string>

namespace mf::apps {

// ---- the checklist ----

enum class Mark { kOk, kWarn, kFail, kInfo };

class Report {
 public:
  explicit Report(bool color) : color_(color) {}
  void section(const std::string& name) { std::printf("\n%s\n", name.c_str()); }
  void add(Mark m, const std::string& text) {
    static const char* kText[] = {"  OK  ", " WARN ", " FAIL ", " info "};
    static const char* kColor[] = {"\033[32m", "\033[33m", "\033[31m", "\033[2m"};
    const int i = static_cast<int>(m);
    if (color_) std::printf("  [%s%s\033[0m] %s\n", kColor[i], kText[i], text.c_str());
    else std::printf("  [%s] %s\n", kText[i], text.c_str());
    std::fflush(stdout);
    ++counts_[i];
  }
  int count(Mark m) const { return counts_[static_cast<int>(m)]; }

 private:
  bool color_;
  int counts_[4] = {0, 0, 0, 0};
};

// printf into a std::string.
std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));

// The smoke tests: each layer forward and backward against the references, on the CPU and,
// when `gpu`, on the GPU against the CPU.
void smoke_tests(Report& rep, bool gpu);
// An n x n x n FP32 GEMM's GFLOP/s on the CPU (Eigen, all threads).
double cpu_gemm_gflops(int n);
// The CPU side: threads, SIMD width, a GEMM's GFLOP/s.
void cpu_checks(Report& rep);

}  // namespace mf::apps
