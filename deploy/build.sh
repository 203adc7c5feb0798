#!/usr/bin/env bash
# Configures and builds kiln into ./build (Ninja, one build dir). Used by run.sh and test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${KILN_BUILD_DIR:-build}"
BUILD_TYPE="${KILN_BUILD_TYPE:-RelWithDebInfo}"
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="$BUILD_TYPE" >/dev/null
fi
cmake --build "$BUILD_DIR" -j"$(nproc)" "$@"
