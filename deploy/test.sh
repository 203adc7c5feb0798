#!/usr/bin/env bash
# Sets up everything, builds all targets and runs every test that needs no GPU: the C++
# suites through ctest, then the Python suite (which starts the real kilnd itself).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh
bash deploy/build.sh
BUILD_DIR="${KILN_BUILD_DIR:-build}"
(cd "$BUILD_DIR" && ctest --output-on-failure -LE gpu -j2 --timeout 900)
if [ -d tests/python ]; then
  export KILN_BINARY_DIR="$PWD/$BUILD_DIR"
  export PYTHONPATH="$PWD/client/python${PYTHONPATH:+:$PYTHONPATH}"
  python3 -m pytest -q -p no:cacheprovider tests/python
fi
# The mutation check on its small sample: the suite must catch deliberately planted bugs
# (tests/mutation; the full list: python3 tests/mutation/run_mutants.py).
if [ -f tests/mutation/run_mutants.py ] && [ "${KILN_MUTATION_SAMPLE:-1}" = 1 ]; then
  python3 tests/mutation/run_mutants.py --sample
fi
