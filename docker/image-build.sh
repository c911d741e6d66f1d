#!/usr/bin/env bash
# Builds qlinear-server and qlinear-cli inside an image's build stage and lays out what the
# runtime stage copies. Both Dockerfiles run this same script; only the environment differs.
#
# Usage: docker/image-build.sh SOURCE_DIR BUILD_DIR OUT_DIR
#
# Environment:
#   QLINEAR_CUDA        OFF (default) or ON: build the CUDA kernels
#   CUDA_ARCHITECTURES  CMAKE_CUDA_ARCHITECTURES when QLINEAR_CUDA=ON (default: CMake's, 90a)
#   BUILD_TYPE          CMake build type (default RelWithDebInfo, as scripts/build.sh)
#   JOBS                parallel compile jobs (default 2)
#   QLINEAR_BUILD_COMMIT  the commit the binaries report (--version), where SRC_DIR has no .git
#                       (a full hash is shortened to 12 digits)
#
# OUT_DIR receives:
#   usr/local/bin/qlinear-server, usr/local/bin/qlinear-cli   (debug info stripped)
#   usr/local/share/qlinear/runtime-packages.txt
#       the distribution packages that own every shared library the two binaries load, found
#       with ldd and dpkg -S; the runtime stage installs exactly these.
set -euo pipefail

if [ $# -ne 3 ]; then
  sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
src="$1"
build="$2"
out="$3"
jobs="${JOBS:-2}"

args=(-S "$src" -B "$build" -G Ninja
  "-DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo}"
  -DQLINEAR_BUILD_TESTS=OFF -DQLINEAR_BUILD_BENCH=OFF
  "-DQLINEAR_CUDA=${QLINEAR_CUDA:-OFF}")
if [ "${QLINEAR_CUDA:-OFF}" = "ON" ] && [ -n "${CUDA_ARCHITECTURES:-}" ]; then
  args+=("-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES}")
fi
# cpu.onednn is written against the oneDNN 2.x API (Debian 12 ships 2.6); a distribution with
# oneDNN 3.x builds without that kernel rather than failing.
dnnl_version="$(dpkg-query -W -f='${Version}' libdnnl-dev 2>/dev/null || true)"
case "$dnnl_version" in
  "" | 0.* | 1.* | 2.*) ;;
  *)
    echo "image-build: oneDNN $dnnl_version is not 2.x; building without cpu.onednn"
    args+=(-DCMAKE_DISABLE_FIND_PACKAGE_dnnl=ON)
    ;;
esac

# cuda.cutlass_sm90 is compiled from the CUTLASS headers of the PyPI package nvidia-cutlass
# (headers only: --no-deps). Without them (no pip, no index) the build leaves that kernel out,
# says so at configure time, and cuda.cublaslt serves.
if [ "${QLINEAR_CUDA:-OFF}" = "ON" ]; then
  if python3 -m pip --version >/dev/null 2>&1; then
    PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-cache-dir --disable-pip-version-check \
      --no-deps nvidia-cutlass==4.2.0.0 ||
      echo "image-build: could not install the CUTLASS headers; building without cuda.cutlass_sm90"
  else
    echo "image-build: no pip; building without cuda.cutlass_sm90"
  fi
fi

echo "image-build: cmake ${args[*]}"
cmake "${args[@]}"
cmake --build "$build" -j "$jobs" --target qlinear-server qlinear-cli

install -d "$out/usr/local/bin" "$out/usr/local/share/qlinear"
bins=()
for b in "$build/server/qlinear-server" "$build/client/qlinear-cli"; do
  install -m 0755 "$b" "$out/usr/local/bin/"
  bins+=("$out/usr/local/bin/$(basename "$b")")
  strip --strip-debug "${bins[-1]}"
done

# The package owning a library: dpkg records /usr/lib/... or /lib/... depending on the
# distribution's merged-/usr state, so try the path ldd printed, its /usr twin and its target.
owner() {
  local lib="$1" p
  for p in "$lib" "/usr$lib" "$(readlink -f "$lib")"; do
    if dpkg-query -S "$p" 2>/dev/null | head -n1 | cut -d: -f1; then
      return 0
    fi
  done
  echo "image-build: no package owns $lib" >&2
  return 1
}

libs="$(ldd "${bins[@]}" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u)"
: "${libs:?image-build: ldd found no shared libraries}"
if ldd "${bins[@]}" | grep -F 'not found'; then
  echo "image-build: unresolved libraries" >&2
  exit 1
fi
pkgs="$(for lib in $libs; do owner "$lib" || exit 1; done)"
printf '%s\n' "$pkgs" | sort -u >"$out/usr/local/share/qlinear/runtime-packages.txt"
echo "image-build: runtime packages: $(tr '\n' ' ' <"$out/usr/local/share/qlinear/runtime-packages.txt")"
