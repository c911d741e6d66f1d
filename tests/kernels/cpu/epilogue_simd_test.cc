// The SIMD epilogues (epilogue_s32_avx512, epilogue_s32_avx2) against reference::epilogue_value
// and store_from_f32: every scheme, bias or not, every output dtype, with accumulators, scales and
// biases that reach int32 wrap-around, fp16 overflow, subnormal outputs, Inf and NaN. Each
// epilogue's tests skip on hosts that cannot run it.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/epilogue_avx2.h"
#include "kernels/cpu/epilogue_avx512.h"
#include "kernels/reference/reference_w8a8.h"
#include "tests/kernels/cpu/cpu_test_util.h"

namespace qlinear::cpu {
namespace {

using testing::kAllDTypes;
using testing::kAllSchemes;

// One epilogue under test.
struct Impl {
  const char* name;
  absl::Status (*supported)(const HostInfo&);
  void (*fn)(const EpilogueArgs&, const int32_t*, int64_t, int64_t, int64_t, int64_t, int64_t);
};

// The epilogues this build holds (a compiler without the ISA's flags builds none of its code).
const Impl kImpls[] = {
#if QLINEAR_HAVE_AVX512_VNNI
    {"avx512", avx512_vnni_isa_status, epilogue_s32_avx512},
#endif
#if QLINEAR_HAVE_AVX2
    {"avx2", avx2_isa_status, epilogue_s32_avx2},
#endif
};

// Test names and ctest show the quantizer's name, not its bytes.
void PrintTo(const Impl& impl, std::ostream* os) { *os << impl.name; }

class EpilogueSimd : public ::testing::TestWithParam<Impl> {
 protected:
  void SetUp() override {
    const absl::Status s = GetParam().supported(host_info());
    if (!s.ok()) GTEST_SKIP() << GetParam().name << " cannot run here: " << s.message();
  }
};

float special_float(SplitMix64& rng) {
  switch (rng.range(0, 7)) {
    case 0:
      return 0.f;
    case 1:
      return std::ldexp(rng.uniform(0.5f, 1.f), static_cast<int>(rng.range(-149, -120)));  // tiny
    case 2:
      return std::ldexp(rng.uniform(-1.f, 1.f), static_cast<int>(rng.range(100, 127)));  // huge
    case 3:
      return rng.uniform(-70000.f, 70000.f);  // fp16 overflow territory
    default:
      return rng.uniform(-2.f, 2.f) * std::ldexp(1.f, static_cast<int>(rng.range(-20, 4)));
  }
}

int32_t special_int(SplitMix64& rng) {
  switch (rng.range(0, 5)) {
    case 0:
      return INT32_MIN + static_cast<int32_t>(rng.range(0, 3));
    case 1:
      return INT32_MAX - static_cast<int32_t>(rng.range(0, 3));
    case 2:
      return static_cast<int32_t>(rng.next());
    default:
      return static_cast<int32_t>(rng.range(-5000000, 5000000));
  }
}

TEST_P(EpilogueSimd, MatchesReferenceBitForBit) {
  QL_SEEDED_RNG(rng);
  for (Scheme scheme : kAllSchemes) {
    for (bool bias : {false, true}) {
      for (DType y_dtype : kAllDTypes) {
        for (bool with_comp : {false, true}) {
          const int64_t m = rng.range(1, 9), n = rng.range(1, 70), ld = n + rng.range(0, 5);
          std::vector<int32_t> acc(m * ld), azp(m), adj(n), comp(n);
          std::vector<float> sa(m), sb(n), bias_f(n);
          for (auto& v : acc) v = special_int(rng);
          for (auto& v : azp) v = special_int(rng);
          for (auto& v : adj) v = special_int(rng);
          for (auto& v : comp) v = special_int(rng);
          for (auto& v : sa) v = std::fabs(special_float(rng));
          for (auto& v : sb) v = special_float(rng);
          for (auto& v : bias_f) v = round_to_dtype(special_float(rng), y_dtype);
          std::vector<uint8_t> y(m * n * dtype_size(y_dtype), 0xee);
          EpilogueArgs e;
          e.scheme = scheme;
          e.sb = sb.data();
          e.bias_f = bias ? bias_f.data() : nullptr;
          e.azp_adj = adj.data();
          e.comp = with_comp ? comp.data() : nullptr;
          e.sa = sa.data();
          e.azp = azp.data();
          e.y = y.data();
          e.y_dtype = y_dtype;
          e.ldy = n;
          // Two calls on column halves, as the GEMM's tiles do.
          const int64_t half = n / 2;
          GetParam().fn(e, acc.data(), ld, 0, m, 0, half);
          GetParam().fn(e, acc.data() + half, ld, 0, m, half, n - half);
          std::vector<uint8_t> want(y.size());
          for (int64_t r = 0; r < m; ++r) {
            for (int64_t c = 0; c < n; ++c) {
              const int32_t a =
                  static_cast<int32_t>(static_cast<uint32_t>(acc[r * ld + c]) +
                                       static_cast<uint32_t>(with_comp ? comp[c] : 0));
              const float v = reference::epilogue_value(scheme, a, sa[r], azp[r], sb[c], adj[c],
                                                        bias, bias_f[c]);
              store_from_f32(want.data(), y_dtype, r * n + c, v);
            }
          }
          const int64_t d =
              testing::first_difference(y.data(), want.data(), m * n, dtype_size(y_dtype));
          ASSERT_EQ(d, -1) << "scheme " << scheme_name(scheme) << " bias " << bias << " y "
                           << dtype_name(y_dtype) << " at element " << d;
        }
      }
    }
  }
}

// The output conversions on their own, over bit patterns that matter: ties, subnormals, the
// largest finite values, Inf and NaN payloads.
TEST_P(EpilogueSimd, OutputConversionsAreExact) {
  QL_SEEDED_RNG(rng);
  std::vector<uint32_t> patterns = {
      0x00000000u, 0x80000000u, 0x00000001u, 0x007fffffu, 0x00800000u, 0x33000000u, 0x33000001u,
      0x387fc000u, 0x477fe000u, 0x477fefffu, 0x477ff000u, 0x7f7fffffu, 0x7f800000u, 0xff800000u,
      0x7fc00000u, 0x7f800001u, 0xffc12345u, 0x7fbfffffu, 0x3f808000u, 0x3f818000u};
  for (int i = 0; i < 20000; ++i) patterns.push_back(static_cast<uint32_t>(rng.next()));
  for (uint32_t h = 0; h < 0x10000u; h += 7) patterns.push_back((h << 16) | 0x8000u);  // bf16 ties
  for (DType y_dtype : kAllDTypes) {
    // Each pattern is fed as sb with acc = 1 and sa = 1: y = out(1 * (sb * 1)) = out(sb), the
    // multiplications being exact (a NaN comes out quieted, the same way on both sides).
    const int64_t n = static_cast<int64_t>(patterns.size());
    std::vector<float> sb(n);
    for (int64_t i = 0; i < n; ++i) sb[i] = f32_from_bits(patterns[i]);
    std::vector<int32_t> acc(n, 1);
    float sa = 1.f;
    std::vector<uint8_t> y(n * dtype_size(y_dtype)), want(y.size());
    EpilogueArgs e;
    e.scheme = Scheme::kDynamicSymmetric;
    e.sb = sb.data();
    e.sa = &sa;
    e.y = y.data();
    e.y_dtype = y_dtype;
    e.ldy = n;
    GetParam().fn(e, acc.data(), n, 0, 1, 0, n);
    for (int64_t i = 0; i < n; ++i) {
      store_from_f32(want.data(), y_dtype, i,
                     reference::epilogue_value(e.scheme, 1, 1.f, 0, sb[i], 0, false, 0.f));
    }
    const int64_t d = testing::first_difference(y.data(), want.data(), n, dtype_size(y_dtype));
    ASSERT_EQ(d, -1) << dtype_name(y_dtype) << " pattern 0x" << std::hex
                     << (d >= 0 ? patterns[d] : 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, EpilogueSimd, ::testing::ValuesIn(kImpls),
                         [](const ::testing::TestParamInfo<Impl>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace qlinear::cpu
