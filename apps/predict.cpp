// predict.cpp: classifies image files of handwritten digits with a trained checkpoint, and
// draws the test digits a checkpoint gets wrong.
//
//   predict --model mnist.ckpt digit.png photo.jpg      # top-3 classes per file
//   predict --model mnist.ckpt --ascii digit.png        # also show what the model sees
//   predict --model mnist.ckpt --grid wrong.png         # misclassified test digits, labelled
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <new>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "apps/common.h"
#include "apps/flags.h"
#include "io/image.h"
#include "apps/plot.h"
#include "data/batching.h"
#include "data/mnist.h"
#include "runtime/errors.h"
#include "runtime/gpu_runtime.h"
#include "train/sequential.h"
#include "tensor/rng.h"

namespace {

using namespace mf;

void print_ascii(const std::vector<float>& px) {
  static const char kRamp[] = " .:-=+*#%@";
  for (int y = 0; y < io::kMnistSide; ++y) {
    std::string row = "    ";
    for (int x = 0; x < io::kMnistSide; ++x) {
      const float v = px[static_cast<std::size_t>(y) * io::kMnistSide + x];
      row += kRamp[std::min(9, static_cast<int>(v * 10.0f))];
    }
    std::printf("%s\n", row.c_str());
  }
}

// What predict says when the model's class scores are not finite.
std::string not_finite(const std::string& model_path) {
  return "the model's class scores are not finite (NaN or infinite): the weights in " + model_path +
         " are too large (a damaged checkpoint, or a run that diverged)";
}

// Misclassified test digits in a grid, each labelled "true→predicted".
void write_grid(Sequential& model, const std::string& model_path, const std::string& data_dir, const std::string& path,
                std::int64_t max_cells) {
  const data::Mnist mnist = data::load_mnist(data_dir);
  const data::Dataset& test = mnist.test;
  const std::int64_t side = test.rows;
  const Shape images{test.rows, test.cols, test.channels};
  if (images != model.input_shape())
    throw std::invalid_argument("--grid: the test images in " + mnist.dir + " are " + images.str() +
                                " (rows, cols, channels); the model takes " + model.input_shape().str());
  Tensor x = Tensor::empty(Shape{test.count, test.rows, test.cols, test.channels});
  std::vector<std::int32_t> idx(static_cast<std::size_t>(test.count)), labels(idx.size());
  std::iota(idx.begin(), idx.end(), 0);
  data::gather_batch(test, idx.data(), test.count, x.data<float>(), labels.data());
  const Tensor probs = model.predict(x);
  const std::int64_t classes = probs.dim(1);
  const float* p = probs.data<float>();
  if (!std::all_of(p, p + probs.numel(), [](float v) { return std::isfinite(v); }))
    throw std::runtime_error("--grid: " + not_finite(model_path) + " (for some of the test images in " + mnist.dir +
                             ")");
  std::vector<std::pair<std::int64_t, int>> wrong;  // (index, predicted)
  for (std::int64_t i = 0; i < test.count; ++i) {
    const float* row = p + i * classes;
    const int pred = static_cast<int>(std::max_element(row, row + classes) - row);
    if (pred != labels[static_cast<std::size_t>(i)]) wrong.emplace_back(i, pred);
  }
  const double acc = 1.0 - static_cast<double>(wrong.size()) / static_cast<double>(test.count);
  const std::int64_t shown = std::min<std::int64_t>(max_cells, static_cast<std::int64_t>(wrong.size()));

  constexpr int kScale = 2, kCols = 10, kPad = 6, kLabelH = 16, kTitleH = 28;
  const int cell_w = static_cast<int>(side) * kScale + 2 * kPad, cell_h = static_cast<int>(side) * kScale + kLabelH + kPad;
  const int rows = std::max<int>(1, static_cast<int>((shown + kCols - 1) / kCols));
  apps::Canvas cv(kCols * cell_w, kTitleH + rows * cell_h, {245, 245, 245});
  char title[160];
  std::snprintf(title, sizeof title, "%zu of %lld test digits misclassified (accuracy %.2f%%), %lld shown: true%spredicted",
                wrong.size(), static_cast<long long>(test.count), 100.0 * acc, static_cast<long long>(shown),
                "\xe2\x86\x92");
  cv.text(8, 9, title, {30, 30, 30});
  for (std::int64_t k = 0; k < shown; ++k) {
    const auto [i, pred] = wrong[static_cast<std::size_t>(k)];
    const int cx = static_cast<int>(k % kCols) * cell_w + kPad, cy = kTitleH + static_cast<int>(k / kCols) * cell_h;
    const std::uint8_t* img = test.images.data() + i * test.sample_size();
    for (std::int64_t y = 0; y < side; ++y)
      for (std::int64_t xx = 0; xx < side; ++xx) {
        const std::uint8_t v = img[y * side + xx];
        cv.fill_rect(cx + static_cast<int>(xx) * kScale, cy + static_cast<int>(y) * kScale,
                     cx + static_cast<int>(xx + 1) * kScale, cy + static_cast<int>(y + 1) * kScale, {v, v, v});
      }
    const std::string label = std::to_string(labels[static_cast<std::size_t>(i)]) + "\xe2\x86\x92" + std::to_string(pred);
    const int lw = apps::Canvas::text_width(label);
    cv.text(cx + static_cast<int>(side) * kScale / 2 - lw / 2, cy + static_cast<int>(side) * kScale + 4, label,
            {200, 30, 30});
  }
  cv.write_png(path);
  std::printf("%zu of %lld test images misclassified (accuracy %.2f%%); wrote %lld of them to %s\n", wrong.size(),
              static_cast<long long>(test.count), 100.0 * acc, static_cast<long long>(shown), path.c_str());
}

}  // namespace

static int run_main(int argc, char** argv) {
  std::string model_path, device_name_flag = "cpu", grid, data_dir = apps::default_data_dir();
  std::int64_t top = 3, grid_max = 100;
  bool ascii = false;
  apps::Flags flags("predict", "--model CKPT [flags] IMAGE...\n\n"
                               "Classifies images of handwritten digits (PNG, JPEG, BMP) with a checkpoint\n"
                               "written by train_mnist --save. Each image is prepared as MNIST's digits were: grey,\n"
                               "white ink on black (dark-on-light images are inverted), cropped to the ink, scaled to\n"
                               "fit 20x20 and centred by its centre of mass in 28x28.\n"
                               "Exit status: 0 done; 1 an image, the checkpoint, the data or the device could not be\n"
                               "used (an image that cannot be read is reported and the others are classified);\n"
                               "2 a flag that cannot be parsed, or a --grid file it must not replace.");
  flags.allow_positional("IMAGE");
  flags.add_string("model", &model_path, "checkpoint to load (train_mnist --save)");
  flags.add_int("top", &top, 1, 10, "classes to print per image");
  flags.add_string("device", &device_name_flag, "where to run the model", {"cpu", "gpu", "auto"});
  flags.add_bool("ascii", &ascii, "print each image as the model sees it (28x28, after preprocessing)");
  flags.add_string("grid", &grid, "write a PNG grid of the misclassified test digits here, labelled true->predicted");
  flags.add_string("data", &data_dir, "folder with the MNIST IDX files, for --grid; $MF_DATA_DIR sets the default");
  flags.add_int("grid-max", &grid_max, 1, 10000, "at most this many digits in the --grid image");
  try {
    if (!flags.parse(argc, argv)) return 0;
    if (model_path.empty()) throw apps::FlagError("--model is required (a checkpoint from train_mnist --save)");
    if (flags.positional().empty() && grid.empty())
      throw apps::FlagError("give image files to classify, or --grid PATH (see --help)");
    // The grid PNG is written last, over whatever file --grid names: refused when that is the
    // checkpoint, one of the images or one of the data files (the grid reads them first), or
    // any other checkpoint.
    if (!grid.empty()) {
      if (apps::same_file(grid, model_path))
        throw apps::FlagError("--grid " + grid + " and --model " + model_path +
                              " name the same file: the grid would overwrite the checkpoint");
      const std::string image = apps::same_file_among(grid, flags.positional());
      if (!image.empty())
        throw apps::FlagError("--grid " + grid + " and the image " + image +
                              " name the same file: the grid would overwrite the image");
      const std::string file = apps::same_file_among(grid, apps::data_files_in(data_dir));
      if (!file.empty())
        throw apps::FlagError("--grid " + grid + " is the data file " + file + ": writing there would destroy the data");
      if (io::is_checkpoint_file(grid))
        throw apps::FlagError("--grid " + grid +
                              " is a microflow checkpoint: writing there would destroy it (remove it first if that is "
                              "meant)");
    }
  } catch (const apps::FlagError& e) {
    std::fprintf(stderr, "predict: error: %s\n", e.what());
    return 2;
  }

  // What predict is doing, and what to try, for an out-of-host-memory message.
  const char* stage = "loading the model";
  const char* oom_hint = "free some memory";
  try {
    apps::check_output_path("grid", grid);  // before the model and the 10,000 test digits
    Rng rng(0);
    Sequential model = Sequential::mnist_cnn(rng);
    io::load_checkpoint(model_path, model, nullptr);
    if (device_name_flag == "gpu" || (device_name_flag == "auto" && gpu_available())) {
      if (!gpu_available()) throw NoGpuError("--device gpu: " + gpu_status().reason);
      model.to(Device::kGpu);
    }

    int failed = 0;
    std::vector<std::string> ok_paths;
    std::vector<float> pixels;
    stage = "reading the images";
    oom_hint = "free some memory, or give fewer or smaller images at a time";
    for (const std::string& path : flags.positional()) {
      try {
        const std::vector<float> px = io::mnist_preprocess(io::read_gray_image(path), path);
        pixels.insert(pixels.end(), px.begin(), px.end());
        ok_paths.push_back(path);
      } catch (const io::ImageError& e) {
        std::fprintf(stderr, "predict: error: %s\n", mf::one_line(e.what()).c_str());
        ++failed;
      } catch (const std::bad_alloc&) {  // this image is too large for the memory left; the next may fit
        std::fprintf(stderr, "predict: error: %s: out of host memory reading or decoding it\n",
                     mf::one_line(path).c_str());
        ++failed;
      }
    }
    if (!ok_paths.empty()) {
      stage = "classifying the images";
      const auto n = static_cast<std::int64_t>(ok_paths.size());
      const Tensor probs =
          model.predict(Tensor::from_vector(Shape{n, io::kMnistSide, io::kMnistSide, 1}, pixels));
      const std::int64_t classes = probs.dim(1);
      for (std::int64_t i = 0; i < n; ++i) {
        const float* p = probs.data<float>() + i * classes;
        // Finite weights (the checkpoint's checks) can still overflow on the way: scores of
        // NaN would print "nan%" and rank as noise.
        if (!std::all_of(p, p + classes, [](float v) { return std::isfinite(v); })) {
          std::fprintf(stderr, "predict: error: %s: %s\n", mf::one_line(ok_paths[static_cast<std::size_t>(i)]).c_str(),
                       mf::one_line(not_finite(model_path)).c_str());
          ++failed;
          continue;
        }
        std::vector<int> order(static_cast<std::size_t>(classes));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
        std::string line = ok_paths[static_cast<std::size_t>(i)] + ":";
        for (std::int64_t k = 0; k < std::min(top, classes); ++k) {
          char b[48];
          std::snprintf(b, sizeof b, "%s %d (%.2f%%)", k ? "," : "", order[k], 100.0 * p[order[k]]);
          line += b;
        }
        std::printf("%s\n", line.c_str());
        if (ascii)
          print_ascii(std::vector<float>(pixels.begin() + i * io::kMnistSide * io::kMnistSide,
                                         pixels.begin() + (i + 1) * io::kMnistSide * io::kMnistSide));
      }
    }
    if (!grid.empty()) {
      stage = "loading the data for --grid and drawing the misclassified digits";
      oom_hint = "free some memory, or use a machine with more";
      write_grid(model, model_path, data_dir, grid, grid_max);
    }
    return failed ? 1 : 0;
  } catch (const std::bad_alloc&) {
    // The C++ library's own message is just "std::bad_alloc": say what ran out, and when.
    std::fprintf(stderr, "predict: error: out of host memory while %s; %s\n", stage, oom_hint);
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "predict: error: %s\n", mf::one_line(e.what()).c_str());
    return 1;
  }
}

int main(int argc, char** argv) {
  mf::apps::reserve_standard_fds();
  mf::io::remove_temp_file_on_stop_signals();  // Ctrl-C while the --grid PNG is written
  // `predict ... | head`: the closed pipe is reported at exit (exit_status_after_stdout),
  // after --grid is written.
  mf::apps::write_failures_are_errors();
  return mf::apps::exit_status_after_stdout("predict", run_main(argc, argv));
}
