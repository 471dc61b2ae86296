// fuzz_idx.cpp: libFuzzer target for data::parse_idx (raw and gzip IDX bytes). Any outcome
// but a parsed array or a DataError (a crash, a sanitizer report, another exception, a
// runaway allocation) is a finding.
#include <cstddef>
#include <cstdint>

#include "data/idx.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const mf::data::IdxArray a = mf::data::parse_idx(data, size, "fuzz-input");
    // The invariant the loaders rely on.
    std::uint64_t n = 1;
    for (auto d : a.dims) n *= static_cast<std::uint64_t>(d);
    if (n != a.values.size()) __builtin_trap();
  } catch (const mf::data::DataError&) {
  }
  return 0;
}
