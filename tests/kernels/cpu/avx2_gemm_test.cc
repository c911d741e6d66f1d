// The VPMADDWD GEMM (kernels/cpu/avx2_gemm.h) on its own: packed weights and raw int32
// accumulators against reference::gemm_s8s8_s32, over M, N and K tails, any row and panel range,
// long K cut into blocks, and the extreme sums at the largest K.
#include "kernels/cpu/avx2_gemm.h"

#include <gtest/gtest.h>

#include <vector>

#include "kernels/reference/reference_w8a8.h"
#include "tests/kernels/cpu/cpu_test_util.h"

namespace qlinear::cpu {
namespace {

#define QL_REQUIRE_AVX2()                                                   \
  do {                                                                      \
    const absl::Status _s = ::qlinear::cpu::avx2_isa_status(host_info());   \
    if (!_s.ok()) GTEST_SKIP() << "cpu.avx2 unavailable: " << _s.message(); \
  } while (0)

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

struct Packed {
  int64_t k_pad, n_pad, panels;
  std::unique_ptr<uint8_t[], FreeDeleter> data;  // 64-byte aligned, 64 guard bytes past the end
};

constexpr uint8_t kGuard = 0x5a;

Packed pack(const std::vector<int8_t>& w, int64_t n, int64_t k) {
  Packed p;
  p.k_pad = round_up(k, 2);
  p.n_pad = round_up(n, 8);
  p.panels = (p.n_pad + kAvx2Panel - 1) / kAvx2Panel;
  p.data = allocate_buffer(static_cast<size_t>(p.k_pad * p.n_pad) + 64);
  // Packed in two ranges of panels, as the kernel's load splits the work; the buffer starts as
  // garbage, so the padding must be written too.
  const size_t bytes = static_cast<size_t>(p.k_pad * p.n_pad);
  std::memset(p.data.get(), kGuard, bytes + 64);
  const int64_t split = p.panels / 2;
  auto* out = reinterpret_cast<int8_t*>(p.data.get());
  pack_weights_avx2(w.data(), n, k, p.k_pad, p.n_pad, out, split, p.panels);
  pack_weights_avx2(w.data(), n, k, p.k_pad, p.n_pad, out, 0, split);
  for (size_t i = bytes; i < bytes + 64; ++i) {
    EXPECT_EQ(p.data[i], kGuard) << "the packer wrote past its buffer, at byte " << i;
  }
  return p;
}

// Raw accumulators for rows [m0, m1) and panels [p0, p1), written into acc [M, N].
void gemm(const Packed& p, const std::vector<int8_t>& xq, int64_t m, int64_t n, int64_t k,
          int64_t m0, int64_t m1, int64_t p0, int64_t p1, bool prefetch, int32_t* acc) {
  const int64_t ldx = p.k_pad + 6;  // a row stride that is no multiple of the panel's
  std::vector<int16_t> x16(m * ldx, 0);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t i = 0; i < k; ++i) x16[r * ldx + i] = xq[r * k + i];
  }
  Avx2GemmArgs g;
  g.packed = reinterpret_cast<const int8_t*>(p.data.get());
  g.n = n;
  g.k_pad = p.k_pad;
  g.n_pad = p.n_pad;
  g.x16 = x16.data();
  g.ldx = ldx;
  g.prefetch_bytes = prefetch ? 1024 : 0;
  g.acc_out = acc;
  g.ld_acc = n;
  std::unique_ptr<uint8_t[], FreeDeleter> scratch = allocate_buffer(kAvx2MaxRows * kAvx2Panel * 4);
  gemm_s16s8_avx2(g, m0, m1, p0, p1, reinterpret_cast<int32_t*>(scratch.get()));
}

TEST(Avx2Gemm, AccumulatorsMatchReferenceOverTails) {
  QL_REQUIRE_AVX2();
  QL_SEEDED_RNG(rng);
  for (int64_t n : {1, 7, 8, 9, 15, 16, 17, 24, 33, 130, 971}) {
    for (int64_t k : {1, 2, 3, 4, 5, 17, 64, 496, 1025}) {
      // Mostly small M; sometimes enough rows for several row tiles.
      const int64_t m = rng.range(0, 3) == 0 ? rng.range(21, 230) : rng.range(1, 20);
      const std::vector<int8_t> w = random_int8(rng, n * k), xq = random_int8(rng, m * k);
      const Packed p = pack(w, n, k);
      std::vector<int32_t> want(m * n), got(m * n, 0x5a5a5a5a);
      reference::gemm_s8s8_s32(xq.data(), w.data(), m, n, k, want.data());
      // Split rows and panels at random points: every split must tile the output exactly once.
      const int64_t ms = rng.range(0, m), ps = rng.range(0, p.panels);
      const bool prefetch = rng.range(0, 1) == 1;
      gemm(p, xq, m, n, k, 0, ms, 0, ps, prefetch, got.data());
      gemm(p, xq, m, n, k, ms, m, 0, ps, prefetch, got.data());
      gemm(p, xq, m, n, k, 0, ms, ps, p.panels, prefetch, got.data());
      gemm(p, xq, m, n, k, ms, m, ps, p.panels, prefetch, got.data());
      ASSERT_EQ(testing::first_difference(got.data(), want.data(), m * n, 4), -1)
          << "M=" << m << " N=" << n << " K=" << k << " prefetch " << prefetch;
    }
  }
}

TEST(Avx2Gemm, LongKIsSplitIntoBlocksOverRowBlocks) {
  QL_REQUIRE_AVX2();
  QL_SEEDED_RNG(rng);
  // K beyond one K block (4096), with tile tails; rows split at a random point, so that a row
  // range starting past row 0 parks its accumulators in the scratch too.
  for (int64_t k : {4097, 8195, 12289}) {
    for (int64_t m : {7, 97, 203}) {
      const int64_t n = rng.range(1, 40);
      const std::vector<int8_t> w = random_int8(rng, n * k), xq = random_int8(rng, m * k);
      const Packed p = pack(w, n, k);
      std::vector<int32_t> want(m * n), got(m * n, 0x5a5a5a5a);
      reference::gemm_s8s8_s32(xq.data(), w.data(), m, n, k, want.data());
      const int64_t ms = rng.range(0, m);
      gemm(p, xq, m, n, k, 0, ms, 0, p.panels, false, got.data());
      gemm(p, xq, m, n, k, ms, m, 0, p.panels, false, got.data());
      ASSERT_EQ(testing::first_difference(got.data(), want.data(), m * n, 4), -1)
          << "M=" << m << " N=" << n << " K=" << k << " rows split at " << ms;
    }
  }
}

TEST(Avx2Gemm, ExtremeSumsAreExactUpToTheLargestK) {
  QL_REQUIRE_AVX2();
  // xq = W = -128 gives every VPMADDWD pair its largest sum, 2^15, and the largest total,
  // 2^14 * K (just under 2^31 at kMaxK); xq = 127 with W = -128 the most negative.
  for (int64_t k : {int64_t{65793}, int64_t{65794}, kMaxK}) {
    for (int8_t xv : {int8_t{127}, int8_t{-128}}) {
      const int64_t n = 17, m = 7;
      const std::vector<int8_t> w(n * k, -128), xq(m * k, xv);
      const Packed p = pack(w, n, k);
      std::vector<int32_t> want(m * n), got(m * n);
      reference::gemm_s8s8_s32(xq.data(), w.data(), m, n, k, want.data());
      gemm(p, xq, m, n, k, 0, m, 0, p.panels, false, got.data());
      ASSERT_EQ(testing::first_difference(got.data(), want.data(), m * n, 4), -1)
          << "K=" << k << " x=" << int{xv};
      EXPECT_EQ(got[0], int32_t{xv} * -128 * static_cast<int32_t>(k));
    }
  }
}

}  // namespace
}  // namespace qlinear::cpu
