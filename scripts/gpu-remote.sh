#!/usr/bin/env bash
# Runs on the GPU host, from the repository root, over the folder scripts/gpu-bundle.sh made:
#   0. which tensor-core instructions the kernels hold (IMMA for mma.sync, GMMA for wgmma),
#   1. the CUDA test binary (every CUDA kernel bit-exact against the reference), then the server's
#      end-to-end test, whose in-process server serves its layers with the CUDA kernels here
#      (uploads, replaces and unloads while requests run; a crash prints its stack),
#   2. qlinear-server from the bundle, with `qlinear-cli health/kernels/smoke/infer` against it
#      when the CLI is in the bundle (infer at M = 1 and 2048, with the selection explained, on
#      the demo layer and on a long-K 4096 x 14336 layer, then on a second layer of that shape,
#      which takes what the first one's load timed), then `qlinear-cli bench` at M = 1, 16
#      and 64 on one stream against the Echo RPC (load.log),
#   3. the GPU benchmark (kernel sweeps, every kernel per shape and M, the serving path),
#   4. the benchmark's --energy section (the large-M ops under a sustained load, at the GPU's
#      power cap; not with --quick, nor when QLINEAR_ENERGY=0),
#   5. with QLINEAR_CPU_SERVING=1, the host's CPU kernels served with autotune against the
#      priority order (bench/cpu_serving.sh, the CUDA kernels turned off; cpu-serving/),
#   6. with QLINEAR_CPU=1, on the host's CPU: the CPU kernel tests in the bundle (the AVX-512
#      VNNI and AMX ones skip on hosts without them) and qlinear_cpu_bench --quick (about 45 s on the H200 host,
#      plus its autotune check).
# Each step has a time limit, so that a hung kernel cannot hold the machine. Full logs go to $OUT
# (else ./gpu-logs); a short summary is printed last, and the exit status is 1 where a step
# failed.
#
# Usage: bash scripts/gpu-remote.sh [--quick]     (--quick: the benchmark's short run)
#
# Environment:
#   QLINEAR_BUNDLE_DIR   bundle directory (default: bundle-gpu)
#   QLINEAR_PORT         server port (default: 50551)
#   QLINEAR_TEST_ARGS    extra arguments for qlinear_cuda_test (e.g. --gtest_filter=...)
#   QLINEAR_TEST_TIMEOUT, QLINEAR_SERVER_TEST_TIMEOUT, QLINEAR_BENCH_TIMEOUT, QLINEAR_ENERGY_TIMEOUT,
#   QLINEAR_CPU_SERVING_TIMEOUT, QLINEAR_CPU_BENCH_TIMEOUT   each step's time limit in seconds
#                        (420, 300, 300, 240, 240, 300; the CUDA tests took 133-188 s on an H100)
#   QLINEAR_CLI_TIMEOUT  each qlinear-cli command's time limit in step 2 (300); the server is
#                        given 30 s to drain and stop after it
# Where no GPU can run them, the GPU tests skip and the benchmark stops, each exiting 0: the
# summary then says so and the exit status is 1.
#   QLINEAR_SANITIZE=1   also run a subset of the tests under compute-sanitizer memcheck
#   QLINEAR_SERVER_ARGS  extra qlinear-server arguments (e.g. --cuda-graphs=false)
#   QLINEAR_ENERGY=0     skip step 4
#   QLINEAR_CPU_SERVING=1  run step 5 (about 2 minutes)
#   QLINEAR_CPU=1        run step 6
#   QLINEAR_GPU=0        skip steps 1-4 (a call for the host's CPU alone)
#   QLINEAR_TESTS=0      skip step 1 (with QLINEAR_BENCH=0, the steps split over two calls where
#                        one call's time limit cannot hold them all; step 2 runs in both)
#   QLINEAR_BENCH=0      skip steps 3 and 4
set -uo pipefail

BUNDLE="${QLINEAR_BUNDLE_DIR:-bundle-gpu}"
PORT="${QLINEAR_PORT:-50551}"
LOG="${OUT:-$PWD/gpu-logs}"
BENCH_ARGS=()
[ "${1:-}" = "--quick" ] && BENCH_ARGS+=(--quick)
mkdir -p "$LOG"
for d in lib bin; do
  for f in "$BUNDLE/$d.tar."*; do
    if [ ! -f "$f" ] || [ -d "$BUNDLE/$d" ]; then continue; fi
    tar -C "$BUNDLE" -xf "$f" || { echo "gpu-remote: cannot unpack $f"; exit 1; }
  done
done
run() { "$BUNDLE/run" "$@"; }
have() { [ -x "$BUNDLE/bin/$1" ]; }

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  uname -r
  command -v cuobjdump >/dev/null && cuobjdump --list-elf "$BUNDLE/bin/qlinear_cuda_test"
} >"$LOG/env.txt" 2>&1
cat "$LOG/env.txt"
sass="no cuobjdump"
if command -v cuobjdump >/dev/null; then
  cuobjdump --dump-sass "$BUNDLE/bin/qlinear_cuda_test" >"$LOG/sass.txt" 2>&1
  sass=$(grep -oE '\b(IMMA|HMMA|[A-Z]?GMMA)[.A-Z0-9_]*' "$LOG/sass.txt" | sort | uniq -c |
         sort -rn | head -n 6 | awk '{printf "%s x%s; ", $2, $1}')
  gzip -f "$LOG/sass.txt"
fi

gpu_steps=1
[ "${QLINEAR_GPU:-1}" = "0" ] && gpu_steps=0
tests=1
[ "${QLINEAR_TESTS:-1}" = "0" ] && tests=0
test_rc=-
if [ "$gpu_steps" = 1 ] && [ "$tests" = 1 ]; then
  echo "=== qlinear_cuda_test"
  # shellcheck disable=SC2086
  timeout "${QLINEAR_TEST_TIMEOUT:-420}" "$BUNDLE/run" qlinear_cuda_test --gtest_color=no ${QLINEAR_TEST_ARGS:-} >"$LOG/cuda_test.log" 2>&1
  test_rc=$?
  tail -n 25 "$LOG/cuda_test.log"
fi

server_test_rc=-
if [ "$gpu_steps" = 1 ] && [ "$tests" = 1 ] && have qlinear_server_e2e_test; then
  echo "=== qlinear_server_e2e_test"
  timeout "${QLINEAR_SERVER_TEST_TIMEOUT:-300}" "$BUNDLE/run" qlinear_server_e2e_test --gtest_color=no \
    >"$LOG/server_test.log" 2>&1
  server_test_rc=$?
  grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$LOG/server_test.log"
  # A crash: the test it died in and the stack the failure signal handler printed.
  grep -A 25 -E '^\*\*\* SIG' "$LOG/server_test.log" | head -n 40
fi

sanitizer_rc=-
if [ "$gpu_steps" = 1 ] && [ "$tests" = 1 ] && [ "${QLINEAR_SANITIZE:-0}" = "1" ] && command -v compute-sanitizer >/dev/null; then
  echo "=== compute-sanitizer memcheck (subset)"
  # (Not the test that loads a layer larger than the L2: its load-time timings under memcheck
  # would take most of the time limit, and it runs no kernel the others do not. The subset took
  # 96-119 s of test time on the H200 host.)
  LD_LIBRARY_PATH="$PWD/$BUNDLE/lib:/usr/local/cuda/lib64" timeout 240 compute-sanitizer \
    --tool memcheck --error-exitcode 3 "$BUNDLE/bin/qlinear_cuda_test" --gtest_color=no \
    '--gtest_filter=*RunFills*:*Replayed*:*OutputsWritten*:*MappedCopy*:*ServingPathCopies*:*ReservedStaging*:*NonFinite*:*LongRows*:GemvS8Plans*:*EveryTile*:*QuantizingTiles*:*QuantizingWhole*:StreamS8Test.*-StreamS8Test.TimesTheTwoLaunchPrefetchOnLayersPastTheL2' >"$LOG/sanitizer.log" 2>&1
  sanitizer_rc=$?
  echo "compute-sanitizer exit $sanitizer_rc"
  grep -E "ERROR SUMMARY|PASSED|FAILED" "$LOG/sanitizer.log" | head -n 5
fi

cli_rc=-
load_rc=-
server_rc=-
if [ "$gpu_steps" = 1 ] && have qlinear-server; then
  echo "=== qlinear-server + qlinear-cli"
  # The launcher itself in the background (it execs the server), not the `run` function: a
  # backgrounded function is a subshell, and killing it would leave the server running.
  # --require-gpu: a server that found no usable GPU exits at once rather than passing every
  # check below on its CPU kernels.
  # shellcheck disable=SC2086
  "$BUNDLE/run" qlinear-server --port="$PORT" --enable-echo --require-gpu ${QLINEAR_SERVER_ARGS:-} \
    >"$LOG/server.log" 2>&1 &
  server_pid=$!
  if have qlinear-cli; then
    # Each command within QLINEAR_CLI_TIMEOUT seconds (a load or smoke upload has no deadline
    # of its own, and a kernel that hangs at load would hold the step).
    cli() {
      echo "\$ qlinear-cli $*"
      timeout "${QLINEAR_CLI_TIMEOUT:-300}" "$BUNDLE/run" qlinear-cli --server="127.0.0.1:$PORT" "$@"
    }
    {
      cli health --wait-seconds 60 &&
        cli kernels --layer demo &&
        cli infer --layer demo --m 1 --explain &&
        cli infer --layer demo --m 2048 --explain &&
        cli load --name down --n 4096 --k 14336 &&
        cli infer --layer down --m 1 --explain &&
        cli infer --layer down --m 16 &&
        cli infer --layer down --m 2048 &&
        cli load --name down2 --n 4096 --k 14336 &&
        explained=$(cli infer --layer down2 --m 1 --explain) && echo "$explained" &&
        grep -q "by an earlier layer of the same N, K, scheme and bias" <<<"$explained" &&
        cli smoke
    } >"$LOG/cli.log" 2>&1
    cli_rc=$?
    head -c 3000 "$LOG/cli.log"
    # Serving under load: one stream on the demo layer, against the Echo RPC's transport floor.
    load_rc=0
    for m in 1 16 64; do
      cli bench --layer demo --m "$m" --streams 1 --warmup 1 --duration 3 --compare-echo ||
        load_rc=$?
    done >"$LOG/load.log" 2>&1
    grep -E '^\$|^  (latency|throughput|server) |^server overhead|for reference' "$LOG/load.log" |
      head -n 30
  else
    sleep 5
    echo "no qlinear-cli in the bundle"
  fi
  # SIGTERM drains and stops the server (exit 0); one still running 30 s later is killed, and
  # either shows in the exit status.
  kill "$server_pid" 2>/dev/null
  for _ in $(seq 60); do
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.5
  done
  kill -9 "$server_pid" 2>/dev/null
  wait "$server_pid" 2>/dev/null
  server_rc=$?
  tail -n 5 "$LOG/server.log"
fi

bench_rc=-
if [ "$gpu_steps" = 0 ] || [ "${QLINEAR_BENCH:-1}" = "0" ]; then
  : >"$LOG/bench.log"
elif [ "$test_rc" = 124 ]; then
  # A test that ran into its time limit points at a hung kernel: do not spend the machine on it.
  echo "skipped: qlinear_cuda_test timed out" >"$LOG/bench.log"
  bench_rc=-
else
  echo "=== qlinear_gpu_bench ${BENCH_ARGS[*]}"
  timeout "${QLINEAR_BENCH_TIMEOUT:-300}" "$BUNDLE/run" qlinear_gpu_bench "${BENCH_ARGS[@]}" \
    >"$LOG/bench.log" 2>&1
  bench_rc=$?
fi

energy_rc=-
if [ "$gpu_steps" = 1 ] && [ "${1:-}" != "--quick" ] && [ "${QLINEAR_ENERGY:-1}" != "0" ] &&
  [ "${QLINEAR_BENCH:-1}" != "0" ] &&
  [ "$test_rc" != 124 ]; then
  echo "=== qlinear_gpu_bench --energy"
  timeout "${QLINEAR_ENERGY_TIMEOUT:-240}" "$BUNDLE/run" qlinear_gpu_bench --energy \
    >"$LOG/energy.log" 2>&1
  energy_rc=$?
fi

cpu_serving_rc=-
if [ "${QLINEAR_CPU_SERVING:-0}" = "1" ] && have qlinear-server && have qlinear-cli; then
  echo "=== bench/cpu_serving.sh (CPU kernels only)"
  OUT="$LOG/cpu-serving" QLINEAR_SERVER_CMD="$BUNDLE/run qlinear-server" \
    QLINEAR_CLI_CMD="$BUNDLE/run qlinear-cli" \
    QLINEAR_SERVER_ARGS="${QLINEAR_SERVER_ARGS:-} --disabled-kernels=cuda.cutlass_sm90,cuda.stream_s8,cuda.cublaslt" \
    timeout "${QLINEAR_CPU_SERVING_TIMEOUT:-240}" \
    bash bench/cpu_serving.sh --port "$((PORT + 1))" >"$LOG/cpu_serving.log" 2>&1
  cpu_serving_rc=$?
fi

cpu_tests=-
cpu_bench_rc=-
if [ "${QLINEAR_CPU:-0}" = "1" ]; then
  echo "=== CPU kernel tests and qlinear_cpu_bench --quick"
  cpu_tests=""
  for t in kernels_cpu_vnni_pack_test kernels_cpu_quantize_simd_test \
      kernels_cpu_avx512_vnni_gemm_test kernels_cpu_amx_gemm_test kernels_cpu_cpu_kernels_test; do
    have "$t" || continue
    timeout 120 "$BUNDLE/run" "$t" --gtest_color=no >"$LOG/$t.log" 2>&1
    rc=$?
    cpu_tests+="$t: exit $rc, $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$LOG/$t.log" | tr -s ' ' | tr '\n' ' ')
"
  done
  if have qlinear_cpu_bench; then
    timeout "${QLINEAR_CPU_BENCH_TIMEOUT:-300}" "$BUNDLE/run" qlinear_cpu_bench --quick \
      --wait-idle-s=10 >"$LOG/cpu_bench.log" 2>&1
    cpu_bench_rc=$?
  fi
fi

echo
echo "=============================== summary ==============================="
grep -E "^GPU:|no usable GPU" "$LOG/bench.log" || true
echo "sass (qlinear_cuda_test): $sass"
if [ "$test_rc" != - ]; then
  counts=$(grep -E '^\[  (PASSED  |FAILED  |SKIPPED )\] [0-9]+ tests?[,.]' "$LOG/cuda_test.log" | tr -s ' ' | tr '\n' ' ')
  echo "qlinear_cuda_test: exit $test_rc; $counts"
  grep -E '^\[  FAILED  \] [A-Za-z]' "$LOG/cuda_test.log" | head -n 10
fi
if [ "$server_test_rc" != - ]; then
  counts=$(grep -E '^\[  (PASSED  |FAILED  |SKIPPED )\] [0-9]+ tests?[,.]' "$LOG/server_test.log" | tr -s ' ' | tr '\n' ' ')
  echo "qlinear_server_e2e_test: exit $server_test_rc; $counts"
  grep -E '^\[  FAILED  \] [A-Za-z]|^\[ RUN      \]' "$LOG/server_test.log" | tail -n 1 |
    grep -q RUN && [ "$server_test_rc" != 0 ] &&
    echo "  died in: $(grep -E '^\[ RUN      \]' "$LOG/server_test.log" | tail -n 1)"
  grep -E '^\[  FAILED  \] [A-Za-z]' "$LOG/server_test.log" | head -n 10
fi
[ "$cli_rc" != - ] && echo "qlinear-cli (health, kernels, infer, smoke): exit $cli_rc; bench: exit $load_rc; qlinear-server: exit $server_rc"
if [ -f "$LOG/cli.log" ]; then
  grep -E '^(host gpu|kernel |smoke: )' "$LOG/cli.log" | cut -c 1-160
  grep -E '^[0-9]+ +cuda\.' "$LOG/cli.log" | cut -c 1-160
  grep -E '^(1|2-16|17-64|65-256|257-1024|>=1025) +[a-z]+\.[a-z0-9_]+ +[a-z]+\.' "$LOG/cli.log" | cut -c 1-100
fi
[ "$bench_rc" != - ] && echo "qlinear_gpu_bench: exit $bench_rc"
grep -E '^gemv-plan ' "$LOG/bench.log" | cut -c 10-150
sed -n '/^serving path/,$p' "$LOG/bench.log"
if [ "$cpu_serving_rc" != - ]; then
  echo "bench/cpu_serving.sh: exit $cpu_serving_rc"
  sed -n '/^=.* CPU serving/,$p' "$LOG/cpu_serving.log"
  [ "$cpu_serving_rc" = 0 ] || echo "  (what each run measured: $LOG/cpu-serving/*.tsv and *.txt)"
fi
if [ "$cpu_tests" != - ]; then
  printf "%s" "$cpu_tests"
fi
if [ "$cpu_bench_rc" != - ]; then
  echo "qlinear_cpu_bench --quick: exit $cpu_bench_rc"
  grep -E '^host:|prepare per copy|^ +[0-9]+ +[0-9]+ +(1|16|256) ' "$LOG/cpu_bench.log" | cut -c 1-170
fi
if [ "$energy_rc" != - ]; then
  echo "qlinear_gpu_bench --energy: exit $energy_rc (sustained load; op against its GEMM + quantize)"
  grep -E 'by energy' "$LOG/energy.log" | sed -E 's/ +/ /g' | cut -c 8-200
fi
# The exit status: 1 where a test, the CLI's checks or the benchmark failed (each step's own exit
# status is printed above), else 0.
failed=""
for step in "qlinear_cuda_test:$test_rc" "qlinear_server_e2e_test:$server_test_rc" \
  "compute-sanitizer:$sanitizer_rc" \
  "qlinear-cli:$cli_rc" "qlinear-cli bench:$load_rc" "qlinear-server:$server_rc" \
  "qlinear_gpu_bench:$bench_rc" "bench --energy:$energy_rc" \
  "cpu_serving.sh:$cpu_serving_rc" "qlinear_cpu_bench:$cpu_bench_rc"; do
  rc=${step##*:}
  [ "$rc" = - ] || [ "$rc" = 0 ] || failed+=" ${step%:*}"
done
case "$cpu_tests" in *"exit "[1-9]*) failed+=" CPU kernel tests" ;; esac
# The GPU tests skip, and the benchmark stops, where no GPU can run them: with an exit status of
# 0, which must not read as a pass.
if [ "$gpu_steps" = 1 ] && grep -qs "no usable GPU" "$LOG/cuda_test.log" "$LOG/bench.log"; then
  failed+=" no-usable-GPU"
fi
if [ -n "$failed" ]; then
  echo "gpu-remote: failed:$failed"
  exit 1
fi
echo "gpu-remote: every step passed"
