#include "kernels/cpu/vnni_pack.h"

#include <algorithm>
#include <cstring>

namespace qlinear::cpu {

void pack_weights_vnni(const int8_t* w, int64_t n, int64_t k, int64_t k_pad, int64_t n_pad,
                       int8_t* packed, int32_t* comp, int64_t p_begin, int64_t p_end) {
  // In the packed order, so the writes are sequential and the reads advance along the panel's
  // rows together: a dword (4 values of K) per column and k-step. (Column by column, each write
  // landing 256 bytes past the last, a 28672 x 4096 layer took several times longer.)
  const int64_t whole_steps = k / 4;  // k-steps with all four values inside K
  for (int64_t p = p_begin; p < p_end; ++p) {
    const int64_t n0 = p * kVnniPanel;
    const int64_t cols = n_pad - n0 >= kVnniPanel ? kVnniPanel : n_pad - n0;
    const int64_t real = n - n0 < cols ? n - n0 : cols;  // columns < n: the rest are padding
    uint32_t sum[kVnniPanel] = {};
    int8_t* const panel = packed + n0 * k_pad;
    const int64_t step_bytes = 4 * cols;  // one k-step of the panel
    int64_t s = 0;
    // Four k-steps at a time: 16 bytes of each row, one dword to each step.
    for (; s + 4 <= whole_steps; s += 4) {
      int8_t* out = panel + s * step_bytes;
      for (int64_t c = 0; c < real; ++c) {
        int8_t v[16];
        std::memcpy(v, w + (n0 + c) * k + 4 * s, 16);
        int32_t total = 0;
        for (int j = 0; j < 16; ++j) total += v[j];
        sum[c] += static_cast<uint32_t>(total);
        for (int q = 0; q < 4; ++q) std::memcpy(out + q * step_bytes + 4 * c, v + 4 * q, 4);
      }
      for (int q = 0; q < 4; ++q) {
        std::memset(out + q * step_bytes + 4 * real, 0, static_cast<size_t>(4 * (cols - real)));
      }
    }
    for (; s < k_pad / 4; ++s) {
      int8_t* out = panel + s * step_bytes;
      // The last step of a K that is not a multiple of 4 holds K % 4 values and zeros; steps
      // past K (a k_pad beyond round_up(K, 4)) hold zeros.
      const int64_t take = s < whole_steps ? 4 : std::max<int64_t>(0, k - 4 * s);
      for (int64_t c = 0; c < real; ++c) {
        int8_t v[4] = {0, 0, 0, 0};
        if (take > 0) std::memcpy(v, w + (n0 + c) * k + 4 * s, static_cast<size_t>(take));
        std::memcpy(out + 4 * c, v, 4);
        sum[c] += static_cast<uint32_t>(v[0] + v[1] + v[2] + v[3]);
      }
      std::memset(out + 4 * real, 0, static_cast<size_t>(4 * (cols - real)));
    }
    for (int64_t c = 0; c < cols; ++c) comp[n0 + c] = static_cast<int32_t>(0u - 128u * sum[c]);
  }
}

}  // namespace qlinear::cpu
