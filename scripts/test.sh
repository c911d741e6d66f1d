#!/usr/bin/env bash
# Builds qlinear and runs the whole test suite with ctest; exits non-zero on any failure.
#
# Usage: scripts/test.sh [ctest arguments]
#   scripts/test.sh                  everything
#   scripts/test.sh -R ServerTest    only tests whose name matches
#
# Environment: everything scripts/build.sh reads (QLINEAR_BUILD_DIR, QLINEAR_SKIP_DEPS,
# QLINEAR_CUDA, JOBS), plus
#   QLINEAR_TEST_TIMEOUT  seconds one test may run before it counts as failed (default 300)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUILD="${QLINEAR_BUILD_DIR:-build}"
start=$(date +%s)

scripts/build.sh

echo "test: running ctest in $BUILD"
rc=0
# --no-tests=error: a build that registered no test is a failure, not a pass.
ctest --test-dir "$BUILD" --output-on-failure --no-tests=error \
  -j "${JOBS:-$(nproc)}" --timeout "${QLINEAR_TEST_TIMEOUT:-300}" "$@" || rc=$?

elapsed=$(($(date +%s) - start))
if [ "$rc" -eq 0 ]; then
  echo "test: PASS in ${elapsed}s (build and tests)"
else
  echo "test: FAIL (ctest exit $rc) in ${elapsed}s (build and tests)"
fi
exit "$rc"
