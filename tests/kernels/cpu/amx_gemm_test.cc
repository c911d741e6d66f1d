// The AMX tile GEMM (kernels/cpu/amx_gemm.h) on its own: packed weights (K padded to 64) and raw
// int32 accumulators against reference::gemm_s8s8_s32, over M, N and K tails, any row and panel
// range, activations whose bytes past K hold garbage, and the extremes where the unsigned-shift
// sums wrap int32 before the compensation. Skipped, with the reason, where AMX cannot run.
#include "kernels/cpu/amx_gemm.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_support.h"
#include "kernels/reference/reference_w8a8.h"
#include "tests/kernels/cpu/cpu_test_util.h"

namespace qlinear::cpu {
namespace {

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

struct Packed {
  int64_t k_pad, n_pad, panels;
  std::unique_ptr<uint8_t[], FreeDeleter> data;  // 64-byte aligned, as the kernel allocates it
  std::vector<int32_t> comp;
};

Packed pack(const std::vector<int8_t>& w, int64_t n, int64_t k) {
  Packed p;
  p.k_pad = round_up(k, kAmxKStep);
  p.n_pad = round_up(n, 16);
  p.panels = (p.n_pad + kVnniPanel - 1) / kVnniPanel;
  p.data = allocate_buffer(static_cast<size_t>(p.k_pad * p.n_pad));
  p.comp.assign(p.n_pad, 0);
  pack_weights_vnni(w.data(), n, k, p.k_pad, p.n_pad, reinterpret_cast<int8_t*>(p.data.get()),
                    p.comp.data(), 0, p.panels);
  return p;
}

// Raw accumulators for rows [m0, m1) (m0 a multiple of 16) and panels [p0, p1), written into acc
// [M, N]. The activations in A tiles (QuantizeArgs::xq_tiles), their bytes past K `garbage`.
void gemm(const Packed& p, const std::vector<int8_t>& xq, int64_t m, int64_t n, int64_t k,
          int64_t m0, int64_t m1, int64_t p0, int64_t p1, uint8_t garbage, int32_t* acc) {
  const int64_t ldx = p.k_pad;
  std::vector<uint8_t> xu((m + 15) / 16 * 16 * ldx, garbage);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t i = 0; i < k; ++i) {
      xu[r / 16 * 16 * ldx + i / 64 * 1024 + r % 16 * 64 + i % 64] =
          static_cast<uint8_t>(xq[r * k + i] ^ 0x80);
    }
  }
  VnniGemmArgs g;
  g.packed = reinterpret_cast<const int8_t*>(p.data.get());
  g.comp = p.comp.data();
  g.n = n;
  g.k_pad = p.k_pad;
  g.n_pad = p.n_pad;
  g.xu = xu.data();
  g.ldx = ldx;
  g.acc_out = acc;
  g.ld_acc = n;
  std::unique_ptr<uint8_t[], FreeDeleter> scratch = allocate_buffer(kAmxScratchBytes);
  for (int64_t r = m0; r < m1; r += kAmxMaxRows) {
    gemm_u8s8_amx(g, r, std::min(m1, r + kAmxMaxRows), p0, p1,
                  reinterpret_cast<int32_t*>(scratch.get()));
  }
}

TEST(AmxGemm, AccumulatorsMatchReferenceOverTails) {
  QL_REQUIRE_AMX();
  QL_SEEDED_RNG(rng);
  for (int64_t n : {1, 15, 16, 17, 48, 64, 65, 130, 971}) {
    for (int64_t k : {1, 3, 4, 5, 17, 63, 64, 65, 496, 1025}) {
      // Mostly small M; sometimes enough rows for many row tiles (and more than one call).
      const int64_t m = rng.range(0, 3) == 0 ? rng.range(17, 600) : rng.range(1, 16);
      const std::vector<int8_t> w = random_int8(rng, n * k), xq = random_int8(rng, m * k);
      const Packed p = pack(w, n, k);
      std::vector<int32_t> want(m * n), got(m * n, 0x5a5a5a5a);
      reference::gemm_s8s8_s32(xq.data(), w.data(), m, n, k, want.data());
      // Split rows (at a tile) and panels at random points: every split must tile the output
      // exactly once.
      const int64_t ms = std::min(m, rng.range(0, m) / kAmxRows * kAmxRows),
                    ps = rng.range(0, p.panels);
      const uint8_t garbage = static_cast<uint8_t>(rng.range(0, 255));
      gemm(p, xq, m, n, k, 0, ms, 0, ps, garbage, got.data());
      gemm(p, xq, m, n, k, ms, m, 0, ps, garbage, got.data());
      gemm(p, xq, m, n, k, 0, ms, ps, p.panels, garbage, got.data());
      gemm(p, xq, m, n, k, ms, m, ps, p.panels, garbage, got.data());
      ASSERT_EQ(testing::first_difference(got.data(), want.data(), m * n, 4), -1)
          << "M=" << m << " N=" << n << " K=" << k << " rows split at " << ms << ", panels at "
          << ps;
    }
  }
}

// K past one block (kAmxKBlock): the C tiles go to the scratch and back between blocks, in both
// tile layouts (row pairs, and a lone last row tile), over several row blocks (kAmxRowBlock).
TEST(AmxGemm, KBlocksAndRowBlocksMatchTheReference) {
  QL_REQUIRE_AMX();
  QL_SEEDED_RNG(rng);
  for (int64_t k : {kAmxKBlock + 1, 2 * kAmxKBlock + 64 + rng.range(1, 63)}) {
    const int64_t n = 64 + 16 * rng.range(1, 3) + rng.range(0, 15);  // a panel and a short one
    const int64_t m = rng.range(0, 1) ? kAmxRowBlock + rng.range(17, 40) : rng.range(33, 48);
    const std::vector<int8_t> w = random_int8(rng, n * k), xq = random_int8(rng, m * k);
    const Packed p = pack(w, n, k);
    std::vector<int32_t> want(m * n), got(m * n, 0x5a5a5a5a);
    reference::gemm_s8s8_s32(xq.data(), w.data(), m, n, k, want.data());
    gemm(p, xq, m, n, k, 0, m, 0, p.panels, static_cast<uint8_t>(rng.range(0, 255)), got.data());
    ASSERT_EQ(testing::first_difference(got.data(), want.data(), m * n, 4), -1)
        << "M=" << m << " N=" << n << " K=" << k;
  }
}

TEST(AmxGemm, ExtremeSumsAreExactUpToTheLargestK) {
  QL_REQUIRE_AMX();
  // xq = 127 enters TDPBUSD as 255; with W = -128 the unsigned sums reach -255 * 128 * K, beyond
  // int32 for K > 65793, and wrap; the compensation must bring back 127 * -128 * K exactly.
  // xq = -128 with W = -128 gives the largest positive sum, 2^14 * K.
  for (int64_t k : {int64_t{65793}, int64_t{65794}, kMaxK}) {
    for (int8_t xv : {int8_t{127}, int8_t{-128}}) {
      const int64_t n = 17, m = 18;  // a row pair (16 + 2 rows)
      const std::vector<int8_t> w(n * k, -128), xq(m * k, xv);
      const Packed p = pack(w, n, k);
      std::vector<int32_t> want(m * n), got(m * n);
      reference::gemm_s8s8_s32(xq.data(), w.data(), m, n, k, want.data());
      gemm(p, xq, m, n, k, 0, m, 0, p.panels, 0xff, got.data());
      ASSERT_EQ(testing::first_difference(got.data(), want.data(), m * n, 4), -1)
          << "K=" << k << " x=" << int{xv};
      EXPECT_EQ(got[0], int32_t{xv} * -128 * static_cast<int32_t>(k));
    }
  }
}

}  // namespace
}  // namespace qlinear::cpu
