#!/usr/bin/env bash
# Sets up everything, builds all targets and runs every test that needs no GPU: the C++
# suites through ctest, then the Python suite (which starts the real kilnd itself) in the
# project's virtualenv. In CI ($CI set) the release configuration's binaries are built too,
# so that `cmake --preset release` cannot rot.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh
bash deploy/build.sh
BUILD_DIR="${KILN_BUILD_DIR:-build}"
if [ -n "${CI:-}${KILN_TEST_RELEASE:-}" ]; then
  cmake --preset release >/dev/null
  cmake --build --preset release --target kilnd kilnc kiln_example
fi
# Formatting, clang's thread-safety analysis and the Python lint/type baseline (tests/lint).
bash tests/lint/run.sh "$BUILD_DIR"
# A machine with the CUDA toolkit must run the CUDA codegen tests, not skip them: a build that
# failed to find NVRTC there is an error (elsewhere those tests skip, naming the reason).
if [ -z "${KILN_REQUIRE_NVRTC+x}" ] && { command -v nvcc >/dev/null || [ -e /usr/local/cuda/include/nvrtc.h ]; }; then
  export KILN_REQUIRE_NVRTC=1
fi
# Likewise the build sandbox (bubblewrap, which setup.sh installs) and the disk-full tests
# (they mount a small tmpfs: root only) must run where they can: a skip there fails.
if [ -z "${KILN_REQUIRE_SANDBOX+x}" ] && command -v bwrap >/dev/null; then
  export KILN_REQUIRE_SANDBOX=1
fi
if [ -z "${KILN_REQUIRE_DISK_FULL+x}" ] && [ "$(id -u)" -eq 0 ]; then
  export KILN_REQUIRE_DISK_FULL=1
fi
# Under $CI a Python test skipped for a reason CI should never meet fails (tests/ci_skips.py).
(cd "$BUILD_DIR" && ctest --output-on-failure -LE gpu -j2 --timeout 900)
# The C++ tests' skips, named (ctest counts a binary with a skipped case as passed).
grep -h "^\[  SKIPPED \]" "$BUILD_DIR/Testing/Temporary/LastTest.log" 2>/dev/null | sort -u || true
if [ -d tests/python ]; then
  export KILN_BINARY_DIR="$PWD/$BUILD_DIR"
  export PYTHONPATH="$PWD/client/python${PYTHONPATH:+:$PYTHONPATH}"
  export KILN_WHEELHOUSE="${KILN_WHEELHOUSE:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/wheels}"
  .venv/bin/python -m pytest -q -rs -p no:cacheprovider tests/python
fi
# The container image (docs/operations.md, "The container image"): a Debian base made by
# debootstrap, deploy/Containerfile built with podman, kilnd started from it and asked for its
# health and compiles (deploy/container/build-and-run.sh). Root only. About 6 minutes from
# nothing here, 4.5 when only the checkout changed (stage 1 compiles kilnd again), seconds when
# nothing did. KILN_CONTAINER_CHECK=0 leaves it out.
if [ "${KILN_CONTAINER_CHECK:-1}" = 0 ]; then
  echo "container check: left out (KILN_CONTAINER_CHECK=0)"
elif [ "$(id -u)" -ne 0 ]; then
  echo "container check: left out (needs root)"
else
  bash deploy/container/build-and-run.sh
fi
# The frontend under libFuzzer (clang build of its own, build-fuzz/), bounded: fails on findings.
bash tests/fuzz/run.sh "${KILN_FUZZ_SECONDS:-120}"
# The mutation check: the suite must catch every deliberately planted bug (tests/mutation,
# one per subsystem or more; all 42 take about 11 minutes here, the compiler cache warm
# from the build above). KILN_MUTATIONS=sample runs two of them, 0 none.
if [ -f tests/mutation/run_mutants.py ]; then
  case "${KILN_MUTATIONS:-all}" in
    all) .venv/bin/python tests/mutation/run_mutants.py ;;
    sample) .venv/bin/python tests/mutation/run_mutants.py --sample ;;
  esac
fi
