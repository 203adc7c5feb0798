#!/usr/bin/env bash
# Program records on a GPU: for each model of tests/python/records_child.py (inference, a training
# step, conv + batch norm) and each mode (default, reduce-overhead), a cold process and a warm one
# with an empty local folder against one kilnd; the warm process must rebuild every graph from
# its record and return the cold run's outputs and gradients bit for bit. Exits 1 on a failure.
#
#   tests/gpu/with_pack.sh PACK bash tests/gpu/records_gpu.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
work="$(mktemp -d)"
"$KILND" --listen 127.0.0.1:50779 --cache-dir "$work/kilnd" >"$work/kilnd.log" 2>&1 &
pid=$!
trap 'kill $pid' EXIT
sleep 2
export KILN_SERVER=127.0.0.1:50779 KILN_TORCH_RECORDS=1
status=0
for cmode in default reduce-overhead; do
  for model in infer train conv; do
    extra=(device=cuda batch=4)
    [ "$cmode" = default ] || extra+=("compile_mode=$cmode")
    for run in cold warm; do
      mkdir -p "$work/$cmode-$model-$run"
      KILN_CACHE_DIR="$work/cache-$cmode-$model-$run" python3 tests/python/records_child.py "$model" \
        "$work/$cmode-$model-$run" "${extra[@]}"
    done
    python3 - "$work/$cmode-$model" "$cmode $model" <<'PY' || status=1
import json, sys, torch
base, name = sys.argv[1], sys.argv[2]
cold, warm = (json.load(open(f"{base}-{r}/result.json")) for r in ("cold", "warm"))
tc, tw = (torch.load(f"{base}-{r}/tensors.pt") for r in ("cold", "warm"))
s, w = cold["stats"], warm["stats"]
same = tc.keys() == tw.keys() and all(torch.equal(tc[k], tw[k]) for k in tc)
ok = same and w["record_hits"] == s["graphs"] == s["records_stored"] and w["partition_s"] == 0 and w["failed"] == 0
print(f"{name:24s} graphs {s['graphs']} parts {s['parts']} stored {s['records_stored']} | warm: hits {w['record_hits']} "
      f"kernel calls {w['kernel_calls']} replays {w['graph_replays']} eager calls {w['eager_calls']} "
      f"record_s {w['record_s']:.3f} | equal {same} -> {'ok' if ok else 'FAILED'}")
sys.exit(0 if ok else 1)
PY
  done
done
exit $status
