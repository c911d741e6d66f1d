#!/usr/bin/env bash
# Builds qlinear with CUDA (RelWithDebInfo, sm_90a by default) and packs what the GPU host runs
# into one folder: the CUDA test binary, the server's end-to-end test, the GPU benchmark, the server
# and, when they are built, the CLI and the CPU kernel tests and benchmark (packed as bin.tar.xz), plus the shared libraries the GPU host
# lacks (see ../shared/tools/bundle-runtime.sh), packed as lib.tar.gz. scripts/gpu-remote.sh
# unpacks and runs them there.
#
# Usage: scripts/gpu-bundle.sh
#
# Environment:
#   QLINEAR_BUILD_DIR        build directory (default: build-cuda)
#   QLINEAR_BUNDLE_DIR       bundle directory (default: bundle-gpu; ignored by git)
#   CMAKE_CUDA_ARCHITECTURES CUDA architectures (default: 90a, the H100/H200)
#   QLINEAR_BUNDLE_TOOL      bundle-runtime.sh (default: ../shared/tools/bundle-runtime.sh)
#   JOBS                     parallel compile jobs (default: 2)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUILD="${QLINEAR_BUILD_DIR:-build-cuda}"
BUNDLE="${QLINEAR_BUNDLE_DIR:-bundle-gpu}"
ARCHS="${CMAKE_CUDA_ARCHITECTURES:-90a}"
TOOL="${QLINEAR_BUNDLE_TOOL:-$ROOT/../shared/tools/bundle-runtime.sh}"
JOBS="${JOBS:-2}"

[ -x "$TOOL" ] || { echo "gpu-bundle: $TOOL not found (set QLINEAR_BUNDLE_TOOL)" >&2; exit 1; }

args=(-S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQLINEAR_CUDA=ON
      "-DCMAKE_CUDA_ARCHITECTURES=$ARCHS" -DQLINEAR_BUILD_TESTS=ON -DQLINEAR_BUILD_BENCH=ON)
[ -f "$BUILD/CMakeCache.txt" ] || args+=(-G Ninja)
echo "gpu-bundle: configuring $BUILD (CUDA archs $ARCHS)"
mkdir -p "$BUILD"
log="$BUILD/gpu-bundle-configure.log"
cmake "${args[@]}" >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
grep -E '^-- qlinear' "$log" || true

# Only what the GPU host runs; the CLI, and for the host's CPU the CPU kernel tests and benchmark,
# are optional.
targets=(qlinear_cuda_test qlinear_server_e2e_test qlinear_gpu_bench qlinear-server)
for optional in qlinear-cli qlinear_cpu_bench kernels_cpu_cpu_kernels_test \
    kernels_cpu_avx512_vnni_gemm_test kernels_cpu_vnni_pack_test; do
  if grep -qs "$optional" "$BUILD/build.ninja" "$BUILD/Makefile"; then
    targets+=("$optional")
  fi
done
echo "gpu-bundle: building ${targets[*]} with $JOBS jobs"
cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}"

exes=()
for t in "${targets[@]}"; do
  exe=$(find "$BUILD" -type f -name "$t" -perm -u+x | head -n 1)
  [ -n "$exe" ] || { echo "gpu-bundle: built $t but cannot find it under $BUILD" >&2; exit 1; }
  exes+=("$exe")
done

rm -rf "$BUNDLE"
"$TOOL" "$BUNDLE" "${exes[@]}"
# The bundle travels with the working tree (64 MiB in all): drop the binaries' debug info (keep
# the symbols, which crash reports print) and pack the binaries (xz: the CUDA ones hold kernel
# images that compress about 4x) and the libraries (oneDNN alone is about 40 MB);
# scripts/gpu-remote.sh unpacks them on the GPU host.
strip --strip-debug "$BUNDLE"/bin/*
tar -C "$BUNDLE" -cJf "$BUNDLE/bin.tar.xz" bin
tar -C "$BUNDLE" -czf "$BUNDLE/lib.tar.gz" lib
rm -rf "${BUNDLE:?}/lib" "${BUNDLE:?}/bin"
# The launcher unpacks them itself on first use, so `bundle-gpu/run BINARY` works on its own.
# Several launchers may start at once on a fresh host (a server and its client): each unpacks
# into a folder of its own and renames it into place, so none runs on a half-written file.
# shellcheck disable=SC2016
unpack='for d in lib bin; do [ -d "$here/$d" ] || { t=$(mktemp -d "$here/.$d.XXXXXX") \&\& tar -C "$t" -xf "$here/$d.tar."* \&\& { mv -T "$t/$d" "$here/$d" 2>/dev/null || [ -d "$here/$d" ]; }; r=$?; rm -rf "$t"; [ "$r" -eq 0 ]; } || exit 1; done'
sed -i "/^here=/a $unpack" "$BUNDLE/run"
grep -q 'for d in lib bin' "$BUNDLE/run" || { echo "gpu-bundle: could not patch $BUNDLE/run" >&2; exit 1; }
du -sh "$BUNDLE" | awk '{print "gpu-bundle: "$1" in '"$BUNDLE"' (binaries in bin.tar.xz, libraries in lib.tar.gz)"}'
