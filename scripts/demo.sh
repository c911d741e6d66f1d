#!/usr/bin/env bash
# Builds qlinear, starts a server with its demo layer, checks it end to end with the CLI, and
# stops it again.
#
# Usage: scripts/demo.sh
#
# Steps: build (scripts/build.sh, which installs missing Debian packages first); start
# qlinear-server on port 50051 (or a free one if that is taken); wait until it reports SERVING;
# show its start-up log (host, kernels, demo layer); run `qlinear-cli smoke` (uploads a layer,
# streams batches of random sizes, compares every output with a client-side reference and prints
# a PASS/FAIL verdict); run one `infer --explain` on the demo layer to show the metadata; stop the
# server with SIGTERM and show its shutdown log. Exits with the smoke's status (or the infer's,
# if the smoke passed and the infer failed).
#
# Environment: everything scripts/build.sh reads (QLINEAR_BUILD_DIR, QLINEAR_SKIP_DEPS,
# QLINEAR_CUDA, JOBS), plus
#   PORT  port for the server (default: 50051 when free, else one the system picks)
#   QLINEAR_DEMO_NO_BUILD=1  run the binaries already in QLINEAR_BUILD_DIR without building
#                            (the test suite's run of this script, scripts.demo)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUILD="${QLINEAR_BUILD_DIR:-build}"
SERVER_BIN="$BUILD/server/qlinear-server"
CLI_BIN="$BUILD/client/qlinear-cli"

[ "${QLINEAR_DEMO_NO_BUILD:-0}" = "1" ] || scripts/build.sh
for bin in "$SERVER_BIN" "$CLI_BIN"; do
  if [ ! -x "$bin" ]; then
    echo "demo: $bin was not built" >&2
    exit 1
  fi
done

# True when something accepts connections on 127.0.0.1:$1.
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

if [ -n "${PORT:-}" ]; then
  port="$PORT"
elif port_busy 50051; then
  port=0  # the server picks a free one and logs it
  echo "demo: port 50051 is busy; letting the server pick a free port"
else
  port=50051
fi

log="$(mktemp -t qlinear-demo.XXXXXX)"
server_pid=""
# shellcheck disable=SC2317  # called from the EXIT trap
cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -f "$log"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

section() { printf '\n== %s\n' "$*"; }
show_log_from() { tail -n "+$1" "$log" | sed 's/^/  | /'; }

section "starting $SERVER_BIN on 127.0.0.1:$port (log: $log)"
"$SERVER_BIN" --address=127.0.0.1 --port="$port" >"$log" 2>&1 &
server_pid=$!

# The server logs "listening on ADDRESS:PORT" once it accepts calls; that line also gives the
# port when the system picked it.
for _ in $(seq 1 600); do
  if grep -q 'listening on ' "$log"; then break; fi
  if ! kill -0 "$server_pid" 2>/dev/null; then
    wait "$server_pid" || true
    echo "demo: the server exited during start-up:" >&2
    show_log_from 1 >&2
    server_pid=""
    exit 1
  fi
  sleep 0.1
done
if ! grep -q 'listening on ' "$log"; then
  echo "demo: the server did not start listening within 60 s:" >&2
  show_log_from 1 >&2
  exit 1
fi
# "listening on ADDRESS:PORT (how it serves)"
port="$(sed -n 's/.*listening on [^ ]*:\([0-9][0-9]*\).*/\1/p' "$log" | head -n 1)"
if [ -z "$port" ]; then
  echo "demo: cannot read the port from the server's log:" >&2
  show_log_from 1 >&2
  exit 1
fi
target="localhost:$port"
cli() { "$CLI_BIN" --server "$target" "$@"; }

section "qlinear-cli --server $target health --wait-seconds 30"
if ! cli health --wait-seconds 30; then
  echo "demo: the server did not report SERVING:" >&2
  show_log_from 1 >&2
  exit 1
fi

section "server log so far"
show_log_from 1
shown=$(wc -l <"$log")

section "qlinear-cli --server $target smoke"
smoke_rc=0
cli smoke || smoke_rc=$?

section "qlinear-cli --server $target infer --layer demo --m 4 --explain"
infer_rc=0
cli infer --layer demo --m 4 --explain || infer_rc=$?

section "stopping the server (SIGTERM)"
kill -TERM "$server_pid"
server_rc=0
wait "$server_pid" || server_rc=$?
server_pid=""
show_log_from $((shown + 1))

rc=$smoke_rc
if [ "$rc" -eq 0 ] && [ "$infer_rc" -ne 0 ]; then
  rc=$infer_rc
fi
echo
echo "demo: smoke exit $smoke_rc, infer exit $infer_rc, server exit $server_rc"
if [ "$rc" -eq 0 ]; then
  echo "demo: PASS"
else
  echo "demo: FAIL"
fi
exit "$rc"
