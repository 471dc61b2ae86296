// eigen_util.h: row-major Eigen views of raw float buffers, for the CPU path's GEMMs.
#pragma once
#include <Eigen/Core>
#include <cstdint>

namespace mf {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatView = Eigen::Map<RowMat, Eigen::Unaligned>;
using ConstMatView = Eigen::Map<const RowMat, Eigen::Unaligned>;
using VecView = Eigen::Map<Eigen::VectorXf>;
using ConstVecView = Eigen::Map<const Eigen::VectorXf>;
using RowVecView = Eigen::Map<Eigen::RowVectorXf>;
using ConstRowVecView = Eigen::Map<const Eigen::RowVectorXf>;

inline MatView mat(float* p, std::int64_t rows, std::int64_t cols) { return MatView(p, rows, cols); }
inline ConstMatView mat(const float* p, std::int64_t rows, std::int64_t cols) {
  return ConstMatView(p, rows, cols);
}
inline ConstMatView cmat(const float* p, std::int64_t rows, std::int64_t cols) { return ConstMatView(p, rows, cols); }

}  // namespace mf
