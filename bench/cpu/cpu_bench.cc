// qlinear_cpu_bench: the full W8A8 op (bf16 x in, per-token quantization, int8 GEMM, epilogue,
// bf16 y out) of the CPU kernels this host runs (cpu.amx, cpu.avx512_vnni, cpu.avx2, cpu.onednn,
// cpu.reference) and the kernel the registry dispatches to, side by side on the Llama-3-8B
// projection shapes (N, K) = (6144, 4096) qkv, (4096, 4096) o, (28672, 4096) gate+up,
// (4096, 14336) down, for M in {1, 4, 16, 64, 256, 1024}.
//
// Why: oneDNN is what vLLM's CPU backend runs; this says how our kernels compare with it and how
// far each is from this machine's ceilings, which the same run measures first: the DRAM read
// bandwidth of all cores (the bound for small M, where the op streams its weights) and the
// multiply rate of all cores (the bound for large M): TDPBUSD for cpu.amx (and oneDNN) on AMX
// hosts, VPDPBUSD on AVX-512 VNNI hosts, else cpu.avx2's VPMADDWD + VPADDD pair.
//
// The anchor: cpu.onednn (the whole op, exact) where it runs. On hosts without AVX-512 VNNI it
// cannot (oneDNN's int8 GEMM saturates there), and the anchor is oneDNN's int8 GEMM alone
// (bench/cpu/onednn_anchor.h), which leaves out the quantization and the epilogue our op includes.
//
// How it measures: each (shape, M) keeps enough copies of the layer (each kernel with its own
// packed weights) that the copies together exceed 8x the last-level cache, and every call uses
// the next copy, so small-M figures measure memory, not cache. Kernels are timed in interleaved
// rounds (a batch of calls per kernel per round; the fastest round's mean call time reported, as
// a neighbour's load or another guest's memory traffic only ever slows a round down), so such
// load hits every kernel alike; and each row first waits (--wait-idle-s) until no other process
// uses the CPUs, since oneDNN's OpenMP team stalls badly when one of its cores is taken.
// "dispatched" is the kernel the registry selects for the row's M bucket, with that kernel's own
// time; "disp/best" compares it with the fastest of the optimized kernels. The reference is scalar
// and only timed when M * N * K <= 2^28.
//
// Columns: rdGB/s = the read bandwidth measured in the row's own rounds (M <= 64) by a probe that
// reads the weights' byte count the way the GEMM does; ms per call; GOPS = 2 M N K / time; wGB/s =
// N K weight bytes / time; %roof = the roofline time max(weight bytes / rdGB/s (or the run's
// start figure), operations / the multiply peak of the kernel's ISA) / time; x1dnn = the anchor's
// time / this kernel's time (above 1: faster than oneDNN); d/best = the dispatched kernel's time /
// the fastest optimized kernel's time.
//
// Autotune check (--tune-check, on by default): under each row, every serving kernel timed as
// autotune times it at a layer's load (caches emptied and the kernel's weights flushed before each
// call; for cpu.onednn, whose OpenMP team is not our pool, the pool's workers asleep first), at
// the M the server measures the row's bucket at, and in three fixed forms for comparison
// ("polling": caches emptied, the weights not flushed, the pool's workers still polling;
// "asleep": then the workers asleep; "warm": no emptying), with the kernel autotune would pick
// from its times and that kernel's time in the row against the row's fastest. The targets list
// whether autotune's pick is within 5% of the fastest.
//
// Tuning variants (--vnni-variants): cpu.avx512_vnni with other VnniTuning settings, as further
// columns after its own, timed in the same rounds; they are compared with oneDNN (x1dnn) but are
// not served, so they take no part in "dispatched", d/best, the autotune check or the targets.
//
// Usage: qlinear_cpu_bench [--quick] [--shapes=N:K,N:K...] [--m=1,4,...] [--rounds=N]
//                          [--batch-ms=T] [--wait-idle-s=S] [--stat=median|min]
//                          [--copies=N] [--tune-check=false]
//                          [--vnni-variants=LABEL=KEY:VALUE/KEY:VALUE,...]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/cpu/onednn_anchor.h"
#if QLINEAR_BENCH_HAVE_AMX
#include "bench/cpu/roofline_amx.h"
#endif
#if QLINEAR_BENCH_HAVE_AVX2
#include "bench/cpu/roofline_avx2.h"
#endif
#if QLINEAR_BENCH_HAVE_AVX512
#include "bench/cpu/roofline_avx512.h"
#endif
#include "common/args.h"
#include "common/random.h"
#include "kernels/core/host_info.h"
#include "kernels/core/weights.h"
#include "kernels/cpu/amx_kernel.h"
#include "kernels/cpu/avx2_kernel.h"
#include "kernels/cpu/avx512_vnni_kernel.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_support.h"
#include "kernels/cpu/onednn_gemm.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/reference/reference_w8a8.h"
#include "kernels/registry.h"

namespace qlinear::bench {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? NAN : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int64_t llc_bytes() {
  const int64_t llc = cpu::last_level_cache_bytes();
  return llc > 0 ? llc : int64_t{32} << 20;
}

// Which ISA the ceilings are measured with: the host's best.
enum class Isa { kAmx, kAvx512Vnni, kAvx2 };

uint64_t read_stream(Isa isa, const uint8_t* data, size_t bytes) {
#if QLINEAR_BENCH_HAVE_AVX512
  if (isa == Isa::kAvx512Vnni) return read_stream_avx512(data, bytes);
#endif
#if QLINEAR_BENCH_HAVE_AVX2
  if (isa == Isa::kAvx2) return read_stream_avx2(data, bytes);
#endif
  (void)isa, (void)data, (void)bytes;
  return 0;
}

// DRAM read bandwidth of all pool threads together, in bytes/s: the best of `reps` passes over
// a buffer far larger than the LLC, read in `chunk`-byte pieces that the threads claim in address
// order. Two access patterns are tried, neighbouring chunks per thread (as the GEMM reads its
// panels) and one half of the buffer per thread, and the faster is the ceiling.
double measure_read_bandwidth(Isa isa, size_t bytes, int reps) {
  auto buf = cpu::allocate_buffer(bytes);
  cpu::ThreadPool& pool = cpu::ThreadPool::global();
  const int t = pool.threads();
  double best = 0;
  volatile uint64_t sink = 0;
  for (int r = 0; r < reps; ++r) {
    for (const size_t chunk : {size_t{256} << 10, bytes / t / 256 * 256}) {
      const int64_t chunks = static_cast<int64_t>(bytes / chunk);
      const auto t0 = Clock::now();
      pool.parallel_for(
          chunks, [&](int64_t i) { sink = sink + read_stream(isa, buf.get() + i * chunk, chunk); });
      best = std::max(best, static_cast<double>(chunk * chunks) / seconds_since(t0));
    }
  }
  return best;
}

// The multiply rate of all pool threads together, in int8 operations/s (2 per multiply-add):
// TDPBUSD (16 x 16 x 64 multiply-adds, 4 per iteration) on AMX, VPDPBUSD (64 multiply-adds, 24
// per iteration) on AVX-512 VNNI, else VPMADDWD (16 multiply-adds, 12 per iteration, each with its
// VPADDD).
double measure_peak(Isa isa) {
  cpu::ThreadPool& pool = cpu::ThreadPool::global();
  const int t = pool.threads();
  // ~20 ms at the issue rate
  const int64_t iters = isa == Isa::kAmx ? 1000000 : 2000000;
  const double ops_per_iter = isa == Isa::kAmx          ? 4.0 * 32768
                              : isa == Isa::kAvx512Vnni ? 24.0 * 128
                                                        : 12.0 * 32;
  double best = 0;
  volatile uint64_t sink = 0;
  for (int r = 0; r < 10; ++r) {
    const auto t0 = Clock::now();
    pool.parallel_for(t, [&](int64_t) {
#if QLINEAR_BENCH_HAVE_AMX
      if (isa == Isa::kAmx) sink = sink + tdpbusd_loop_amx(iters);
#endif
#if QLINEAR_BENCH_HAVE_AVX512
      if (isa == Isa::kAvx512Vnni) sink = sink + vpdpbusd_loop_avx512(iters);
#endif
#if QLINEAR_BENCH_HAVE_AVX2
      if (isa == Isa::kAvx2) sink = sink + vpmaddwd_loop_avx2(iters);
#endif
    });
    best = std::max(best, static_cast<double>(t) * iters * ops_per_iter / seconds_since(t0));
  }
  return best;
}

// Stands in for a kernel in the timing rounds but only reads as many bytes as the layer's weights
// (the next slice of a buffer as large as all the weight copies each call, in 256 KiB chunks
// claimed in address order like the GEMM's panels): the read ceiling measured next to each row,
// since this machine's memory bandwidth drifts over a run.
class ReadProbe final : public PreparedKernel {
 public:
  ReadProbe(Isa isa, const uint8_t* buf, size_t buf_bytes, size_t bytes)
      : isa_(isa), buf_(buf), buf_bytes_(buf_bytes), bytes_(bytes / 256 * 256) {}
  absl::Status run(const RunArgs&, RunTimings*) const override {
    if (offset_ + bytes_ > buf_bytes_) offset_ = 0;
    const uint8_t* base = buf_ + offset_;
    offset_ += bytes_;
    constexpr size_t kChunk = size_t{256} << 10;
    const int64_t chunks = static_cast<int64_t>((bytes_ + kChunk - 1) / kChunk);
    cpu::ThreadPool::global().parallel_for(chunks, [&](int64_t i) {
      const size_t begin = static_cast<size_t>(i) * kChunk;
      const size_t len = std::min(kChunk, bytes_ - begin);
      sink_.fetch_add(read_stream(isa_, base + begin, len), std::memory_order_relaxed);
    });
    return absl::OkStatus();
  }

 private:
  Isa isa_;
  const uint8_t* buf_;
  size_t buf_bytes_, bytes_;
  mutable size_t offset_ = 0;  // one caller at a time
  mutable std::atomic<uint64_t> sink_{0};
};

// Rows up to this M also time the read probe (where the weights' read time is the bound).
constexpr int64_t kReadProbeMaxM = 64;

struct Candidate {
  std::string name;
  std::vector<std::unique_ptr<PreparedKernel>> per_copy;  // one per layer copy
  std::vector<double> call_ms;                            // every timed call, in ms
  std::vector<double> round_ms;                           // mean ms per call of each round
  double ms = NAN;
};

// Runs calls of `c` (rotating over the copies) for about `batch_s`, appending each call's time
// to `out` when given; returns the mean ms per call.
double run_batch(Candidate& c, size_t* next_copy, const RunArgs& args, double batch_s,
                 int min_calls, std::vector<double>* out) {
  const auto t0 = Clock::now();
  int calls = 0;
  while (calls < min_calls || seconds_since(t0) < batch_s) {
    const PreparedKernel& k = *c.per_copy[*next_copy % c.per_copy.size()];
    ++*next_copy;
    const auto tc = Clock::now();
    const absl::Status s = k.run(args, nullptr);
    if (!s.ok()) {
      std::fprintf(stderr, "%s failed: %s\n", c.name.c_str(), std::string(s.message()).c_str());
      std::exit(1);
    }
    if (out != nullptr) out->push_back(1e3 * seconds_since(tc));
    ++calls;
  }
  return 1e3 * seconds_since(t0) / calls;
}

struct Row {
  int64_t n, k, m;
  double ref_ms;
  std::vector<double> opt_ms;  // per optimized kernel but the variants, in the order of the table
  double dnnl_ms;              // the anchor
  std::string dispatched;
  double disp_ms;
  double read_bw;         // bytes/s, measured in the row's rounds (or the run's start)
  std::string tuned;      // the kernel autotune's measurement ranks first (empty: not checked)
  double tuned_ms = NAN;  // its time in the row
};

// CPU time (in clock ticks) that every process but this one has used so far: all CPUs' busy
// time from /proc/stat minus this process's from /proc/self/stat.
int64_t others_busy_ticks() {
  std::ifstream stat("/proc/stat");
  std::string cpu;
  int64_t user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  stat >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
  std::ifstream self("/proc/self/stat");
  std::string line;
  std::getline(self, line);
  // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
  const size_t close = line.rfind(')');
  std::vector<std::string> f = absl::StrSplit(line.substr(close + 2), ' ');
  int64_t utime = 0, stime = 0;
  if (f.size() > 12) {
    (void)absl::SimpleAtoi(f[11], &utime);
    (void)absl::SimpleAtoi(f[12], &stime);
  }
  return user + nice + system + irq + softirq + steal - utime - stime;
}

// Waits up to `max_s` seconds for a quarter second in which other processes (and other guests,
// through steal time) used under 4% of one CPU. Returns false if the machine never got quiet.
bool wait_for_idle_machine(double max_s) {
  const auto t0 = Clock::now();
  do {
    const int64_t before = others_busy_ticks();
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    if (others_busy_ticks() - before <= 1) return true;
  } while (seconds_since(t0) < max_s);
  return false;
}

struct Options {
  bool quick = false;
  double wait_idle_s = 120;
  std::string shapes = "6144:4096,4096:4096,28672:4096,4096:14336";
  std::string ms = "1,4,16,64,256,1024";
  int64_t rounds = 5;
  double batch_ms = 40;
  std::string stat = "best-round";
  bool tune_check = true;
  int64_t copies = 0;  // weight copies per shape (0: enough to exceed 8x the LLC)
  std::string vnni_variants;
};

// --vnni-variants: "LABEL=KEY:VALUE/KEY:VALUE,..." with the keys of VnniTuning below.
struct VnniVariant {
  std::string label;
  cpu::VnniTuning tuning;
};

absl::StatusOr<std::vector<VnniVariant>> parse_vnni_variants(absl::string_view spec) {
  std::vector<VnniVariant> out;
  for (absl::string_view v : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
    const std::pair<absl::string_view, absl::string_view> lk = absl::StrSplit(v, '=');
    VnniVariant var{std::string(lk.first), {}};
    if (var.label.empty()) return absl::InvalidArgumentError(absl::StrCat("no label in '", v, "'"));
    for (absl::string_view kv : absl::StrSplit(lk.second, '/', absl::SkipEmpty())) {
      const std::pair<absl::string_view, absl::string_view> p = absl::StrSplit(kv, ':');
      int64_t value;
      if (!absl::SimpleAtoi(p.second, &value) || value < 0) {
        return absl::InvalidArgumentError(absl::StrCat("bad value in '", kv, "'"));
      }
      cpu::VnniTuning& t = var.tuning;
      if (p.first == "stream") {
        t.stream_max_m = value;
      } else if (p.first == "pf") {
        t.prefetch_bytes = value;
      } else if (p.first == "block") {
        t.block_max_m = value;
      } else if (p.first == "kblock" && value % 4 == 0) {
        t.k_block = value;
      } else if (p.first == "next") {
        t.prefetch_next_block = value != 0;
      } else if (p.first == "whole") {
        t.whole_rows_min_panels = value;
      } else if (p.first == "tasks" && value > 0) {
        t.tasks_per_thread = value;
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            "unknown or bad '", kv,
            "' (keys: stream, pf, whole, block, kblock (a multiple of 4), next, tasks (> 0))"));
      }
    }
    out.push_back(std::move(var));
  }
  return out;
}

std::string fmt_or_dash(double v, const char* f) {
  return std::isnan(v) ? std::string("-") : absl::StrFormat(f, v);
}

struct TuneCheck {
  std::string line;  // printed under the row
  std::string pick;  // the kernel autotune ranks first
  double pick_ms = NAN;
};

// Times each serving kernel of a row (first copy of the layer) the way autotune does at a layer's
// load (PreparedKernel::measure_us, at the M the server measures the row's bucket at: its top,
// at most kMeasureMaxM; in the priority order, as the server does) and in three fixed forms of
// cpu::measure_call_us: "polling" (caches emptied, the pool's workers still polling when the
// call starts), "asleep" (caches emptied, then the pool's workers asleep) and "warm" (no
// emptying: the weights where the previous call left them). Autotune's pick follows the
// server's rule: the first kernel in the priority order keeps the lead unless the fastest
// measured more than its measure_margin faster; ties keep the priority order. `best_ms` is the
// row's fastest time.
TuneCheck check_autotune(std::vector<const Candidate*> serving, const LayerConfig& config,
                         const ProblemShape& row_shape, double best_ms) {
  const MBucket& b = m_buckets()[m_bucket_index(row_shape.m)];
  ProblemShape at = row_shape;
  at.m = std::min(b.hi, cpu::kMeasureMaxM);
  const auto& order = kernel_priority_order();
  auto priority = [&](const Candidate* c) {
    return std::find(order.begin(), order.end(), c->name) - order.begin();
  };
  std::stable_sort(serving.begin(), serving.end(), [&](const Candidate* a, const Candidate* c) {
    return priority(a) < priority(c);
  });
  const cpu::MeasureOptions forms[] = {{true, false, {}}, {true, true, {}}, {false, false, {}}};
  TuneCheck tc;
  tc.line = absl::StrFormat("    autotune at M=%lld, us (as the load / polling / asleep / warm):",
                            static_cast<long long>(at.m));
  const Candidate* pick = nullptr;  // the lead, then the fastest if it beats the margin
  double lead_us = NAN, fastest_us = INFINITY;
  const Candidate* fastest = nullptr;
  for (const Candidate* c : serving) {
    const PreparedKernel& k = *c->per_copy[0];
    const absl::StatusOr<double> tuned = k.measure_us(at);
    absl::StrAppendFormat(&tc.line, "  %s %s", c->name,
                          tuned.ok() ? absl::StrFormat("%.1f", *tuned) : "failed");
    for (const cpu::MeasureOptions& f : forms) {
      const absl::StatusOr<double> us = cpu::measure_call_us(k, config, at, f);
      absl::StrAppendFormat(&tc.line, " / %s", us.ok() ? absl::StrFormat("%.1f", *us) : "-");
    }
    if (!tuned.ok()) continue;
    if (pick == nullptr) {
      pick = c;
      lead_us = *tuned;
    }
    if (*tuned < fastest_us) {
      fastest_us = *tuned;
      fastest = c;
    }
  }
  if (pick == nullptr) return tc;
  const double margin = pick->per_copy[0]->measure_margin();
  if (fastest != pick && lead_us > fastest_us * (1.0 + margin)) pick = fastest;
  tc.pick = pick->name;
  tc.pick_ms = pick->ms;
  absl::StrAppendFormat(&tc.line, "  -> %s, %.2fx the row's fastest", tc.pick,
                        tc.pick_ms / best_ms);
  return tc;
}

// A column group of the table: an optimized kernel, or the anchor.
struct Timed {
  std::string label;  // the column header's prefix
  Candidate cand;
  std::unique_ptr<Kernel> kernel;  // null for the bench-only oneDNN GEMM anchor
  double peak = NAN;               // the multiply peak its %roof is taken against, in ops/s
  bool variant = false;            // a --vnni-variants column: timed, never served
};

int run(const Options& opt) {
  const absl::StatusOr<std::vector<VnniVariant>> variants = parse_vnni_variants(opt.vnni_variants);
  if (!variants.ok()) {
    std::fprintf(stderr, "--vnni-variants: %s\n", std::string(variants.status().message()).c_str());
    return 2;
  }
  const HostInfo& host = host_info();
  std::printf("host: %s\n", host.cpu_description().c_str());
  const absl::Status vnni_status = cpu::avx512_vnni_isa_status(host);
  const absl::Status avx2_status = cpu::avx2_isa_status(host);
  const absl::Status amx_status = cpu::amx_supported(host);
  if (!vnni_status.ok() && !avx2_status.ok()) {
    std::printf("no optimized CPU kernel runs here (cpu.avx512_vnni: %s; cpu.avx2: %s)\n",
                std::string(vnni_status.message()).c_str(),
                std::string(avx2_status.message()).c_str());
    return 0;
  }
  const Isa isa = vnni_status.ok() ? Isa::kAvx512Vnni : Isa::kAvx2;
  const bool have_dnnl = cpu::onednn_supported(host).ok();
  // Without cpu.onednn, the anchor is oneDNN's int8 GEMM alone, where this binary has oneDNN.
  const bool gemm_anchor = !have_dnnl && onednn_anchor_available();
  const bool have_anchor = have_dnnl || gemm_anchor;
  const int threads = cpu::ThreadPool::global().threads();
  const int64_t llc = llc_bytes();

  if (opt.wait_idle_s > 0) (void)wait_for_idle_machine(opt.wait_idle_s);
  const size_t bw_bytes = opt.quick ? (size_t{256} << 20) : (size_t{1} << 30);
  const double bw0 = measure_read_bandwidth(isa, bw_bytes, 5);
  // The peak of each ISA a kernel here uses; the anchor's %roof uses the host's best.
  // The AVX2 pair first: on CPUs that lower their clock for 512-bit code, a 256-bit loop timed
  // right after the VPDPBUSD loop would run at the lowered clock.
  const double avx2_peak = avx2_status.ok() ? measure_peak(Isa::kAvx2) : NAN;
  const double peak = isa == Isa::kAvx2 ? avx2_peak : measure_peak(isa);
  const double amx_peak = amx_status.ok() ? measure_peak(Isa::kAmx) : NAN;
  std::printf("threads: %d   last-level cache: %lld MiB\n", threads,
              static_cast<long long>(llc >> 20));
  std::string peaks;
  if (amx_status.ok()) absl::StrAppendFormat(&peaks, "   TDPBUSD peak: %.0f GOPS", amx_peak / 1e9);
  if (isa == Isa::kAvx512Vnni)
    absl::StrAppendFormat(&peaks, "   VPDPBUSD peak: %.0f GOPS", peak / 1e9);
  if (avx2_status.ok()) {
    absl::StrAppendFormat(&peaks, "   VPMADDWD + VPADDD peak: %.0f GOPS", avx2_peak / 1e9);
  }
  std::printf("measured DRAM read bandwidth: %.1f GB/s%s\n", bw0 / 1e9, peaks.c_str());
  if (have_dnnl) {
    std::printf("anchor (dnnl): cpu.onednn, the whole op\n");
  } else if (gemm_anchor) {
    std::printf(
        "anchor (dnnl): oneDNN's int8 GEMM alone (u8 x s8 -> s32; cpu.onednn cannot run here: "
        "%s). It leaves out the quantization and epilogue that the ops include%s\n",
        std::string(cpu::onednn_supported(host).message()).c_str(),
        vnni_status.ok() ? "" : ", and without AVX-512 VNNI it saturates (not exact)");
  } else {
    std::printf("no anchor: this binary was built without oneDNN\n");
  }

  // The CPU kernels and the reference only: in a CUDA build on a GPU host the registry would
  // dispatch to a GPU kernel, which this benchmark does not time.
  Registry registry;
  absl::Status registered = register_cpu_kernels(&registry);
  if (registered.ok()) registered = registry.add(reference::make_reference_kernel());
  if (!registered.ok()) {
    std::fprintf(stderr, "qlinear_cpu_bench: %s\n", std::string(registered.message()).c_str());
    return 1;
  }
  const std::unique_ptr<Kernel> ref_kernel = reference::make_reference_kernel();

  // The optimized kernels this host runs, in priority order, and the anchor last.
  std::vector<Timed> columns;
  if (amx_status.ok()) {
    columns.push_back({"amx", {"cpu.amx", {}, {}, {}, NAN}, cpu::make_amx_kernel(), amx_peak});
  } else {
    std::printf("cpu.amx not timed: %s\n", std::string(amx_status.message()).c_str());
  }
  if (vnni_status.ok()) {
    columns.push_back(
        {"vnni", {"cpu.avx512_vnni", {}, {}, {}, NAN}, cpu::make_avx512_vnni_kernel(), peak});
    for (const VnniVariant& v : *variants) {
      columns.push_back({v.label,
                         {absl::StrCat("cpu.avx512_vnni[", v.label, "]"), {}, {}, {}, NAN},
                         cpu::make_avx512_vnni_kernel(v.tuning),
                         peak,
                         true});
    }
  } else if (!variants->empty()) {
    std::printf("--vnni-variants: not timed, cpu.avx512_vnni cannot run here\n");
  }
  if (avx2_status.ok()) {
    columns.push_back({"avx2", {"cpu.avx2", {}, {}, {}, NAN}, cpu::make_avx2_kernel(), avx2_peak});
  }
  const size_t n_opt = columns.size();
  // (oneDNN runs AMX where the host has it: its %roof is against that peak then.)
  const double best_peak = amx_status.ok() ? amx_peak : peak;
  if (have_dnnl) {
    columns.push_back(
        {"dnnl", {"cpu.onednn", {}, {}, {}, NAN}, cpu::make_onednn_kernel(), best_peak});
  } else if (gemm_anchor) {
    columns.push_back({"dnnl", {"onednn gemm", {}, {}, {}, NAN}, nullptr, best_peak});
  }

  std::vector<int64_t> ms;
  for (absl::string_view s : absl::StrSplit(opt.ms, ',', absl::SkipEmpty())) {
    int64_t v;
    if (absl::SimpleAtoi(s, &v) && v > 0) ms.push_back(v);
  }
  std::vector<std::pair<int64_t, int64_t>> shapes;
  for (absl::string_view s : absl::StrSplit(opt.shapes, ',', absl::SkipEmpty())) {
    std::vector<std::string> nk = absl::StrSplit(s, ':');
    int64_t n, k;
    if (nk.size() == 2 && absl::SimpleAtoi(nk[0], &n) && absl::SimpleAtoi(nk[1], &k)) {
      shapes.push_back({n, k});
    }
  }

  // The row-by-row read probe: a buffer over 8x the LLC.
  const size_t probe_bytes =
      std::max<size_t>(size_t{8} * llc, opt.quick ? size_t{256} << 20 : size_t{1} << 30);
  auto probe_buf = cpu::allocate_buffer(probe_bytes);

  std::string header =
      absl::StrFormat("\n%6s %6s %5s %6s | %8s %5s", "N", "K", "M", "rdGB/s", "ref ms", "x1dnn");
  for (size_t i = 0; i < columns.size(); ++i) {
    absl::StrAppendFormat(&header, " | %8s %6s %6s %5s", columns[i].label + " ms", "GOPS", "wGB/s",
                          "%roof");
    if (i < n_opt) absl::StrAppendFormat(&header, " %5s", "x1dnn");
  }
  absl::StrAppendFormat(&header, " | %-16s %6s %5s", "dispatched", "d/best", "x1dnn");
  std::printf("%s\n", header.c_str());

  std::vector<Row> rows;
  SplitMix64 rng(12345);
  for (const auto& [n, k] : shapes) {
    // Copies so that together they exceed 8x the LLC (weights are N*K bytes per copy): the L3 of
    // this CPU does not evict in strict LRU order, so a rotation only a few times its size still
    // hits in it for a good part.
    const int64_t copies =
        opt.copies > 0 ? opt.copies : std::max<int64_t>(2, (8 * llc + n * k - 1) / (n * k));
    LayerSpec spec;
    spec.n = n;
    spec.k = k;
    spec.scheme = Scheme::kDynamicSymmetric;
    spec.weight_scale = random_floats(rng, n, 1e-3f, 1e-2f);
    std::vector<std::shared_ptr<const LayerWeights>> layers;
    const std::vector<int8_t> w = random_int8(rng, static_cast<size_t>(n * k));
    for (int64_t c = 0; c < copies; ++c) {
      auto lw = build_layer_weights(spec, w);
      if (!lw.ok()) {
        std::fprintf(stderr, "%s\n", std::string(lw.status().message()).c_str());
        return 1;
      }
      layers.push_back(*lw);
    }
    Candidate ref{"cpu.reference", {}, {}, {}, NAN}, read{"read", {}, {}, {}, NAN};
    // The probe rotates over as many bytes as the weight copies do: the same chance of a cache hit.
    read.per_copy.push_back(std::make_unique<ReadProbe>(
        isa, probe_buf.get(), std::min(probe_bytes, static_cast<size_t>(copies * n * k)),
        static_cast<size_t>(n * k)));
    std::string prep_line;
    for (Timed& t : columns) {
      t.cand.per_copy.clear();
      const auto t0 = Clock::now();
      for (const auto& l : layers) {
        auto p = t.kernel != nullptr ? t.kernel->prepare(*l) : make_onednn_gemm_anchor(*l);
        if (!p.ok()) {
          std::fprintf(stderr, "%s: %s\n", t.cand.name.c_str(),
                       std::string(p.status().message()).c_str());
          return 1;
        }
        t.cand.per_copy.push_back(std::move(*p));
      }
      absl::StrAppendFormat(&prep_line, "%s %s %.0f ms", prep_line.empty() ? "" : ",", t.cand.name,
                            1e3 * seconds_since(t0) / copies);
    }
    std::printf("  (N=%lld K=%lld: %lld weight copies, %.0f MiB; prepare per copy:%s)\n",
                static_cast<long long>(n), static_cast<long long>(k),
                static_cast<long long>(copies), copies * static_cast<double>(n * k) / (1 << 20),
                prep_line.c_str());
    ref.per_copy.push_back(*ref_kernel->prepare(*layers[0]));

    for (int64_t m : ms) {
      // Each row starts on a quiet machine where possible: a neighbour's load skews a row far
      // more than it slows its kernels alike (oneDNN's OpenMP team stalls on a busy core).
      const bool quiet = opt.wait_idle_s <= 0 || wait_for_idle_machine(opt.wait_idle_s);
      std::vector<uint16_t> x(static_cast<size_t>(m * k));
      for (auto& v : x) v = f32_to_bf16(rng.uniform(-2.f, 2.f));
      std::vector<uint16_t> y(static_cast<size_t>(m * n));
      RunArgs args;
      args.x = x.data();
      args.x_dtype = DType::kBF16;
      args.m = m;
      args.y = y.data();
      args.y_dtype = DType::kBF16;

      std::vector<Candidate*> timed;
      for (Timed& t : columns) timed.push_back(&t.cand);
      if (m <= kReadProbeMaxM) timed.push_back(&read);
      read.ms = NAN;
      for (Candidate* c : timed) {
        c->call_ms.clear();
        c->round_ms.clear();
      }
      size_t next_copy = 0;
      const double batch_s = opt.batch_ms / 1e3;
      for (Candidate* c : timed)
        run_batch(*c, &next_copy, args, batch_s / 2, 2, nullptr);  // warm-up
      for (int64_t r = 0; r < opt.rounds; ++r) {
        // Alternate the order so neither kernel always follows the other.
        std::vector<Candidate*> order = timed;
        if (r % 2) std::reverse(order.begin(), order.end());
        for (Candidate* c : order) {
          c->round_ms.push_back(run_batch(*c, &next_copy, args, batch_s, 1, &c->call_ms));
          // Let spinning threads park (ours, and OpenMP's with apply_openmp_spin_default's
          // setting, spin about 0.5 ms).
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
      }
      for (Candidate* c : timed) {
        c->ms = opt.stat == "median" ? median(c->call_ms)
                : opt.stat == "min"  ? *std::min_element(c->call_ms.begin(), c->call_ms.end())
                                     : *std::min_element(c->round_ms.begin(), c->round_ms.end());
      }
      double ref_ms = NAN;
      if (m * n * k <= (int64_t{1} << 28)) ref_ms = run_batch(ref, &next_copy, args, 0, 1, nullptr);
      const double dnnl_ms = have_anchor ? columns.back().cand.ms : NAN;

      // What the registry picks for this M's bucket.
      const MBucket& b = m_buckets()[m_bucket_index(m)];
      const ProblemShape shape{m, n, k, DType::kBF16, DType::kBF16};
      auto sel = registry.select(host, layers[0]->config, shape, "", b.lo, b.hi);
      const std::string chosen = sel.ok() ? std::string(sel->kernel->name()) : "?";
      double disp_ms = chosen == ref.name ? ref_ms : NAN;
      // The fastest kernel that can serve (the GEMM-alone anchor cannot).
      double best = INFINITY;
      for (size_t i = 0; i < columns.size(); ++i) {
        if (columns[i].cand.name == chosen) disp_ms = columns[i].cand.ms;
        if (!columns[i].variant && (i < n_opt || have_dnnl)) {
          best = std::min(best, columns[i].cand.ms);
        }
      }

      const double ops = 2.0 * m * n * k, wbytes = static_cast<double>(n) * k;
      // Roofline time: the weights at the read bandwidth (of this row where measured) or the
      // operations at the multiply peak of the column's ISA.
      const double row_bw = std::isnan(read.ms) ? bw0 : wbytes / (read.ms / 1e3);
      auto gops = [&](double t) { return fmt_or_dash(ops / t / 1e6, "%.0f"); };
      auto gbs = [&](double t) { return fmt_or_dash(wbytes / t / 1e6, "%.1f"); };
      auto pct = [&](double t, double col_peak) {
        const double roof_ms = 1e3 * std::max(wbytes / row_bw, ops / col_peak);
        return fmt_or_dash(100 * roof_ms / t, "%.0f%%");
      };
      auto x1dnn = [&](double t) { return fmt_or_dash(dnnl_ms / t, "%.2f"); };
      std::string line = absl::StrFormat(
          "%6lld %6lld %5lld %6s | %8s %5s", static_cast<long long>(n), static_cast<long long>(k),
          static_cast<long long>(m), fmt_or_dash(wbytes / read.ms / 1e6, "%.1f"),
          fmt_or_dash(ref_ms, "%.2f"), x1dnn(ref_ms));
      Row row{n, k, m, ref_ms, {}, dnnl_ms, chosen, disp_ms, row_bw, {}, NAN};
      for (size_t i = 0; i < columns.size(); ++i) {
        const double t = columns[i].cand.ms;
        absl::StrAppendFormat(&line, " | %8s %6s %6s %5s", fmt_or_dash(t, "%.3f"), gops(t), gbs(t),
                              pct(t, columns[i].peak));
        if (i < n_opt) {
          absl::StrAppendFormat(&line, " %5s", x1dnn(t));
          if (!columns[i].variant) row.opt_ms.push_back(t);
        }
      }
      absl::StrAppendFormat(&line, " | %-16s %6.3f %5s%s", chosen, disp_ms / best, x1dnn(disp_ms),
                            quiet ? "" : "  (machine busy)");
      std::printf("%s\n", line.c_str());
      if (opt.tune_check) {
        std::vector<const Candidate*> serving;
        for (size_t i = 0; i < columns.size(); ++i) {
          if (!columns[i].variant && (i < n_opt || have_dnnl)) {
            serving.push_back(&columns[i].cand);
          }
        }
        const TuneCheck tc = check_autotune(serving, layers[0]->config, shape, best);
        std::printf("%s\n", tc.line.c_str());
        row.tuned = tc.pick;
        row.tuned_ms = tc.pick_ms;
      }
      std::fflush(stdout);
      rows.push_back(std::move(row));
    }
  }

  // Bandwidth again: the machine is shared, so the ceiling may have moved during the run.
  if (opt.wait_idle_s > 0) (void)wait_for_idle_machine(opt.wait_idle_s);
  const double bw1 = measure_read_bandwidth(isa, bw_bytes, 5);
  std::printf(
      "\nread bandwidth at the end: %.1f GB/s (start %.1f); %%BW targets use each row's own "
      "rdGB/s\n",
      bw1 / 1e9, bw0 / 1e9);

  // Targets of the kernel the registry dispatches to at each row's M (on an AMX host cpu.amx
  // from M = 17, cpu.avx512_vnni below) against the anchor. Against cpu.onednn (the whole op):
  // 1.3x at M = 1, 0.95x from M = 256. Against oneDNN's GEMM alone, which leaves out the
  // quantization and the epilogue: 1.0x at M = 1 and 0.95x from M = 256.
  const double m1_target = have_dnnl ? 1.3 : 1.0;
  std::printf("\ntargets (the kernel dispatched at each M, against %s):\n",
              have_dnnl     ? "cpu.onednn"
              : have_anchor ? "oneDNN's GEMM alone"
                            : "no anchor");
  for (const Row& r : rows) {
    const double own = r.disp_ms;
    if (std::isnan(own)) {  // the reference, untimed at this size
      std::printf("  N=%-6lld K=%-6lld M=%-5lld %s: not timed\n", static_cast<long long>(r.n),
                  static_cast<long long>(r.k), static_cast<long long>(r.m), r.dispatched.c_str());
      continue;
    }
    const double speedup = r.dnnl_ms / own;
    double best = *std::min_element(r.opt_ms.begin(), r.opt_ms.end());
    if (have_dnnl) best = std::min(best, r.dnnl_ms);
    const double bw_frac = static_cast<double>(r.n) * r.k / (own / 1e3) / r.read_bw;
    std::vector<std::string> parts;
    if (r.m == 1) {
      const bool b = bw_frac >= 0.8;
      std::string p;
      if (have_anchor) {
        const bool a = speedup >= m1_target;
        p = absl::StrFormat("x1dnn %.2f (>= %.2f: %s), ", speedup, m1_target, a ? "met" : "MISSED");
      }
      absl::StrAppendFormat(&p, "%.0f%% of read BW (>= 80%%: %s)", 100 * bw_frac,
                            b ? "met" : "MISSED");
      parts.push_back(p);
    } else if (r.m >= 256 && have_anchor) {
      const bool ok = speedup >= 0.95;
      parts.push_back(absl::StrFormat("x1dnn %.2f (>= 0.95: %s)", speedup, ok ? "met" : "MISSED"));
    }
    const bool d = r.disp_ms <= 1.05 * best;
    parts.push_back(absl::StrFormat("within %.1f%% of the best (<= 5%%: %s)",
                                    100 * (r.disp_ms / best - 1), d ? "met" : "MISSED"));
    if (!r.tuned.empty()) {
      const bool t = r.tuned_ms <= 1.05 * best;
      parts.push_back(absl::StrFormat("autotuned %s within %.1f%% (<= 5%%: %s)", r.tuned,
                                      100 * (r.tuned_ms / best - 1), t ? "met" : "MISSED"));
    }
    const std::string line =
        absl::StrFormat("  N=%-6lld K=%-6lld M=%-5lld %s: %s", static_cast<long long>(r.n),
                        static_cast<long long>(r.k), static_cast<long long>(r.m), r.dispatched,
                        absl::StrJoin(parts, "; "));
    std::printf("%s\n", line.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace qlinear::bench

int main(int argc, char** argv) {
  // As the server does: OpenMP's spin for cpu.onednn (may re-execute the program).
  const std::string openmp_note = qlinear::cpu::apply_openmp_spin_default(argv);
  qlinear::bench::Options opt;
  qlinear::ArgParser p("qlinear_cpu_bench [options]",
                       "Times the CPU W8A8 kernels against oneDNN and this machine's ceilings.");
  p.add("quick", &opt.quick, "M in {1, 16, 256}, 3 rounds of 25 ms batches");
  p.add("shapes", &opt.shapes, "comma-separated N:K layer shapes");
  p.add("m", &opt.ms, "comma-separated M values");
  p.add("rounds", &opt.rounds, "interleaved timing rounds per row");
  p.add("batch-ms", &opt.batch_ms, "time per kernel per round, in ms");
  p.add("wait-idle-s", &opt.wait_idle_s,
        "before each row, wait up to this long for other processes to leave the CPUs idle "
        "(0: do not wait); rows measured on a busy machine are marked");
  p.add("copies", &opt.copies,
        "weight copies per shape that the calls rotate over (0: enough to exceed 8x the "
        "last-level cache, so that small M reads the weights from memory; 1: one copy, which "
        "stays in the caches where it fits)");
  p.add("tune-check", &opt.tune_check,
        "after each row, time every kernel as autotune does at load (and in three other forms) "
        "and compare autotune's pick with the row's fastest kernel");
  p.add("vnni-variants", &opt.vnni_variants,
        "extra cpu.avx512_vnni columns with other tuning, as LABEL=KEY:VALUE/KEY:VALUE,... with "
        "keys of cpu::VnniTuning: stream (stream_max_m), pf (prefetch bytes), whole (panels "
        "per thread that keep rows whole up to stream_max_m, 0: split rows), block "
        "(block_max_m), kblock (K block up to block_max_m, 0: only past K = 4096), next "
        "(0/1: the blocks stream the next one), tasks (tasks per thread); e.g. "
        "before=stream:16/whole:0/block:16/kblock:0/next:0");
  p.add("stat", &opt.stat,
        "what a row reports per kernel: best-round (the fastest round's mean call time: a "
        "neighbour's load only ever slows a round down), median (of all calls) or min (fastest "
        "call)");
  if (const absl::Status s = p.parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "%s\n%s", std::string(s.message()).c_str(), p.help().c_str());
    return 2;
  }
  if (p.help_requested()) {
    std::printf("%s", p.help().c_str());
    return 0;
  }
  if (!openmp_note.empty()) std::printf("%s\n", openmp_note.c_str());
  if (opt.quick) {
    if (opt.ms == "1,4,16,64,256,1024") opt.ms = "1,16,256";
    opt.rounds = std::min<int64_t>(opt.rounds, 3);
    opt.batch_ms = std::min(opt.batch_ms, 25.0);
  }
  return qlinear::bench::run(opt);
}
