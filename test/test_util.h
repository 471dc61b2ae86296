// test_util.h: tolerances, comparisons, random tensors, and the naive double-precision
// references that define the right answer for both devices.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "runtime/gpu_runtime.h"
#include "kernels/kernel_options.h"
#include "tensor/rng.h"
#include "tensor/tensor.h"

// A GPU test on a machine without one is skipped, with the reason.
#define MF_SKIP_WITHOUT_GPU()                                                 \
  do {                                                                        \
    if (!::mf::gpu_available()) GTEST_SKIP() << ::mf::gpu_status().reason;     \
  } while (0)

namespace mf {
// GoogleTest prints a Shape in failure messages as "(2, 28, 28, 1)" (found by ADL).
inline void PrintTo(const Shape& s, std::ostream* os) { *os << s.str(); }
}  // namespace mf

namespace mf::testing {

// A fresh folder under the system's temp folder, named after the running test (plus `tag`)
// and this process, removed with everything in it when the object goes.
class TempDir {
 public:
  explicit TempDir(const std::string& tag = "");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// The program a test runs (train_mnist, predict, doctor), given its path in the build tree:
// the file of that name beside the running test binary when there is one, so a bin/ folder
// copied to another machine runs its own programs; else the build-tree path itself.
std::string program_path(const std::string& built);

// `s` in single quotes for the shell, so that a path with spaces (a build folder under
// "My projects") stays one argument of the commands the tests run.
std::string sh_quote(const std::string& s);

// How a program a test ran ended (status: its exit status, -1 when a signal ended it) and
// what it printed.
// The bytes of `path`; "" when it cannot be opened (a file a child has not created yet).
std::string read_whole_file(const std::string& path);

struct RunResult {
  int status;
  std::string out, err;
};
// Runs `program args` through the shell (program_path(program), quoted), standard input
// from /dev/null, its output going to stdout.txt and stderr.txt in `dir`. `before`, when
// given, is a shell command run first in the same shell (a ulimit that then applies to the
// program).
RunResult run_program(const std::string& program, const std::string& args, const TempDir& dir,
                      const std::string& before = "");
// The number of lines in `s` (its '\n's).
int count_lines(const std::string& s);

struct Tol {
  double atol, rtol;
};

// Every element: |a - r| <= atol + rtol * |r|. On failure reports the count, the largest
// error with its index, and the first few failing pairs.
::testing::AssertionResult all_close(const std::vector<double>& a, const std::vector<double>& ref, Tol tol);
::testing::AssertionResult all_close(const Tensor& a, const std::vector<double>& ref, Tol tol);
::testing::AssertionResult all_close(const Tensor& a, const Tensor& ref, Tol tol);
// FP32 tolerance for a reduction of `terms` products of size <= 1 (weight and bias
// gradients): float rounding of a running sum grows like sqrt(terms) * eps * |sum|, so the
// absolute part scales with sqrt(terms): 1e-5 * sqrt(3380) = 5.8e-4 for the largest
// reductions tested, while a wrong or missing term (an error of ~0.3) is far outside.
inline Tol fp32_reduction_tol(std::int64_t terms) { return Tol{1e-5 * std::sqrt(static_cast<double>(terms)), 1e-4}; }

// Bits of a float and back (for exact checks of conversions).
float float_from_bits(std::uint32_t b);
std::uint32_t bits_of_float(float f);

// Normalised mean squared error sum (a - r)^2 / sum r^2 (0 when both are zero).
double nmse(const std::vector<double>& a, const std::vector<double>& ref);
double nmse(const Tensor& a, const std::vector<double>& ref);

std::vector<double> to_double(const Tensor& t);
Tensor uniform(const Shape& shape, float lo, float hi, Rng& rng);
// Each value of a host f32 tensor rounded to the nearest f16 (in place): inputs that an FP16
// layer sees exactly as the FP32 reference does.
void round_to_half(Tensor& t);
// Values whose neighbours differ by at least `gap` (no max-pool ties, no values near
// ReLU's kink when offset away from zero): a random permutation of a spaced grid.
Tensor spaced(const Shape& shape, float gap, Rng& rng);
// Labels uniform in [0, classes) as an i32 host tensor.
Tensor random_labels(std::int64_t n, int classes, Rng& rng);
// These labels as an i32 host tensor.
Tensor labels_of(const std::vector<std::int32_t>& labels);

// ---- naive references, double precision, NHWC, same conventions as the layers ----
// conv: x (N,H,W,C), w (K,k,k,C), b (K) -> (N,H-k+1,W-k+1,K), optional ReLU.
std::vector<double> conv2d_forward_ref(const Tensor& x, const Tensor& w, const Tensor& b, bool relu);
// Given dy for the conv's output (after ReLU), the gradients wrt x, w, b.
struct ConvGrads {
  std::vector<double> dx, dw, db;
};
ConvGrads conv2d_backward_ref(const Tensor& x, const Tensor& w, const Tensor& b, bool relu, const Tensor& dy);
// Each window's winner: the first NaN if it holds one (the output is NaN), else the first of
// its largest values (row by row: top-left, top-right, bottom-left, bottom-right).
std::vector<double> maxpool_forward_ref(const Tensor& x);
std::vector<double> maxpool_backward_ref(const Tensor& x, const Tensor& dy);
// One 2x2 image of `c` channels whose channel ch holds the window windows[ch % windows.size()]
// (its four values row by row): for MaxPool2D's tests of which position wins.
Tensor maxpool_windows(const std::vector<std::vector<float>>& windows, std::int64_t c);
// maxpool_windows whose windows hold NaN at various places, and some no NaN at all, inf
// and -inf among them: MaxPool2D's NaN tests on both devices.
Tensor maxpool_nan_windows(std::int64_t c);
// (1, 1, 1, c) gradients, ch + 1 for channel ch, so that each window's shows where it went.
Tensor window_gradients(std::int64_t c);
// `a` equals `ref` exactly, NaN where `ref` is NaN.
::testing::AssertionResult same_or_both_nan(const Tensor& a, const std::vector<double>& ref);
// ReLU's non-finite cases, for Conv2D and Dense on both devices: sets the biases of filters 0,
// 1 and 2 (host f32, at least 3 of them) to NaN, +inf and -inf.
void set_nonfinite_biases(Tensor& bias);
// A ReLU layer's output (host, channels last) after set_nonfinite_biases: channel 0 is NaN
// everywhere, channel 1 +inf, channel 2 zero, and every other channel finite and >= 0.
::testing::AssertionResult relu_of_nonfinite_biases(const Tensor& y);
// dense: x (N,in), w (in,units), b (units)
std::vector<double> dense_forward_ref(const Tensor& x, const Tensor& w, const Tensor& b, bool relu);
struct DenseGrads {
  std::vector<double> dx, dw, db;
};
DenseGrads dense_backward_ref(const Tensor& x, const Tensor& w, const Tensor& b, bool relu, const Tensor& dy);
// mean softmax cross-entropy of logits (N,K) and its gradient; correct = argmax hits.
struct XentRef {
  double loss_sum;
  std::int64_t correct;
  std::vector<double> dlogits;  // of the mean loss
};
XentRef softmax_xent_ref(const Tensor& logits, const Tensor& labels);

}  // namespace mf::testing
