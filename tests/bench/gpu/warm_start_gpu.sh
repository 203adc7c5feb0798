#!/usr/bin/env bash
# Warm start on a GPU machine: the first compiled result of BERT-base inference, a BERT-base
# training step (AdamW) and resnet18 inference in fresh processes, kiln (warm kilnd and local
# folder; warm kilnd and an empty local folder, as on another machine; without program records;
# precompiled models, with a full and an empty local folder) against Inductor with its caches
# warm and PyTorch's own AOT precompile loaded from its file, alternating rounds
# (tests/bench/torch_warm_bench.py). Logs go to $OUT when it is set.
#
#   tests/gpu/with_pack.sh PACK bash tests/bench/gpu/warm_start_gpu.sh [REPEAT] [WORKLOADS]
# $BACKENDS overrides torch_warm_bench.py's backend list.
set -euo pipefail
repeat="${1:-3}"
workloads="${2:-bert bert-train resnet18}"
cd "$(dirname "$0")/../../.."
out="${OUT:-$(mktemp -d)}"
for w in $workloads; do
  case "$w" in
    resnet18) size=(--batch 16) ;;
    *) size=(--hidden 768 --layers 12 --batch 16 --seq 128) ;;
  esac
  echo "== $w"
  python3 tests/bench/torch_warm_bench.py --device cuda --workload "$w" "${size[@]}" --repeat "$repeat" \
    ${BACKENDS:+--backends "$BACKENDS"} \
    2>&1 | tee "$out/warm_$w.log" | grep -v '^kiln.* warm [0-9]*: \|^inductor warm [0-9]*: \|^torch-aot warm [0-9]*: ' || true
done
