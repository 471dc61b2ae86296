// test_emulated_races.cpp: the CUDA emulation turns each planted synchronisation bug of
// planted_races.cu into a wrong result, and leaves each correct twin right. Every test runs
// its kernel over several launches: each launch draws another block and warp order
// (cuda_emulator.h), and a bug must show in at least one of them. What the emulation cannot
// show, a missing __threadfence(), has no test: see __threadfence in cuda_emulator.h.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <set>
#include <vector>

#include "test/emulator/include/mma.h"
#include "test/emulator/planted_races.h"

namespace mf {
namespace {

constexpr int kLaunches = 8;

// The planted bugs are real data races between the host threads that run the blocks, so
// ThreadSanitizer (test.sh --sanitize, build-tsan) reports them, as it should. There those
// two tests are skipped; they run in the normal and the ASan builds.
#if defined(__SANITIZE_THREAD__)
#define MF_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define MF_UNDER_TSAN 1
#endif
#endif
#if defined(MF_UNDER_TSAN)
#define MF_SKIP_PLANTED_RACE_UNDER_TSAN() \
  GTEST_SKIP() << "a planted data race: ThreadSanitizer reports it by design; runs in the normal and ASan builds"
#else
#define MF_SKIP_PLANTED_RACE_UNDER_TSAN() (void)0
#endif

std::vector<float> ramp(std::size_t n) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 7) + 1.0f;  // small integers: exact sums
  return x;
}

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(EmulatedRaces, MissingSyncthreadsLetsAWarpReadUnwrittenSharedMemory) {
  MF_SKIP_PLANTED_RACE_UNDER_TSAN();
  const int blocks = 4;
  const std::vector<float> x = ramp(blocks * 256);
  std::vector<float> want(blocks, 0.0f);
  for (int i = 0; i < blocks * 256; ++i) want[i / 256] += x[i];
  int wrong = 0;
  for (int launch = 0; launch < kLaunches; ++launch) {
    std::vector<float> with(blocks), without(blocks);
    planted::block_sums(x.data(), blocks, /*sync=*/true, with.data());
    planted::block_sums(x.data(), blocks, /*sync=*/false, without.data());
    EXPECT_EQ(with, want) << "with the barrier, launch " << launch;
    wrong += without != want;
  }
  EXPECT_GT(wrong, 0) << "without the barrier every one of " << kLaunches << " launches summed right";
}

TEST(EmulatedRaces, LastBlockByIndexMissesPartialsOfBlocksStillRunning) {
  MF_SKIP_PLANTED_RACE_UNDER_TSAN();
  const int blocks = 16;
  const std::vector<float> x = ramp(blocks * 32);
  float want = 0.0f;
  for (float v : x) want += v;
  int wrong = 0;
  for (int launch = 0; launch < kLaunches; ++launch) {
    for (const bool trust_index : {false, true}) {
      std::vector<float> partials(blocks, std::nanf(""));  // what an earlier launch may have left
      unsigned counter = 0;
      float out = -1.0f;
      planted::last_block_sum(x.data(), blocks, trust_index, partials.data(), &counter, &out);
      if (trust_index) {
        wrong += out != want;
        continue;
      }
      EXPECT_EQ(out, want) << "counting blocks, launch " << launch;
      EXPECT_EQ(counter, 0u) << "the last block resets the counter";
    }
  }
  EXPECT_GT(wrong, 0) << "the largest index finished last in every one of " << kLaunches << " launches";
}

TEST(EmulatedRaces, FloatAtomicsLandInAnotherOrderAtEachLaunch) {
  // Block sums of very different sizes and signs: each order of the additions rounds
  // differently, so the bits tell the orders apart.
  const int blocks = 16;
  std::vector<float> x(blocks * 32, 0.0f);
  for (int b = 0; b < blocks; ++b) x[b * 32] = std::ldexp(b % 2 ? -1.0f : 1.0f, (b * 5) % 24) * (1.0f + 0.1f * b);
  std::set<std::uint32_t> results;
  for (int launch = 0; launch < kLaunches; ++launch) {
    float out = 0.0f;
    planted::atomic_sum(x.data(), blocks, &out);
    results.insert(bits(out));
  }
  EXPECT_GT(results.size(), 1u) << "all " << kLaunches << " launches added in one order";
}

}  // namespace
}  // namespace mf

namespace mf {
namespace {

// The emulated Tensor Cores (include/mma.h): a 16 x 8 by 8 x 16 product of small integers
// (exact in TF32) as the loops give it; without the __syncwarp() between the lanes' staging
// and the warp's load, some launch multiplies a tile not yet written (poison: NaN).
TEST(EmulatedRaces, WmmaLoadWithoutSyncwarpReadsAnUnwrittenStage) {
  MF_SKIP_PLANTED_RACE_UNDER_TSAN();
  struct alignas(32) Tile {  // a warp matrix load or store wants 32-byte alignment
    float v[256];
    bool operator!=(const Tile& o) const { return std::memcmp(v, o.v, sizeof v) != 0; }
  };
  Tile a{}, b{}, want{};
  for (int i = 0; i < 16 * 8; ++i) a.v[i] = static_cast<float>(i % 5 - 2);
  for (int i = 0; i < 8 * 16; ++i) b.v[i] = static_cast<float>(i % 3 - 1);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j)
      for (int k = 0; k < 8; ++k) want.v[i * 16 + j] += a.v[i * 8 + k] * b.v[k * 16 + j];
  int wrong = 0;
  for (int launch = 0; launch < kLaunches; ++launch) {
    Tile with{}, without{};
    planted::wmma_product(a.v, b.v, /*sync=*/true, with.v);
    planted::wmma_product(a.v, b.v, /*sync=*/false, without.v);
    EXPECT_FALSE(with != want) << "with __syncwarp(), launch " << launch;
    wrong += without != want;
  }
  EXPECT_GT(wrong, 0) << "without __syncwarp() every one of " << kLaunches << " launches multiplied right";
}

// What the CUDA guide asks of a warp matrix load or store: a 256-bit aligned pointer, ldm a
// multiple of 16 bytes; and TF32's rounding, to nearest with ties away from zero.
TEST(EmulatedRaces, WmmaChecksAlignmentAndRoundsToTf32) {
  alignas(32) float tile[64] = {};
  EXPECT_NO_THROW(nvcuda::wmma::detail::check_access(tile, 8, sizeof(float), "load"));
  EXPECT_THROW(nvcuda::wmma::detail::check_access(tile + 4, 8, sizeof(float), "load"), std::runtime_error);
  EXPECT_THROW(nvcuda::wmma::detail::check_access(tile, 6, sizeof(float), "load"), std::runtime_error);
  EXPECT_NO_THROW(nvcuda::wmma::detail::check_access(tile, 8, 2, "load"));  // 8 halves: 16 bytes
  const float ulp = std::ldexp(1.0f, -10);  // TF32's spacing at 1
  EXPECT_EQ(nvcuda::wmma::__float_to_tf32(1.0f + ulp / 2), 1.0f + ulp);     // a tie: away from zero
  EXPECT_EQ(nvcuda::wmma::__float_to_tf32(-1.0f - ulp / 2), -1.0f - ulp);
  EXPECT_EQ(nvcuda::wmma::__float_to_tf32(1.0f + ulp / 4), 1.0f);
  EXPECT_EQ(nvcuda::wmma::__float_to_tf32(1.0f + ulp * 0.75f), 1.0f + ulp);
  EXPECT_EQ(nvcuda::wmma::__float_to_tf32(INFINITY), INFINITY);
  EXPECT_TRUE(std::isnan(nvcuda::wmma::__float_to_tf32(NAN)));
}

}  // namespace
}  // namespace mf
