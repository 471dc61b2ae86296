// checkpoint.h: saving a training run (f32 weights, optimizer state, where it stopped) to one
// binary file and restoring it, with every byte checked before the model is touched.
//
// File format, version 1. Integers are little-endian; "str" is a u32 byte count then the
// bytes (no terminator).
//
//   offset  field        type    contents
//        0  magic        8 B     "MFCKPT" 0x00 0x01
//        8  version      u32     1
//       12  reserved     u32     0
//       16  file_size    u64     total bytes of the file, checksum included (finds truncation)
//       24  architecture str     Sequential::architecture() of the saved model
//           meta         str     "key=value" lines (CheckpointMeta; unknown keys are ignored)
//           count        u32     number of tensors, then `count` records:
//             name       str     "<layer>/<param>" ("conv2d/kernel") or "optimizer/<state>"
//                                ("optimizer/adam.m"), unique
//             dtype      u8      0 f32, 1 f16, 2 u8, 3 i32 (mf::DType)
//             rank       u8      0..8, then rank x i64 dimensions
//             nbytes     u64     numel x dtype size, then the raw little-endian values
//   size-4  crc32        u32     zlib crc32 of every byte before it
//
// The weights are the f32 masters (also in mixed precision; the f16 copies are rebuilt from
// them on load). Optimizer state tensors are copied from wherever they live (GPU included).
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/file_error.h"
#include "optim/optimizer.h"
#include "train/sequential.h"

namespace mf::io {

// A checkpoint is missing, truncated, corrupt, foreign or does not fit the model.
// what() is one line: "<path>: <problem>".
class CheckpointError : public FileError {
 public:
  CheckpointError(const std::string& path, const std::string& problem)
      : FileError(Kind::kCheckpoint, path, problem) {}
};

constexpr std::uint32_t kCheckpointVersion = 1;

// The largest file read_checkpoint reads. A checkpoint holds the f32 weights and, for Adam,
// two f32 moments per weight: 12 bytes per parameter, plus at most 16 MiB of metadata and
// 64 KiB of architecture (the format's own limits). The MNIST model (121,930 parameters)
// makes 1.5 MB. mnist_cnn grows with the image size through its first dense layer (about
// 4,096 parameters per pixel of the last pooled map), and 256 MiB holds it for square
// images up to about 290 x 290 pixels: ten times MNIST's side. A file, pipe or device
// larger than this is refused without being read to its end.
constexpr std::size_t kMaxCheckpointBytes = std::size_t{256} << 20;

// Where a run stands and how it was set up, so that --resume continues it exactly.
struct CheckpointMeta {
  int epoch = 0;               // epochs fully trained
  bool partial_epoch = false;  // interrupted inside the next epoch: resuming restarts that epoch
                               // (the weights already hold its first steps)
  std::uint64_t seed = 0;
  std::int64_t batch_size = 0;
  bool fp16 = false;
  std::string optimizer;       // Optimizer::name() ("Adam"); written by save_checkpoint
  std::string optimizer_config;  // Optimizer::describe(); informational
  double lr = 0, momentum = 0;
  double validation_split = 0;
  std::int64_t limit_train = 0;
  std::int64_t iterations = 0;   // optimizer updates applied; written by save_checkpoint
  std::string device;            // where it was trained ("cpu", "gpu"); informational
  std::string created;           // UTC time of the save; written by save_checkpoint
  std::vector<EpochLog> history;  // per-epoch metrics so far (plots and JSON continue after resume)
};

// One tensor record of a parsed file: its bytes are [offset, offset + nbytes) of the buffer
// that was parsed.
struct CheckpointTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<std::int64_t> dims;
  std::size_t offset = 0, nbytes = 0;
};

struct CheckpointContents {
  std::string architecture;
  CheckpointMeta meta;
  std::vector<CheckpointTensor> tensors;
};

// A checkpoint read from disk and checked: the bytes and what they hold.
struct CheckpointFile {
  std::string path;
  std::string bytes;
  CheckpointContents contents;
};

// The file's bytes for `model` and its optimizer (null: weights only, cannot be resumed).
// Synchronises the GPU first when the model lives there.
std::string serialize_checkpoint(Sequential& model, Optimizer* optimizer, const CheckpointMeta& meta);

// Writes the checkpoint atomically (atomic_file.h): a failed save leaves any old file at
// `path` as it was. Throws CheckpointError, also, writing nothing, when a weight or state
// value would make the file refused on loading (NaN or inf in the weights or the state, a
// negative count).
void save_checkpoint(const std::string& path, Sequential& model, Optimizer* optimizer, const CheckpointMeta& meta);
inline void save_checkpoint(const std::string& path, Sequential& model, Optimizer& optimizer,
                            const CheckpointMeta& meta) {
  save_checkpoint(path, model, &optimizer, meta);
}

// Checks and decodes checkpoint bytes held in memory; `name` stands in for the path in
// errors. Checks, in this order: magic, version, size against the header's file_size, the
// crc32 (skipped when !verify_checksum: the fuzzer uses that to reach the decoder), then the
// structure: every length is bounded by the bytes left, so a corrupt header cannot make it
// allocate more than the file holds. Throws CheckpointError; never touches a model.
CheckpointContents parse_checkpoint(const std::uint8_t* bytes, std::size_t size, const std::string& name,
                                    bool verify_checksum = true);

// Reads a file and parses it (parse_checkpoint). Throws CheckpointError, also when the file
// cannot be read, is larger than kMaxCheckpointBytes, or does not start with the magic (a
// pipe or a device is refused after its first bytes, not read to its end).
CheckpointFile read_checkpoint(const std::string& path);

// True when `path` is a regular file that starts as a checkpoint does (its 8-byte magic):
// what an output other than --save must not be written over. Reads 8 bytes; false when the
// file is missing, unreadable, shorter, or anything else.
bool is_checkpoint_file(const std::string& path);

// Copies parsed contents (`bytes`: the buffer they were parsed from) into `model`, and into
// `optimizer`'s state() when not null, after checking ALL of it first: the architecture
// equals model.architecture() (the message shows both), the optimizer is the one saved,
// every parameter and state tensor is present with the right dtype and shape, and nothing
// is left over. A failed check leaves model and optimizer untouched. In mixed precision the
// f16 weight copies are rebuilt from the loaded f32 masters.
void restore_checkpoint(const CheckpointContents& contents, const std::uint8_t* bytes, const std::string& name,
                        Sequential& model, Optimizer* optimizer);

// read_checkpoint + restore_checkpoint. The optimizer must be attached (model.compile) when
// given; null loads the weights only (predict). Returns the metadata.
CheckpointMeta load_checkpoint(const std::string& path, Sequential& model, Optimizer* optimizer);
inline CheckpointMeta load_checkpoint(const std::string& path, Sequential& model, Optimizer& optimizer) {
  return load_checkpoint(path, model, &optimizer);
}

}  // namespace mf::io
