// shape.h: a tensor's dimensions, outermost first (row-major: the last one is contiguous).
#pragma once
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

namespace mf {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims) : dims_(dims) { validate(); }
  explicit Shape(std::vector<std::int64_t> dims) : dims_(std::move(dims)) { validate(); }

  int rank() const { return static_cast<int>(dims_.size()); }
  // Dimension i, 0 <= i < rank(); any other i throws std::out_of_range naming it and the shape.
  std::int64_t operator[](int i) const { return dims_[checked(i)]; }
  std::int64_t& operator[](int i) { return dims_[checked(i)]; }
  const std::vector<std::int64_t>& dims() const { return dims_; }
  // Product of all dimensions (1 for a scalar). Throws std::overflow_error when it does not
  // fit in int64: a wrapped count (2^62 x 784 wraps to 0) would pass every size check and
  // get a buffer far too small. Called per tensor, not per element: the check is free.
  std::int64_t numel() const { return product(0); }
  // Product of all dimensions but the first: the size of one sample.
  std::int64_t sample_numel() const { return product(1); }
  // Same shape with the first (batch) dimension replaced.
  Shape with_batch(std::int64_t n) const {
    Shape s = *this;
    s.dims_[checked(0)] = n;
    return s;
  }
  std::string str() const {
    std::string s = "(";
    for (std::size_t i = 0; i < dims_.size(); ++i) s += (i ? ", " : "") + std::to_string(dims_[i]);
    return s + (dims_.size() == 1 ? ",)" : ")");
  }
  bool operator==(const Shape& o) const { return dims_ == o.dims_; }
  bool operator!=(const Shape& o) const { return dims_ != o.dims_; }

 private:
  std::size_t checked(int i) const {
    if (i < 0 || i >= rank())
      throw std::out_of_range("dimension " + std::to_string(i) + " of shape " + str() + ", which has " +
                              std::to_string(rank()) + (rank() == 1 ? " dimension" : " dimensions"));
    return static_cast<std::size_t>(i);
  }
  void validate() const {
    for (auto d : dims_)
      if (d < 0) throw std::invalid_argument("negative dimension in shape");
  }
  // Product of dims_[first..]; a zero anywhere makes it 0 even when the others alone would
  // overflow.
  std::int64_t product(std::size_t first) const {
    std::int64_t n = 1;
    bool overflow = false;
    for (std::size_t i = first; i < dims_.size(); ++i) {
      if (dims_[i] == 0) return 0;
      overflow = overflow || __builtin_mul_overflow(n, dims_[i], &n);
    }
    if (overflow) throw std::overflow_error("shape " + str() + " has more elements than int64 can count");
    return n;
  }
  std::vector<std::int64_t> dims_;
};

}  // namespace mf
