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
  std::int64_t operator[](int i) const { return dims_.at(static_cast<std::size_t>(i)); }
  std::int64_t& operator[](int i) { return dims_.at(static_cast<std::size_t>(i)); }
  const std::vector<std::int64_t>& dims() const { return dims_; }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : dims_) n *= d;
    return n;
  }
  // Product of all dimensions but the first: the size of one sample.
  std::int64_t sample_numel() const {
    std::int64_t n = 1;
    for (std::size_t i = 1; i < dims_.size(); ++i) n *= dims_[i];
    return n;
  }
  // Same shape with the first (batch) dimension replaced.
  Shape with_batch(std::int64_t n) const {
    Shape s = *this;
    s.dims_.at(0) = n;
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
  void validate() const {
    for (auto d : dims_)
      if (d < 0) throw std::invalid_argument("negative dimension in shape");
  }
  std::vector<std::int64_t> dims_;
};

}  // namespace mf
