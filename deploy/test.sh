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
# A machine with the CUDA toolkit must run the CUDA codegen tests, not skip them: a build that
# failed to find NVRTC there is an error (elsewhere those tests skip, naming the reason).
if [ -z "${KILN_REQUIRE_NVRTC+x}" ] && { command -v nvcc >/dev/null || [ -e /usr/local/cuda/include/nvrtc.h ]; }; then
  export KILN_REQUIRE_NVRTC=1
fi
(cd "$BUILD_DIR" && ctest --output-on-failure -LE gpu -j2 --timeout 900)
if [ -d tests/python ]; then
  export KILN_BINARY_DIR="$PWD/$BUILD_DIR"
  export PYTHONPATH="$PWD/client/python${PYTHONPATH:+:$PYTHONPATH}"
  export KILN_WHEELHOUSE="${KILN_WHEELHOUSE:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/wheels}"
  .venv/bin/python -m pytest -q -rs -p no:cacheprovider tests/python
fi
# The frontend under libFuzzer (clang build of its own, build-fuzz/), bounded: fails on findings.
bash tests/fuzz/run.sh "${KILN_FUZZ_SECONDS:-120}"
# The mutation check: the suite must catch every deliberately planted bug (tests/mutation,
# one per subsystem or more; all of them take about 5 minutes here, the compiler cache warm
# from the build above). KILN_MUTATIONS=sample runs two of them, 0 none.
if [ -f tests/mutation/run_mutants.py ]; then
  case "${KILN_MUTATIONS:-all}" in
    all) .venv/bin/python tests/mutation/run_mutants.py ;;
    sample) .venv/bin/python tests/mutation/run_mutants.py --sample ;;
  esac
fi
