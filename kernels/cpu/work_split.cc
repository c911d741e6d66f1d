#include "kernels/cpu/work_split.h"

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "kernels/cpu/cpu_support.h"

namespace qlinear::cpu {

void pack_panels_on_pool(ThreadPool& pool, int64_t panels,
                         absl::FunctionRef<void(int64_t p0, int64_t p1)> pack) {
  const int64_t chunks = std::min<int64_t>(panels, 8 * pool.threads());
  pool.parallel_for(chunks,
                    [&](int64_t t) { pack(panels * t / chunks, panels * (t + 1) / chunks); });
}

int64_t quantize_rows_on_pool(ThreadPool& pool, int64_t m, bool parallel,
                              absl::FunctionRef<int64_t(int64_t, int64_t)> quantize) {
  const int threads = pool.threads();
  if (!parallel || threads == 1) return quantize(0, m);
  const int64_t tasks = std::min<int64_t>(m, 4 * threads);
  std::atomic<int64_t> first_bad{INT64_MAX};
  pool.parallel_for(tasks, [&](int64_t t) {
    const int64_t r = quantize(m * t / tasks, m * (t + 1) / tasks);
    if (r >= 0) {
      int64_t cur = first_bad.load();
      while (r < cur && !first_bad.compare_exchange_weak(cur, r)) {
      }
    }
  });
  const int64_t bad = first_bad.load();
  return bad == INT64_MAX ? -1 : bad;
}

GemmSplit::GemmSplit(int64_t m, int64_t panels, int64_t mr, int64_t max_rows, int threads,
                     int64_t tasks_per_thread, int64_t whole_rows_min_panels)
    : m_(m), panels_(panels), mr_(mr), row_tiles_((m + mr - 1) / mr) {
  const int64_t target = threads <= 1 ? 1 : threads * tasks_per_thread;
  panel_chunks_ = std::max<int64_t>(1, std::min(panels, target));
  const int64_t max_chunk_tiles = max_rows / mr;
  const int64_t for_max_rows = (row_tiles_ + max_chunk_tiles - 1) / max_chunk_tiles;
  const bool whole_rows =
      whole_rows_min_panels > 0 && panels >= whole_rows_min_panels * std::max(threads, 1);
  const int64_t for_tasks = whole_rows ? 1 : (target + panel_chunks_ - 1) / panel_chunks_;
  row_chunks_ = std::max<int64_t>(1, std::min(row_tiles_, std::max(for_tasks, for_max_rows)));
}

GemmSplit::Range GemmSplit::task(int64_t t) const {
  const int64_t pc = t / row_chunks_, rc = t % row_chunks_;
  Range r;
  r.p0 = panels_ * pc / panel_chunks_;
  r.p1 = panels_ * (pc + 1) / panel_chunks_;
  r.r0 = std::min(m_, row_tiles_ * rc / row_chunks_ * mr_);
  r.r1 = std::min(m_, row_tiles_ * (rc + 1) / row_chunks_ * mr_);
  return r;
}

bool run_gemm_tasks(ThreadPool& pool, const GemmSplit& split, size_t scratch_bytes,
                    absl::FunctionRef<void(const GemmSplit::Range&, int32_t*)> gemm) {
  std::atomic<bool> out_of_memory{false};
  pool.parallel_for(split.tasks(), [&](int64_t t) {
    thread_local ScratchBuffer acc_scratch;
    auto* acc = reinterpret_cast<int32_t*>(acc_scratch.get(scratch_bytes));
    if (acc == nullptr) {
      out_of_memory.store(true);
      return;
    }
    gemm(split.task(t), acc);
  });
  return !out_of_memory.load();
}

}  // namespace qlinear::cpu
