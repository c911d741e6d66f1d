// cpu.onednn: the W8A8 op with oneDNN's int8 matmul (Debian libdnnl 2.6) for the GEMM and our
// own AVX-512 quantization and epilogue around it, so the result is bit-exact with cpu.reference.
//
// At load the native [N, K] weights, seen by oneDNN as a K x N matrix with strides {1, K}, are
// reordered once into the blocked layout its matmul picks (format_tag::any). Per call the
// activations are quantized to xq + 128 (uint8: oneDNN's u8 x s8 path needs no compensation pass
// and is the faster one), the matmul writes int32 [M, N], and the epilogue adds
// -128 * colsum[n] back before SPEC section 4. One matmul primitive per distinct M is created on
// first use and kept (bounded); creation takes ~0.2 ms, a cached call ~5 us.
//
// Threads: libdnnl is built on OpenMP (libgomp), so oneDNN runs on an OpenMP team of
// OMP_NUM_THREADS threads (default: one per CPU); our quantization and epilogue run on the same
// team, so no second pool competes with it for the cores during a call. Between calls the team
// spins for the next one as long as GOMP_SPINCOUNT says; the server and the CPU benchmark set it
// to about as long as our ThreadPool polls (apply_openmp_spin_default below).
//
// The unsigned operand bounds K: oneDNN accumulates sum (xq + 128) * W in int32, which stays in
// range only for K <= 65793 (255 * 128 * K < 2^31); larger K is declined (cpu.avx512_vnni takes
// it).
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "kernels/core/host_info.h"
#include "kernels/core/kernel.h"

namespace qlinear::cpu {

// Largest K whose u8 x s8 int32 accumulation cannot overflow.
inline constexpr int64_t kOneDnnMaxK = 65793;

// OK when this binary links oneDNN and the host can run its exact int8 path and our AVX-512
// quantization and epilogue (avx512f, avx512bw, avx512vl, avx512_vnni); otherwise the reason.
absl::Status onednn_supported(const HostInfo& host);

std::unique_ptr<Kernel> make_onednn_kernel();

// How long oneDNN's OpenMP threads spin for the next parallel region before they sleep, in
// libgomp's GOMP_SPINCOUNT loops (one loop is a PAUSE and a load: 30-50 ns, so about 0.3-0.5 ms,
// as long as our ThreadPool's workers poll). libgomp's own default is 300,000 loops: after each
// oneDNN call every thread of its team but the caller's spun on for about 10 ms (measured on a
// Zen 2 host: 10-11 ms of CPU per thread after a parallel region, 0.0-0.7 ms with 20,000), holding
// the cores that the thread pool's kernels, the cache-emptying pass of autotune and the server's
// own threads then needed.
inline constexpr const char* kOpenMpSpinCount = "10000";

// Call first thing in main, with main's argv. libgomp reads its settings from the environment once,
// when it loads, before main. Where this binary is built with cpu.onednn and the environment sets
// neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT, this sets GOMP_SPINCOUNT=kOpenMpSpinCount and
// re-executes the program (its own file, the same arguments and process) so that libgomp starts
// with it; not where the program was started through another (a loader, valgrind). Returns,
// without re-executing, in every other case: a line for the start-up log that says what applies
// and why (empty where cpu.onednn is not built).
std::string apply_openmp_spin_default(char** argv);

}  // namespace qlinear::cpu
