#!/usr/bin/env bash
# Configures and builds qlinear (server, CLI, tests, benchmarks) with CMake and Ninja.
#
# Usage: scripts/build.sh
#
# Environment:
#   QLINEAR_BUILD_DIR   build directory (default: build, relative to the repository root)
#   QLINEAR_SKIP_DEPS=1 do not run scripts/install-deps.sh first
#   QLINEAR_CUDA        AUTO (default: CUDA kernels if nvcc is found), ON or OFF
#   QLINEAR_CMAKE_ARGS  extra arguments for the CMake configure step
#   QLINEAR_SANITIZE    host sanitizers to build with (-fsanitize=...), e.g. address,undefined;
#                       for a check build of its own (QLINEAR_BUILD_DIR) without CUDA
#                       (QLINEAR_CUDA=OFF): the CUDA runtime does not run under AddressSanitizer
#   JOBS                parallel compile jobs (default: nproc)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUILD="${QLINEAR_BUILD_DIR:-build}"
JOBS="${JOBS:-$(nproc)}"

if [ "${QLINEAR_SKIP_DEPS:-0}" != "1" ]; then
  scripts/install-deps.sh
fi

args=(-S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo)
# The generator is fixed when a build directory is first configured; asking again for a
# different one is an error, so only a fresh directory gets -G.
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  args+=(-G Ninja)
fi
if [ -n "${QLINEAR_CUDA:-}" ]; then
  args+=("-DQLINEAR_CUDA=${QLINEAR_CUDA}")
fi
if [ -n "${QLINEAR_SANITIZE:-}" ]; then
  args+=("-DCMAKE_CXX_FLAGS=-fsanitize=${QLINEAR_SANITIZE} -fno-omit-frame-pointer"
         "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=${QLINEAR_SANITIZE}")
fi
if [ -n "${QLINEAR_CMAKE_ARGS:-}" ]; then
  # Word splitting is intended: several -D options in one variable.
  # shellcheck disable=SC2206
  args+=(${QLINEAR_CMAKE_ARGS})
fi

echo "build: configuring $BUILD"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! cmake "${args[@]}" >"$log" 2>&1; then
  cat "$log" >&2
  echo "build: CMake configure failed" >&2
  exit 1
fi
# Show what the configure step decided (CPU-only or CUDA, optional libraries).
grep -E '^-- qlinear' "$log" || true

echo "build: compiling with $JOBS jobs"
cmake --build "$BUILD" -j "$JOBS"
echo "build: done ($BUILD)"
