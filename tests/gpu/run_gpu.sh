#!/usr/bin/env bash
# kiln's GPU suite, for a machine with an NVIDIA GPU and PyTorch (nothing else of ours needed):
# runs every op-suite graph against PyTorch on fresh random data with poisoned outputs, then
# benchmarks kiln against PyTorch eager and torch.compile (Inductor), and prints a table
# (also $OUT/gpu_results.md when OUT is set).
#
# The kernels come prebuilt in tests/gpu/artifacts/ (tests/gpu/build_artifacts.sh, run where
# kiln is built; the folder is git-ignored, so carry it along with the working tree).
#
#   tests/gpu/run_gpu.sh [--suite-only | --bench-only] [--iters N] [--seed S]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${PYTHON:-python3}"
if [ ! -f "$here/artifacts/manifest.json" ]; then
  echo "run_gpu: no $here/artifacts; run tests/gpu/build_artifacts.sh where kiln is built, then bring the folder" >&2
  exit 2
fi
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
# The whole run stays well under 8 minutes; the limit only stops a hung run.
exec timeout --signal=INT 900 "$python" "$here/gpu_suite.py" "$@"
