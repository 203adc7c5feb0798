#!/usr/bin/env bash
# Program records on a GPU: for each model of tests/python/records_child.py (inference, a training
# step, conv + batch norm) and each mode (default, reduce-overhead), a cold process and a warm one
# with an empty local folder against one kilnd; the warm process must rebuild every graph from
# its record and return the cold run's outputs and gradients bit for bit. The same again with
# kiln.torch.compile's precompiled models (precompile=1): the warm process must load the whole
# model without a graph reaching the backend. Exits 1 on a failure.
#
#   tests/gpu/with_pack.sh PACK bash tests/gpu/records_gpu.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
work="$(mktemp -d)"
python="${PYTHON:-python3}"
# A free loopback port, read back from kilnd's log: other checks may run beside this one.
"$KILND" --listen 127.0.0.1:0 --cache-dir "$work/kilnd" >"$work/kilnd.log" 2>&1 &
pid=$!
trap 'kill $pid; wait $pid' EXIT
address=""
for _ in $(seq 300); do
  address="$(sed -n 's/.*kilnd listening on \([0-9.]*:[0-9]*\).*/\1/p' "$work/kilnd.log" | head -1)"
  [ -n "$address" ] && break
  kill -0 $pid 2>/dev/null || { cat "$work/kilnd.log"; exit 1; }
  sleep 0.1
done
[ -n "$address" ] || { echo "records_gpu: kilnd never listened"; cat "$work/kilnd.log"; exit 1; }
export KILN_SERVER="$address" KILN_TORCH_RECORDS=1
status=0
for how in records precompile; do
for cmode in default reduce-overhead; do
  for model in infer train conv; do
    name="$how-$cmode-$model"
    extra=(device=cuda)
    if [ "$how" = precompile ]; then extra+=(batch=5 precompile=1); else extra+=(batch=4); fi
    [ "$cmode" = default ] || extra+=("compile_mode=$cmode")
    for run in cold warm; do
      mkdir -p "$work/$name-$run"
      KILN_CACHE_DIR="$work/cache-$name-$run" "$python" tests/python/records_child.py "$model" \
        "$work/$name-$run" "${extra[@]}"
    done
    "$python" - "$work/$name" "$how $cmode $model" "$how" <<'PY' || status=1
import json, sys, torch
base, name, how = sys.argv[1], sys.argv[2], sys.argv[3]
cold, warm = (json.load(open(f"{base}-{r}/result.json")) for r in ("cold", "warm"))
tc, tw = (torch.load(f"{base}-{r}/tensors.pt") for r in ("cold", "warm"))
s, w = cold["stats"], warm["stats"]
same = tc.keys() == tw.keys() and all(torch.equal(tc[k], tw[k]) for k in tc)
if how == "precompile":  # loaded whole: no graph reached the backend, nothing traced
    ok = w["precompile_hits"] == 1 and s["precompiles_stored"] == 1 and w["graphs"] == 0
else:
    ok = w["record_hits"] == s["graphs"] == s["records_stored"]
ok = ok and same and w["partition_s"] == 0 and w["failed"] == 0 and w["eager_calls"] == 0
print(f"{name:34s} graphs {s['graphs']} parts {s['parts']} stored {s['records_stored']} | warm: hits {w['record_hits']} "
      f"precompiled {w['precompile_hits']} kernel calls {w['kernel_calls']} replays {w['graph_replays']} "
      f"eager calls {w['eager_calls']} record_s {w['record_s']:.3f} precompile_s {w['precompile_s']:.3f} "
      f"| max err vs eager {warm['max_err']:.2e} | equal {same} -> {'ok' if ok else 'FAILED'}")
sys.exit(0 if ok else 1)
PY
  done
done
done
exit $status
