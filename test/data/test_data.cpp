// test_data.cpp: IDX reading/writing and its errors, MNIST loading, Keras splits, shuffles, batches.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <new>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "data/batching.h"
#include "data/idx.h"
#include "data/mnist.h"

// The largest single request made through operator new since it was last set to 0. A
// reader that reserved what a header claims would show here even if it never touched the
// memory (which peak resident memory would not show). This test program's operator new
// and delete are malloc and free plus this record.
std::atomic<std::size_t> g_largest_new{0};

// GCC pairs the library's operator new with its delete and, not seeing that this file
// replaces both, warns that free() meets memory from new: here it is malloc's.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void* operator new(std::size_t n) {
  std::size_t seen = g_largest_new.load(std::memory_order_relaxed);
  while (n > seen && !g_largest_new.compare_exchange_weak(seen, n, std::memory_order_relaxed)) {
  }
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return ::operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

namespace {

namespace fs = std::filesystem;
using mf::data::DataError;
using mf::data::Dataset;
using Bytes = std::vector<std::uint8_t>;

// ---- helpers ---------------------------------------------------------------------------------

// An IDX header: two zero bytes, type code, number of dims, big-endian uint32 dims.
Bytes idx_header(std::uint8_t type, const std::vector<std::uint32_t>& dims, int ndim = -1) {
  Bytes h = {0, 0, type, static_cast<std::uint8_t>(ndim < 0 ? dims.size() : ndim)};
  for (const std::uint32_t d : dims) {
    h.push_back(static_cast<std::uint8_t>(d >> 24));
    h.push_back(static_cast<std::uint8_t>(d >> 16));
    h.push_back(static_cast<std::uint8_t>(d >> 8));
    h.push_back(static_cast<std::uint8_t>(d));
  }
  return h;
}

Bytes concat(Bytes a, const Bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

Bytes gzip(const Bytes& raw) {
  z_stream s{};
  // 16 + MAX_WBITS: gzip wrapper; level 6 is gzip's default.
  EXPECT_EQ(deflateInit2(&s, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  Bytes out(deflateBound(&s, static_cast<uLong>(raw.size())) + 64);
  s.next_in = const_cast<Bytef*>(raw.data());
  s.avail_in = static_cast<uInt>(raw.size());
  s.next_out = out.data();
  s.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&s, Z_FINISH), Z_STREAM_END);
  out.resize(s.total_out);
  deflateEnd(&s);
  return out;
}

void write_file(const std::string& path, const Bytes& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

Bytes read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Pixel k of synthetic image i; distinct enough that a misplaced image is caught.
std::uint8_t pixel(std::int64_t i, std::int64_t k) { return static_cast<std::uint8_t>((i * 7 + k * 3) & 0xff); }

Bytes synthetic_images(std::int64_t n, std::int64_t rows, std::int64_t cols) {
  Bytes v(static_cast<std::size_t>(n * rows * cols));
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t k = 0; k < rows * cols; ++k) v[i * rows * cols + k] = pixel(i, k);
  return v;
}

Bytes synthetic_labels(std::int64_t n) {
  Bytes v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>((i * 3) % 10);
  return v;
}

// Passes if f throws DataError whose message is one line, starts with "<path>: " and contains
// every fragment.
::testing::AssertionResult throws_data_error(const std::function<void()>& f, const std::string& path,
                                             const std::vector<std::string>& fragments) {
  try {
    f();
  } catch (const DataError& e) {
    const std::string msg = e.what();
    if (msg.rfind(path + ": ", 0) != 0)
      return ::testing::AssertionFailure() << "message does not start with '" << path << ": ': " << msg;
    if (msg.find('\n') != std::string::npos) return ::testing::AssertionFailure() << "not one line: " << msg;
    for (const std::string& frag : fragments)
      if (msg.find(frag) == std::string::npos)
        return ::testing::AssertionFailure() << "missing '" << frag << "' in: " << msg;
    return ::testing::AssertionSuccess() << msg;
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw something other than DataError: " << e.what();
  }
  return ::testing::AssertionFailure() << "no exception for " << path;
}

// A fresh folder under ::testing::TempDir(), removed afterwards.
class DataFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "mf_data_XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    ASSERT_NE(mkdtemp(buf.data()), nullptr) << tmpl;
    dir_ = buf.data();
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }
  std::string put(const std::string& name, const Bytes& bytes) const {
    const std::string p = path(name);
    write_file(p, bytes);
    return p;
  }
  // The four MNIST files with the given name style: 50 train and 20 test images of 28x28.
  void write_mnist(const std::string& sep, bool gz) const {
    const std::string ext = gz ? ".gz" : "";
    mf::data::write_idx(path("train-images" + sep + "idx3-ubyte" + ext), {50, 28, 28}, synthetic_images(50, 28, 28), gz);
    mf::data::write_idx(path("train-labels" + sep + "idx1-ubyte" + ext), {50}, synthetic_labels(50), gz);
    mf::data::write_idx(path("t10k-images" + sep + "idx3-ubyte" + ext), {20, 28, 28}, synthetic_images(20, 28, 28), gz);
    mf::data::write_idx(path("t10k-labels" + sep + "idx1-ubyte" + ext), {20}, synthetic_labels(20), gz);
  }
  std::string dir_;
};

// ---- IDX round trips ---------------------------------------------------------------------------

using IdxRoundTrip = DataFiles;

TEST_F(IdxRoundTrip, RawThreeDims) {
  const std::string p = path("images-idx3-ubyte");
  const Bytes values = synthetic_images(5, 28, 28);
  mf::data::write_idx(p, {5, 28, 28}, values, /*gzip=*/false);
  EXPECT_EQ(fs::file_size(p), 16u + 5 * 28 * 28);
  EXPECT_EQ(read_file(p), concat(idx_header(0x08, {5, 28, 28}), values));
  const mf::data::IdxArray a = mf::data::read_idx(p);
  EXPECT_EQ(a.dims, (std::vector<std::int64_t>{5, 28, 28}));
  EXPECT_EQ(a.values, values);
}

TEST_F(IdxRoundTrip, GzipEveryRank) {
  const std::vector<std::vector<std::int64_t>> shapes = {{7}, {3, 5}, {4, 6, 2}, {2, 3, 4, 5}};
  for (const auto& dims : shapes) {
    std::int64_t n = 1;
    for (const std::int64_t d : dims) n *= d;
    const Bytes values = synthetic_images(1, 1, n);
    const std::string p = path("a.gz");
    mf::data::write_idx(p, dims, values, /*gzip=*/true);
    const Bytes file = read_file(p);
    ASSERT_GE(file.size(), 2u);
    EXPECT_EQ(file[0], 0x1f);
    EXPECT_EQ(file[1], 0x8b);
    const mf::data::IdxArray a = mf::data::read_idx(p);
    EXPECT_EQ(a.dims, dims);
    EXPECT_EQ(a.values, values);
  }
}

TEST_F(IdxRoundTrip, GzipDetectedByContentNotName) {
  const Bytes values = synthetic_labels(30);
  const std::string gz_plain_name = path("labels-idx1-ubyte");
  const std::string raw_gz_name = path("labels-idx1-ubyte.gz");
  mf::data::write_idx(gz_plain_name, {30}, values, /*gzip=*/true);
  mf::data::write_idx(raw_gz_name, {30}, values, /*gzip=*/false);
  EXPECT_EQ(mf::data::read_idx(gz_plain_name).values, values);
  EXPECT_EQ(mf::data::read_idx(raw_gz_name).values, values);
}

TEST_F(IdxRoundTrip, ConcatenatedGzipMembersAndZeroPadding) {
  // gzip -d accepts both: several members form one stream, and zero bytes after the end are padding.
  const Bytes values = synthetic_images(2, 3, 3);
  const Bytes header = idx_header(0x08, {2, 3, 3});
  const std::string p = put("multi.gz", concat(gzip(header), gzip(values)));
  EXPECT_EQ(mf::data::read_idx(p).values, values);
  const std::string q = put("padded.gz", concat(gzip(concat(header, values)), Bytes(100, 0)));
  EXPECT_EQ(mf::data::read_idx(q).values, values);
  // Padding longer than the reader's 64 KiB chunks of compressed input: skipped across
  // several reads.
  const std::string t = put("long_tail.gz", concat(gzip(concat(header, values)), Bytes(200000, 0)));
  EXPECT_EQ(mf::data::read_idx(t).values, values);
  const std::string u = put("long_tail_then_junk.gz", concat(concat(gzip(concat(header, values)), Bytes(200000, 0)),
                                                              Bytes{'j', 'u', 'n', 'k'}));
  EXPECT_TRUE(throws_data_error([&] { mf::data::read_idx(u); }, u, {"trailing garbage after the end of the gzip stream"}));
}

TEST(IdxParse, FromMemoryRawAndGzip) {
  const Bytes values = synthetic_images(3, 4, 4);
  const Bytes raw = concat(idx_header(0x08, {3, 4, 4}), values);
  EXPECT_EQ(mf::data::parse_idx(raw.data(), raw.size(), "mem").values, values);
  const Bytes gz = gzip(raw);
  EXPECT_EQ(mf::data::parse_idx(gz.data(), gz.size(), "mem.gz").values, values);
  EXPECT_TRUE(throws_data_error([&] { mf::data::parse_idx(raw.data(), raw.size() - 1, "mem"); }, "mem",
                                {"truncated"}));
}

// ---- IDX errors --------------------------------------------------------------------------------

using IdxErrors = DataFiles;

TEST_F(IdxErrors, MissingFile) {
  const std::string p = path("no-such-file");
  EXPECT_TRUE(throws_data_error([&] { mf::data::read_idx(p); }, p, {"cannot open", "No such file or directory"}));
}

TEST_F(IdxErrors, FolderInsteadOfFile) {
  EXPECT_TRUE(throws_data_error([&] { mf::data::read_idx(dir_); }, dir_, {"cannot open", "folder"}));
}

TEST_F(IdxErrors, EmptyFile) {
  const std::string p = put("empty", {});
  EXPECT_TRUE(throws_data_error([&] { mf::data::read_idx(p); }, p, {"empty file"}));
  const std::string q = put("empty.gz", gzip({}));
  EXPECT_TRUE(throws_data_error([&] { mf::data::read_idx(q); }, q, {"empty file", "gzip"}));
}

TEST_F(IdxErrors, TruncatedHeader) {
  const std::string a = put("magic-only-2", {0, 0});
  EXPECT_TRUE(throws_data_error([&] { mf::data::read_idx(a); }, a, {"truncated header", "only 2 bytes"}));
  // Magic says 3 dims (16-byte header) but only one and a half dims follow.
  const std::string b = put("dims-cut", {0, 0, 8, 3, 0, 0, 0, 10, 0, 0});
  EXPECT_TRUE(throws_data_error([&] { mf::data::read_idx(b); }, b, {"truncated header", "16-byte header", "has 10 bytes"}));
  const std::string c = put("dims-cut.gz", gzip({0, 0, 8, 3, 0, 0, 0, 10, 0, 0}));
  EXPECT_TRUE(throws_data_error([&] { mf::data::read_idx(c); }, c, {"truncated header", "decompressed data has 10 bytes"}));
}

TEST_F(IdxErrors, TruncatedDataRaw) {
  const std::string p = put("cut", concat(idx_header(0x08, {10, 28, 28}), Bytes(1000, 1)));
  EXPECT_TRUE(throws_data_error([&] { mf::data::read_idx(p); }, p, {"truncated: header says 7856 bytes, file has 1016"}));
}

TEST_F(IdxErrors, TruncatedDataGzip) {
  const std::string p = put("cut.gz", gzip(concat(idx_header(0x08, {10, 28, 28}), Bytes(1000, 1))));
  EXPECT_TRUE(throws_data_error([&] { mf::data::read_idx(p); }, p,
                                {"truncated: header says 7856 bytes, decompressed data has 1016"}));
}

TEST_F(IdxErrors, TruncatedGzipStream) {
  const Bytes gz = gzip(concat(idx_header(0x08, {10, 28, 28}), synthetic_images(10, 28, 28)));
  const std::string p = put("cut-stream.gz", Bytes(gz.begin(), gz.begin() + gz.size() / 2));
  EXPECT_TRUE(throws_data_error([&] { mf::data::read_idx(p); }, p, {"truncated gzip stream"}));
  // Cut inside the 8-byte trailer (CRC-32, length): all data is there but unverified.
  const std::string q = put("cut-trailer.gz", Bytes(gz.begin(), gz.end() - 3));
  EXPECT_TRUE(throws_data_error([&] { mf::data::read_idx(q); }, q, {"truncated gzip stream"}));
}

TEST_F(IdxErrors, WrongMagic) {
  const std::string p = put("bad-magic", concat({0x12, 0x34, 0x56, 0x78}, Bytes(20, 0)));
  EXPECT_TRUE(throws_data_error([&] { mf::data::read_idx(p); }, p,
                                {"wrong magic number 0x12345678", "expected 0x00000801 to 0x00000804"}));
  const std::string html = "<!DOCTYPE html><html>Not Found</html>";
  const std::string q = put("page", Bytes(html.begin(), html.end()));
  EXPECT_TRUE(throws_data_error([&] { mf::data::read_idx(q); }, q, {"wrong magic number 0x3c21444f", "HTML"}));
}

TEST_F(IdxErrors, UnsupportedTypeCode) {
  const std::string p = put("signed", concat(idx_header(0x09, {4}), Bytes(4, 0)));
  EXPECT_TRUE(throws_data_error([&] { mf::data::read_idx(p); }, p,
                                {"wrong magic number 0x00000901", "type code 0x09 (signed byte) is not supported"}));
  const std::string q = put("float", concat(idx_header(0x0d, {4}), Bytes(16, 0)));
  EXPECT_TRUE(throws_data_error([&] { mf::data::read_idx(q); }, q, {"0x00000d01", "float32", "not supported"}));
  const std::string r = put("unknown", concat(idx_header(0x05, {4}), Bytes(4, 0)));
  EXPECT_TRUE(throws_data_error([&] { mf::data::read_idx(r); }, r, {"unknown IDX type code 0x05"}));
}

TEST_F(IdxErrors, NumberOfDimensions) {
  const std::string p = put("ndim0", {0, 0, 8, 0, 1, 2, 3});
  EXPECT_TRUE(throws_data_error([&] { mf::data::read_idx(p); }, p,
                                {"wrong magic number 0x00000800", "0 dimensions (expected 1 to 4)"}));
  const std::string q = put("ndim5", concat(idx_header(0x08, {1, 1, 1, 1, 1}), Bytes(1, 0)));
  EXPECT_TRUE(throws_data_error([&] { mf::data::read_idx(q); }, q, {"0x00000805", "5 dimensions"}));
}

TEST_F(IdxErrors, ZeroDimension) {
  const std::string p = put("zero-dim", idx_header(0x08, {3, 0, 28}));
  EXPECT_TRUE(throws_data_error([&] { mf::data::read_idx(p); }, p, {"dimension 2 of 3 is 0", "3 x 0 x 28"}));
}

// A header claiming more than the element cap: rejected from the header alone.
TEST_F(IdxErrors, AbsurdSizeFailsFast) {
  const Bytes file = concat(idx_header(0x08, {4000000000u, 28, 28}), Bytes(4, 7));  // 20 bytes
  const std::string p = put("huge", file);
  const std::string q = put("huge.gz", gzip(file));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(throws_data_error([&] { mf::data::read_idx(p); }, p,
                                {"header claims 4000000000 x 28 x 28 elements", "more than the limit of 2147483648"}));
  EXPECT_TRUE(throws_data_error([&] { mf::data::read_idx(q); }, q, {"more than the limit"}));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(500));
}

// A claim under the cap (2e9 bytes) on a 20-byte file: raw files are checked against their
// size, gzip data grows the buffer only as bytes arrive; neither may ask for gigabytes.
TEST_F(IdxErrors, ClaimedSizeIsNotAllocatedUpFront) {
  const Bytes file = concat(idx_header(0x08, {2000000000u}), Bytes(12, 7));  // 20 bytes
  const std::string p = put("big-claim", file);
  const std::string q = put("big-claim.gz", gzip(file));
  g_largest_new = 0;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(throws_data_error([&] { mf::data::read_idx(p); }, p,
                                {"truncated: header says 2000000008 bytes, file has 20"}));
  EXPECT_TRUE(throws_data_error([&] { mf::data::read_idx(q); }, q,
                                {"truncated: header says 2000000008 bytes, decompressed data has 20"}));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(500));
  // The gzip path's first buffer is 1 MiB (data/idx.cpp, kFirstGrowth); nothing near 2e9.
  EXPECT_LE(g_largest_new.load(), std::size_t{4} << 20) << "bytes asked for at once";
}

TEST_F(IdxErrors, TrailingBytes) {
  const Bytes file = concat(concat(idx_header(0x08, {2, 2}), Bytes(4, 9)), Bytes(3, 0));
  const std::string p = put("trailing", file);
  EXPECT_TRUE(throws_data_error([&] { mf::data::read_idx(p); }, p,
                                {"3 bytes of trailing data after the 16 bytes the header describes"}));
  const std::string q = put("trailing.gz", gzip(file));
  EXPECT_TRUE(throws_data_error([&] { mf::data::read_idx(q); }, q, {"3 bytes of trailing data"}));
}

TEST_F(IdxErrors, TrailingGarbageAfterGzipStream) {
  const Bytes good = gzip(concat(idx_header(0x08, {2, 2}), Bytes(4, 9)));
  const std::string p = put("garbage.gz", concat(good, {'j', 'u', 'n', 'k'}));
  EXPECT_TRUE(throws_data_error([&] { mf::data::read_idx(p); }, p, {"trailing garbage", "gzip"}));
  // Too few bytes to make a gzip header: still junk after the stream, not a cut in its data
  // (one byte, and gzip's own first byte, 0x1f, alone).
  for (const Bytes& junk : {Bytes{'j'}, Bytes{0x1f}, Bytes{0x1f, 0x8b, 0x08}}) {
    const std::string q = put("garbage_short.gz", concat(good, junk));
    EXPECT_TRUE(throws_data_error([&] { mf::data::read_idx(q); }, q, {"trailing garbage", "after member 1"}))
        << junk.size() << " bytes";
  }
}

TEST_F(IdxErrors, CorruptGzip) {
  const Bytes gz = gzip(concat(idx_header(0x08, {10, 28, 28}), synthetic_images(10, 28, 28)));
  Bytes body = gz;
  for (std::size_t i = gz.size() / 2; i < gz.size() / 2 + 8; ++i) body[i] ^= 0x5a;
  const std::string p = put("corrupt.gz", body);
  EXPECT_TRUE(throws_data_error([&] { mf::data::read_idx(p); }, p, {"corrupt gzip data"}));
  Bytes method = gz;
  method[2] = 7;  // compression method: only 8 (deflate) exists
  const std::string q = put("method.gz", method);
  EXPECT_TRUE(throws_data_error([&] { mf::data::read_idx(q); }, q, {"corrupt gzip data", "unknown compression method"}));
  Bytes crc = gz;
  crc[crc.size() - 6] ^= 1;  // inside the CRC-32 of the trailer
  const std::string r = put("crc.gz", crc);
  EXPECT_TRUE(throws_data_error([&] { mf::data::read_idx(r); }, r, {"corrupt gzip data", "incorrect data check"}));
}

// Random byte flips, cuts and insertions: every input either parses or gives a DataError.
TEST(IdxParse, MutatedInputsNeverCrash) {
  const Bytes raw = concat(idx_header(0x08, {3, 5, 5}), synthetic_images(3, 5, 5));
  const Bytes gz = gzip(raw);
  mf::data::ShuffleRng rng(/*seed=*/123);
  int parsed = 0, rejected = 0;
  for (int it = 0; it < 4000; ++it) {
    Bytes b = (it % 2) ? gz : raw;
    const int edits = 1 + static_cast<int>(rng.bounded(3));
    for (int e = 0; e < edits && !b.empty(); ++e) {
      const std::size_t at = rng.bounded(b.size());
      switch (rng.bounded(3)) {
        case 0: b[at] = static_cast<std::uint8_t>(rng.next()); break;
        case 1: b.resize(at); break;
        default: b.insert(b.begin() + static_cast<std::ptrdiff_t>(at), static_cast<std::uint8_t>(rng.next())); break;
      }
    }
    try {
      mf::data::parse_idx(b.data(), b.size(), "fuzz");
      ++parsed;
    } catch (const DataError& e) {
      ++rejected;
      ASSERT_EQ(std::string(e.what()).rfind("fuzz: ", 0), 0u) << e.what();
    }
  }
  EXPECT_GT(rejected, 0);
  EXPECT_GT(parsed, 0);  // flips inside raw pixel values are still valid files
}

TEST_F(IdxErrors, WriteRejectsBadArguments) {
  const std::string p = path("w");
  EXPECT_THROW(mf::data::write_idx(p, {}, {}, false), std::invalid_argument);
  EXPECT_THROW(mf::data::write_idx(p, {1, 1, 1, 1, 1}, {0}, false), std::invalid_argument);
  EXPECT_THROW(mf::data::write_idx(p, {0}, {}, false), std::invalid_argument);
  EXPECT_THROW(mf::data::write_idx(p, {2, 2}, {1, 2, 3}, false), std::invalid_argument);
  const std::string q = path("no-such-folder/x");
  EXPECT_TRUE(throws_data_error([&] { mf::data::write_idx(q, {1}, {0}, false); }, q, {"cannot open for writing"}));
  EXPECT_TRUE(throws_data_error([&] { mf::data::write_idx(q, {1}, {0}, true); }, q, {"cannot open for writing"}));
}

// ---- image/label pairs -------------------------------------------------------------------------

using IdxPair = DataFiles;

TEST_F(IdxPair, LoadsImagesAndLabels) {
  const std::string im = path("im"), lb = path("lb.gz");
  mf::data::write_idx(im, {6, 3, 4}, synthetic_images(6, 3, 4), false);
  mf::data::write_idx(lb, {6}, synthetic_labels(6), true);
  const Dataset d = mf::data::load_idx_pair(im, lb);
  EXPECT_EQ(d.count, 6);
  EXPECT_EQ(d.rows, 3);
  EXPECT_EQ(d.cols, 4);
  EXPECT_EQ(d.sample_size(), 12);
  EXPECT_EQ(d.num_classes, 10);
  EXPECT_EQ(d.images, synthetic_images(6, 3, 4));
  EXPECT_EQ(d.labels, synthetic_labels(6));
}

TEST_F(IdxPair, CountMismatchNamesBothFiles) {
  const std::string im = path("im"), lb = path("lb");
  mf::data::write_idx(im, {50, 2, 2}, synthetic_images(50, 2, 2), false);
  mf::data::write_idx(lb, {49}, synthetic_labels(49), false);
  EXPECT_TRUE(throws_data_error([&] { mf::data::load_idx_pair(im, lb); }, im, {"50 images", lb, "49 labels"}));
}

TEST_F(IdxPair, LabelOutOfRange) {
  const std::string im = path("im"), lb = path("lb");
  Bytes labels = synthetic_labels(20);
  labels[7] = 10;
  mf::data::write_idx(im, {20, 2, 2}, synthetic_images(20, 2, 2), false);
  mf::data::write_idx(lb, {20}, labels, false);
  EXPECT_TRUE(throws_data_error([&] { mf::data::load_idx_pair(im, lb); }, lb, {"index 7", "is 10", "10 classes"}));
  labels[7] = 4;
  mf::data::write_idx(lb, {20}, labels, false);
  EXPECT_NO_THROW(mf::data::load_idx_pair(im, lb));
  // With 5 classes, the first label >= 5 is reported (synthetic label 3*i % 10: index 2 is 6).
  EXPECT_TRUE(throws_data_error([&] { mf::data::load_idx_pair(im, lb, 5); }, lb, {"index 2", "is 6", "5 classes"}));
  EXPECT_THROW(mf::data::load_idx_pair(im, lb, 0), std::invalid_argument);
  EXPECT_THROW(mf::data::load_idx_pair(im, lb, 257), std::invalid_argument);
}

TEST_F(IdxPair, WrongRanks) {
  const std::string im2 = path("im2"), lb = path("lb"), lb2 = path("lb2"), im = path("im");
  mf::data::write_idx(im2, {4, 4}, Bytes(16, 0), false);
  mf::data::write_idx(lb, {4}, Bytes(4, 0), false);
  mf::data::write_idx(lb2, {4, 1}, Bytes(4, 0), false);
  mf::data::write_idx(im, {4, 2, 2}, Bytes(16, 0), false);
  EXPECT_TRUE(throws_data_error([&] { mf::data::load_idx_pair(im2, lb); }, im2,
                                {"3 dimensions (count x rows x cols) or 4 (count x rows x cols x channels)",
                                 "got 2 (4 x 4)"}));
  EXPECT_TRUE(throws_data_error([&] { mf::data::load_idx_pair(im, lb2); }, lb2, {"1 dimension", "got 2 (4 x 1)"}));
  const std::string im1 = path("im1");
  mf::data::write_idx(im1, {16}, Bytes(16, 0), false);
  EXPECT_TRUE(throws_data_error([&] { mf::data::load_idx_pair(im1, lb); }, im1, {"got 1 (16)"}));
}

// A 4-D images file is count x rows x cols x channels, each pixel's channels together (HWC),
// and is kept as it is: the batches the model takes are laid out the same way.
TEST_F(IdxPair, FourDimensionsAreImagesWithChannels) {
  const std::string im = path("im"), lb = path("lb");
  mf::data::write_idx(im, {5, 3, 4, 3}, synthetic_images(5, 3, 12), false);
  mf::data::write_idx(lb, {5}, synthetic_labels(5), false);
  const Dataset d = mf::data::load_idx_pair(im, lb);
  EXPECT_EQ(d.count, 5);
  EXPECT_EQ(d.rows, 3);
  EXPECT_EQ(d.cols, 4);
  EXPECT_EQ(d.channels, 3);
  EXPECT_EQ(d.sample_size(), 36);
  EXPECT_EQ(d.images, synthetic_images(5, 3, 12));
  // One channel spelled as a fourth dimension is the same as three dimensions.
  mf::data::write_idx(im, {5, 3, 4, 1}, synthetic_images(5, 3, 4), false);
  const Dataset one = mf::data::load_idx_pair(im, lb);
  EXPECT_EQ(one.channels, 1);
  EXPECT_EQ(one.sample_size(), 12);
  // No channels: refused by the reader, as any dimension of 0 is.
  const std::string none = put("none", idx_header(0x08, {5, 3, 4, 0}));
  EXPECT_TRUE(throws_data_error([&] { mf::data::load_idx_pair(none, lb); }, none, {"dimension 4 of 4 is 0"}));
}

// ---- MNIST folders -----------------------------------------------------------------------------

using MnistFolder = DataFiles;

void expect_synthetic_mnist(const mf::data::Mnist& m) {
  EXPECT_EQ(m.train.count, 50);
  EXPECT_EQ(m.test.count, 20);
  EXPECT_EQ(m.train.rows, 28);
  EXPECT_EQ(m.train.cols, 28);
  EXPECT_EQ(m.test.rows, 28);
  EXPECT_EQ(m.test.cols, 28);
  EXPECT_EQ(m.train.images, synthetic_images(50, 28, 28));
  EXPECT_EQ(m.train.labels, synthetic_labels(50));
  EXPECT_EQ(m.test.images, synthetic_images(20, 28, 28));
  EXPECT_EQ(m.test.labels, synthetic_labels(20));
}

TEST_F(MnistFolder, RawFiles) {
  write_mnist("-", false);
  const mf::data::Mnist m = mf::data::load_mnist(dir_);
  EXPECT_EQ(m.dir, dir_);
  expect_synthetic_mnist(m);
}

TEST_F(MnistFolder, GzipFiles) {
  write_mnist("-", true);
  expect_synthetic_mnist(mf::data::load_mnist(dir_));
}

TEST_F(MnistFolder, DotIdxNaming) {
  write_mnist(".", false);
  expect_synthetic_mnist(mf::data::load_mnist(dir_));
}

TEST_F(MnistFolder, DotIdxNamingGzip) {
  write_mnist(".", true);
  expect_synthetic_mnist(mf::data::load_mnist(dir_));
}

TEST_F(MnistFolder, MissingFolder) {
  const std::string missing = path("nowhere");
  EXPECT_TRUE(throws_data_error([&] { mf::data::load_mnist(missing); }, missing, {"data folder not found"}));
}

TEST_F(MnistFolder, MissingOneFileListsTheNamesTried) {
  write_mnist("-", false);
  fs::remove(path("t10k-labels-idx1-ubyte"));
  EXPECT_TRUE(throws_data_error([&] { mf::data::load_mnist(dir_); }, dir_,
                                {"test labels", "t10k-labels-idx1-ubyte, t10k-labels.idx1-ubyte, "
                                                "t10k-labels-idx1-ubyte.gz, t10k-labels.idx1-ubyte.gz"}));
}

TEST_F(MnistFolder, BadFileInsideIsNamed) {
  write_mnist("-", false);
  const std::string bad = put("train-labels-idx1-ubyte", {0, 0, 8});
  EXPECT_TRUE(throws_data_error([&] { mf::data::load_mnist(dir_); }, bad, {"truncated header"}));
}

// The loader says which files it read (the apps keep their outputs off them): the raw
// name where there is one, else the .gz, each as dir/name.
TEST_F(MnistFolder, RecordsTheFilesItRead) {
  write_mnist("-", true);
  mf::data::write_idx(path("t10k-labels-idx1-ubyte"), {20}, synthetic_labels(20), false);
  // The raw file under the other spelling ("train-images.idx3-ubyte") is preferred to the
  // .gz too: it was found after the .gz, which then had to be inflated.
  mf::data::write_idx(path("train-labels.idx1-ubyte"), {50}, synthetic_labels(50), false);
  const mf::data::Mnist m = mf::data::load_mnist(dir_);
  EXPECT_EQ(m.files.train_images, path("train-images-idx3-ubyte.gz"));
  EXPECT_EQ(m.files.train_labels, path("train-labels.idx1-ubyte"));
  EXPECT_EQ(m.files.test_images, path("t10k-images-idx3-ubyte.gz"));
  EXPECT_EQ(m.files.test_labels, path("t10k-labels-idx1-ubyte"));
  const mf::data::MnistFiles found = mf::data::find_mnist_files(dir_);
  EXPECT_EQ(found.train_images, m.files.train_images);
  EXPECT_EQ(found.test_labels, m.files.test_labels);
}

// A name that is there but is no file is said to be so: "cannot find" would send the user
// looking for a file that is in plain sight.
TEST_F(MnistFolder, FolderOrPipeUnderAFileNameIsNamed) {
  write_mnist("-", false);
  fs::remove(path("train-images-idx3-ubyte"));
  fs::create_directory(path("train-images-idx3-ubyte"));
  EXPECT_TRUE(throws_data_error([&] { mf::data::load_mnist(dir_); }, path("train-images-idx3-ubyte"),
                                {"is a folder, not a file", "training images"}));
  fs::remove(path("train-images-idx3-ubyte"));
  ASSERT_EQ(mkfifo(path("train-images-idx3-ubyte").c_str(), 0600), 0) << std::strerror(errno);
  EXPECT_TRUE(throws_data_error([&] { mf::data::load_mnist(dir_); }, path("train-images-idx3-ubyte"),
                                {"is a FIFO (named pipe), not a file", "training images"}));
  // A file under one of the other usual names is still found (and the FIFO never opened).
  fs::remove(path("train-images-idx3-ubyte"));
  fs::create_directory(path("train-images-idx3-ubyte"));
  mf::data::write_idx(path("train-images-idx3-ubyte.gz"), {50, 28, 28}, synthetic_images(50, 28, 28), true);
  const mf::data::Mnist m = mf::data::load_mnist(dir_);
  EXPECT_EQ(m.files.train_images, path("train-images-idx3-ubyte.gz"));
  expect_synthetic_mnist(m);
}

// A name that cannot be looked at gives the system's reason, and a symlink to nothing says so.
TEST_F(MnistFolder, UnreadableNameGivesTheSystemsReason) {
  write_mnist("-", false);
  fs::remove(path("train-labels-idx1-ubyte"));
  fs::create_symlink(path("train-labels-idx1-ubyte"), path("train-labels-idx1-ubyte"));  // a loop
  EXPECT_TRUE(throws_data_error([&] { mf::data::load_mnist(dir_); }, path("train-labels-idx1-ubyte"),
                                {"cannot look at the training labels file", std::strerror(ELOOP)}));
  fs::remove(path("train-labels-idx1-ubyte"));
  fs::create_symlink(path("gone"), path("train-labels-idx1-ubyte"));
  EXPECT_TRUE(throws_data_error([&] { mf::data::load_mnist(dir_); }, path("train-labels-idx1-ubyte"),
                                {"is a symlink to a missing file", "training labels"}));
}

TEST_F(MnistFolder, FolderWithoutPermissionGivesTheSystemsReason) {
  // root reads and searches every folder whatever its mode bits, so no error would come.
  if (geteuid() == 0) GTEST_SKIP() << "running as root, which permissions do not stop";
  write_mnist("-", false);
  fs::create_directory(path("inner"));
  fs::permissions(dir_, fs::perms::none);
  const bool files = throws_data_error([&] { mf::data::load_mnist(dir_); }, path("train-images-idx3-ubyte"),
                                       {"cannot look at the training images file", std::strerror(EACCES)});
  // A data folder inside it is there, just out of reach: not "not found".
  const bool folder = throws_data_error([&] { mf::data::load_mnist(path("inner")); }, path("inner"),
                                        {"cannot look at the data folder", std::strerror(EACCES)});
  fs::permissions(dir_, fs::perms::owner_all);  // so that TearDown can remove it
  EXPECT_TRUE(files);
  EXPECT_TRUE(folder);
}

// Images with channels in files named idx4-ubyte (raw or gzip, either spelling), or in files
// still named idx3-ubyte: the file's header says what it holds, not its name.
TEST_F(MnistFolder, ImagesWithChannels) {
  for (const bool idx4_name : {true, false}) {
    for (const bool gz : {false, true}) {
      SCOPED_TRACE(std::string(idx4_name ? "idx4" : "idx3") + (gz ? ".gz" : ""));
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(dir_)) fs::remove(e.path(), ec);
      const std::string kind = idx4_name ? "idx4-ubyte" : "idx3-ubyte", ext = gz ? ".gz" : "";
      mf::data::write_idx(path("train-images-" + kind + ext), {50, 28, 28, 3}, synthetic_images(50, 28, 84), gz);
      mf::data::write_idx(path("train-labels-idx1-ubyte"), {50}, synthetic_labels(50), false);
      mf::data::write_idx(path("t10k-images." + kind + ext), {20, 28, 28, 3}, synthetic_images(20, 28, 84), gz);
      mf::data::write_idx(path("t10k-labels.idx1-ubyte"), {20}, synthetic_labels(20), false);
      const mf::data::Mnist m = mf::data::load_mnist(dir_);
      EXPECT_EQ(m.files.train_images, path("train-images-" + kind + ext));
      EXPECT_EQ(m.train.channels, 3);
      EXPECT_EQ(m.test.channels, 3);
      EXPECT_EQ(m.train.images, synthetic_images(50, 28, 84));
      EXPECT_EQ(m.test.images, synthetic_images(20, 28, 84));
      // The split and subsets keep the channels.
      const mf::data::Split split = mf::data::split_validation(m.train, 0.2);
      EXPECT_EQ(split.train.channels, 3);
      EXPECT_EQ(split.validation.channels, 3);
      EXPECT_EQ(split.validation.images, Bytes(m.train.images.begin() + 40 * 28 * 84, m.train.images.end()));
    }
  }
  // A missing images file lists the idx4 names too.
  fs::remove(path("t10k-images.idx3-ubyte.gz"));
  EXPECT_TRUE(throws_data_error([&] { mf::data::load_mnist(dir_); }, dir_,
                                {"test images", "t10k-images.idx3-ubyte.gz, t10k-images-idx4-ubyte, "
                                                "t10k-images.idx4-ubyte, t10k-images-idx4-ubyte.gz, "
                                                "t10k-images.idx4-ubyte.gz"}));
}

TEST_F(MnistFolder, TrainAndTestChannelsMustAgree) {
  write_mnist("-", false);
  mf::data::write_idx(path("t10k-images-idx3-ubyte"), {20, 28, 28, 3}, synthetic_images(20, 28, 84), false);
  EXPECT_TRUE(throws_data_error([&] { mf::data::load_mnist(dir_); }, path("t10k-images-idx3-ubyte"),
                                {"images have 3 channels but the training images in",
                                 "train-images-idx3-ubyte have one channel"}));
}

TEST_F(MnistFolder, TrainAndTestSizesMustAgree) {
  write_mnist("-", false);
  mf::data::write_idx(path("t10k-images-idx3-ubyte"), {20, 32, 32}, synthetic_images(20, 32, 32), false);
  EXPECT_TRUE(throws_data_error([&] { mf::data::load_mnist(dir_); }, path("t10k-images-idx3-ubyte"),
                                {"32x32", "28x28"}));
}

// ---- validation split --------------------------------------------------------------------------

// n images of 2x2 whose bytes encode their index, so a moved sample is caught.
Dataset indexed_dataset(std::int64_t n) {
  Dataset d;
  d.count = n;
  d.rows = 2;
  d.cols = 2;
  for (std::int64_t i = 0; i < n; ++i) {
    d.images.insert(d.images.end(), {static_cast<std::uint8_t>(i), static_cast<std::uint8_t>(i >> 8),
                                     static_cast<std::uint8_t>(i >> 16), static_cast<std::uint8_t>(i % 251)});
    d.labels.push_back(static_cast<std::uint8_t>(i % 10));
  }
  return d;
}

std::int64_t index_of(const Dataset& d, std::int64_t j) {
  const std::uint8_t* p = d.images.data() + j * 4;
  return p[0] | (p[1] << 8) | (p[2] << 16);
}

TEST(SplitValidation, KerasSplitOf60000) {
  const Dataset d = indexed_dataset(60000);
  const mf::data::Split s = mf::data::split_validation(d, 0.2);
  ASSERT_EQ(s.train.count, 48000);
  ASSERT_EQ(s.validation.count, 12000);
  EXPECT_EQ(s.train.images.size(), 48000u * 4);
  EXPECT_EQ(s.validation.labels.size(), 12000u);
  EXPECT_EQ(s.validation.rows, 2);
  EXPECT_EQ(s.validation.num_classes, 10);
  // The train part is samples 0..47999 and validation is 48000..59999, bytes and labels.
  EXPECT_TRUE(std::equal(s.train.images.begin(), s.train.images.end(), d.images.begin()));
  EXPECT_TRUE(std::equal(s.validation.images.begin(), s.validation.images.end(), d.images.begin() + 48000 * 4));
  EXPECT_TRUE(std::equal(s.validation.labels.begin(), s.validation.labels.end(), d.labels.begin() + 48000));
  EXPECT_EQ(index_of(s.train, 0), 0);
  EXPECT_EQ(index_of(s.train, 47999), 47999);
  EXPECT_EQ(index_of(s.validation, 0), 48000);
  EXPECT_EQ(index_of(s.validation, 11999), 59999);
}

TEST(SplitValidation, FractionZeroKeepsEverything) {
  const Dataset d = indexed_dataset(100);
  const mf::data::Split s = mf::data::split_validation(d, 0.0);
  EXPECT_EQ(s.train.count, 100);
  EXPECT_EQ(s.train.images, d.images);
  EXPECT_EQ(s.validation.count, 0);
  EXPECT_TRUE(s.validation.images.empty());
  EXPECT_TRUE(s.validation.labels.empty());
  EXPECT_EQ(s.validation.rows, 2);
}

TEST(SplitValidation, TruncatesLikeKeras) {
  const mf::data::Split s = mf::data::split_validation(indexed_dataset(10), 0.25);
  EXPECT_EQ(s.train.count, 7);  // int(10 * 0.75) = int(7.5) = 7
  ASSERT_EQ(s.validation.count, 3);
  EXPECT_EQ(index_of(s.validation, 0), 7);
  EXPECT_EQ(index_of(s.validation, 2), 9);
  // Python's int(n * (1. - f)) for cases where the double product lands just off an integer:
  // 10 * (1 - 0.8) = 1.9999999999999996 -> 1; 10 * (1 - 0.9) = 0.9999999999999998 -> 0;
  // 100 * (1 - 0.34) = 65.99999999999999 -> 65; 10 * (1 - 0.7) = 3.0000000000000004 -> 3.
  EXPECT_EQ(mf::data::split_validation(indexed_dataset(10), 0.8).train.count, 1);
  EXPECT_EQ(mf::data::split_validation(indexed_dataset(10), 0.9).train.count, 0);
  EXPECT_EQ(mf::data::split_validation(indexed_dataset(100), 0.34).train.count, 65);
  EXPECT_EQ(mf::data::split_validation(indexed_dataset(10), 0.7).train.count, 3);
  EXPECT_EQ(mf::data::split_validation(indexed_dataset(60000), 0.1).train.count, 54000);
  EXPECT_EQ(mf::data::split_validation(indexed_dataset(60000), 1.0 / 3.0).train.count, 40000);
}

TEST(SplitValidation, BadFractionsThrow) {
  const Dataset d = indexed_dataset(10);
  for (const double f : {-0.1, 1.0, 1.5, std::numeric_limits<double>::quiet_NaN(),
                         std::numeric_limits<double>::infinity()}) {
    try {
      mf::data::split_validation(d, f);
      ADD_FAILURE() << "no exception for fraction " << f;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("fraction must be in [0, 1)"), std::string::npos) << e.what();
    }
  }
}

TEST(Subset, RangesAndBounds) {
  const Dataset d = indexed_dataset(10);
  const Dataset s = mf::data::subset(d, 3, 6);
  ASSERT_EQ(s.count, 3);
  EXPECT_EQ(index_of(s, 0), 3);
  EXPECT_EQ(index_of(s, 2), 5);
  EXPECT_EQ(s.labels, (Bytes{3, 4, 5}));
  EXPECT_EQ(mf::data::subset(d, 10, 10).count, 0);
  EXPECT_THROW(mf::data::subset(d, -1, 2), std::invalid_argument);
  EXPECT_THROW(mf::data::subset(d, 5, 4), std::invalid_argument);
  EXPECT_THROW(mf::data::subset(d, 0, 11), std::invalid_argument);
  Dataset broken = d;
  broken.labels.pop_back();
  EXPECT_THROW(mf::data::subset(broken, 0, 1), std::invalid_argument);
}

// ---- shuffling ---------------------------------------------------------------------------------

bool is_permutation_of_iota(const std::vector<std::int32_t>& p) {
  std::vector<bool> seen(p.size(), false);
  for (const std::int32_t v : p) {
    if (v < 0 || static_cast<std::size_t>(v) >= p.size() || seen[v]) return false;
    seen[v] = true;
  }
  return true;
}

TEST(EpochPermutation, IsAPermutation) {
  for (const std::int64_t n : {0, 1, 2, 10, 1000, 60000}) {
    const std::vector<std::int32_t> p = mf::data::epoch_permutation(n, /*seed=*/42, /*epoch=*/3);
    ASSERT_EQ(static_cast<std::int64_t>(p.size()), n);
    EXPECT_TRUE(is_permutation_of_iota(p)) << "n = " << n;
  }
  EXPECT_THROW(mf::data::epoch_permutation(-1, 1, 0), std::invalid_argument);
  EXPECT_THROW(mf::data::epoch_permutation(std::int64_t{1} << 31, 1, 0), std::invalid_argument);
}

TEST(EpochPermutation, DeterministicPerSeedAndEpoch) {
  const auto a = mf::data::epoch_permutation(48000, 7, 0);
  EXPECT_EQ(a, mf::data::epoch_permutation(48000, 7, 0));
  EXPECT_NE(a, mf::data::epoch_permutation(48000, 7, 1));
  EXPECT_NE(a, mf::data::epoch_permutation(48000, 8, 0));
  EXPECT_NE(mf::data::epoch_permutation(48000, 7, 1), mf::data::epoch_permutation(48000, 8, 0));
  // A real shuffle: few fixed points (about 1 expected).
  int fixed = 0;
  for (std::size_t i = 0; i < a.size(); ++i) fixed += a[i] == static_cast<std::int32_t>(i);
  EXPECT_LT(fixed, 10);
}

// Pinned outputs: a change to the generator, its seeding, the bounded draw or the Fisher-Yates
// loop changes every training run's batch order, so it must show up here. Cross-checked with an
// independent implementation of SplitMix64 + xoshiro256** in Python.
TEST(EpochPermutation, GoldenValues) {
  EXPECT_EQ(mf::data::epoch_permutation(10, /*seed=*/1, /*epoch=*/0),
            (std::vector<std::int32_t>{7, 4, 8, 0, 2, 9, 1, 6, 3, 5}));
  EXPECT_EQ(mf::data::epoch_permutation(10, /*seed=*/1, /*epoch=*/1),
            (std::vector<std::int32_t>{8, 4, 6, 2, 7, 9, 3, 5, 0, 1}));
  mf::data::ShuffleRng rng(/*seed=*/0);
  EXPECT_EQ(rng.next(), 0x99ec5f36cb75f2b4ull);
  EXPECT_EQ(rng.next(), 0xbf6e1f784956452aull);
}

TEST(EpochPermutation, RoughlyUniform) {
  // 6000 shuffles of 3 items: each of the 6 orders should come up ~1000 times (sd ~29).
  std::map<std::vector<std::int32_t>, int> counts;
  for (int e = 0; e < 6000; ++e) ++counts[mf::data::epoch_permutation(3, 99, e)];
  ASSERT_EQ(counts.size(), 6u);
  for (const auto& [perm, c] : counts) {
    EXPECT_GT(c, 850);
    EXPECT_LT(c, 1150);
  }
}

TEST(ShuffleRng, BoundedStaysInRange) {
  mf::data::ShuffleRng rng(5);
  for (const std::uint64_t bound : {1ull, 2ull, 3ull, 10ull, 1000003ull, (1ull << 63) + 1}) {
    for (int i = 0; i < 1000; ++i) EXPECT_LT(rng.bounded(bound), bound);
  }
  EXPECT_THROW(rng.bounded(0), std::invalid_argument);
}

// ---- batching ----------------------------------------------------------------------------------

// count * rows * cols past 64 bits is refused, not wrapped around to a small number that
// the bytes present could match: one image of 2^32 x 2^32 pixels wraps to exactly 0, the
// size of no images at all, and would pass as a consistent (empty) image.
TEST(DatasetChecks, SizesWhoseProductOverflowsAreInconsistent) {
  Dataset d;
  d.count = 1;
  d.labels = {0};
  d.rows = d.cols = std::int64_t{1} << 32;
  EXPECT_THROW(mf::data::check_dataset(d, "test"), std::invalid_argument);
  d.rows = d.cols = 0;
  EXPECT_NO_THROW(mf::data::check_dataset(d, "test")) << "one 0x0 image, 0 bytes: consistent";
  // The channels count in the product too, and an image has at least one.
  d.rows = d.cols = std::int64_t{1} << 31;
  d.channels = std::int64_t{1} << 2;  // 2^64 bytes: wraps to 0 without the check
  EXPECT_THROW(mf::data::check_dataset(d, "test"), std::invalid_argument);
  d.rows = d.cols = 1;
  d.images = {7, 8, 9};
  d.channels = 3;
  EXPECT_NO_THROW(mf::data::check_dataset(d, "test"));
  d.channels = 1;
  try {
    mf::data::check_dataset(d, "test");
    ADD_FAILURE() << "3 bytes for one 1x1 image of one channel passed";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "test: inconsistent Dataset: count 1, 1x1x1 (rows x cols x channels), 3 image bytes, 1 labels");
  }
  d.images.clear();
  d.channels = 0;
  EXPECT_THROW(mf::data::check_dataset(d, "test"), std::invalid_argument) << "0 channels";
}

TEST(Batching, NumBatchesKeepsThePartialBatch) {
  EXPECT_EQ(mf::data::num_batches(48000, 64), 750);
  EXPECT_EQ(mf::data::num_batches(48000, 1024), 47);
  EXPECT_EQ(mf::data::batch_length(48000, 1024, 45), 1024);
  EXPECT_EQ(mf::data::batch_length(48000, 1024, 46), 896);  // 48000 - 46 * 1024
  EXPECT_EQ(mf::data::batch_length(48000, 64, 749), 64);
  EXPECT_EQ(mf::data::num_batches(60000, 128), 469);
  EXPECT_EQ(mf::data::batch_length(60000, 128, 468), 96);
  EXPECT_EQ(mf::data::num_batches(0, 64), 0);
  EXPECT_EQ(mf::data::num_batches(1, 64), 1);
  EXPECT_EQ(mf::data::num_batches(std::numeric_limits<std::int64_t>::max(), 2),
            std::numeric_limits<std::int64_t>::max() / 2 + 1);
  EXPECT_THROW(mf::data::num_batches(10, 0), std::invalid_argument);
  EXPECT_THROW(mf::data::num_batches(-1, 8), std::invalid_argument);
  EXPECT_THROW(mf::data::batch_length(48000, 1024, 47), std::invalid_argument);
  EXPECT_THROW(mf::data::batch_length(48000, 1024, -1), std::invalid_argument);
}

TEST(Batching, GatherScalesPixels) {
  Dataset d;
  d.count = 1;
  d.rows = 16;
  d.cols = 16;
  for (int p = 0; p < 256; ++p) d.images.push_back(static_cast<std::uint8_t>(p));
  d.labels = {3};
  const std::int32_t idx = 0;
  std::vector<float> x(256, -1.0f);
  std::int32_t y = -1;
  mf::data::gather_batch(d, &idx, 1, x.data(), &y);
  EXPECT_EQ(y, 3);
  EXPECT_EQ(x[0], 0.0f);
  EXPECT_EQ(x[255], 1.0f);
  EXPECT_NEAR(x[51], 0.2f, 1e-7f);
  for (int p = 0; p < 256; ++p) EXPECT_EQ(x[p], static_cast<float>(p) / 255.0f) << p;  // bit-exact
}

// With channels, a sample is rows x cols x channels bytes, copied in the order they are
// stored (HWC): image i's pixel (r, c), channel k is at ((r * cols) + c) * channels + k.
TEST(Batching, GatherTakesEveryChannel) {
  Dataset d;
  d.count = 3;
  d.rows = 2;
  d.cols = 5;
  d.channels = 3;
  for (int i = 0; i < 3; ++i)
    for (int k = 0; k < 30; ++k) d.images.push_back(static_cast<std::uint8_t>(i * 30 + k));
  d.labels = {0, 1, 2};
  const std::vector<std::int32_t> idx = {2, 0};
  std::vector<float> x(60, -1.0f);
  mf::data::gather_batch(d, idx.data(), 2, x.data(), nullptr);
  for (int k = 0; k < 30; ++k) {
    EXPECT_EQ(x[k], static_cast<float>(60 + k) / 255.0f) << k;
    EXPECT_EQ(x[30 + k], static_cast<float>(k) / 255.0f) << k;
  }
}

TEST(Batching, GatherFollowsIndexOrder) {
  const Dataset d = indexed_dataset(5);
  const std::vector<std::int32_t> idx = {4, 0, 3, 3};
  std::vector<float> x(idx.size() * 4, -1.0f);
  std::vector<std::int32_t> y(idx.size(), -1);
  mf::data::gather_batch(d, idx.data(), static_cast<std::int64_t>(idx.size()), x.data(), y.data());
  for (std::size_t i = 0; i < idx.size(); ++i) {
    EXPECT_EQ(y[i], idx[i] % 10);
    EXPECT_EQ(x[i * 4 + 0], static_cast<float>(idx[i]) / 255.0f);  // byte 0 is the index
    EXPECT_EQ(x[i * 4 + 3], static_cast<float>(idx[i] % 251) / 255.0f);
  }
  // Null outputs are skipped; bad indices are reported.
  mf::data::gather_batch(d, idx.data(), 2, nullptr, y.data());
  mf::data::gather_batch(d, idx.data(), 2, x.data(), nullptr);
  const std::int32_t bad[] = {1, 5};
  EXPECT_THROW(mf::data::gather_batch(d, bad, 2, x.data(), y.data()), std::out_of_range);
  const std::int32_t negative[] = {-1};
  EXPECT_THROW(mf::data::gather_batch(d, negative, 1, x.data(), y.data()), std::out_of_range);
}

TEST(Batching, AnEpochVisitsEverySampleOnce) {
  const Dataset d = indexed_dataset(1000);
  const auto perm = mf::data::epoch_permutation(d.count, 1, 0);
  const std::int64_t bs = 64;
  std::vector<float> x(bs * 4);
  std::vector<std::int32_t> y(bs);
  std::set<std::int64_t> seen;
  for (std::int64_t b = 0; b < mf::data::num_batches(d.count, bs); ++b) {
    const std::int64_t len = mf::data::batch_length(d.count, bs, b);
    mf::data::gather_batch(d, perm.data() + b * bs, len, x.data(), y.data());
    for (std::int64_t i = 0; i < len; ++i) {
      const std::int64_t idx = std::lround(x[i * 4] * 255.0f) + 256 * std::lround(x[i * 4 + 1] * 255.0f);
      EXPECT_EQ(y[i], idx % 10);
      seen.insert(idx);
    }
  }
  EXPECT_EQ(seen.size(), 1000u);
}

// ---- the real data sets, when present -----------------------------------------------------------

std::string env_dir(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

TEST(RealData, Mnist) {
  const std::string dir = env_dir("MF_MNIST_DIR");
  if (dir.empty()) GTEST_SKIP() << "MF_MNIST_DIR is not set";
  if (!fs::is_directory(dir)) GTEST_SKIP() << "MF_MNIST_DIR=" << dir << " is not a folder";
  const mf::data::Mnist m = mf::data::load_mnist(dir);
  EXPECT_EQ(m.train.count, 60000);
  EXPECT_EQ(m.test.count, 10000);
  for (const Dataset* d : {&m.train, &m.test}) {
    EXPECT_EQ(d->rows, 28);
    EXPECT_EQ(d->cols, 28);
    EXPECT_EQ(d->images.size(), static_cast<std::size_t>(d->count * 784));
  }
  // The published class counts of MNIST; they also sum to 60000 and 10000.
  const std::vector<std::int64_t> train_hist = {5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949};
  const std::vector<std::int64_t> test_hist = {980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009};
  std::vector<std::int64_t> h_train(10, 0), h_test(10, 0);
  for (const std::uint8_t l : m.train.labels) ++h_train.at(l);
  for (const std::uint8_t l : m.test.labels) ++h_test.at(l);
  EXPECT_EQ(std::accumulate(h_train.begin(), h_train.end(), std::int64_t{0}), 60000);
  EXPECT_EQ(std::accumulate(h_test.begin(), h_test.end(), std::int64_t{0}), 10000);
  EXPECT_EQ(h_train, train_hist);
  EXPECT_EQ(h_test, test_hist);
  EXPECT_EQ(m.train.labels[0], 5);  // the well-known first training digit
  EXPECT_EQ(m.test.labels[0], 7);
}

TEST(RealData, FashionMnist) {
  const std::string dir = env_dir("MF_FASHION_MNIST_DIR");
  if (dir.empty()) GTEST_SKIP() << "MF_FASHION_MNIST_DIR is not set";
  if (!fs::is_directory(dir)) GTEST_SKIP() << "MF_FASHION_MNIST_DIR=" << dir << " is not a folder";
  const mf::data::Mnist m = mf::data::load_mnist(dir);
  EXPECT_EQ(m.train.count, 60000);
  EXPECT_EQ(m.test.count, 10000);
  EXPECT_EQ(m.train.rows, 28);
  EXPECT_EQ(m.train.cols, 28);
  std::vector<std::int64_t> h_train(10, 0), h_test(10, 0);
  for (const std::uint8_t l : m.train.labels) ++h_train.at(l);
  for (const std::uint8_t l : m.test.labels) ++h_test.at(l);
  EXPECT_EQ(h_train, std::vector<std::int64_t>(10, 6000));  // Fashion-MNIST is balanced
  EXPECT_EQ(h_test, std::vector<std::int64_t>(10, 1000));
}

}  // namespace
