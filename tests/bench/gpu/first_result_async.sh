#!/usr/bin/env bash
# Time to the first result in fresh processes, eager against kiln.torch.compile's async mode (the
# first call eager, traced in the background) and torch.compile(backend="kiln") async (traced on
# the caller's thread), alternating, against one kilnd with an empty cache per workload.
# Uses tests/gpu/torch_backend_gpu.py's --child runs; prints one RESULT line per process.
#
#   tests/gpu/with_pack.sh PACK bash tests/bench/gpu/first_result_async.sh [ROUNDS] [WORKLOAD...]
set -euo pipefail
rounds="${1:-2}"
shift || true
workloads=("${@:-bert}")
cd "$(dirname "$0")/../../.."
work="$(mktemp -d)"
for w in "${workloads[@]}"; do
  "$KILND" --listen 127.0.0.1:50779 --cache-dir "$work/kilnd-$w" >"$work/kilnd-$w.log" 2>&1 &
  pid=$!
  sleep 2
  for r in $(seq "$rounds"); do
    for backend in eager kiln-async kiln-async-tc; do
      line="$(KILN_SERVER=127.0.0.1:50779 KILN_CACHE_DIR="$work/client-$w-$r-$backend" \
              python3 tests/gpu/torch_backend_gpu.py --child "$w" "$backend" 2>/dev/null | grep '^RESULT')"
      echo "$w round $r $backend ${line#RESULT }"
    done
  done
  kill "$pid"
  wait "$pid" 2>/dev/null || true
done
