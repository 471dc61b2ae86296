// mnist.h: MNIST-style datasets (images + labels from an IDX pair), loading, Keras-style splits.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/idx.h"

namespace mf::data {

// `count` images of rows x cols pixels of `channels` unsigned bytes each, and their labels.
// An image is row-major with its channels interleaved (pixel after pixel, each pixel's
// channels together: HWC, as a 4-D IDX file stores it and as the model's NHWC batches are
// laid out), image after image. MNIST's are 28x28 with one channel.
struct Dataset {
  std::vector<std::uint8_t> images;  // count * rows * cols * channels bytes
  std::vector<std::uint8_t> labels;  // count values, each < num_classes
  std::int64_t count = 0, rows = 0, cols = 0, channels = 1;
  int num_classes = 10;
  std::int64_t sample_size() const { return rows * cols * channels; }
};

// Loads an images file (3-D IDX: count x rows x cols, one channel; or 4-D: count x rows x
// cols x channels) and a labels file (1-D IDX: count), raw or gzip. Throws DataError if the
// shapes are wrong, the counts differ (naming both files and counts) or a label is >=
// num_classes (naming the file, the index and the value), and std::invalid_argument unless
// 1 <= num_classes <= 256.
Dataset load_idx_pair(const std::string& images_path, const std::string& labels_path,
                      int num_classes = 10);

// The four files of a dataset, as found in its folder (dir/name, the name being whichever
// usual spelling was there). train_mnist and predict compare their output paths with these
// before writing anything, so that a --save, --plot or --grid never overwrites the data.
struct MnistFiles {
  std::string train_images, train_labels, test_images, test_labels;
};

struct Mnist {
  Dataset train, test;
  std::string dir;
  MnistFiles files;  // the four files read, as find_mnist_files found them
};

// Finds the four standard files in `dir` (see load_mnist for the names tried) without
// reading them. Throws DataError as load_mnist does when the folder or a file is missing
// or a name is there but is no file.
MnistFiles find_mnist_files(const std::string& dir);

// Loads the four standard files from `dir`. Each may be named in either usual way, optionally
// gzipped, e.g. train-images-idx3-ubyte, train-images-idx3-ubyte.gz, train-images.idx3-ubyte or
// train-images.idx3-ubyte.gz (likewise train-labels-idx1-ubyte, t10k-images-idx3-ubyte,
// t10k-labels-idx1-ubyte); image files with channels (4-D) may say idx4 instead of idx3.
// Works for Fashion-MNIST, which uses the same names. Throws DataError "<dir>: data folder
// not found", or naming the folder and the names it looked for when a file is missing, or
// naming the path when a name is there but is no file (a folder, a FIFO) or cannot be looked
// at (with the system's reason, e.g. "Permission denied"), or if train and test images differ
// in size or channels.
Mnist load_mnist(const std::string& dir);

// Keras `validation_split`: split_at = int(count * (1 - fraction)); train is samples
// [0, split_at), validation the LAST count - split_at samples, in order, never shuffled.
struct Split {
  Dataset train, validation;
};
// Throws std::invalid_argument unless 0 <= fraction < 1.
Split split_validation(const Dataset& d, double fraction);

// Samples [begin, end) of d, copied. Throws std::invalid_argument unless 0 <= begin <= end <= count.
Dataset subset(const Dataset& d, std::int64_t begin, std::int64_t end);

// "one channel" or "3 channels": an image's channels, in the words of the error messages.
std::string channels_text(std::int64_t channels);

// Throws std::invalid_argument naming `caller` unless images and labels have the sizes that
// count, rows, cols and channels say, and channels >= 1 (guards hand-built Datasets before
// they are indexed).
void check_dataset(const Dataset& d, const char* caller);

}  // namespace mf::data
