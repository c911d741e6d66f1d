// How the CPU kernels cut one call into tasks for the thread pool (generic code, no ISA flags):
// the per-row quantization, and the GEMM's grid of weight panels x row tiles. cpu.avx512_vnni and
// cpu.avx2 share them, and the load-time packing of their weight panels.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "kernels/cpu/thread_pool.h"

namespace qlinear::cpu {

// Runs quantize(r0, r1) over rows [0, m): on the calling thread alone unless `parallel` and the
// pool has more than one thread, else in up to 4 contiguous ranges per thread. quantize returns the
// first row of its range that holds a non-finite value, or -1; this returns the lowest such row of
// all, or -1.
int64_t quantize_rows_on_pool(ThreadPool& pool, int64_t m, bool parallel,
                              absl::FunctionRef<int64_t(int64_t r0, int64_t r1)> quantize);

// Runs pack(p0, p1) over weight panels [0, panels) at load, in up to 8 contiguous ranges per
// thread of `pool`: packing is a pass over the weights (a load that finds the pool busy with
// requests packs on its own thread).
void pack_panels_on_pool(ThreadPool& pool, int64_t panels,
                         absl::FunctionRef<void(int64_t p0, int64_t p1)> pack);

// The GEMM's tasks: contiguous ranges of weight panels first (each panel's weights are read once
// per call), then ranges of row tiles where there are too few panels to give every thread
// `tasks_per_thread` tasks, or where one range would hold more than `max_rows` rows (the
// kernels' accumulator scratch for long K).
//
// Splitting a panel's rows has each of its row ranges read the whole panel, on different cores
// at about the same time. Where the weights stream from DRAM (small M) that multiplies what the
// cores pull from memory and the L3; so with `whole_rows_min_panels` > 0, rows are cut only
// where a range would exceed max_rows as long as there are at least that many panels per thread.
class GemmSplit {
 public:
  // m rows in tiles of mr; max_rows a multiple of mr.
  GemmSplit(int64_t m, int64_t panels, int64_t mr, int64_t max_rows, int threads,
            int64_t tasks_per_thread, int64_t whole_rows_min_panels = 0);

  int64_t tasks() const { return panel_chunks_ * row_chunks_; }
  int64_t panel_chunks() const { return panel_chunks_; }
  int64_t row_chunks() const { return row_chunks_; }

  // Task t's panels [p0, p1) and rows [r0, r1). Together the tasks cover every (panel, row) once.
  struct Range {
    int64_t p0, p1, r0, r1;
  };
  Range task(int64_t t) const;

 private:
  int64_t m_, panels_, mr_, row_tiles_, panel_chunks_, row_chunks_;
};

// Runs gemm(task's range, acc) for every task of `split` on the pool, acc being `scratch_bytes`
// (64-byte aligned) of accumulator scratch private to the thread that runs the task and kept by it
// across calls. Returns false, with some tasks not run, when a thread cannot allocate its scratch.
bool run_gemm_tasks(ThreadPool& pool, const GemmSplit& split, size_t scratch_bytes,
                    absl::FunctionRef<void(const GemmSplit::Range& r, int32_t* acc)> gemm);

}  // namespace qlinear::cpu
