#!/usr/bin/env bash
# Fuzzes the compiler frontend with libFuzzer for a bounded time and fails on any finding.
#
#   tests/fuzz/run.sh [SECONDS]        default 120 (or $KILN_FUZZ_SECONDS)
#
# Builds tests/fuzz/frontend_fuzzer with clang-14 (-fsanitize=fuzzer,address,undefined) in its
# own build folder ($KILN_FUZZ_BUILD_DIR, default build-fuzz), so the main build stays g++;
# writes a seed corpus from the golden, GPU-test, regression and random valid graphs; then runs
# the fuzzer niced. A finding (crash, sanitizer report, Internal status, timeout) is saved under
# build-fuzz/findings/; copy it into tests/fuzz/regressions/ once fixed, where
# fuzz_regression_test replays it in every build.
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_TO_RUN="${1:-${KILN_FUZZ_SECONDS:-120}}"
BUILD="${KILN_FUZZ_BUILD_DIR:-build-fuzz}"
JOBS="${KILN_FUZZ_JOBS:-2}"
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fsanitize=fuzzer-no-link -fno-omit-frame-pointer"

if [ ! -f "$BUILD/build.ninja" ]; then
  CC=clang-14 CXX=clang++-14 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
    -DCMAKE_C_FLAGS="$SAN" -DCMAKE_CXX_FLAGS="$SAN" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DKILN_FUZZ=ON -DKILN_WERROR=OFF >/dev/null
fi
cmake --build "$BUILD" --target frontend_fuzzer -j"$JOBS"

corpus="$BUILD/corpus"
work="$BUILD/corpus-work"
findings="$BUILD/findings"
rm -rf "$corpus" "$findings"
mkdir -p "$work" "$findings"
# The corpus writer imports the kiln package: the project's virtualenv has it and its needs.
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
"$PY" tests/fuzz/make_corpus.py "$corpus"

# Leak checking is off: the CUDA toolkit's NVRTC keeps allocations for the process's life.
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:symbolize=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
status=0
nice -n 10 "$BUILD/tests/fuzz/frontend_fuzzer" "$work" "$corpus" \
  -max_total_time="$SECONDS_TO_RUN" -timeout=20 -rss_limit_mb=4096 -max_len=65536 \
  -artifact_prefix="$findings/" -print_final_stats=1 >"$BUILD/fuzz.log" 2>&1 || status=$?
grep -E "^#[0-9]+ +(INITED|DONE)|stat::number_of_executed_units|ERROR|SUMMARY|contract|Test unit written|target" \
  "$BUILD/fuzz.log" || true
if [ "$status" -ne 0 ] || compgen -G "$findings/*" >/dev/null; then
  echo "fuzz: FINDINGS (exit $status); inputs in $findings, log in $BUILD/fuzz.log" >&2
  tail -n 60 "$BUILD/fuzz.log" >&2
  exit 1
fi
echo "fuzz: no findings in ${SECONDS_TO_RUN}s"
