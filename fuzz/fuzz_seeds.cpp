// fuzz_seeds.cpp: writes the seed corpora of the fuzzers into OUT/<target>/seeds: small
// valid IDX files (raw and gzip, 1-D to 4-D), checkpoints of the fuzzers' small model (with
// and without optimizer state, after some training) and small digit images in each format
// predict decodes.
//   fuzz_seeds OUT [MNIST_DIR]   (a MNIST labels file is added when MNIST_DIR has one)
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "data/idx.h"
#include "fuzz/fuzz_model.h"
#if MF_WITH_STB
#include <stb_image_write.h>

#include "io/image.h"
#endif

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: fuzz_seeds OUT [MNIST_DIR]\n");
    return 2;
  }
  const fs::path out = argv[1];
  const fs::path idx = out / "idx" / "seeds", ckpt = out / "checkpoint" / "seeds";
  fs::create_directories(idx);
  fs::create_directories(ckpt);

  int n = 0;
  auto idx_seed = [&](const std::vector<std::int64_t>& dims) {
    std::int64_t count = 1;
    for (auto d : dims) count *= d;
    std::vector<std::uint8_t> v(static_cast<std::size_t>(count));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::uint8_t>(i * 37 + 11);
    for (bool gz : {false, true}) mf::data::write_idx((idx / ("seed" + std::to_string(n++) + ".idx")).string(), dims, v, gz);
  };
  idx_seed({10});
  idx_seed({3, 4, 4});
  idx_seed({2, 3, 5, 2});
  idx_seed({1, 28, 28});
  if (argc > 2) {  // a real file, when small enough to be a useful seed
    for (const char* name : {"t10k-labels-idx1-ubyte", "t10k-labels-idx1-ubyte.gz"}) {
      const fs::path p = fs::path(argv[2]) / name;
      if (fs::exists(p)) fs::copy_file(p, idx / name, fs::copy_options::overwrite_existing);
    }
  }

  mf::Sequential m = mf::fuzz::small_model(1);
  mf::io::CheckpointMeta meta;
  meta.epoch = 1;
  meta.seed = 1;
  meta.batch_size = 4;
  meta.lr = 1e-3;
  mf::EpochLog e;
  e.loss = 1.5;
  e.accuracy = 0.5;
  meta.history.push_back(e);
  auto save = [&](const std::string& name, bool with_opt) {
    const std::string bytes = mf::io::serialize_checkpoint(m, with_opt ? m.optimizer() : nullptr, meta);
    mf::io::write_bytes_atomic((ckpt / name).string(), bytes.data(), bytes.size());
  };
  save("fresh.ckpt", true);
  save("weights_only.ckpt", false);
  // A few Adam steps so that the state is not all zeros.
  mf::data::Dataset d;
  d.count = 8;
  d.rows = d.cols = 4;
  d.num_classes = 3;
  d.images.assign(8 * 16, 100);
  d.labels = {0, 1, 2, 0, 1, 2, 0, 1};
  mf::FitOptions fo;
  fo.epochs = 1;
  fo.batch_size = 4;
  m.fit(d, nullptr, fo);
  meta.partial_epoch = true;
  save("trained.ckpt", true);
#if MF_WITH_STB
  const fs::path img = out / "image" / "seeds";
  fs::create_directories(img);
  // A 12x12 "7": a bar and a diagonal, white on black, and its inverse.
  std::vector<std::uint8_t> g(12 * 12, 0), rgba(12 * 12 * 4, 0);
  for (int x = 2; x < 10; ++x) g[2 * 12 + x] = 255;
  for (int y = 3; y < 11; ++y) g[y * 12 + 9 - (y - 3) / 2] = 220;
  for (std::size_t i = 0; i < g.size(); ++i) rgba[4 * i + 3] = g[i];  // strokes as alpha
  auto put = [&](const std::string& name, const std::string& bytes) {
    mf::io::write_bytes_atomic((img / name).string(), bytes.data(), bytes.size());
  };
  auto collect = [](void* ctx, void* data, int size) {
    static_cast<std::string*>(ctx)->append(static_cast<const char*>(data), static_cast<std::size_t>(size));
  };
  put("grey.png", mf::io::encode_png(12, 12, 1, g.data()));
  put("rgba.png", mf::io::encode_png(12, 12, 4, rgba.data()));
  std::string bmp, jpg;
  stbi_write_bmp_to_func(collect, &bmp, 12, 12, 1, g.data());
  stbi_write_jpg_to_func(collect, &jpg, 12, 12, 1, g.data(), 90);
  put("grey.bmp", bmp);
  put("grey.jpg", jpg);
#endif
  std::printf("seeds written to %s\n", out.string().c_str());
  return 0;
}
