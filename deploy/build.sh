#!/usr/bin/env bash
# Configures and builds kiln into ./build (Ninja, one build dir). Used by run.sh and test.sh.
# Warnings are errors only in CI ($CI set) or when KILN_WERROR=ON is asked for: the compilers
# of users and packagers may warn where ours does not.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${KILN_BUILD_DIR:-build}"
BUILD_TYPE="${KILN_BUILD_TYPE:-RelWithDebInfo}"
if [ -n "${CI:-}" ]; then WERROR="${KILN_WERROR:-ON}"; else WERROR="${KILN_WERROR:-OFF}"; fi
if [ ! -f "$BUILD_DIR/build.ninja" ] || ! grep -qx "KILN_WERROR:BOOL=$WERROR" "$BUILD_DIR/CMakeCache.txt"; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="$BUILD_TYPE" -DKILN_WERROR="$WERROR" >/dev/null
fi
cmake --build "$BUILD_DIR" -j"$(nproc)" "$@"
