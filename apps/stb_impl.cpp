// stb_impl.cpp: the one place the stb single-header libraries (Debian's libstb-dev headers)
// are compiled, so nothing links libstb.so (the GPU machine has none).
//
// Only PNG, JPEG and BMP are decoded: a smaller attack surface for files from anywhere
// (fuzz/fuzz_image found signed overflow in stb 2.27's PGM/PPM header reader, so those
// formats stay out). decode_gray_image reads the size from the header (stbi_info) and
// refuses absurd sizes before decoding.
#include "apps/image.h"

#define STBI_ONLY_PNG
#define STBI_ONLY_JPEG
#define STBI_ONLY_BMP
#define STBI_NO_STDIO  // we read files ourselves (read_file_bytes), so errors name the path
#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STBI_WRITE_NO_STDIO  // PNGs are encoded to memory, then written atomically
#define STB_IMAGE_RESIZE_IMPLEMENTATION

#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#endif
#include <stb_image.h>
#include <stb_image_resize.h>
#include <stb_image_write.h>
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
