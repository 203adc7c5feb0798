#!/usr/bin/env python3
"""timm models at a realistic size on a CUDA GPU: batch 16, 224x224, inference, random weights.
For each model named on the command line: kiln's and Inductor's error against eager (relative
to the output's scale, TF32 off), then eager, Inductor and kiln in interleaved rounds (median
of CUDA-event timings over 10 calls), and kiln's parts and fallbacks. With ``--profile N``,
also each backend's N most expensive GPU kernels per call (torch.profiler, 10 calls) and the
GPU time and launches per call: where kiln's time goes against Inductor's.

``--sweep`` takes every timm family of the model sweep (tests/models/zoo.py) at its own input
size (224 unless timm records another); ``--jobs N`` compiles in N processes at once while one
at a time holds the GPU for timing; ``--out`` collects a JSON line per model and ends with the
table, the geometric mean of kiln / Inductor and the models above 1.10.

    tests/gpu/with_pack.sh PACK python3 tests/bench/gpu/timm_quick.py [--profile 15] poolformer_s12 convnext_atto
    tests/gpu/with_pack.sh PACK python3 tests/bench/gpu/timm_quick.py --sweep --jobs 3 --deadline 480 --out t.jsonl
"""
import argparse
import collections
import contextlib
import fcntl
import json
import math
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "gpu"))  # tests/gpu
import kiln.torch as kt  # noqa: E402
import timm  # noqa: E402
from gpu_common import interleaved_ms, kilnd_binary, local_client  # noqa: E402


def kernel_profile(f, x, top: int, calls: int = 10) -> str:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            f(x)
        torch.cuda.synchronize()
    ms, count, aten = collections.Counter(), collections.Counter(), collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            name = e.name if e.name.startswith(("k", "triton")) else e.name[:60] + "..." + e.name[-90:]
            ms[name] += e.device_time / 1000.0 / calls
            count[name] += 1 / calls
        elif e.name.startswith("aten::"):
            aten[e.name] += 1 / calls
    lines = [f"    GPU {sum(ms.values()):.3f} ms/call in {sum(count.values()):.0f} launches"]
    lines += [f"    {v:8.4f} ms  x{count[k]:<4.0f} {k}" for k, v in ms.most_common(top)]
    lines.append("    aten ops per call: " + ", ".join(f"{k[6:]} {v:.0f}" for k, v in aten.most_common(top)))
    return "\n".join(lines)


def sweep_timm_names() -> list[str]:
    """The timm families of the model sweep's full list (tests/models/zoo.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models"))
    from zoo import specs

    return [s.name.split("/", 1)[1] for s in specs("full") if s.name.startswith("timm/")]


def input_side(m: torch.nn.Module) -> int:
    """The model's own input size where timm records one (256 for botnet26t_256), else 224."""
    size = (getattr(m, "pretrained_cfg", None) or {}).get("input_size") or (3, 224, 224)
    return int(size[-1])


def measure(name: str, client, profile: int, lock_path: Optional[str]) -> dict:
    """One model: errors, interleaved timing (under the file lock, so that shards compiling at
    the same time never time at once), parts and fallbacks."""
    torch._dynamo.reset()
    kt.reset_stats()
    m = timm.create_model(name, pretrained=False).eval()
    with torch.no_grad():  # a zero-initialised head (MLP-Mixer's) would make every output 0
        for p in m.parameters():
            if p.is_floating_point() and p.numel() > 1 and bool((p == p.reshape(-1)[0]).all()):
                p.add_(torch.randn_like(p) * max(abs(float(p.reshape(-1)[0])), 1.0) * 0.1)
    m = m.cuda()
    side = input_side(m)
    x = torch.randn(16, 3, side, side, device="cuda")
    fns = {"eager": m, "Inductor": torch.compile(m),
           "kiln": torch.compile(m, backend="kiln", options={"client": client})}
    want = m(x)
    errs = {k: ((f(x) - want).abs().max() / want.abs().max()).item() for k, f in fns.items() if k != "eager"}
    kt.wait()
    with exclusive(lock_path):
        med = interleaved_ms({k: lambda r, f=f, x=x: f(x) for k, f in fns.items()}, 5, 10, warmup=1)
        for k in ("Inductor", "kiln") if profile else ():
            print(f"  {name} {k}:\n{kernel_profile(fns[k], x, profile)}", flush=True)
    st = kt.stats()
    refused = sorted({f"{', '.join(p['ops'][:6])}: {str(p['error']).splitlines()[0][:240]}"
                      for g in kt.last_graphs() for p in g["parts"] if p["error"]})
    return {"model": name, "fallbacks": refused, "side": side, "err_kiln": errs["kiln"], "err_inductor": errs["Inductor"],
            "eager_ms": med["eager"], "inductor_ms": med["Inductor"], "kiln_ms": med["kiln"],
            "ratio": med["kiln"] / med["Inductor"], "parts": st["parts"], "failed": st["failed"]}


@contextlib.contextmanager
def exclusive(lock_path: Optional[str]):
    if lock_path is None:
        yield
        return
    with open(lock_path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def run_shard(names: list[str], args) -> None:
    """Measures ``names`` one after another, appending a JSON line per model to ``--out``."""
    warnings.simplefilter("ignore")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    deadline = time.monotonic() + args.deadline if args.deadline else None
    with local_client(kilnd_binary("pf"), "pf-") as client, torch.no_grad():
        for name in names:
            if deadline is not None and time.monotonic() > deadline:
                row = {"model": name, "status": "not run (deadline)"}
            else:
                try:
                    row = measure(name, client, args.profile, args.lock)
                    row["status"] = "ok"
                    print(f"{name} ({row['side']}²): err kiln {row['err_kiln']:.1e} ind {row['err_inductor']:.1e} | "
                          f"eager {row['eager_ms']:.3f} ind {row['inductor_ms']:.3f} kiln {row['kiln_ms']:.3f} ms, "
                          f"kiln/ind {row['ratio']:.3f} | parts {row['parts']} failed {row['failed']}", flush=True)
                    for why in row["fallbacks"]:
                        print(f"  refused: {why}", flush=True)
                except Exception as e:  # one model's failure is a row, not the end of the run
                    row = {"model": name, "status": f"error: {type(e).__name__}: {str(e).splitlines()[0][:300]}"}
                    print(f"{name}: {row['status']}", flush=True)
                torch.cuda.empty_cache()
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")


def summary(path: str) -> str:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    ok = [r for r in rows if r["status"] == "ok"]
    lines = ["| model | input | eager ms | Inductor ms | kiln ms | kiln / Inductor | parts | fallbacks |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in sorted(ok, key=lambda r: r["ratio"]):
        lines.append(f"| {r['model']} | {r['side']} | {r['eager_ms']:.3f} | {r['inductor_ms']:.3f} | {r['kiln_ms']:.3f} "
                     f"| {r['ratio']:.3f} | {r['parts']} | {r['failed']} |")
    if ok:
        gm = math.exp(statistics.fmean(math.log(r["ratio"]) for r in ok))
        worst = max(ok, key=lambda r: r["ratio"])
        lines.append(f"\n{len(ok)} models: kiln / Inductor geometric mean {gm:.3f}, "
                     f"worst {worst['model']} {worst['ratio']:.3f}, above 1.10: "
                     f"{[r['model'] for r in ok if r['ratio'] > 1.10] or 'none'}; "
                     f"fallbacks {sum(r['failed'] for r in ok)}")
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"{r['model']}: {r['status']}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*", help="timm model names (default with --sweep: every timm family of the sweep)")
    ap.add_argument("--sweep", action="store_true", help="every timm family of tests/models/zoo.py's full list")
    ap.add_argument("--skip", default="", help="comma-separated models to leave out (measured already)")
    ap.add_argument("--profile", type=int, default=0, help="kernels listed per backend (0: no profile)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="processes compiling at once; timing stays one at a time (a file lock)")
    ap.add_argument("--deadline", type=float, default=0, help="seconds after which no new model starts")
    ap.add_argument("--out", default="", help="JSON lines, one per model; a table and the geometric mean at the end")
    ap.add_argument("--lock", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    names = [n for n in (args.models or []) + (sweep_timm_names() if args.sweep else []) if n not in skip]
    if args.jobs <= 1:
        run_shard(names, args)
    else:
        if not args.out:
            ap.error("--jobs needs --out")
        lock = args.out + ".lock"
        procs = []
        for j in range(args.jobs):
            shard = names[j::args.jobs]
            cmd = [sys.executable, __file__, *shard, "--out", args.out, "--lock", lock, "--profile", str(args.profile),
                   "--deadline", str(args.deadline)]
            procs.append(subprocess.Popen(cmd))
        for p in procs:
            p.wait()
    if args.out:
        print(summary(args.out), flush=True)


if __name__ == "__main__":
    main()
