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
# The mutation check on its small sample: the suite must catch deliberately planted bugs
# (tests/mutation; every mutant: .venv/bin/python tests/mutation/run_mutants.py).
if [ -f tests/mutation/run_mutants.py ] && [ "${KILN_MUTATION_SAMPLE:-1}" = 1 ]; then
  .venv/bin/python tests/mutation/run_mutants.py --sample
fi
