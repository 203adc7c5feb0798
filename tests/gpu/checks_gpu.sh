#!/usr/bin/env bash
# Every GPU correctness check in one run (no benchmarks): each script compares kiln's results
# with PyTorch or NumPy on real data and exits non-zero on a mismatch, a fallback it does not
# allow, or a check that ran nothing. Prints one PASS/FAIL line per check and exits 1 if any
# failed. Each check's log goes to $OUT (or a temporary folder) as check_NAME.log, and what the
# check writes to $OUT/NAME. A check that leaves a process running (a kilnd it started and never
# stopped) fails, and what it left is killed.
#
# ctest runs each check as `gpu_NAME` (label gpu), from a build tree or from tests/gpu configured
# on its own (tests/gpu/CMakeLists.txt), several at once with -j. Serially, on a machine with a
# carried pack:
#
#   tests/gpu/with_pack.sh PACK bash tests/gpu/checks_gpu.sh [NAME...]
#
# Names pick checks (default: all of them, about 20 minutes on an H200 one at a time).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
out="${OUT:-$(mktemp -d)}"
python="${PYTHON:-python3}"
: "${KILND:?set KILND to the kilnd binary (with_pack.sh does)}"

# name | time limit (s) | command
CHECKS=(
  "torch_backend|420|$python tests/gpu/torch_backend_gpu.py --checks-only"
  "models|420|$python tests/gpu/models_gpu.py --no-timing"
  "vision_cnn|480|$python tests/gpu/vision_gpu.py --no-timing --models resnet50,resnext50_32x4d,mobilenet_v2,mobilenet_v3_small,efficientnet_b0,regnet_y_400mf,shufflenet_v2_x1_0,squeezenet1_1"
  "vision_other|480|$python tests/gpu/vision_gpu.py --no-timing --models densenet121,googlenet,mnasnet0_5,convnext_tiny,swin_t,vit_b_16"
  "records|420|bash tests/gpu/records_gpu.sh"
  "dynamic|300|$python tests/gpu/dynamic_gpu.py"
  "embedding_grad|180|$python tests/gpu/embedding_grad_gpu.py"
  "random_graphs|300|$python tests/gpu/random_graphs_gpu.py"
  "jit_cuda|300|$python tests/gpu/jit_cuda_gpu.py"
  "core_loader|180|$python tests/gpu/cpp_loader_gpu.py"
  "layout|180|$python tests/gpu/layout_gpu.py"
  "bert_lengths|420|$python tests/gpu/bert_lengths_gpu.py"
  "load_inline|420|$python tests/gpu/load_inline_gpu.py"
)

want=" $* "
failed=0
ran=0
for entry in "${CHECKS[@]}"; do
  IFS='|' read -r name limit cmd <<<"$entry"
  if [ $# -gt 0 ] && [[ "$want" != *" $name "* ]]; then continue; fi
  ran=$((ran + 1))
  start=$SECONDS
  mkdir -p "$out/$name"
  # Its own session, so that whatever it leaves behind can be found by session id.
  # shellcheck disable=SC2086  # the command is a word list on purpose
  OUT="$out/$name" setsid timeout --signal=INT "$limit" $cmd >"$out/check_$name.log" 2>&1 &
  sid=$!
  wait $sid
  rc=$?
  took=$((SECONDS - start))
  left="$(pgrep -s "$sid" -a 2>/dev/null || true)"
  if [ -n "$left" ]; then
    pkill -KILL -s "$sid" 2>/dev/null || true
    echo "$name left processes running: $left" >>"$out/check_$name.log"
    [ $rc -eq 0 ] && rc=3
  fi
  if [ $rc -eq 0 ]; then
    echo "PASS $name (${took} s)"
  else
    failed=$((failed + 1))
    why="exit $rc"
    [ $rc -eq 124 ] || [ $rc -eq 130 ] && why="over ${limit} s"
    [ -n "$left" ] && why="$why, left processes running"
    echo "FAIL $name ($why, ${took} s): last lines of $out/check_$name.log"
    tail -n 15 "$out/check_$name.log" | sed 's/^/    /'
  fi
done
if [ $ran -eq 0 ]; then
  echo "checks_gpu: no check is named $*" >&2
  exit 2
fi
echo "checks_gpu: $((ran - failed)) of $ran passed"
[ $failed -eq 0 ]
