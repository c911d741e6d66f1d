#!/usr/bin/env bash
# Builds qlinear with CUDA (RelWithDebInfo, sm_90a by default) and packs what the GPU host runs
# into one folder: the CUDA test binary, the server's end-to-end test, the GPU benchmark, the server
# and, when they are built, the CLI and the CPU kernel tests and benchmark (packed as bin.tar.xz), plus the shared libraries the GPU host
# may lack (gRPC, Protobuf, Abseil, oneDNN, ...: every library they load but the C and C++
# runtimes and the CUDA driver and toolkit, which the host has), packed as lib.tar.gz, and the
# launcher `run`. scripts/gpu-remote.sh unpacks and runs them there (`bundle-gpu/run NAME ARGS`).
#
# Usage: scripts/gpu-bundle.sh
#
# Environment:
#   QLINEAR_BUILD_DIR        build directory (default: build-cuda)
#   QLINEAR_BUNDLE_DIR       bundle directory (default: bundle-gpu; ignored by git)
#   CMAKE_CUDA_ARCHITECTURES CUDA architectures (default: 90a, the H100/H200)
#   QLINEAR_BUNDLE_TOOL      a program to make the folder instead (called as TOOL DIR EXECUTABLE...;
#                            it must write DIR/bin, DIR/lib and DIR/run as bundle_runtime below)
#   JOBS                     parallel compile jobs (default: 2)
#   QLINEAR_SKIP_DEPS=1      do not run scripts/install-deps.sh first (it installs what a fresh
#                            machine lacks, the CUTLASS headers among it; nvcc must be there)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUILD="${QLINEAR_BUILD_DIR:-build-cuda}"
BUNDLE="${QLINEAR_BUNDLE_DIR:-bundle-gpu}"
ARCHS="${CMAKE_CUDA_ARCHITECTURES:-90a}"
TOOL="${QLINEAR_BUNDLE_TOOL:-}"
JOBS="${JOBS:-2}"

[ -z "$TOOL" ] || [ -x "$TOOL" ] || { echo "gpu-bundle: QLINEAR_BUNDLE_TOOL=$TOOL is not a program" >&2; exit 1; }

# DIR EXECUTABLE...: copies the executables to DIR/bin and every shared library they load to
# DIR/lib, but for those the GPU host has of its own (the C and C++ runtimes, newer there, and the
# CUDA driver and toolkit libraries under /usr/local/cuda/lib64; the CUDA runtime is linked in
# statically), and writes DIR/run, which runs bin/NAME with lib/ first on the library path.
bundle_runtime() {
  local out=$1 exe name path
  shift
  local host_has='^(linux-vdso|ld-linux|lib(c|m|dl|rt|pthread)\.so|libstdc\+\+|libgcc_s|libcuda\.so|libcudart|libcublas|libcufft|libcurand|libcusparse|libcusolver|libnvidia|libnvJitLink|libnvrtc)'
  mkdir -p "$out/bin" "$out/lib"
  for exe in "$@"; do
    cp -L "$exe" "$out/bin/"
    while read -r name path; do
      [[ $name =~ $host_has ]] || [ -e "$out/lib/$name" ] || cp -L "$path" "$out/lib/$name"
    done < <(ldd "$exe" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}')
  done
  cat >"$out/run" <<'LAUNCHER'
#!/usr/bin/env bash
here=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH="$here/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
name=$1
shift
exec "$here/bin/$name" "$@"
LAUNCHER
  chmod +x "$out/run"
}

if [ "${QLINEAR_SKIP_DEPS:-0}" != "1" ]; then
  scripts/install-deps.sh
fi

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
    kernels_cpu_avx512_vnni_gemm_test kernels_cpu_amx_gemm_test kernels_cpu_vnni_pack_test \
    kernels_cpu_quantize_simd_test; do
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
if [ -n "$TOOL" ]; then "$TOOL" "$BUNDLE" "${exes[@]}"; else bundle_runtime "$BUNDLE" "${exes[@]}"; fi
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
