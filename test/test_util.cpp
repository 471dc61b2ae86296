// test_util.cpp: comparisons and the naive double-precision references of test_util.h.
#include "test/test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <sys/wait.h>
#include <unistd.h>

#include "tensor/half.h"

namespace mf::testing {

TempDir::TempDir(const std::string& tag) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string test = info ? std::string(info->test_suite_name()) + "_" + info->name() : "none";
  path_ = std::filesystem::temp_directory_path() / ("mf_" + test + tag + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(path_);
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::vector<double> to_double(const Tensor& t) {
  const std::vector<float> f = t.to_vector();
  return std::vector<double>(f.begin(), f.end());
}

::testing::AssertionResult all_close(const std::vector<double>& a, const std::vector<double>& ref, Tol tol) {
  if (a.size() != ref.size())
    return ::testing::AssertionFailure() << "size " << a.size() << " vs reference " << ref.size();
  std::size_t bad = 0, worst = 0;
  double worst_excess = -1.0;
  std::ostringstream first;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double err = std::fabs(a[i] - ref[i]);
    const double allowed = tol.atol + tol.rtol * std::fabs(ref[i]);
    const bool ok = err <= allowed;  // NaN fails
    if (!ok) {
      if (bad < 5) first << "\n  [" << i << "] got " << a[i] << ", want " << ref[i] << " (err " << err << ")";
      ++bad;
      const double excess = std::isnan(err) ? 1e300 : err - allowed;
      if (excess > worst_excess) worst_excess = excess, worst = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << a.size() << " elements outside atol " << tol.atol
                                       << " + rtol " << tol.rtol << "; worst at [" << worst << "]: got " << a[worst]
                                       << ", want " << ref[worst] << first.str();
}

::testing::AssertionResult all_close(const Tensor& a, const std::vector<double>& ref, Tol tol) {
  return all_close(to_double(a), ref, tol);
}
::testing::AssertionResult all_close(const Tensor& a, const Tensor& ref, Tol tol) {
  if (a.shape() != ref.shape())
    return ::testing::AssertionFailure() << "shape " << a.shape().str() << " vs " << ref.shape().str();
  return all_close(to_double(a), to_double(ref), tol);
}

float float_from_bits(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
std::uint32_t bits_of_float(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

double nmse(const std::vector<double>& a, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size() && i < ref.size(); ++i) {
    num += (a[i] - ref[i]) * (a[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  if (den == 0) return num == 0 ? 0.0 : INFINITY;
  return num / den;
}
double nmse(const Tensor& a, const std::vector<double>& ref) { return nmse(to_double(a), ref); }

Tensor uniform(const Shape& shape, float lo, float hi, Rng& rng) {
  Tensor t = Tensor::empty(shape);
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = rng.uniform(lo, hi);
  return t;
}

void round_to_half(Tensor& t) {
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = mf::round_to_half(p[i]);
}

Tensor spaced(const Shape& shape, float gap, Rng& rng) {
  Tensor t = Tensor::empty(shape);
  const std::int64_t n = t.numel();
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[i] = (static_cast<float>(i) - static_cast<float>(n) / 2) * gap;
  for (std::int64_t i = n - 1; i > 0; --i) std::swap(v[i], v[rng.below(static_cast<std::uint64_t>(i + 1))]);
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

Tensor random_labels(std::int64_t n, int classes, Rng& rng) {
  Tensor t = Tensor::empty(Shape{n}, DType::kI32);
  for (std::int64_t i = 0; i < n; ++i) t.data<std::int32_t>()[i] = static_cast<std::int32_t>(rng.below(classes));
  return t;
}

Tensor labels_of(const std::vector<std::int32_t>& labels) {
  Tensor t = Tensor::empty(Shape{static_cast<std::int64_t>(labels.size())}, DType::kI32);
  std::copy(labels.begin(), labels.end(), t.data<std::int32_t>());
  return t;
}

namespace {
struct Dims4 {
  std::int64_t n, h, w, c;
};
Dims4 dims(const Tensor& x) { return {x.dim(0), x.dim(1), x.dim(2), x.dim(3)}; }
// max(0, s), except that NaN stays NaN (PyTorch's and TensorFlow's ReLU).
double relu_ref(double s) { return std::isnan(s) ? s : std::max(0.0, s); }
}  // namespace

std::vector<double> conv2d_forward_ref(const Tensor& x, const Tensor& w, const Tensor& b, bool relu) {
  const Dims4 d = dims(x);
  const std::int64_t K = w.dim(0), k = w.dim(1), oh = d.h - k + 1, ow = d.w - k + 1;
  const std::vector<double> xv = to_double(x), wv = to_double(w), bv = to_double(b);
  std::vector<double> y(static_cast<std::size_t>(d.n * oh * ow * K));
  for (std::int64_t n = 0; n < d.n; ++n)
    for (std::int64_t i = 0; i < oh; ++i)
      for (std::int64_t j = 0; j < ow; ++j)
        for (std::int64_t o = 0; o < K; ++o) {
          double s = bv[o];
          for (std::int64_t r = 0; r < k; ++r)
            for (std::int64_t q = 0; q < k; ++q)
              for (std::int64_t c = 0; c < d.c; ++c)
                s += xv[((n * d.h + i + r) * d.w + j + q) * d.c + c] * wv[((o * k + r) * k + q) * d.c + c];
          y[((n * oh + i) * ow + j) * K + o] = relu ? relu_ref(s) : s;
        }
  return y;
}

ConvGrads conv2d_backward_ref(const Tensor& x, const Tensor& w, const Tensor& b, bool relu, const Tensor& dy) {
  const Dims4 d = dims(x);
  const std::int64_t K = w.dim(0), k = w.dim(1), oh = d.h - k + 1, ow = d.w - k + 1;
  const std::vector<double> xv = to_double(x), wv = to_double(w), dyv = to_double(dy);
  const std::vector<double> y = conv2d_forward_ref(x, w, b, relu);
  ConvGrads g;
  g.dx.assign(xv.size(), 0.0);
  g.dw.assign(wv.size(), 0.0);
  g.db.assign(static_cast<std::size_t>(K), 0.0);
  for (std::int64_t n = 0; n < d.n; ++n)
    for (std::int64_t i = 0; i < oh; ++i)
      for (std::int64_t j = 0; j < ow; ++j)
        for (std::int64_t o = 0; o < K; ++o) {
          const std::size_t yi = static_cast<std::size_t>(((n * oh + i) * ow + j) * K + o);
          const double dz = relu && y[yi] <= 0.0 ? 0.0 : dyv[yi];
          g.db[o] += dz;
          for (std::int64_t r = 0; r < k; ++r)
            for (std::int64_t q = 0; q < k; ++q)
              for (std::int64_t c = 0; c < d.c; ++c) {
                const std::size_t xi = static_cast<std::size_t>(((n * d.h + i + r) * d.w + j + q) * d.c + c);
                const std::size_t wi = static_cast<std::size_t>(((o * k + r) * k + q) * d.c + c);
                g.dw[wi] += dz * xv[xi];
                g.dx[xi] += dz * wv[wi];
              }
        }
  return g;
}

namespace {
// The index in `xv` of the input that wins window (n, i, j) of channel c: the first NaN if
// there is one, else the first of the largest values.
std::size_t maxpool_winner(const std::vector<double>& xv, const Dims4& d, std::int64_t n, std::int64_t i,
                           std::int64_t j, std::int64_t c) {
  std::size_t best = 0;
  double m = -INFINITY;
  for (int a = 0; a < 2; ++a)
    for (int e = 0; e < 2; ++e) {
      const std::size_t xi = static_cast<std::size_t>(((n * d.h + 2 * i + a) * d.w + 2 * j + e) * d.c + c);
      if (std::isnan(xv[xi])) return xi;
      if (xv[xi] > m || (a == 0 && e == 0)) m = xv[xi], best = xi;  // first of equal values wins
    }
  return best;
}
}  // namespace

std::vector<double> maxpool_forward_ref(const Tensor& x) {
  const Dims4 d = dims(x);
  const std::int64_t oh = d.h / 2, ow = d.w / 2;
  const std::vector<double> xv = to_double(x);
  std::vector<double> y(static_cast<std::size_t>(d.n * oh * ow * d.c));
  for (std::int64_t n = 0; n < d.n; ++n)
    for (std::int64_t i = 0; i < oh; ++i)
      for (std::int64_t j = 0; j < ow; ++j)
        for (std::int64_t c = 0; c < d.c; ++c)
          y[static_cast<std::size_t>(((n * oh + i) * ow + j) * d.c + c)] = xv[maxpool_winner(xv, d, n, i, j, c)];
  return y;
}

std::vector<double> maxpool_backward_ref(const Tensor& x, const Tensor& dy) {
  const Dims4 d = dims(x);
  const std::int64_t oh = d.h / 2, ow = d.w / 2;
  const std::vector<double> xv = to_double(x), dyv = to_double(dy);
  std::vector<double> dx(xv.size(), 0.0);
  for (std::int64_t n = 0; n < d.n; ++n)
    for (std::int64_t i = 0; i < oh; ++i)
      for (std::int64_t j = 0; j < ow; ++j)
        for (std::int64_t c = 0; c < d.c; ++c)
          dx[maxpool_winner(xv, d, n, i, j, c)] += dyv[static_cast<std::size_t>(((n * oh + i) * ow + j) * d.c + c)];
  return dx;
}

Tensor maxpool_windows(const std::vector<std::vector<float>>& windows, std::int64_t c) {
  Tensor x = Tensor::empty({1, 2, 2, c});  // x[r][s][ch] = window[2r + s]
  for (std::int64_t ch = 0; ch < c; ++ch)
    for (int p = 0; p < 4; ++p)
      x.data<float>()[p * c + ch] = windows[static_cast<std::size_t>(ch) % windows.size()][static_cast<std::size_t>(p)];
  return x;
}

Tensor maxpool_nan_windows(std::int64_t c) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  return maxpool_windows({{nan, 1, 2, 3}, {1, nan, 2, 3}, {1, 2, nan, 3}, {1, 2, 3, nan},  // one NaN, at each place
                          {1, nan, 2, nan}, {nan, 5, nan, 1},                              // two: the first wins
                          {INFINITY, nan, 1, 2}, {-INFINITY, -INFINITY, nan, -1},          // with infinities
                          {1, 2, 3, 4}, {4, 3, 2, 1}, {-INFINITY, INFINITY, 0, 1}},        // none
                         c);
}

Tensor window_gradients(std::int64_t c) {
  Tensor dy = Tensor::empty({1, 1, 1, c});
  for (std::int64_t ch = 0; ch < c; ++ch) dy.data<float>()[ch] = static_cast<float>(ch + 1);
  return dy;
}

::testing::AssertionResult same_or_both_nan(const Tensor& a, const std::vector<double>& ref) {
  const std::vector<double> v = to_double(a);
  if (v.size() != ref.size()) return ::testing::AssertionFailure() << "size " << v.size() << " vs " << ref.size();
  for (std::size_t i = 0; i < v.size(); ++i)
    if (std::isnan(ref[i]) ? !std::isnan(v[i]) : v[i] != ref[i])
      return ::testing::AssertionFailure() << "[" << i << "] got " << v[i] << ", want " << ref[i];
  return ::testing::AssertionSuccess();
}

void set_nonfinite_biases(Tensor& bias) {
  float* b = bias.data<float>();
  b[0] = std::numeric_limits<float>::quiet_NaN();
  b[1] = std::numeric_limits<float>::infinity();
  b[2] = -std::numeric_limits<float>::infinity();
}

::testing::AssertionResult relu_of_nonfinite_biases(const Tensor& y) {
  const std::vector<double> v = to_double(y);
  const std::int64_t channels = y.dim(y.rank() - 1);
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::int64_t ch = static_cast<std::int64_t>(i) % channels;
    const bool ok = ch == 0   ? std::isnan(v[i])
                    : ch == 1 ? v[i] == std::numeric_limits<double>::infinity()
                    : ch == 2 ? v[i] == 0.0
                              : std::isfinite(v[i]) && v[i] >= 0.0;
    if (!ok)
      return ::testing::AssertionFailure() << "element " << i << " (channel " << ch << ") is " << v[i] << "; want "
                                           << (ch == 0 ? "NaN" : ch == 1 ? "inf" : ch == 2 ? "0" : "finite, >= 0");
  }
  return ::testing::AssertionSuccess();
}

std::vector<double> dense_forward_ref(const Tensor& x, const Tensor& w, const Tensor& b, bool relu) {
  const std::int64_t n = x.dim(0), in = x.dim(1), u = w.dim(1);
  const std::vector<double> xv = to_double(x), wv = to_double(w), bv = to_double(b);
  std::vector<double> y(static_cast<std::size_t>(n * u));
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t o = 0; o < u; ++o) {
      double s = bv[o];
      for (std::int64_t f = 0; f < in; ++f) s += xv[i * in + f] * wv[f * u + o];
      y[i * u + o] = relu ? relu_ref(s) : s;
    }
  return y;
}

DenseGrads dense_backward_ref(const Tensor& x, const Tensor& w, const Tensor& b, bool relu, const Tensor& dy) {
  const std::int64_t n = x.dim(0), in = x.dim(1), u = w.dim(1);
  const std::vector<double> xv = to_double(x), wv = to_double(w), dyv = to_double(dy);
  const std::vector<double> y = dense_forward_ref(x, w, b, relu);
  DenseGrads g;
  g.dx.assign(xv.size(), 0.0);
  g.dw.assign(wv.size(), 0.0);
  g.db.assign(static_cast<std::size_t>(u), 0.0);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t o = 0; o < u; ++o) {
      const double dz = relu && y[i * u + o] <= 0.0 ? 0.0 : dyv[i * u + o];
      g.db[o] += dz;
      for (std::int64_t f = 0; f < in; ++f) {
        g.dw[f * u + o] += xv[i * in + f] * dz;
        g.dx[i * in + f] += wv[f * u + o] * dz;
      }
    }
  return g;
}

std::string program_path(const std::string& built) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path beside = self.parent_path() / fs::path(built).filename();
    if (fs::is_regular_file(beside, ec)) return beside.string();
  }
  return built;
}

std::string sh_quote(const std::string& s) {
  std::string q = "'";
  for (const char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string read_whole_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

RunResult run_program(const std::string& program, const std::string& args, const TempDir& dir,
                      const std::string& before) {
  const std::string out = dir.file("stdout.txt"), err = dir.file("stderr.txt");
  const std::string cmd = (before.empty() ? "" : before + " && ") + sh_quote(program_path(program)) + " " + args +
                          " > " + sh_quote(out) + " 2> " + sh_quote(err) + " < /dev/null";
  const int st = std::system(cmd.c_str());
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, read_whole_file(out), read_whole_file(err)};
}

int count_lines(const std::string& s) {
  return static_cast<int>(std::count(s.begin(), s.end(), '\n'));
}

XentRef softmax_xent_ref(const Tensor& logits, const Tensor& labels) {
  const std::int64_t n = logits.dim(0), k = logits.dim(1);
  const std::vector<double> z = to_double(logits);
  const std::vector<float> lab = labels.to_vector();
  XentRef r{0.0, 0, std::vector<double>(z.size())};
  for (std::int64_t i = 0; i < n; ++i) {
    const int y = static_cast<int>(lab[i]);
    double m = -std::numeric_limits<double>::infinity();  // NaN never wins; class 0 if all are NaN
    std::int64_t arg = 0;
    for (std::int64_t j = 0; j < k; ++j)
      if (z[i * k + j] > m) m = z[i * k + j], arg = j;
    double s = 0;
    for (std::int64_t j = 0; j < k; ++j) s += std::exp(z[i * k + j] - m);
    r.loss_sum += std::log(s) + m - z[i * k + y];
    r.correct += arg == y;
    for (std::int64_t j = 0; j < k; ++j)
      r.dlogits[i * k + j] = (std::exp(z[i * k + j] - m) / s - (j == y ? 1.0 : 0.0)) / static_cast<double>(n);
  }
  return r;
}

}  // namespace mf::testing
