#!/usr/bin/env bash
# Time to the first result of torch.compile(..., options={"async": True}) in fresh processes
# ($BACKENDS, default "kiln-async-tc eager"; kiln-async is kiln.torch.compile's eager first call),
# for two builds of the kiln wheel side by side: the pack's (B) and another one (A, e.g. the
# previous commit's), in alternating rounds against one kilnd (an async first call never waits
# for kilnd, so its cache does not matter). Uses tests/gpu/torch_backend_gpu.py's --child runs.
#
#   tests/gpu/with_pack.sh PACK bash tests/bench/gpu/first_result_ab.sh WHEEL_A WORKLOAD [ROUNDS]
set -euo pipefail
wheel_a="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
workload="${2:?workload, e.g. bert}"
rounds="${3:-3}"
cd "$(dirname "$0")/../../.."
work="$(mktemp -d)"
python3 -m pip install -q --no-deps --no-index --target "$work/site-a" "$wheel_a"
"$KILND" --listen 127.0.0.1:50778 --cache-dir "$work/kilnd" >"$work/kilnd.log" 2>&1 &
pid=$!
trap 'kill $pid' EXIT
sleep 2
export KILN_SERVER=127.0.0.1:50778 KILN_CACHE_DIR="$work/client"
for r in $(seq "$rounds"); do
  for build in A B; do
    if [ "$build" = A ]; then pp="$work/site-a:$PYTHONPATH"; else pp="$PYTHONPATH"; fi
    for backend in ${BACKENDS:-kiln-async-tc eager}; do
      line="$(PYTHONPATH="$pp" python3 tests/gpu/torch_backend_gpu.py --child "$workload" "$backend" | grep '^RESULT')"
      echo "round $r build $build $backend ${line#RESULT }"
    done
  done
done
