// mnist.cpp: IDX image/label pairs, finding the MNIST files in a folder, validation splits.
#include "data/mnist.h"

#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <system_error>

namespace mf::data {
namespace {

std::string join_dims(const std::vector<std::int64_t>& dims) {
  std::string s;
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? " x " : "") + std::to_string(dims[i]);
  return s;
}

// The first existing file among the usual names for `stem` ("train-images" + "idx3-ubyte").
// Raw names come before .gz so an unpacked copy next to the archive is preferred (no inflate).
std::string find_file(const std::filesystem::path& dir, const std::string& stem, const std::string& kind,
                      const std::string& what) {
  const std::string names[] = {stem + "-" + kind, stem + "-" + kind + ".gz", stem + "." + kind,
                               stem + "." + kind + ".gz"};
  std::string looked;
  for (const std::string& name : names) {
    const std::filesystem::path p = dir / name;
    std::error_code ec;
    if (std::filesystem::is_regular_file(p, ec)) return p.string();
    looked += (looked.empty() ? "" : ", ") + name;
  }
  throw DataError(dir.string(), "cannot find the " + what + " file; looked for " + looked);
}

}  // namespace

void check_dataset(const Dataset& d, const char* caller) {
  const bool ok = d.count >= 0 && d.rows >= 0 && d.cols >= 0 &&
                  d.labels.size() == static_cast<std::size_t>(d.count) &&
                  d.images.size() == static_cast<std::size_t>(d.count * d.rows * d.cols);
  if (!ok) {
    throw std::invalid_argument(std::string(caller) + ": inconsistent Dataset: count " + std::to_string(d.count) +
                                ", " + std::to_string(d.rows) + "x" + std::to_string(d.cols) + ", " +
                                std::to_string(d.images.size()) + " image bytes, " +
                                std::to_string(d.labels.size()) + " labels");
  }
}

Dataset load_idx_pair(const std::string& images_path, const std::string& labels_path, int num_classes) {
  if (num_classes < 1 || num_classes > 256) {
    throw std::invalid_argument("load_idx_pair: num_classes must be 1..256 (labels are bytes), got " +
                                std::to_string(num_classes));
  }
  IdxArray images = read_idx(images_path);
  if (images.dims.size() != 3) {
    throw DataError(images_path, "expected images with 3 dimensions (count x rows x cols), got " +
                                     std::to_string(images.dims.size()) + " (" + join_dims(images.dims) + ")");
  }
  IdxArray labels = read_idx(labels_path);
  if (labels.dims.size() != 1) {
    throw DataError(labels_path, "expected labels with 1 dimension (count), got " +
                                     std::to_string(labels.dims.size()) + " (" + join_dims(labels.dims) + ")");
  }
  if (images.dims[0] != labels.dims[0]) {
    throw DataError(images_path, "has " + std::to_string(images.dims[0]) + " images but " + labels_path +
                                     " has " + std::to_string(labels.dims[0]) + " labels");
  }
  for (std::size_t i = 0; i < labels.values.size(); ++i) {
    if (labels.values[i] >= num_classes) {
      throw DataError(labels_path, "label at index " + std::to_string(i) + " is " +
                                       std::to_string(labels.values[i]) + ", not below the " +
                                       std::to_string(num_classes) + " classes");
    }
  }
  Dataset d;
  d.count = images.dims[0];
  d.rows = images.dims[1];
  d.cols = images.dims[2];
  d.num_classes = num_classes;
  d.images = std::move(images.values);
  d.labels = std::move(labels.values);
  return d;
}

Mnist load_mnist(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) throw DataError(dir, "data folder not found");
  if (!std::filesystem::is_directory(dir, ec)) throw DataError(dir, "not a folder");
  const std::filesystem::path p(dir);
  const std::string train_images = find_file(p, "train-images", "idx3-ubyte", "training images");
  const std::string train_labels = find_file(p, "train-labels", "idx1-ubyte", "training labels");
  const std::string test_images = find_file(p, "t10k-images", "idx3-ubyte", "test images");
  const std::string test_labels = find_file(p, "t10k-labels", "idx1-ubyte", "test labels");
  Mnist m;
  m.dir = dir;
  m.train = load_idx_pair(train_images, train_labels);
  m.test = load_idx_pair(test_images, test_labels);
  if (m.train.rows != m.test.rows || m.train.cols != m.test.cols) {
    throw DataError(test_images, "images are " + std::to_string(m.test.rows) + "x" + std::to_string(m.test.cols) +
                                     " but the training images in " + train_images + " are " +
                                     std::to_string(m.train.rows) + "x" + std::to_string(m.train.cols));
  }
  return m;
}

Dataset subset(const Dataset& d, std::int64_t begin, std::int64_t end) {
  check_dataset(d, "subset");
  if (begin < 0 || begin > end || end > d.count) {
    throw std::invalid_argument("subset: range [" + std::to_string(begin) + ", " + std::to_string(end) +
                                ") is not within [0, " + std::to_string(d.count) + "]");
  }
  Dataset s;
  s.count = end - begin;
  s.rows = d.rows;
  s.cols = d.cols;
  s.num_classes = d.num_classes;
  const std::int64_t n = d.sample_size();
  s.images.assign(d.images.begin() + begin * n, d.images.begin() + end * n);
  s.labels.assign(d.labels.begin() + begin, d.labels.begin() + end);
  return s;
}

Split split_validation(const Dataset& d, double fraction) {
  // !(a && b) rather than (!a || !b) so that NaN is rejected too.
  if (!(fraction >= 0.0 && fraction < 1.0)) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", fraction);
    throw std::invalid_argument(std::string("split_validation: fraction must be in [0, 1), got ") + buf);
  }
  // Exactly Keras: int(n * (1. - split)), truncating toward zero, in double precision. For
  // n = 60000, fraction 0.2: 1 - 0.2 rounds to the double 0.8 and 60000 * 0.8 to 48000.
  const std::int64_t split_at = static_cast<std::int64_t>(static_cast<double>(d.count) * (1.0 - fraction));
  return Split{subset(d, 0, split_at), subset(d, split_at, d.count)};
}

}  // namespace mf::data
