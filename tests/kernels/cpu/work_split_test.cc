// The work split the CPU kernels share (kernels/cpu/work_split.h): the GEMM's tasks cover every
// (panel, row) exactly once, in row ranges that start on a tile and hold at most max_rows rows;
// the quantization covers every row once and reports the lowest bad row whatever task found it.
#include "kernels/cpu/work_split.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace qlinear::cpu {
namespace {

TEST(GemmSplit, TasksCoverEveryPanelAndRowOnce) {
  for (int threads : {1, 2, 3, 8, 64}) {
    for (int64_t m : {1, 5, 6, 7, 67, 516, 517, 1031, 3000}) {
      for (int64_t panels : {1, 2, 7, 31, 32, 33, 257}) {
        for (int64_t mr : {4, 6}) {
          const int64_t max_rows = 86 * mr;
          for (int64_t whole : {0, 1, 2}) {
            const GemmSplit split(m, panels, mr, max_rows, threads, 16, whole);
            SCOPED_TRACE(::testing::Message() << "threads " << threads << " M " << m << " panels "
                                              << panels << " mr " << mr << " whole " << whole);
            ASSERT_GE(split.tasks(), 1);
            std::vector<int> seen(static_cast<size_t>(m * panels), 0);
            for (int64_t t = 0; t < split.tasks(); ++t) {
              const GemmSplit::Range r = split.task(t);
              ASSERT_LE(r.r1 - r.r0, max_rows) << "task " << t;
              ASSERT_EQ(r.r0 % mr, 0) << "task " << t << " starts inside a row tile";
              for (int64_t p = r.p0; p < r.p1; ++p) {
                for (int64_t row = r.r0; row < r.r1; ++row) ++seen[p * m + row];
              }
            }
            ASSERT_EQ(std::count(seen.begin(), seen.end(), 1), static_cast<long>(seen.size()));
            if (threads == 1 && m <= max_rows) {
              EXPECT_EQ(split.tasks(), 1);
            }
          }
        }
      }
    }
  }
}

TEST(GemmSplit, FewPanelsAreSplitByRowsToo) {
  // 2 threads x 16 tasks wanted, 4 panels: 8 row ranges per panel range.
  const GemmSplit split(/*m=*/600, /*panels=*/4, /*mr=*/6, /*max_rows=*/516, /*threads=*/2, 16);
  EXPECT_EQ(split.panel_chunks(), 4);
  EXPECT_EQ(split.row_chunks(), 8);
  // Enough panels: rows are cut only where one range would exceed max_rows.
  const GemmSplit wide(/*m=*/600, /*panels=*/256, 6, 516, 2, 16);
  EXPECT_EQ(wide.panel_chunks(), 32);
  EXPECT_EQ(wide.row_chunks(), 2);
}

TEST(GemmSplit, WholeRowsStayInOneTaskWhereThereAreEnoughPanels) {
  // 16 threads x 16 tasks wanted, 96 panels, 16 rows: split into 3 row ranges by default, one with
  // whole rows (at least 2 panels per thread).
  const GemmSplit split(/*m=*/16, /*panels=*/96, /*mr=*/6, /*max_rows=*/516, /*threads=*/16, 16);
  EXPECT_EQ(split.row_chunks(), 3);
  const GemmSplit whole(16, 96, 6, 516, 16, 16, /*whole_rows_min_panels=*/2);
  EXPECT_EQ(whole.panel_chunks(), 96);
  EXPECT_EQ(whole.row_chunks(), 1);
  for (int64_t t = 0; t < whole.tasks(); ++t) {
    EXPECT_EQ(whole.task(t).r0, 0);
    EXPECT_EQ(whole.task(t).r1, 16);
  }
  // Too few panels per thread: rows are split as before.
  const GemmSplit few(16, 31, 6, 516, 16, 16, 2);
  EXPECT_EQ(few.row_chunks(), 3);
  // max_rows still cuts.
  const GemmSplit tall(1031, 96, 6, 516, 16, 16, 2);
  EXPECT_EQ(tall.row_chunks(), 2);
  for (int64_t t = 0; t < tall.tasks(); ++t) {
    EXPECT_LE(tall.task(t).r1 - tall.task(t).r0, 516);
  }
}

TEST(QuantizeRowsOnPool, CoversEveryRowOnceAndReportsTheLowestBadRow) {
  ThreadPool pool(4);
  ThreadPool one(1);
  for (bool parallel : {false, true}) {
    for (int64_t m : {1, 3, 16, 17, 200}) {
      for (const std::set<int64_t>& bad : std::vector<std::set<int64_t>>{
               {}, {0}, {m - 1}, {m / 2, m - 1}, {m / 3, m / 2, m - 1}}) {
        std::mutex mu;
        std::vector<int> seen(static_cast<size_t>(m), 0);
        int calls = 0;
        auto quantize = [&](int64_t r0, int64_t r1) {
          int64_t found = -1;
          {
            std::lock_guard<std::mutex> lock(mu);
            ++calls;
            for (int64_t r = r0; r < r1 && found < 0; ++r) {
              ++seen[r];
              if (bad.count(r) != 0) found = r;  // a quantizer stops at its first bad row
            }
          }
          // The lower the bad row, the later its task reports it: the lowest must win anyway.
          if (found >= 0) std::this_thread::sleep_for(std::chrono::microseconds(50 * (m - found)));
          return found;
        };
        const int64_t got = quantize_rows_on_pool(pool, m, parallel, quantize);
        SCOPED_TRACE(::testing::Message() << "parallel " << parallel << " M " << m);
        EXPECT_EQ(got, bad.empty() ? -1 : *bad.begin());
        EXPECT_EQ(calls, parallel ? std::min<int64_t>(m, 16) : 1);
        // Every row up to the first bad one was quantized exactly once.
        const int64_t upto = bad.empty() ? m : *bad.begin() + 1;
        for (int64_t r = 0; r < upto; ++r) ASSERT_EQ(seen[r], 1) << "row " << r;
        // A pool of one thread quantizes on the caller, in one call, even when asked to split.
        calls = 0;
        std::fill(seen.begin(), seen.end(), 0);
        EXPECT_EQ(quantize_rows_on_pool(one, m, parallel, quantize), got);
        EXPECT_EQ(calls, 1);
      }
    }
  }
}

}  // namespace
}  // namespace qlinear::cpu
