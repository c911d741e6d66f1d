// The VPDPBUSD GEMM (kernels/cpu/avx512_vnni_gemm.h) on its own: packed weights and raw int32
// accumulators against reference::gemm_s8s8_s32, over M, N and K tails, any row and panel range,
// and the extremes where the unsigned-shift sums wrap int32 before the compensation.
#include "kernels/cpu/avx512_vnni_gemm.h"

#include <gtest/gtest.h>

#include <vector>

#include "kernels/reference/reference_w8a8.h"
#include "tests/kernels/cpu/cpu_test_util.h"

namespace qlinear::cpu {
namespace {

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

struct Packed {
  int64_t k_pad, n_pad, panels;
  std::vector<int8_t> data;
  std::vector<int32_t> comp;
};

Packed pack(const std::vector<int8_t>& w, int64_t n, int64_t k) {
  Packed p;
  p.k_pad = round_up(k, 4);
  p.n_pad = round_up(n, 16);
  p.panels = (p.n_pad + kVnniPanel - 1) / kVnniPanel;
  p.data.assign(p.k_pad * p.n_pad + 64, 0);
  p.comp.assign(p.n_pad, 0);
  pack_weights_vnni(w.data(), n, k, p.k_pad, p.n_pad, p.data.data(), p.comp.data(), 0, p.panels);
  return p;
}

// Raw accumulators for rows [m0, m1) and panels [p0, p1), written into acc [M, N].
struct Options {
  bool prefetch = false;
  int64_t k_block = 0;
  bool prefetch_next_block = false;
};

void gemm(const Packed& p, const std::vector<int8_t>& xq, int64_t m, int64_t n, int64_t k,
          int64_t m0, int64_t m1, int64_t p0, int64_t p1, const Options& blk, int32_t* acc) {
  const int64_t ldx = p.k_pad + 4;
  std::vector<uint8_t> xu(m * ldx, 0x80);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t i = 0; i < k; ++i) xu[r * ldx + i] = static_cast<uint8_t>(xq[r * k + i] ^ 0x80);
  }
  // The packed buffer must be 64-byte aligned; std::vector<int8_t> only promises 16.
  std::unique_ptr<uint8_t[], FreeDeleter> aligned = allocate_buffer(p.data.size());
  std::memcpy(aligned.get(), p.data.data(), p.data.size());
  VnniGemmArgs g;
  g.packed = reinterpret_cast<const int8_t*>(aligned.get());
  g.comp = p.comp.data();
  g.n = n;
  g.k_pad = p.k_pad;
  g.n_pad = p.n_pad;
  g.xu = xu.data();
  g.ldx = ldx;
  g.prefetch_bytes = blk.prefetch ? 1024 : 0;
  g.k_block = blk.k_block;
  g.prefetch_next_block = blk.prefetch_next_block;
  g.acc_out = acc;
  g.ld_acc = n;
  std::unique_ptr<uint8_t[], FreeDeleter> scratch = allocate_buffer(kVnniMaxRows * kVnniPanel * 4);
  gemm_u8s8_vnni_avx512(g, m0, m1, p0, p1, reinterpret_cast<int32_t*>(scratch.get()));
}

TEST(Avx512VnniGemm, AccumulatorsMatchReferenceOverTails) {
  QL_REQUIRE_AVX512_VNNI();
  QL_SEEDED_RNG(rng);
  for (int64_t n : {1, 15, 16, 17, 48, 64, 65, 130, 971}) {
    for (int64_t k : {1, 3, 4, 5, 17, 64, 496, 1025}) {
      // Mostly small M; sometimes enough rows for several row blocks.
      const int64_t m = rng.range(0, 3) == 0 ? rng.range(21, 230) : rng.range(1, 20);
      const std::vector<int8_t> w = random_int8(rng, n * k), xq = random_int8(rng, m * k);
      const Packed p = pack(w, n, k);
      std::vector<int32_t> want(m * n), got(m * n, 0x5a5a5a5a);
      reference::gemm_s8s8_s32(xq.data(), w.data(), m, n, k, want.data());
      // Split rows and panels at random points: every split must tile the output exactly once.
      const int64_t ms = rng.range(0, m), ps = rng.range(0, p.panels);
      Options blk;
      blk.prefetch = rng.range(0, 1) == 1;
      blk.k_block = 64 * rng.range(0, 5);  // 0: the default blocks
      blk.prefetch_next_block = rng.range(0, 1) == 1;
      gemm(p, xq, m, n, k, 0, ms, 0, ps, blk, got.data());
      gemm(p, xq, m, n, k, ms, m, 0, ps, blk, got.data());
      gemm(p, xq, m, n, k, 0, ms, ps, p.panels, blk, got.data());
      gemm(p, xq, m, n, k, ms, m, ps, p.panels, blk, got.data());
      ASSERT_EQ(testing::first_difference(got.data(), want.data(), m * n, 4), -1)
          << "M=" << m << " N=" << n << " K=" << k << " prefetch " << blk.prefetch << " k_block "
          << blk.k_block << " prefetch_next_block " << blk.prefetch_next_block;
    }
  }
}

TEST(Avx512VnniGemm, LongKIsSplitIntoBlocksOverRowBlocks) {
  QL_REQUIRE_AVX512_VNNI();
  QL_SEEDED_RNG(rng);
  // K beyond one K block (4096), with tile tails.
  for (int64_t k : {4097, 8195, 12289}) {
    for (int64_t m : {7, 97, 203}) {
      const int64_t n = rng.range(1, 80);
      const std::vector<int8_t> w = random_int8(rng, n * k), xq = random_int8(rng, m * k);
      const Packed p = pack(w, n, k);
      std::vector<int32_t> want(m * n), got(m * n, 0x5a5a5a5a);
      reference::gemm_s8s8_s32(xq.data(), w.data(), m, n, k, want.data());
      gemm(p, xq, m, n, k, 0, m, 0, p.panels, Options{}, got.data());
      ASSERT_EQ(testing::first_difference(got.data(), want.data(), m * n, 4), -1)
          << "M=" << m << " N=" << n << " K=" << k;
    }
  }
}

TEST(Avx512VnniGemm, ShallowBlocksWithTheNextBlockStreamedMatchEveryRowCount) {
  QL_REQUIRE_AVX512_VNNI();
  QL_SEEDED_RNG(rng);
  // The small-M streaming form: K in blocks of a few k-steps (the last one short), each row count
  // from one full tile and a tail to eleven tiles, so every far stream (4, 2 and 1 lines a k-step,
  // and tiles left without one) and the near stream of uncovered blocks run, over several panels
  // (the last block of one streaming the next panel's first) and a last panel of 1 to 3 vectors.
  for (int64_t m = 7; m <= 67; m += rng.range(1, 5)) {
    const int64_t k = 4 * rng.range(9, 140) + rng.range(0, 3);
    const int64_t n = 64 * rng.range(1, 3) + 16 * rng.range(0, 3) + rng.range(0, 15) + 1;
    const std::vector<int8_t> w = random_int8(rng, n * k), xq = random_int8(rng, m * k);
    const Packed p = pack(w, n, k);
    std::vector<int32_t> want(m * n), got(m * n, 0x5a5a5a5a);
    reference::gemm_s8s8_s32(xq.data(), w.data(), m, n, k, want.data());
    Options blk;
    blk.prefetch = rng.range(0, 1) == 1;
    // Now and then a k_block under 4, or not a multiple of 4: rounded down, at least one k-step.
    blk.k_block = rng.range(0, 4) == 0 ? rng.range(1, 7) : 4 * rng.range(1, 32);
    blk.prefetch_next_block = true;
    gemm(p, xq, m, n, k, 0, m, 0, p.panels, blk, got.data());
    ASSERT_EQ(testing::first_difference(got.data(), want.data(), m * n, 4), -1)
        << "M=" << m << " N=" << n << " K=" << k << " k_block " << blk.k_block << " prefetch "
        << blk.prefetch;
  }
}

TEST(Avx512VnniGemm, ExtremeSumsAreExactUpToTheLargestK) {
  QL_REQUIRE_AVX512_VNNI();
  // xq = 127 enters VPDPBUSD as 255; with W = -128 the unsigned sums reach -255 * 128 * K, beyond
  // int32 for K > 65793, and wrap; the compensation must bring back 127 * -128 * K exactly.
  // xq = -128 with W = -128 gives the largest positive sum, 2^14 * K.
  for (int64_t k : {int64_t{65793}, int64_t{65794}, kMaxK}) {
    for (int8_t xv : {int8_t{127}, int8_t{-128}}) {
      const int64_t n = 17, m = 2;
      const std::vector<int8_t> w(n * k, -128), xq(m * k, xv);
      const Packed p = pack(w, n, k);
      std::vector<int32_t> want(m * n), got(m * n);
      reference::gemm_s8s8_s32(xq.data(), w.data(), m, n, k, want.data());
      gemm(p, xq, m, n, k, 0, m, 0, p.panels, Options{}, got.data());
      ASSERT_EQ(testing::first_difference(got.data(), want.data(), m * n, 4), -1)
          << "K=" << k << " x=" << int{xv};
      EXPECT_EQ(got[0], int32_t{xv} * -128 * static_cast<int32_t>(k));
    }
  }
}

}  // namespace
}  // namespace qlinear::cpu
