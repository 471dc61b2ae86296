// checkpoint_format.h: internal to io/checkpoint*.cpp: what the writer and the reader of the format share.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mf::io::detail {

// The first 8 bytes of every checkpoint (checkpoint.h: "MFCKPT" 0x00 0x01).
inline constexpr char kMagic[8] = {'M', 'F', 'C', 'K', 'P', 'T', '\0', '\1'};

// Dimensions as Shape::str() writes them (checkpoint_read.cpp).
std::string dims_str(const std::vector<std::int64_t>& d);

}  // namespace mf::io::detail
