#!/usr/bin/env bash
# The CPU kernels served through qlinear-server, with autotune (the layer's load measures the
# measurable CPU kernels and ranks them by time) against the priority order (--autotune=false).
# For each layer shape: the load time of a first layer and of a second one of the same shape
# (which takes the first one's times), the kernel each M bucket chose, and `qlinear-cli bench`
# on the first layer at each M. On a host with more than one measurable CPU kernel (AVX-512 VNNI
# and oneDNN) it shows what the load's measurements cost and what their choices are worth in
# served requests; on an AVX2-only host both runs choose alike and the load measures nothing.
#
# Usage: bench/cpu_serving.sh [options]
#   --shapes N:K,...   layer shapes (default: 4096:4096,28672:4096,4096:14336)
#   --m LIST           rows per request for the bench (default: 1,16,64,256)
#   --streams S        concurrent InferStreams (default: 2)
#   --duration SEC     measured seconds per bench (default: 3)
#   --port P           server port (default: 50561)
#   --help
# Environment:
#   QLINEAR_BUILD_DIR    where the binaries are (default: build): server/qlinear-server and
#                        client/qlinear-cli in it
#   QLINEAR_SERVER_CMD   the server command instead (e.g. "bundle-gpu/run qlinear-server")
#   QLINEAR_CLI_CMD      the client command instead
#   QLINEAR_SERVER_ARGS  extra server arguments; on a GPU host, disable the CUDA kernels so that
#                        the CPU ones serve: --disabled-kernels=cuda.cutlass_sm90,cuda.stream_s8,cuda.cublaslt
# Logs go to $OUT (else ./cpu-serving-logs); a table is printed last.
set -uo pipefail

shapes="4096:4096,28672:4096,4096:14336"
ms="1,16,64,256"
streams=2
duration=3
port=50561
while [ $# -gt 0 ]; do
  case "$1" in
    --shapes) shapes="$2"; shift 2 ;;
    --shapes=*) shapes="${1#*=}"; shift ;;
    --m) ms="$2"; shift 2 ;;
    --m=*) ms="${1#*=}"; shift ;;
    --streams) streams="$2"; shift 2 ;;
    --streams=*) streams="${1#*=}"; shift ;;
    --duration) duration="$2"; shift 2 ;;
    --duration=*) duration="${1#*=}"; shift ;;
    --port) port="$2"; shift 2 ;;
    --port=*) port="${1#*=}"; shift ;;
    --help | -h) sed -n '2,/^set -uo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "cpu_serving: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

build="${QLINEAR_BUILD_DIR:-build}"
read -r -a server_cmd <<<"${QLINEAR_SERVER_CMD:-$build/server/qlinear-server}"
read -r -a cli_cmd <<<"${QLINEAR_CLI_CMD:-$build/client/qlinear-cli}"
read -r -a server_args <<<"${QLINEAR_SERVER_ARGS:-}"
log="${OUT:-$PWD/cpu-serving-logs}"
mkdir -p "$log"
if ! "${cli_cmd[@]}" --help >/dev/null 2>&1; then
  echo "cpu_serving: cannot run the client '${cli_cmd[*]}' (build first, or set QLINEAR_CLI_CMD)" >&2
  exit 1
fi
cli() { "${cli_cmd[@]}" --server="127.0.0.1:$port" "$@"; }
IFS=, read -r -a shape_list <<<"$shapes"
IFS=, read -r -a m_list <<<"$ms"

server_pid=
stop_server() {
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null
    wait "$server_pid" 2>/dev/null
    server_pid=
  fi
}
trap stop_server EXIT

# One run: mode "autotune" or "priority". Writes $log/<mode>.txt (load and bench output) and
# $log/<mode>.tsv (one line per result: kind, shape, key, value).
run_mode() {
  local mode="$1" flag=true
  [ "$mode" = priority ] && flag=false
  local out="$log/$mode.txt" tsv="$log/$mode.tsv"
  : >"$out"
  : >"$tsv"
  # A server already on the port makes this one exit (cannot listen), but would answer the health
  # check below, and the benchmark, in its place.
  if cli health >/dev/null 2>&1; then
    echo "cpu_serving: a server already answers on port $port; choose another with --port" >&2
    return 1
  fi
  "${server_cmd[@]}" --port="$port" --autotune="$flag" ${server_args[@]+"${server_args[@]}"} \
    >"$log/$mode-server.log" 2>&1 &
  server_pid=$!
  local waited=0
  until cli health >>"$out" 2>&1; do
    if ! kill -0 "$server_pid" 2>/dev/null || [ "$waited" -ge 60 ]; then
      echo "cpu_serving: the server did not come up ($mode); see $log/$mode-server.log" >&2
      tail -n 5 "$log/$mode-server.log" >&2
      server_pid=
      return 1
    fi
    sleep 1
    waited=$((waited + 1))
  done
  local s n k i loaded
  for s in "${shape_list[@]}"; do
    n="${s%%:*}"
    k="${s##*:}"
    for i in 1 2; do
      echo "\$ qlinear-cli load --name l${n}x${k}_$i --n $n --k $k" >>"$out"
      if ! loaded=$(cli load --name "l${n}x${k}_$i" --n "$n" --k "$k" 2>>"$out"); then
        echo "$loaded" >>"$out"
        echo "cpu_serving: loading a $n x $k layer failed ($mode); see $out" >&2
        return 1
      fi
      echo "$loaded" >>"$out"
      awk -v s="$s" -v i="$i" '/load time/ { printf "load\t%s\t%s\t%s\n", s, i, $3 }' \
        <<<"$loaded" >>"$tsv"
      if [ "$i" = 1 ]; then
        awk -v s="$s" '$1 == "M" && NF == 3 { printf "kernel\t%s\t%s\t%s\n", s, $2, $3 }' \
          <<<"$loaded" >>"$tsv"
      fi
    done
    local m res
    for m in "${m_list[@]}"; do
      echo "\$ qlinear-cli bench --layer l${n}x${k}_1 --m $m --streams $streams" >>"$out"
      if ! res=$(cli bench --layer "l${n}x${k}_1" --m "$m" --streams "$streams" --warmup 1 \
                   --duration "$duration" 2>>"$out"); then
        printf "failed\t%s\t%s\t%s\n" "$s" "$m" "see $out" >>"$tsv"
      fi
      echo "$res" >>"$out"
      awk -v s="$s" -v m="$m" '
        $1 == "throughput" { printf "rps\t%s\t%s\t%s\n", s, m, $2 }
        $1 == "server" && $2 == "p50" { printf "p50\t%s\t%s\t%s\n", s, m, $(NF - 1) }
        $1 == "kernels" { printf "ran\t%s\t%s\t%s\n", s, m, $2 }' <<<"$res" >>"$tsv"
    done
  done
  stop_server
}

echo "cpu_serving: ${shape_list[*]}; M ${m_list[*]}; $streams streams, ${duration} s each; logs in $log"
for mode in autotune priority; do
  echo "== $mode"
  run_mode "$mode" || exit 1
done

# The table: per shape, the load times, each bucket's kernel, and per M the served requests.
val() { awk -F'\t' -v a="$2" -v b="$3" -v c="$4" '$1 == a && $2 == b && $3 == c { print $4; exit }' "$log/$1.tsv"; }
status=0  # 1 where a bench failed
echo
echo "=========================== CPU serving: autotune / priority order ==========================="
echo "(the two runs one after the other: where both ran the same kernel, the ratio is run-to-run noise)"
for s in "${shape_list[@]}"; do
  echo "layer ${s/:/ x } (N x K)"
  printf "  load ms, first layer %s / %s; second layer of the shape %s / %s\n" \
    "$(val autotune load "$s" 1)" "$(val priority load "$s" 1)" \
    "$(val autotune load "$s" 2)" "$(val priority load "$s" 2)"
  for b in 1 2-16 17-64 65-256 257-1024 ">=1025"; do
    printf "  M %-9s %-18s %s\n" "$b" "$(val autotune kernel "$s" "$b")" "$(val priority kernel "$s" "$b")"
  done
  for m in "${m_list[@]}"; do
    a=$(val autotune rps "$s" "$m")
    p=$(val priority rps "$s" "$m")
    ratio=$(awk -v a="$a" -v p="$p" 'BEGIN { if (p > 0) printf "%.2f", a / p; else print "-" }')
    printf "  M=%-5s req/s %9s / %-9s (x%s)   server p50 us %s / %s   ran %s / %s\n" "$m" "$a" "$p" \
      "$ratio" "$(val autotune p50 "$s" "$m")" "$(val priority p50 "$s" "$m")" \
      "$(val autotune ran "$s" "$m")" "$(val priority ran "$s" "$m")"
    for mode in autotune priority; do
      failed=$(val "$mode" failed "$s" "$m")
      if [ -n "$failed" ]; then
        echo "    the $mode bench failed: $failed"
        status=1
      fi
    done
  done
done
exit "$status"
