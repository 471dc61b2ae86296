// fuzz_checkpoint.cpp: libFuzzer target for the checkpoint reader: parse_checkpoint, with
// the checksum checked (what users get) and skipped (so mutations reach the decoder), then
// restore_checkpoint into a model the seeds fit. Only CheckpointError may come out.
#include <cstddef>
#include <cstdint>

#include "io/checkpoint.h"
#include "fuzz/fuzz_model.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static mf::Sequential model = mf::fuzz::small_model(1);
  for (bool verify : {true, false}) {
    try {
      const mf::io::CheckpointContents c = mf::io::parse_checkpoint(data, size, "fuzz-input", verify);
      mf::io::restore_checkpoint(c, data, "fuzz-input", model, model.optimizer());
    } catch (const mf::io::CheckpointError&) {
    }
  }
  return 0;
}
