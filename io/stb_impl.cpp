// stb_impl.cpp: the one place the stb single-header libraries (Debian's libstb-dev headers)
// are compiled, so nothing links libstb.so (the GPU machine has none).
//
// Only PNG, JPEG and BMP are decoded: a smaller attack surface for files from anywhere
// (fuzz/fuzz_image found signed overflow in stb 2.27's PGM/PPM header reader, so those
// formats stay out). decode_gray_image reads the size from the header (stbi_info) and
// refuses absurd sizes before decoding.
#include "io/image.h"

#include <cstdlib>

// stb_image's allocations go through these two, which note a failure: stb does not always
// say "outofmem" when it runs out (its PNG inflater returns NULL without a reason, leaving
// the one an earlier format probe set), and a file that is fine but too big for the memory
// at hand must not be reported as corrupt.
//
// New blocks are zeroed. stb 2.27 does not clear its JPEG decoder's state, so a scan that
// uses a Huffman table no DHT segment defined reads uninitialised heap memory as the
// table (valgrind: "conditional jump depends on uninitialised value", in
// stbi__jpeg_decode_block) and uses it for lookups: such a file decoded to whatever the heap
// held, a different image in each process (fuzz/regressions/image/jpeg_bits_run_out.jpg:
// classified in predict, blank in a test). An all-zero table gives symbol 0 for 0 bits at
// every lookup, the same in every process. Large blocks come as fresh zero pages anyway.
namespace {
thread_local bool g_stb_out_of_memory = false;

void* stb_malloc(std::size_t size) {
  void* p = std::calloc(1, size);
  if (!p && size > 0) g_stb_out_of_memory = true;
  return p;
}
void* stb_realloc(void* old, std::size_t size) {
  void* p = std::realloc(old, size);
  if (!p && size > 0) g_stb_out_of_memory = true;
  return p;
}
}  // namespace

bool mf::io::stb_ran_out_of_memory() {
  const bool failed = g_stb_out_of_memory;
  g_stb_out_of_memory = false;
  return failed;
}

#define STBI_MALLOC(size) stb_malloc(size)
#define STBI_REALLOC(p, size) stb_realloc(p, size)
#define STBI_FREE(p) std::free(p)
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
