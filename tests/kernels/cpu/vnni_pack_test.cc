// The AVX-512 VNNI weight packer (kernels/cpu/vnni_pack.h) against its documented layout, byte
// for byte, on any host: N and K tails, every panel width, panel ranges packed separately (as the
// thread pool splits them) into buffers that start as garbage, and the column sums' compensation
// where it wraps int32.
#include "kernels/cpu/vnni_pack.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "tests/kernels/cpu/cpu_test_util.h"

namespace qlinear::cpu {
namespace {

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

struct Layout {
  int64_t k_pad, n_pad, panels;
  // k_to: K's padding, 4 (cpu.avx512_vnni) or 64 (cpu.amx).
  Layout(int64_t n, int64_t k, int64_t k_to = 4)
      : k_pad(round_up(k, k_to)),
        n_pad(round_up(n, 16)),
        panels((round_up(n, 16) + kVnniPanel - 1) / kVnniPanel) {}
};

// The layout as the header states it, one byte at a time: panel p at p * 64 * k_pad; in it, for
// k-step s, nv vectors of 64 bytes; vector v, lane l (column 64p + 16v + l) holds W[n, 4s .. 4s+3],
// zero past N and past K. comp = -128 * sum_k W[n, k], wrapping, 0 for padded columns.
void expected(const std::vector<int8_t>& w, int64_t n, int64_t k, const Layout& L,
              std::vector<int8_t>* packed, std::vector<int32_t>* comp) {
  packed->assign(static_cast<size_t>(L.n_pad * L.k_pad), 0);
  comp->assign(static_cast<size_t>(L.n_pad), 0);
  for (int64_t col = 0; col < L.n_pad; ++col) {
    const int64_t p = col / kVnniPanel;
    const int64_t nv = std::min<int64_t>(4, (L.n_pad - p * kVnniPanel) / 16);
    const int64_t v = (col % kVnniPanel) / 16, lane = col % 16;
    uint32_t sum = 0;
    for (int64_t s = 0; s < L.k_pad / 4; ++s) {
      for (int64_t j = 0; j < 4; ++j) {
        const int64_t i = 4 * s + j;
        const int8_t value = col < n && i < k ? w[col * k + i] : 0;
        (*packed)[p * kVnniPanel * L.k_pad + s * nv * 64 + v * 64 + lane * 4 + j] = value;
        sum += static_cast<uint32_t>(static_cast<int32_t>(value));
      }
    }
    (*comp)[col] = static_cast<int32_t>(0u - 128u * sum);
  }
}

TEST(VnniPack, MatchesTheDocumentedLayoutOverTailsAndPanelRanges) {
  QL_SEEDED_RNG(rng);
  for (int64_t n : {1, 15, 16, 17, 33, 48, 63, 64, 65, 100, 130, 192, 971}) {
    for (int64_t k : {1, 2, 3, 4, 5, 15, 16, 17, 19, 64, 67, 496, 1025}) {
      for (int64_t k_to : {4, 64}) {
        SCOPED_TRACE(::testing::Message()
                     << "N=" << n << " K=" << k << " K padded to a multiple of " << k_to);
        const Layout L(n, k, k_to);
        const std::vector<int8_t> w = random_int8(rng, n * k);
        std::vector<int8_t> want;
        std::vector<int32_t> want_comp;
        expected(w, n, k, L, &want, &want_comp);
        // Garbage first: the packer writes every byte of its panels, padding included.
        std::vector<int8_t> got(want.size(), 0x5a);
        std::vector<int32_t> got_comp(want_comp.size(), 0x5a5a5a5a);
        // Two or three ranges, as the thread pool deals them (an empty one included sometimes).
        const int64_t a = rng.range(0, L.panels), b = rng.range(a, L.panels);
        pack_weights_vnni(w.data(), n, k, L.k_pad, L.n_pad, got.data(), got_comp.data(), b,
                          L.panels);
        pack_weights_vnni(w.data(), n, k, L.k_pad, L.n_pad, got.data(), got_comp.data(), 0, a);
        pack_weights_vnni(w.data(), n, k, L.k_pad, L.n_pad, got.data(), got_comp.data(), a, b);
        ASSERT_EQ(got, want);
        ASSERT_EQ(got_comp, want_comp);
      }
    }
  }
}

TEST(VnniPack, CompensationWrapsAtTheLongestK) {
  // Columns of -128 and of 127 at the largest K: -128 * sum_k W leaves int32 and wraps.
  const int64_t n = 32, k = kMaxK;
  const Layout L(n, k);
  std::vector<int8_t> w(static_cast<size_t>(n * k));
  for (int64_t col = 0; col < n; ++col) {
    for (int64_t i = 0; i < k; ++i) w[col * k + i] = col % 2 == 0 ? -128 : 127;
  }
  std::vector<int8_t> packed(static_cast<size_t>(L.n_pad * L.k_pad));
  std::vector<int32_t> comp(static_cast<size_t>(L.n_pad));
  pack_weights_vnni(w.data(), n, k, L.k_pad, L.n_pad, packed.data(), comp.data(), 0, L.panels);
  for (int64_t col = 0; col < n; ++col) {
    const int64_t sum = (col % 2 == 0 ? -128 : 127) * k;
    const int32_t want = static_cast<int32_t>(static_cast<uint32_t>(-128 * sum));
    ASSERT_EQ(comp[col], want) << "column " << col;
  }
  // The last k-step holds K % 4 = 3 values and a zero.
  EXPECT_EQ(packed[(L.k_pad / 4 - 1) * 2 * 64 + 3], 0);
  EXPECT_EQ(packed[(L.k_pad / 4 - 1) * 2 * 64 + 2], -128);
}

}  // namespace
}  // namespace qlinear::cpu
