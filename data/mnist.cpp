// mnist.cpp: IDX image/label pairs, finding the MNIST files in a folder, validation splits.
#include "data/mnist.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace mf::data {
namespace {

std::string join_dims(const std::vector<std::int64_t>& dims) {
  std::string s;
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? " x " : "") + std::to_string(dims[i]);
  return s;
}

// What a path that exists but is not a regular file is, for the error message.
const char* non_file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  return "not a regular file";
}

// The first regular file among the usual names for `stem` and each of `kinds` ("train-images"
// + "idx3-ubyte", then "idx4-ubyte"). For each kind, raw names come before .gz so an unpacked
// copy next to the archive is preferred (no inflate).
// A name that exists but is no file (a folder, a FIFO), or that cannot be looked at (no
// permission on the folder, a symlink loop), is skipped too; when no name gives a file, the
// error names the first such problem rather than "cannot find", which would send the user
// looking for a file that is there.
std::string find_file(const std::filesystem::path& dir, const std::string& stem,
                      const std::vector<std::string>& kinds, const std::string& what) {
  std::vector<std::string> names;
  for (const std::string& kind : kinds)
    for (const char* ext : {"", ".gz"})
      for (const char sep : {'-', '.'}) names.push_back(stem + sep + kind + ext);
  std::string looked, problem_path, problem;
  for (const std::string& name : names) {
    const std::string p = (dir / name).string();
    struct stat st {};
    if (::stat(p.c_str(), &st) == 0) {  // stat follows symlinks: a link to a file is a file
      if (S_ISREG(st.st_mode)) return p;
      if (problem.empty()) {
        problem_path = p;
        problem = std::string("is ") + non_file_kind(st.st_mode) + ", not a file (wanted the " + what + " file)";
      }
    } else if (problem.empty()) {
      const int err = errno;
      struct stat lst {};
      if (err != ENOENT && err != ENOTDIR) {  // anything but "not there": EACCES, ELOOP, EIO, ...
        problem_path = p;
        problem = "cannot look at the " + what + " file: " + std::strerror(err);
      } else if (::lstat(p.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode)) {  // "not there" through a link
        problem_path = p;
        problem = "is a symlink to a missing file (wanted the " + what + " file)";
      }
    }
    looked += (looked.empty() ? "" : ", ") + name;
  }
  if (!problem.empty()) throw DataError(problem_path, problem);
  throw DataError(dir.string(), "cannot find the " + what + " file; looked for " + looked);
}

}  // namespace

std::string channels_text(std::int64_t channels) {
  return channels == 1 ? "one channel" : std::to_string(channels) + " channels";
}

void check_dataset(const Dataset& d, const char* caller) {
  // count * rows * cols * channels in 64 bits, checked: a hand-made count of 10^17 would
  // otherwise wrap around and could match the bytes that are there.
  std::int64_t bytes = 0;
  const bool sizes_ok = d.count >= 0 && d.rows >= 0 && d.cols >= 0 && d.channels >= 1 &&
                        !__builtin_mul_overflow(d.count, d.rows, &bytes) &&
                        !__builtin_mul_overflow(bytes, d.cols, &bytes) &&
                        !__builtin_mul_overflow(bytes, d.channels, &bytes);
  const bool ok = sizes_ok && d.labels.size() == static_cast<std::size_t>(d.count) &&
                  d.images.size() == static_cast<std::size_t>(bytes);
  if (!ok) {
    throw std::invalid_argument(std::string(caller) + ": inconsistent Dataset: count " + std::to_string(d.count) +
                                ", " + std::to_string(d.rows) + "x" + std::to_string(d.cols) + "x" +
                                std::to_string(d.channels) + " (rows x cols x channels), " +
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
  if (images.dims.size() != 3 && images.dims.size() != 4) {
    throw DataError(images_path,
                    "expected images with 3 dimensions (count x rows x cols) or 4 (count x rows x cols x channels), "
                    "got " + std::to_string(images.dims.size()) + " (" + join_dims(images.dims) + ")");
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
  d.channels = images.dims.size() == 4 ? images.dims[3] : 1;
  d.num_classes = num_classes;
  d.images = std::move(images.values);
  d.labels = std::move(labels.values);
  return d;
}

MnistFiles find_mnist_files(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    const int err = errno;
    // "not found" only when it is not there; a folder above it without permission, say,
    // gets the system's reason.
    if (err == ENOENT || err == ENOTDIR) throw DataError(dir, "data folder not found");
    throw DataError(dir, std::string("cannot look at the data folder: ") + std::strerror(err));
  }
  if (!S_ISDIR(st.st_mode)) throw DataError(dir, "not a folder");
  const std::filesystem::path p(dir);
  MnistFiles f;
  f.train_images = find_file(p, "train-images", {"idx3-ubyte", "idx4-ubyte"}, "training images");
  f.train_labels = find_file(p, "train-labels", {"idx1-ubyte"}, "training labels");
  f.test_images = find_file(p, "t10k-images", {"idx3-ubyte", "idx4-ubyte"}, "test images");
  f.test_labels = find_file(p, "t10k-labels", {"idx1-ubyte"}, "test labels");
  return f;
}

Mnist load_mnist(const std::string& dir) {
  Mnist m;
  m.dir = dir;
  m.files = find_mnist_files(dir);
  m.train = load_idx_pair(m.files.train_images, m.files.train_labels);
  m.test = load_idx_pair(m.files.test_images, m.files.test_labels);
  if (m.train.rows != m.test.rows || m.train.cols != m.test.cols) {
    throw DataError(m.files.test_images, "images are " + std::to_string(m.test.rows) + "x" +
                                             std::to_string(m.test.cols) + " but the training images in " +
                                             m.files.train_images + " are " + std::to_string(m.train.rows) + "x" +
                                             std::to_string(m.train.cols));
  }
  if (m.train.channels != m.test.channels) {
    throw DataError(m.files.test_images, "images have " + channels_text(m.test.channels) +
                                             " but the training images in " + m.files.train_images + " have " +
                                             channels_text(m.train.channels));
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
  s.channels = d.channels;
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
