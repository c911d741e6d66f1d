#!/usr/bin/env bash
# End-to-end test of qlinear-cli against a real qlinear-server on a free local port: health,
# smoke (every scheme, bit-exact against the client-side reference), kernels, layers, load
# (random, from .npy files, and a layer manifest, also loaded by a second server at start-up), infer (unary and streamed, .npy in and out), short load
# benchmarks (streams, unary, echo), unload, error exit codes (messages over the size limit,
# sizes that overflow, bad options), --help of every command, health through a slow link, a server
# with mutual TLS (certificates made with openssl, then rotated while it serves), deadlines
# against a mute server and a stopped one (SIGSTOP), and a graceful SIGTERM stop of the server
# (exit 0).
#
# Usage: cli_smoke_test.sh QLINEAR_SERVER_BINARY QLINEAR_CLI_BINARY
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 QLINEAR_SERVER_BINARY QLINEAR_CLI_BINARY" >&2
  exit 2
fi
server_bin=$1
cli_bin=$2
work=$(mktemp -d)
server_pid=""

cleanup() {
  for pid in "$server_pid" "${server2_pid:-}" "${mute_pid:-}" "${proxy_pid:-}" "${cli_pid:-}"; do
    [[ -n $pid ]] && { kill -CONT "$pid" 2>/dev/null || true; }
    if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  rm -rf "$work"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  echo "--- last qlinear-cli stdout ---" >&2
  cat "$work/out" >&2 2>/dev/null || true
  echo "--- last qlinear-cli stderr ---" >&2
  cat "$work/err" >&2 2>/dev/null || true
  echo "--- server log ---" >&2
  cat "$work/server.log" >&2 2>/dev/null || true
  exit 1
}

# expect RC ARGS...: runs qlinear-cli ARGS, keeps its output in $work/out and $work/err, and
# checks the exit code.
expect() {
  local want=$1
  shift
  local rc=0
  "$cli_bin" "$@" >"$work/out" 2>"$work/err" || rc=$?
  [[ $rc -eq $want ]] || fail "qlinear-cli $* exited $rc, expected $want"
}
# grep_out PATTERN / grep_err PATTERN: the last command's stdout / stderr contains PATTERN.
grep_out() { grep -q -- "$1" "$work/out" || fail "stdout lacks '$1'"; }
grep_err() { grep -q -- "$1" "$work/err" || fail "stderr lacks '$1'"; }

# reap VAR: waits for the background job whose pid the variable VAR holds, clears VAR (so that
# cleanup leaves it alone) and leaves the job's exit status in rc.
reap() {
  rc=0
  wait "${!1}" || rc=$?
  printf -v "$1" '%s' ""
}

# stop_server2 WHAT: SIGTERM to the extra server $server2_pid, which must exit 0.
stop_server2() {
  kill -TERM "$server2_pid"
  local rc
  reap server2_pid
  [[ $rc -eq 0 ]] || fail "$1 exited $rc on SIGTERM, expected 0"
}

# listening_port LOG: the port a server started with --port 0 logs once it listens (up to 20 s).
listening_port() {
  local p=""
  for _ in $(seq 200); do
    p=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$1")
    [[ -n $p ]] && break
    sleep 0.1
  done
  [[ -n $p ]] && echo "$p"
}

# on_terminal [--interrupt-on TEXT] ARGS...: runs qlinear-cli ARGS with stdin, stdout and stderr on
# a terminal (a pseudo-terminal), SIGINT (Ctrl-C) sent to it once its output shows TEXT; what it
# wrote goes to $work/out (carriage returns made newlines), its exit status to rc.
on_terminal() {
  local interrupt=()
  if [[ $1 == --interrupt-on ]]; then
    interrupt=("$1" "$2")
    shift 2
  fi
  rc=0
  # With --interrupt-on TEXT, the command gets SIGINT once it has printed TEXT, with the server
  # held stopped (SIGSTOP) meanwhile: an upload it interrupts cannot finish first.
  QLINEAR_TEST_SERVER_PID="$server_pid" python3 -c 'import os, pty, signal, sys, time
args, text = sys.argv[1:], None
if args[0] == "--interrupt-on":
    text, args = args[1].encode(), args[2:]
server = int(os.environ["QLINEAR_TEST_SERVER_PID"]) if text is not None else 0
pid, fd = pty.fork()
if pid == 0:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.execv(args[0], args)
out, sent = b"", False
while True:
    try:
        data = os.read(fd, 65536)
    except OSError:
        break
    if not data:
        break
    out += data
    if text is not None and not sent and text in out:
        os.kill(server, signal.SIGSTOP)
        os.kill(pid, signal.SIGINT)
        time.sleep(0.5)
        os.kill(server, signal.SIGCONT)
        sent = True
_, status = os.waitpid(pid, 0)
sys.stdout.buffer.write(out.replace(b"\r", b"\n"))
sys.exit(os.waitstatus_to_exitcode(status))' "${interrupt[@]}" "$cli_bin" "$@" >"$work/out" 2>&1 ||
    rc=$?
  kill -CONT "$server_pid" 2>/dev/null || true
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# --- start the server -------------------------------------------------------------------------
port=$(free_port)
"$server_bin" --address 127.0.0.1 --port "$port" --no-demo-layer --enable-echo \
  2>"$work/server.log" &
server_pid=$!
export QLINEAR_SERVER=127.0.0.1:$port

expect 0 health --wait-seconds 20
grep_out '^SERVING$'
grep -q "listening on 127.0.0.1:$port" "$work/server.log" || fail "no 'listening on' log line"
await_log() {  # up to 10 s for the log $1 to hold $2
  for _ in $(seq 100); do grep -qF -- "$2" "$1" && return 0; sleep 0.1; done
  fail "$1 lacks '$2'"
}
await_log_re() {  # the same for a line matching the regular expression $2
  for _ in $(seq 100); do grep -q -- "$2" "$1" && return 0; sleep 0.1; done
  fail "$1 has no line matching '$2'"
}
# The log line of an upload cancelled by its client: with its name and bytes, or, where the server
# had not read its header yet (held stopped when Ctrl-C landed), without.
cancelled_upload_re() {
  echo "upload of layer '$1[0-9a-f-]*' cancelled after [0-9]* of $2 bytes; nothing kept\|upload cancelled before its header arrived; nothing kept"
}
await_one_more() {  # up to 10 s for the log $1 to hold more than $3 lines matching $2
  for _ in $(seq 100); do (($(grep -c -- "$2" "$1") > $3)) && return 0; sleep 0.1; done
  fail "$1 has no new line matching '$2'"
}
# SIGHUP reads the TLS files again; without TLS it says so and the server goes on.
kill -HUP "$server_pid"
await_log "$work/server.log" "received SIGHUP: no TLS files to read (plaintext)"
expect 0 health
grep_out '^SERVING$'

# --- smoke: every scheme, streamed, bit-exact ---------------------------------------------------
expect 0 smoke --n 256 --k 320 --batches 4
cat "$work/out"
grep_out '^smoke: PASS'
for scheme in dynamic_symmetric static_symmetric dynamic_asymmetric static_asymmetric; do
  grep_out "^$scheme  *256x320 .* INVALID_ARGUMENT  *cpu\."
done
expect 0 layers
grep_out 'no layers loaded'  # smoke unloads its layers
# Named with the pid and a random part (CLIs in containers are often all pid 1).
grep -q "loaded layer 'smoke-static_asymmetric-[0-9]*-[0-9a-f]\{8\}'" "$work/server.log" ||
  fail "smoke's layers are not named smoke-<scheme>-<pid>-<8 hex digits>"
expect 2 smoke --schemes dynamic_symmetric,static_symmetric,dynamic_symmetric
grep_err '^qlinear-cli: INVALID_ARGUMENT: --schemes lists dynamic_symmetric twice$'
# Inputs too large for the memory it may take: smoke fails before it uploads anything.
rc=0
(ulimit -v 3000000 && exec "$cli_bin" smoke --n 64 --k 1024 --max-m 4000000 --batches 2 --seed 1 \
  --schemes dynamic_symmetric) >"$work/out" 2>"$work/err" || rc=$?
[[ $rc -eq 1 ]] || fail "smoke out of memory exited $rc, expected 1"
grep_err '^qlinear-cli: out of memory'
expect 0 layers
grep_out 'no layers loaded'
# Ctrl-C once its first layer is loaded: smoke stops, unloads what it loaded and exits 1. (A job
# started with & ignores SIGINT; python gives it back the default action, as a terminal's has.)
python3 -c 'import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
os.execv(sys.argv[1], sys.argv[1:])' "$cli_bin" smoke --n 512 --k 2048 --batches 40 --max-m 64 >"$work/out" 2>"$work/err" &
cli_pid=$!
await_log "$work/server.log" "loaded layer 'smoke-dynamic_symmetric-$cli_pid-"
kill -INT "$cli_pid"
reap cli_pid
[[ $rc -eq 1 ]] || fail "smoke after Ctrl-C exited $rc, expected 1"
grep_out 'interrupted (Ctrl-C)'
expect 0 layers
grep_out 'no layers loaded'
# An upload over 4 MiB shows its progress on a terminal, and Ctrl-C stops it there: the call is
# cancelled, the server keeps nothing of it, and the schemes after it do not run.
re=$(cancelled_upload_re smoke-dynamic_symmetric- 67108864)
before=$(grep -c -- "$re" "$work/server.log" || true)
on_terminal --interrupt-on "upload smoke-dynamic_symmetric-" smoke --n 8192 --k 8192 \
  --batches 1 --max-m 1 --schemes dynamic_symmetric,static_symmetric
[[ $rc -eq 1 ]] || fail "smoke interrupted during its upload exited $rc, expected 1"
grep_out '^upload smoke-dynamic_symmetric-[0-9a-f-]*: [0-9.]* [KM]iB / 64.0 MiB ([0-9]*%)'
grep_out '  dynamic_symmetric: interrupted (Ctrl-C) while uploading smoke-dynamic_symmetric-[0-9a-f-]*; nothing was loaded$'
grep_out '  static_symmetric: not run: interrupted (Ctrl-C)$'
await_one_more "$work/server.log" "$re" "$before"
expect 0 layers
grep_out 'no layers loaded'

# load: the same on a terminal, and the layer it would have replaced stays served.
expect 0 load --name cli-test/interrupted --n 64 --k 64
re=$(cancelled_upload_re cli-test/interrupted 67108864)
before=$(grep -c -- "$re" "$work/server.log" || true)
on_terminal --interrupt-on "upload cli-test/interrupted" load --name cli-test/interrupted \
  --n 8192 --k 8192 --replace
[[ $rc -eq 1 ]] || fail "load interrupted during its upload exited $rc, expected 1"
grep_out '^upload cli-test/interrupted: [0-9.]* [KM]iB / 64.0 MiB ([0-9]*%)'
grep_out "^qlinear-cli: CANCELLED: interrupted (Ctrl-C) while uploading layer 'cli-test/interrupted'; nothing was loaded or replaced$"
await_one_more "$work/server.log" "$re" "$before"
expect 0 describe cli-test/interrupted
grep_out 'N=64 K=64'
expect 0 unload cli-test/interrupted
# Ctrl-C once every byte is sent, while the server builds the layer: the CLI ends (by the signal,
# or, where it landed before the last chunk's callback returned, CANCELLED), and the server, its
# call cancelled, keeps nothing.
on_terminal --interrupt-on "upload cli-test/built: 64.0 MiB / 64.0 MiB (100%)" load \
  --name cli-test/built --n 8192 --k 8192
[[ $rc -ne 0 ]] || fail "load interrupted while its layer was built exited 0"
await_log_re "$work/server.log" "layer 'cli-test/built'.*\(nothing kept\|CANCELLED\)"
expect 0 layers
grep -q '^cli-test/built' "$work/out" && fail "a load interrupted while its layer was built left it loaded"
# Elsewhere (stderr a file) an upload's progress comes as whole lines, one every
# $QLINEAR_PROGRESS_S seconds and the last once every byte is sent; none with 0; a bad value is
# named and the default kept.
QLINEAR_PROGRESS_S=0.001 expect 0 load --name cli-test/logged --n 8192 --k 8192
grep_err '^upload cli-test/logged: 64.0 MiB / 64.0 MiB (100%), .*/s$'
grep -q $'\r' "$work/err" && fail "an upload's progress line for a log holds a carriage return"
QLINEAR_PROGRESS_S=0 expect 0 load --name cli-test/logged --n 8192 --k 8192 --replace
grep -q '^upload ' "$work/err" && fail "QLINEAR_PROGRESS_S=0 printed an upload progress line"
QLINEAR_PROGRESS_S=soon expect 0 load --name cli-test/logged --n 8192 --k 8192 --replace
grep_err "^qlinear-cli: ignoring QLINEAR_PROGRESS_S='soon' (seconds, 0-86400); upload progress lines every 10 s$"
expect 0 unload cli-test/logged

# --- versions, kernels, load, layers, describe --------------------------------------------------
server_version=$("$server_bin" --version) || fail "qlinear-server --version exited $?"
[[ $server_version =~ ^qlinear-server\ [0-9]+\.[0-9]+\.[0-9]+\ \(commit\ [A-Za-z0-9._+-]+\)$ ]] ||
  fail "qlinear-server --version printed '$server_version'"
expect 0 --version
grep_out "^qlinear-cli ${server_version#qlinear-server }\$"  # the same build
grep -qF "version ${server_version#qlinear-server }; host: " "$work/server.log" ||
  fail "the server's log does not give its version"
expect 0 kernels
grep -qxF "server: $server_version" "$work/out" || fail "kernels does not name the server's build"
grep_out '^host cpu: '
grep_out 'cpu.reference'
expect 0 load --name cli-test/random --n 96 --k 136 --scheme dynamic_asymmetric --seed 5
grep_out "loaded layer 'cli-test/random'"
grep_out 'N=96 K=136'
grep_out 'M >=1025'
expect 1 load --name cli-test/random --n 96 --k 136
grep_err '^qlinear-cli: ALREADY_EXISTS: '
expect 0 load --name cli-test/random --n 96 --k 136 --scheme static_asymmetric \
  --input-scale 0.03 --input-zero-point -4 --logical-widths 32,32,32 --replace \
  --max-batch-rows 1 --max-queue-delay-us 250
grep_out "replaced layer 'cli-test/random'"
grep_out 'up to 1 rows per GEMM (off), up to 250 us'
expect 0 layers
grep_out '^cli-test/random  *96  *136  *static_asymmetric  *yes '
expect 0 kernels --layer cli-test/random
grep_out '^>=1025 '
expect 0 describe cli-test/random
grep_out '^input zero point -4'
grep_out '^logical widths   \[32, 32, 32\]'

# --- infer: random input, unary and streamed, .npy output ---------------------------------------
expect 0 infer --layer cli-test/random --m 3 --explain --scales --output "$work/y1.npy"
grep_out '^y  *\[3, 96\] bf16'
grep_out '^kernel '
grep_out '^sa '
expect 0 infer --layer cli-test/random --m 3 --stream --output "$work/y2.npy"
cmp -s "$work/y1.npy" "$work/y2.npy" || fail "unary and streamed results differ"
expect 2 infer --layer cli-test/random --m 3 --output "$work"
grep_err "^qlinear-cli: INVALID_ARGUMENT: --output $work is a folder$"
expect 1 infer --layer cli-test/random --m 4611686018427387904
grep_err '^qlinear-cli: INVALID_ARGUMENT: --m 4611686018427387904 rows of K=136 values are too many for one request$'
# A request over the client's message limit is refused before it is sent, with what to do.
for how in "" --stream; do
  # shellcheck disable=SC2086  # no word, or one
  expect 1 --max-message-mb 1 infer --layer cli-test/random --m 4000 $how
  grep_err '^qlinear-cli: RESOURCE_EXHAUSTED: .*(M=4000) is 1088[0-9]* bytes, over the 1048576 bytes a message may have; send fewer rows per request, or raise --max-message-mb'
done
expect 0 infer --layer cli-test/random --m 2 --dtype fp32 --output-dtype fp16 \
  --output "$work/y3.npy"
grep_out '^y  *\[2, 96\] fp16'
python3 - "$work" <<'EOF' || fail "bad .npy output"
import sys
work = sys.argv[1]
for name, descr, shape in (("y1.npy", "<f4", "(3, 96)"), ("y3.npy", "<f2", "(2, 96)")):
    data = open(f"{work}/{name}", "rb").read()
    assert data[:8] == b"\x93NUMPY\x01\x00", name
    hlen = data[8] | data[9] << 8
    header = data[10:10 + hlen].decode()
    assert f"'descr': '{descr}'" in header and f"'shape': {shape}" in header, header
    assert (10 + hlen) % 64 == 0, name
    size = 4 if descr == "<f4" else 2
    assert len(data) == 10 + hlen + eval(shape)[0] * 96 * size, name
EOF

# --- load and infer from .npy files -------------------------------------------------------------
python3 - "$work" <<'EOF'
import random, struct, sys
work = sys.argv[1]
def save(name, descr, shape, data):
    dims = "".join(f"{d}," for d in shape) if len(shape) == 1 else ", ".join(map(str, shape))
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (descr, dims)
    header = header.ljust((10 + len(header) + 1 + 63) // 64 * 64 - 10 - 1) + "\n"
    with open(f"{work}/{name}", "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data)
rng = random.Random(1)
n, k, m = 40, 72, 5
save("w.npy", "|i1", (n, k), bytes(rng.randrange(256) for _ in range(n * k)))
save("s.npy", "<f4", (n, 1), struct.pack(f"<{n}f", *(rng.uniform(5e-4, 2e-3) for _ in range(n))))
save("b.npy", "<f2", (n,), struct.pack(f"<{n}e", *(rng.uniform(-1, 1) for _ in range(n))))
save("x.npy", "<f4", (m, k), struct.pack(f"<{m * k}f", *(rng.uniform(-1, 1) for _ in range(m * k))))
save("x8.npy", "|i1", (m, k), bytes(m * k))
x = open(f"{work}/x.npy", "rb").read()[-4 * m * k:]
open(f"{work}/x16.raw", "wb").write(struct.pack(f"<{m * k}e", *struct.unpack(f"<{m * k}f", x)))
save("b0.npy", "<f4", (0,), b"")
open(f"{work}/w.raw", "wb").write(bytes(rng.randrange(256) for _ in range(n * k)))
EOF
expect 0 load --name cli-test/files --weights "$work/w.npy" --weight-scale "$work/s.npy" \
  --bias "$work/b.npy"
grep_out 'N=40 K=72'
grep_out 'with bias'
# .npy weights are read once and copied once: 256 MiB of them (a sparse file) fit in 720 MB of
# address space, where a third copy would not. (A refused port: only the reading matters here.)
python3 - "$work" <<'EOF'
import struct, sys
work = sys.argv[1]
def save(name, descr, shape, nbytes, data=b""):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    header = header.ljust((10 + len(header) + 1 + 63) // 64 * 64 - 10 - 1) + "\n"
    with open(f"{work}/{name}", "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data)
        f.truncate(f.tell() + nbytes - len(data))
save("w256m.npy", "|i1", "(16384, 16384)", 1 << 28)
save("scale1.npy", "<f4", "(1,)", 4, struct.pack("<f", 1e-3))
EOF
rc=0
(ulimit -v 720000 && exec "$cli_bin" --server "127.0.0.1:$(free_port)" load --name cli-test/big \
  --weights "$work/w256m.npy" --weight-scale "$work/scale1.npy") >"$work/out" 2>"$work/err" || rc=$?
[[ $rc -eq 1 ]] || fail "load of 256 MiB of .npy weights in 720 MB exited $rc, expected 1"
grep_err '^qlinear-cli: UNAVAILABLE: '  # not out of memory
rm "$work/w256m.npy"
expect 1 load --name cli-test/no-bias --weights "$work/w.npy" --weight-scale "$work/s.npy" \
  --bias "$work/b0.npy"
grep_err "^qlinear-cli: INVALID_ARGUMENT: $work/b0.npy: bias has 0 values, expected n=40$"
expect 0 infer --layer cli-test/files --input "$work/x.npy" --output-dtype fp32 \
  --output "$work/y4.npy"
grep_out '^y  *\[5, 40\] fp32  from x \[5, 72\] fp32'
expect 0 load --name cli-test/raw --weights "$work/w.raw" --n 40 --k 72 \
  --weight-scale "$work/s.npy" --chunk-mb 0.001
grep_out 'no bias'
expect 1 load --name cli-test/raw2 --weights "$work/w.raw" --n 41 --k 72 \
  --weight-scale "$work/s.npy"
grep_err 'raw int8 weights \[41, 72\] need 2952'
# Raw activations have no dtype of their own: --dtype must say it (fp16 read as bf16 would give
# wrong values, without an error), and with it they answer as the same values from a .npy file.
expect 2 infer --layer cli-test/files --input "$work/x16.raw"
grep_err "^qlinear-cli: INVALID_ARGUMENT: --input $work/x16.raw is not a .npy file: raw activations need --dtype (bf16, fp16 or fp32)$"
expect 0 infer --layer cli-test/files --input "$work/x16.raw" --dtype fp16 --output-dtype fp32 \
  --output "$work/y16raw.npy"
grep_out "^input  *$work/x16.raw (raw fp16)$"
expect 0 infer --layer cli-test/files --input "$work/x.npy" --dtype fp16 --output-dtype fp32 \
  --output "$work/y16npy.npy"
cmp -s "$work/y16raw.npy" "$work/y16npy.npy" || fail "raw fp16 input answers otherwise than the same values from .npy"
expect 1 infer --layer cli-test/files --input "$work/x8.npy"
grep_err "activations must be float32 (<f4) or float16 (<f2), got |i1"
expect 1 infer --layer cli-test/missing
grep_err '^qlinear-cli: NOT_FOUND: '

# --- a layer manifest: uploaded by the CLI, and loaded by a second server at start-up ----------
cat >"$work/layers.json" <<'EOF'
{"layers": [
  {"name": "cli-test/manifest-a", "weights": "w.npy", "weight_scale": "s.npy", "bias": "b.npy"},
  {"name": "cli-test/manifest-b", "weights": "w.npy", "weight_scale": "s.npy",
   "scheme": "static_symmetric", "input_scale": 0.01, "max_batch_rows": 8}
]}
EOF
expect 0 load --manifest "$work/layers.json"
grep_out "^\[1/2\] loaded layer 'cli-test/manifest-a' N=40 K=72 dynamic_symmetric on cpu in "
grep_out "^\[2/2\] loaded layer 'cli-test/manifest-b' N=40 K=72 static_symmetric on cpu in "
grep_out "^uploaded 2 layers (5.6 KiB of weights) from $work/layers.json in "
expect 0 infer --layer cli-test/manifest-a --input "$work/x.npy" --output-dtype fp32 \
  --output "$work/y5.npy"
cmp -s "$work/y4.npy" "$work/y5.npy" || fail "the manifest's layer answers otherwise than the same files loaded one by one"
expect 1 load --manifest "$work/layers.json"
grep_err "^qlinear-cli: ALREADY_EXISTS: $work/layers.json: layer 'cli-test/manifest-a' (layers\[0\]): .* (0 of 2 layers uploaded before it)$"
expect 0 load --manifest "$work/layers.json" --replace
grep_out "^\[2/2\] replaced layer 'cli-test/manifest-b'"
expect 2 load --manifest "$work/layers.json" --name other
grep_err 'manifest takes every layer.s settings from the file'
# Ctrl-C during a manifest's second upload: that layer is not loaded, the first one is, and the
# error says so.
python3 - "$work" <<'EOF'
import struct, sys
def save(name, descr, shape, nbytes, data=b""):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    header = header.ljust((10 + len(header) + 1 + 63) // 64 * 64 - 10 - 1) + "\n"
    with open(f"{sys.argv[1]}/{name}", "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data)
        f.truncate(f.tell() + nbytes - len(data))
save("w64m.npy", "|i1", "(8192, 8192)", 1 << 26)
save("s1.npy", "<f4", "(1,)", 4, struct.pack("<f", 1e-3))
EOF
cat >"$work/big.json" <<'EOF'
{"layers": [
  {"name": "cli-test/manifest-small", "weights": "w.npy", "weight_scale": "s.npy"},
  {"name": "cli-test/manifest-big", "weights": "w64m.npy", "weight_scale": "s1.npy"}
]}
EOF
re=$(cancelled_upload_re cli-test/manifest-big 67108864)
before=$(grep -c -- "$re" "$work/server.log" || true)
on_terminal --interrupt-on "upload cli-test/manifest-big" load --manifest "$work/big.json"
[[ $rc -eq 1 ]] || fail "load --manifest interrupted during its upload exited $rc, expected 1"
grep_out "^\[1/2\] loaded layer 'cli-test/manifest-small' N=40 K=72 "
grep_out "^qlinear-cli: CANCELLED: $work/big.json: layer 'cli-test/manifest-big' (layers\[1\]): interrupted (Ctrl-C) while uploading it; nothing of it was loaded (1 of 2 layers uploaded before it)$"
await_one_more "$work/server.log" "$re" "$before"
expect 0 layers
grep_out '^cli-test/manifest-small '
grep -q '^cli-test/manifest-big' "$work/out" && fail "the interrupted manifest upload left its layer loaded"
expect 0 unload cli-test/manifest-small
rm "$work/w64m.npy"
printf '{"layers": [{"name": "x", "weights": "w.npy", "weight_scale": "s.npy", "bais": "b.npy"}]}' \
  >"$work/bad.json"
expect 1 load --manifest "$work/bad.json"
grep_err "INVALID_ARGUMENT: $work/bad.json: layer 'x' (layers\[0\]): unknown key \"bais\""

# (Port 0: the server picks a free one and logs it once its layers are loaded.)
"$server_bin" --address 127.0.0.1 --port 0 --no-demo-layer --max-message-mb 1 \
  --layer-manifest "$work/layers.json" 2>"$work/server2.log" &
server2_pid=$!
port2=$(listening_port "$work/server2.log") ||
  fail "the server with a manifest did not start listening"
expect 0 --server "127.0.0.1:$port2" health --wait-seconds 20
expect 0 --server "127.0.0.1:$port2" layers
grep_out '^cli-test/manifest-a  *40  *72  *dynamic_symmetric  *yes '
grep_out '^cli-test/manifest-b  *40  *72  *static_symmetric  *no '
expect 0 --server "127.0.0.1:$port2" infer --layer cli-test/manifest-a --input "$work/x.npy" \
  --output-dtype fp32 --output "$work/y6.npy"
cmp -s "$work/y4.npy" "$work/y6.npy" || fail "the layer loaded at start-up answers otherwise"
grep -q "^.*\[2/2\] loaded layer 'cli-test/manifest-b' 40x72 static_symmetric on cpu" \
  "$work/server2.log" || fail "no '[2/2] loaded layer' log line"
grep -q "loaded 2 layers (0.0 MiB of weights) from the manifest in" "$work/server2.log" ||
  fail "no 'loaded 2 layers' log line"
# Upload chunks leave room for their message's framing: 1.5 MiB of weights to a server whose
# messages are at most 1 MiB.
expect 0 --server "127.0.0.1:$port2" load --name cli-test/one-mib --n 1024 --k 1536
grep_out 'N=1024 K=1536'
stop_server2 "the second server"
# A manifest that cannot load stops the server at start-up, naming the layer and why.
rc=0
"$server_bin" --address 127.0.0.1 --port 0 --no-demo-layer --layer-manifest "$work/bad.json" \
  2>"$work/server3.log" || rc=$?
[[ $rc -eq 1 ]] || fail "a server with a bad manifest exited $rc, expected 1"
grep -q "layer 'x' (layers\[0\]): unknown key \"bais\"" "$work/server3.log" ||
  fail "the bad manifest's reason is not in the server's log"
# SIGTERM while the manifest's layers load stops the start-up between two layers, exit 0. (300
# layers of 1 MiB: seconds to load on this kind of machine, the signal comes after the first.)
python3 - "$work" <<'EOF'
import json, os, struct, sys
work = sys.argv[1]
def save(name, descr, shape, data):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    header = header.ljust((10 + len(header) + 1 + 63) // 64 * 64 - 10 - 1) + "\n"
    with open(f"{work}/{name}", "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data)
save("w1m.npy", "|i1", "(1024, 1024)", os.urandom(1 << 20))
save("s1.npy", "<f4", "(1,)", struct.pack("<f", 1e-3))
layers = [{"name": f"many/{i}", "weights": "w1m.npy", "weight_scale": "s1.npy"} for i in range(300)]
json.dump({"layers": layers}, open(f"{work}/many.json", "w"))
EOF
metrics4=$(free_port)
"$server_bin" --address 127.0.0.1 --port 0 --no-demo-layer --layer-manifest "$work/many.json" \
  --metrics-port "$metrics4" 2>"$work/server4.log" &
server2_pid=$!
for _ in $(seq 200); do
  grep -q '\[1/300\] loaded layer' "$work/server4.log" && break
  sleep 0.05
done
# While its layers load, the metrics port is up: live, and not ready.
python3 - "$metrics4" >"$work/probes" <<'EOF' || fail "cannot reach the metrics port while loading"
import sys, urllib.error, urllib.request
for path in ("/healthz", "/readyz"):
    try:
        r = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}{path}", timeout=5)
        print(path, r.status, r.read().decode().strip())
    except urllib.error.HTTPError as e:
        print(path, e.code, e.read().decode().strip())
EOF
grep -q '^/healthz 200 ok$' "$work/probes" || fail "/healthz while loading: $(cat "$work/probes")"
grep -q '^/readyz 503 starting: layers are loading$' "$work/probes" ||
  fail "/readyz while loading: $(cat "$work/probes")"
stop_server2 "the server stopped while loading the manifest"
grep -q "received a stop signal while starting: stopped while loading the manifest $work/many.json, after [0-9]* of 300 layers; stopped" \
  "$work/server4.log" || fail "no log line of the start-up stopped while loading"
grep -q 'listening on' "$work/server4.log" && fail "the server listened although stopped while loading"
for layer in cli-test/manifest-a cli-test/manifest-b; do
  expect 0 unload "$layer"
done

# --- a W8A8 safetensors checkpoint (compressed-tensors): its manifest, uploaded -----------------
mkdir "$work/ckpt"
python3 - "$work" <<'EOF'
import json, struct, sys
work = sys.argv[1]
def npy_data(name):  # the data bytes of a .npy file written above (format 1.0)
    raw = open(f"{work}/{name}", "rb").read()
    return raw[10 + struct.unpack("<H", raw[8:10])[0]:]
w, s, b = npy_data("w.npy"), npy_data("s.npy"), npy_data("b.npy")
bf16 = b"".join(x[2:] for x in (s[i:i + 4] for i in range(0, len(s), 4)))  # truncated to bf16
def save(name, tensors):
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for t, dtype, shape, raw in tensors:
        header[t] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    open(f"{work}/ckpt/{name}", "wb").write(struct.pack("<Q", len(h)) + h + data)
p = "model.layers.0.mlp."
save("model-00001-of-00002.safetensors", [
    (p + "down_proj.weight", "I8", [40, 72], w), (p + "down_proj.weight_scale", "F32", [40, 1], s),
    (p + "down_proj.bias", "F16", [40], b), ("lm_head.weight", "BF16", [4, 72], bytes(576))])
a = "model.layers.0.self_attn."
s2 = struct.pack("<40f", *(2 * x for x in struct.unpack("<40f", s)))
qkv = {"q": (w, s), "k": (w[::-1], s), "v": (w, s2)}  # three different parts
save("model-00002-of-00002.safetensors", [
    (p + "up_proj.weight", "I8", [40, 72], w), (p + "up_proj.weight_scale", "BF16", [40, 1], bf16),
    (p + "gate_proj.weight", "I8", [40, 72], w)] + [
    (a + f"{x}_proj.{t}", dtype, shape, raw) for x in "qkv" for t, dtype, shape, raw in (
        ("weight", "I8", [40, 72], qkv[x][0]), ("weight_scale", "F32", [40, 1], qkv[x][1]),
        ("bias", "F16", [40], b))])
json.dump({"quantization_config": {"quant_method": "compressed-tensors", "config_groups": {
    "group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "int", "symmetric": True,
                                                   "strategy": "channel"},
                "input_activations": {"num_bits": 8, "type": "int", "dynamic": True,
                                      "symmetric": True}}}}}, open(f"{work}/ckpt/config.json", "w"))
EOF
expect 0 manifest --checkpoint "$work/ckpt" --output "$work/ckpt/layers.json"
grep_out "^wrote $work/ckpt/layers.json: 3 layers (14.1 KiB of int8 weights; 1 fused module) from 2 safetensors files; dynamic_symmetric (config.json)$"
grep_out '^skipped model.layers.0.mlp.gate_proj.weight: int8 without a weight_scale$'
grep -q '"file": "model-00001-of-00002.safetensors"' "$work/ckpt/layers.json" ||
  fail "the manifest beside the checkpoint does not name its files by their names"
expect 0 load --manifest "$work/ckpt/layers.json"
grep_out "^\[1/3\] loaded layer 'model.layers.0.mlp.down_proj' N=40 K=72 dynamic_symmetric"
grep_out "^\[3/3\] loaded layer 'model.layers.0.self_attn.qkv_proj' N=120 K=72 dynamic_symmetric"
expect 0 describe model.layers.0.self_attn.qkv_proj
grep_out '^logical widths   \[40, 40, 40\]'
expect 0 infer --layer model.layers.0.self_attn.qkv_proj --input "$work/x.npy" --output-dtype fp32 \
  --output "$work/y8.npy"
# The fused layer answers, row by row, what each of its parts (all different) does alone.
expect 0 manifest --checkpoint "$work/ckpt" --output "$work/unfused.json" --fuse=false
grep_out "^wrote $work/unfused.json: 5 layers (14.1 KiB of int8 weights) from 2 safetensors files"
expect 0 load --manifest "$work/unfused.json" --replace
for x in q k v; do
  expect 0 infer --layer "model.layers.0.self_attn.${x}_proj" --input "$work/x.npy" \
    --output-dtype fp32 --output "$work/y8$x.npy"
done
python3 - "$work" <<'EOF' || fail "the fused qkv_proj does not answer its parts' rows"
import struct, sys
work = sys.argv[1]
def data(name):
    raw = open(f"{work}/{name}", "rb").read()
    return raw[10 + struct.unpack("<H", raw[8:10])[0]:]
fused, parts = data("y8.npy"), [data(f"y8{x}.npy") for x in "qkv"]
row = 40 * 4
assert len(fused) == sum(map(len, parts)), (len(fused), [len(p) for p in parts])
assert parts[0] != parts[1] and parts[0] != parts[2]
for m in range(len(parts[0]) // row):
    assert fused[3 * row * m:3 * row * (m + 1)] == b"".join(p[row * m:row * (m + 1)] for p in parts), m
EOF
expect 0 describe model.layers.0.mlp.down_proj
grep_out 'with bias\|bias  *yes'
expect 0 infer --layer model.layers.0.mlp.down_proj --input "$work/x.npy" --output-dtype fp32 \
  --output "$work/y7.npy"
cmp -s "$work/y4.npy" "$work/y7.npy" || fail "the checkpoint's layer answers otherwise than the same tensors from .npy files"
expect 0 infer --layer model.layers.0.mlp.up_proj --input "$work/x.npy"
expect 0 manifest --checkpoint "$work/ckpt" --output "$work/elsewhere.json"
grep -q "\"file\": \"$work/ckpt/model-00002-of-00002.safetensors\"" "$work/elsewhere.json" ||
  fail "a manifest written elsewhere does not name the checkpoint's files by absolute paths"
expect 1 manifest --checkpoint "$work" --output "$work/none.json"
grep_err "^qlinear-cli: NOT_FOUND: no \*.safetensors files in "
expect 2 manifest --checkpoint "$work/ckpt"
# Without a config.json the scheme comes from the tensors: an input_scale and an I8 zero point.
mkdir "$work/ckpt2"
cp "$work/ckpt/model-00001-of-00002.safetensors" "$work/ckpt2/"
python3 - "$work" <<'EOF'
import json, struct, sys
work = sys.argv[1]
raw = open(f"{work}/ckpt2/model-00001-of-00002.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
for name, dtype, value in (("input_scale", "F32", struct.pack("<f", 0.02)),
                           ("input_zero_point", "I8", struct.pack("<b", -5))):
    header[f"model.layers.0.mlp.down_proj.{name}"] = {
        "dtype": dtype, "shape": [1], "data_offsets": [len(data), len(data) + len(value)]}
    data += value
h = json.dumps(header).encode()
open(f"{work}/ckpt2/model.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + data)
EOF
rm "$work/ckpt2/model-00001-of-00002.safetensors"
expect 0 manifest --checkpoint "$work/ckpt2" --output "$work/ckpt2/layers.json"
grep_out '; static_asymmetric (from the tensors, without a config.json)$'
expect 0 load --manifest "$work/ckpt2/layers.json" --replace
grep_out "^\[1/1\] replaced layer 'model.layers.0.mlp.down_proj' N=40 K=72 static_asymmetric"
expect 0 describe model.layers.0.mlp.down_proj
grep_out '^input zero point -5'
# A config.json that names what qlinear does not serve is refused with the reason.
echo '{"quantization_config": {"quant_method": "compressed-tensors", "config_groups": {"g": {
  "weights": {"num_bits": 8, "type": "int", "symmetric": false, "strategy": "channel"},
  "input_activations": {"num_bits": 8, "type": "int", "dynamic": true}}}}}' >"$work/ckpt2/config.json"
expect 1 manifest --checkpoint "$work/ckpt2" --output "$work/ckpt2/layers.json"
grep_err "config group 'g' quantizes weights other than symmetric per channel or per tensor"
echo '{"quantization_config": {"quant_method": "compressed-tensors", "config_groups": {"g": {
  "weights": {"num_bits": 8, "type": "int", "strategy": "tensor"},
  "input_activations": {"num_bits": 8, "type": "int", "dynamic": "yes"}}}}}' >"$work/ckpt2/config.json"
expect 1 manifest --checkpoint "$work/ckpt2" --output "$work/ckpt2/layers.json"
grep_err "config group 'g': dynamic and symmetric must be true or false"
for layer in model.layers.0.mlp.down_proj model.layers.0.mlp.up_proj \
  model.layers.0.self_attn.qkv_proj model.layers.0.self_attn.q_proj \
  model.layers.0.self_attn.k_proj model.layers.0.self_attn.v_proj; do
  expect 0 unload "$layer"
done

# --- bench: streams, echo, unary with the echo comparison, an existing layer --------------------
expect 0 bench --n 256 --k 256 --streams 4 --duration 2 --m 1
cat "$work/out"
# The layer's name: the pid and a random part (CLIs in containers are often all pid 1).
grep_out '^bench: infer on layer .bench-[0-9]*-[0-9a-f]\{8\}. (N=256 K=256, random, dynamic_symmetric'
grep_out '4 InferStreams on their own channels, 2 s after 1 s warm-up'
grep_out '^  throughput  [0-9.]* requests/s, [0-9.]* rows/s$'
grep_out '^  latency     p50 [0-9.]* ms   p90 [0-9.]* ms   p99 [0-9.]* ms   max .*   (client, [0-9]* successful requests)$'
grep_out '^  errors      none$'
grep -q 'failed request' "$work/out" && fail "bench reports failed requests where none failed"
grep_out '^  server      queue [0-9.]* us   quantize [0-9.]* us   gemm [0-9.]* us   copies [0-9.]* us   total '
grep_out '^  batch       [0-9.]* requests, [0-9.]* rows per GEMM'
grep_out '^  kernels     cpu\.'
grep_err '^bench: .* req/s  0 errors$'  # the progress line, plain lines when not a terminal
# The random layer's upload, over 4 MiB, shows its progress on a terminal, and Ctrl-C stops it:
# the call is cancelled and the server keeps nothing of it.
re=$(cancelled_upload_re bench- 67108864)
before=$(grep -c -- "$re" "$work/server.log" || true)
on_terminal --interrupt-on "upload bench-" bench --n 8192 --k 8192 --m 1 --requests 5 --warmup 0
[[ $rc -eq 1 ]] || fail "bench interrupted during its upload exited $rc, expected 1"
grep_out '^upload bench-[0-9a-f-]*: [0-9.]* [KM]iB / 64.0 MiB ([0-9]*%)'
grep_out "^qlinear-cli: CANCELLED: interrupted (Ctrl-C) while uploading layer 'bench-[0-9a-f-]*'; nothing was loaded"
await_one_more "$work/server.log" "$re" "$before"
expect 0 layers
grep_out '^cli-test/random '
grep -q '^bench-' "$work/out" && fail "the interrupted upload left its layer loaded"
expect 0 bench --echo --n 256 --k 256 --duration 1
grep_out '^bench: echo (512 B/row up, 512 B/row down, as for N=256 K=256), M=1'
grep_out '^  throughput  [0-9.]* requests/s'
grep_out '^  latency     p50 '
expect 0 bench --unary --streams 2 --requests 50 --n 256 --k 256 --m-min 1 --m-max 8 \
  --deadline-ms 5000 --shared-channel --compare-echo
grep_out '2 unary Infer callers on one channel, 50 requests'
grep_out '^  requests    50 ok, 0 failed'
grep_out '^  throughput  [0-9.]* requests/s'
grep_out '^server overhead = latency - echo latency:  p50 -*[0-9.]* ms (.*)   p99 '
expect 0 bench --layer cli-test/random --m 2 --requests 20 --warmup 0
grep_out "^bench: infer on layer 'cli-test/random' (N=96 K=136, existing, static_asymmetric, batching off)"
grep_out '^  requests    20 ok'
expect 1 bench --layer cli-test/missing --duration 1
grep_err '^qlinear-cli: NOT_FOUND: '
expect 2 bench --n 256
grep_err 'need --layer, or --n >= 1 and 2 <= --k'
expect 2 bench --n 256 --k 256 --duration 1 --requests 5
expect 2 bench --n 256 --k 256 --deadline-ms 10
# now + this deadline wraps around to just before now (every call DEADLINE_EXCEEDED at once):
# --deadline-ms is at most a day.
expect 2 bench --n 256 --k 256 --unary --deadline-ms 9223372036854775807
grep_err '^qlinear-cli: INVALID_ARGUMENT: --deadline-ms must be in 0..86400000 (a day; 0: --timeout-s), got 9223372036854775807$'
expect 2 bench --n 256 --k 256 --duration nan
grep_err '--duration and --warmup in 0..604800 s'
expect 2 bench --n 256 --k 256 --m 99999999
grep_err '^qlinear-cli: INVALID_ARGUMENT: --m, --m-min and --m-max must be at most 16777216$'
# --m-min alone is the largest M too: the same limit, before M x K can overflow.
expect 2 bench --n 256 --k 4 --m-min 4611686018427387904
grep_err '^qlinear-cli: INVALID_ARGUMENT: --m, --m-min and --m-max must be at most 16777216$'
expect 2 bench --n 256 --k 256 --max-queue-delay-us -5
# A request larger than a message may be (here over protobuf's 2 GiB) is refused up front,
# before any input is made.
expect 1 bench --n 16 --k 1024 --m 1100000 --duration 1
grep_err '^qlinear-cli: RESOURCE_EXHAUSTED: an InferStream request of M=1100000 (K=1024, bf16) is 22528000[2-4][0-9] bytes, over the 1073741824 bytes a message may have; lower --m or --m-max'
# The inputs of a range of M take the rows of the largest M (8 MiB here), not a buffer per M.
rc=0
(ulimit -v 3000000 && exec "$cli_bin" bench --n 16 --k 4096 --m-min 1 --m-max 1024 --requests 20 \
  --warmup 0) >"$work/out" 2>"$work/err" || rc=$?
[[ $rc -eq 0 ]] || fail "bench of M 1..1024 at K=4096 in 3 GB of address space exited $rc"
grep_out '^  requests    20 ok'
expect 2 load --name cli-test/big-chunks --n 8 --k 16 --chunk-mb 100
grep_err 'a chunk is one message of at most --max-message-mb 64 MiB'
# The smallest message limit still uploads (1.5 MiB of weights in chunks just under 1 MiB).
expect 0 --max-message-mb 1 load --name cli-test/one-mib --n 1024 --k 1536
grep_out 'N=1024 K=1536'
expect 0 unload cli-test/one-mib
# The header carries the weight scale and bias: [N] each, 1.6 MB here.
expect 1 --max-message-mb 1 load --name cli-test/wide --n 200000 --k 2
grep_err '^qlinear-cli: RESOURCE_EXHAUSTED: the LoadLayer header (the layer.s settings, weight scale and bias) is 16[0-9]* bytes, over the 1048576 bytes'
expect 2 load --name cli-test/huge --n 4611686018427387904 --k 4
grep_err 'random layers are limited to 16 GiB'
expect 2 load --name cli-test/tiny-scale --scheme static_symmetric --input-scale 1e-50
grep_err '^qlinear-cli: INVALID_ARGUMENT: --input-scale 1e-50 is out of the range of a float32$'
expect 2 load --name cli-test/nan-scale --scheme static_symmetric --input-scale nan
grep_err "^qlinear-cli: INVALID_ARGUMENT: --input-scale takes a finite number, got 'nan'$"
expect 2 load --name cli-test/batching --max-batch-rows -2
grep_err 'must be >= -1'
expect 2 --max-message-mb 0 health
grep_err '--max-message-mb must be in 1..2047, got 0'
expect 2 health --wait-seconds 99999999999

# --- unload ---------------------------------------------------------------------------------------
for layer in cli-test/random cli-test/files cli-test/raw; do
  expect 0 unload "$layer"
done
expect 1 unload cli-test/random
grep_err '^qlinear-cli: NOT_FOUND: '
expect 0 layers
grep_out 'no layers loaded'  # bench unloads its random layers too

# --- command line: help, usage errors, server selection -----------------------------------------
expect 0 --help
grep_out '^Commands:'
expect 0 help
grep_out '^  smoke '
for cmd in health kernels layers describe load unload infer smoke bench; do
  expect 0 "$cmd" --help
  grep_out "^Usage: qlinear-cli $cmd"
  expect 0 help "$cmd"
  grep_out "^Usage: qlinear-cli $cmd"
  expect 2 "$cmd" --no-such-option
  grep_err '^qlinear-cli: INVALID_ARGUMENT: unknown option --no-such-option'
done
expect 2
expect 2 frobnicate
grep_err "unknown command 'frobnicate'"
expect 2 describe
grep_err 'missing NAME'
expect 2 load --name x --scheme bogus
grep_err "unknown scheme 'bogus'"
expect 2 infer --layer x --dtype fp8
expect 2 --server
expect 2 -x --version
grep_err "^qlinear-cli: INVALID_ARGUMENT: unknown option -x "
QLINEAR_SERVER= expect 0 --server "127.0.0.1:$port" layers
QLINEAR_SERVER= expect 0 layers --server "127.0.0.1:$port"
closed=$(free_port)
start=$(date +%s%N)
expect 1 health --server "127.0.0.1:$closed"
grep_err '^qlinear-cli: UNAVAILABLE: '
(( ($(date +%s%N) - start) / 1000000 < 3000 )) || fail "health took over 3 s on a refused port"
# bench says why too (gRPC's reason, as the other commands), as soon.
start=$(date +%s%N)
expect 1 bench --server "127.0.0.1:$closed" --n 256 --k 256 --duration 1
grep_err '^qlinear-cli: UNAVAILABLE: failed to connect to all addresses; .*Connection refused'
(( ($(date +%s%N) - start) / 1000000 < 3000 )) || fail "bench took over 3 s on a refused port"
# Through a link 150 ms away each way, health waits for the connection.
python3 -c 'import asyncio, sys
async def pipe(r, w):
    try:
        while data := await r.read(65536):
            await asyncio.sleep(0.15)
            w.write(data)
            await w.drain()
    finally:
        w.close()
async def handle(cr, cw):
    sr, sw = await asyncio.open_connection("127.0.0.1", int(sys.argv[1]))
    await asyncio.gather(pipe(cr, sw), pipe(sr, cw), return_exceptions=True)
async def main():
    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(srv.sockets[0].getsockname()[1], flush=True)
    await srv.serve_forever()
asyncio.run(main())' "$port" >"$work/proxy.port" &
proxy_pid=$!
for _ in $(seq 50); do [[ -s $work/proxy.port ]] && break; sleep 0.1; done
expect 0 health --server "127.0.0.1:$(cat "$work/proxy.port")"
grep_out '^SERVING$'
kill "$proxy_pid" 2>/dev/null || true
wait "$proxy_pid" 2>/dev/null || true
proxy_pid=""

# --- TLS: a server with mutual TLS, certificates made here --------------------------------------
tls=$work/tls
mkdir -p "$tls"
(
  cd "$tls"
  ec=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes)
  openssl req -x509 "${ec[@]}" -keyout ca.key -out ca.pem -days 2 -subj "/CN=cli test CA"
  for who in server client; do
    openssl req "${ec[@]}" -keyout "$who.key" -out "$who.csr" -subj "/CN=cli test $who"
  done
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >server.ext
  openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
    -extfile server.ext -out server.pem
  openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
    -out client.pem
) >"$work/openssl.log" 2>&1 || { cat "$work/openssl.log" >&2; fail "openssl could not make the test certificates"; }
rc=0
"$server_bin" --port 0 --tls-cert "$tls/server.pem" 2>"$work/server3.log" || rc=$?
[[ $rc -eq 2 ]] || fail "qlinear-server --tls-cert without --tls-key exited $rc, expected 2"
grep -q -- '--tls-cert needs --tls-key' "$work/server3.log" || fail "no '--tls-cert needs --tls-key'"
rc=0
"$server_bin" --port 0 --tls-cert "$tls/server.pem" --tls-key "$tls/client.key" \
  2>"$work/server3.log" || rc=$?
[[ $rc -eq 1 ]] || fail "qlinear-server with another certificate's key exited $rc, expected 1"
grep -q -- "--tls-key $tls/client.key does not match --tls-cert $tls/server.pem" \
  "$work/server3.log" || fail "no 'does not match' on a key that is not the certificate's"
"$server_bin" --address 127.0.0.1 --port 0 --demo-n 64 --demo-k 128 --enable-echo \
  --tls-cert "$tls/server.pem" --tls-key "$tls/server.key" --tls-client-ca "$tls/ca.pem" \
  --tls-reload-interval-s 0 2>"$work/server3.log" &
server2_pid=$!
port3=$(listening_port "$work/server3.log") || fail "the TLS server did not start listening"
grep -q "(TLS with CN=cli test server (no intermediates; valid until .*); client certificates required, issued by $tls/ca.pem (1 certificate))" \
  "$work/server3.log" || fail "the TLS server's 'listening on' line does not say how it serves"
mtls=(--server "localhost:$port3" --tls-ca "$tls/ca.pem" --tls-cert "$tls/client.pem"
  --tls-key "$tls/client.key")
expect 0 "${mtls[@]}" health --wait-seconds 20
grep_out '^SERVING$'
expect 0 "${mtls[@]}" smoke --n 64 --k 96 --batches 2
grep_out '^smoke: PASS'
expect 0 "${mtls[@]}" infer --layer demo --m 3
expect 0 "${mtls[@]}" bench --layer demo --streams 2 --requests 20 --warmup 0
grep_out '^  requests    20 ok'
grep_out ", server localhost:$port3 over TLS$"
expect 0 "${mtls[@]}" --tls-server-name localhost --server "127.0.0.1:$port3" layers
grep_out '^demo '
# The same settings from the environment.
QLINEAR_TLS_CA=$tls/ca.pem QLINEAR_TLS_CERT=$tls/client.pem QLINEAR_TLS_KEY=$tls/client.key \
  QLINEAR_TLS_SERVER_NAME=localhost expect 0 --server "127.0.0.1:$port3" layers
grep_out '^demo '
# Refused at the handshake, each with a hint of why.
expect 1 --server "localhost:$port3" layers
grep_err '^qlinear-cli: UNAVAILABLE: .*(if the server serves TLS, connect with --tls or --tls-ca)$'
expect 1 --server "localhost:$port3" bench --layer demo --requests 5
grep_err '^qlinear-cli: UNAVAILABLE: .*(if the server serves TLS, connect with --tls or --tls-ca)$'
expect 1 --server "localhost:$port3" --tls-ca "$tls/ca.pem" layers
grep_err '(if the server asks for client certificates, give --tls-cert and --tls-key)$'
expect 1 --server "localhost:$port3" --tls-ca "$tls/ca.pem" health --wait-seconds 1
grep_err '(after waiting 1 s) (if the server asks for client certificates, give --tls-cert and --tls-key)$'
expect 1 --server "localhost:$port3" --tls layers
grep_err '(the server.s certificate is not issued by --tls-ca, or by the default roots without it)$'
expect 1 "${mtls[@]}" --tls-server-name qlinear.example layers
grep_err '(the server.s certificate does not bear the name connected to: give --tls-server-name with a name it bears)$'
expect 1 --tls-ca "$tls/ca.pem" layers  # the plaintext server
grep_err '(the server speaks plaintext: connect without --tls and its files)$'
# Client files checked before any call.
expect 2 --tls-cert "$tls/client.pem" layers
grep_err '^qlinear-cli: INVALID_ARGUMENT: --tls-cert needs --tls-key'
expect 2 --tls-ca "$tls/ca.key" layers
grep_err "^qlinear-cli: INVALID_ARGUMENT: --tls-ca: $tls/ca.key holds no PEM certificate"
expect 2 --tls-ca "$tls/none.pem" layers
grep_err "^qlinear-cli: NOT_FOUND: --tls-ca: cannot open $tls/none.pem"
# A rotation while it serves, read on SIGHUP (the server polls with --tls-reload-interval-s 0
# never): a key that fails the checks is logged and the served certificate kept; a renewed
# certificate (a new key, the same CA) is served from the next connection on.
kill -HUP "$server2_pid"
await_log "$work/server3.log" "received SIGHUP: TLS files unchanged"
printf 'not a key\n' >"$tls/bad.key"
mv "$tls/bad.key" "$tls/server.key"
kill -HUP "$server2_pid"
await_log "$work/server3.log" "TLS files changed but not reloaded (--tls-key: $tls/server.key holds no unencrypted PEM private key"
await_log "$work/server3.log" "received SIGHUP: TLS files not reloaded"
kill -HUP "$server2_pid"  # the same bad key: not logged again, but said
await_log "$work/server3.log" "received SIGHUP: TLS files still not reloaded (--tls-key: $tls/server.key holds no unencrypted PEM private key"
expect 0 "${mtls[@]}" layers
(
  cd "$tls"
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout renewed.key \
    -out renewed.csr -subj "/CN=cli test server renewed"
  openssl x509 -req -in renewed.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
    -extfile server.ext -out renewed.pem
) >>"$work/openssl.log" 2>&1 || fail "openssl could not renew the server certificate"
mv "$tls/renewed.pem" "$tls/server.pem"
mv "$tls/renewed.key" "$tls/server.key"
kill -HUP "$server2_pid"
await_log "$work/server3.log" "TLS files reloaded: now serving TLS with CN=cli test server renewed (no intermediates"
subject=$(openssl s_client -connect "127.0.0.1:$port3" -alpn h2 -CAfile "$tls/ca.pem" \
  -cert "$tls/client.pem" -key "$tls/client.key" </dev/null 2>/dev/null |
  openssl x509 -noout -subject 2>/dev/null) || true
[[ $subject == *"cli test server renewed"* ]] ||
  fail "a new connection to the TLS server got '$subject', not the renewed certificate"
expect 0 "${mtls[@]}" layers
grep_out '^demo '
stop_server2 "the TLS server"

# --- deadlines: a server that takes the connection and never answers ----------------------------
expect 2 --timeout-s -1 layers
grep_err '--timeout-s must be in 0..86400 seconds, got -1'
expect 2 --timeout-s nan layers
python3 -c 'import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(16)
print(s.getsockname()[1], flush=True); time.sleep(120)' >"$work/mute.port" &
mute_pid=$!
for _ in $(seq 50); do [[ -s $work/mute.port ]] && break; sleep 0.1; done
mute=127.0.0.1:$(cat "$work/mute.port")
for cmd in "layers" "kernels" "describe x" "unload x" "infer --layer x --m 1"; do
  start=$(date +%s%N)
  # shellcheck disable=SC2086  # the command's words
  QLINEAR_SERVER=$mute expect 1 --timeout-s 1 $cmd
  grep_err '^qlinear-cli: DEADLINE_EXCEEDED: no answer within the call.s deadline of 1s'
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  (( ms < 15000 )) || fail "qlinear-cli $cmd took $ms ms against a mute server, with --timeout-s 1"
done
kill "$mute_pid" 2>/dev/null || true
wait "$mute_pid" 2>/dev/null || true
mute_pid=""

# --- a server that stops answering mid-run (SIGSTOP) ----------------------------------------------
# bench's stream waits --timeout-s for each answer, then fails (the server stopped during the
# warm-up: every measured request times out).
expect 0 load --name cli-test/stalled --n 64 --k 64
start=$(date +%s%N)
"$cli_bin" --timeout-s 2 bench --layer cli-test/stalled --requests 1 --warmup 3 >"$work/out" \
  2>"$work/err" &
cli_pid=$!
await_log "$work/err" "(warm-up)"
kill -STOP "$server_pid"
reap cli_pid
kill -CONT "$server_pid"
ms=$(( ($(date +%s%N) - start) / 1000000 ))
[[ $rc -eq 1 ]] || fail "bench against a stopped server exited $rc, expected 1"
grep_err "^qlinear-cli: DEADLINE_EXCEEDED: every InferStream request failed; first: no answer within the call's deadline of 2s (--timeout-s)$"
# The percentiles are the successful requests'; the failed one is counted apart, with its time.
grep_out '^  latency     - (no successful request)$'
failed_ms=$(sed -n 's/^ *1 failed request not in the percentiles: max \([0-9]*\)\.[0-9]* ms$/\1/p' \
  "$work/out")
[[ -n $failed_ms ]] && (( failed_ms >= 2000 )) ||
  fail "bench does not report its failed request's latency (at least the 2 s it waited)"
(( ms < 30000 )) || fail "bench against a stopped server took $ms ms, with --timeout-s 2"
expect 0 unload cli-test/stalled

# --- graceful stop -----------------------------------------------------------------------------
kill -TERM "$server_pid"
reap server_pid
[[ $rc -eq 0 ]] || fail "the server exited $rc after SIGTERM, expected 0"
expect 1 health
echo "cli_smoke_test: PASS"
