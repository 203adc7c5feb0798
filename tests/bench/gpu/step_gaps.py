#!/usr/bin/env python3
"""Where a compiled BERT-base inference step leaves the GPU idle, per backend (Inductor, kiln):
profiles a few steps (torch profiler, CPU and CUDA), then reports each step's wall time, GPU
busy time, and the idle gaps between kernels grouped by the host op that launched the kernel
ending each gap (the op the GPU waited for), with the host ops' total times. A host-bound
step shows as gaps; this names the host work behind them.

    tests/gpu/with_pack.sh PACK python3 tests/bench/gpu/step_gaps.py [--seq 128] [--steps 3]

Writes $OUT/step_gaps.md when $OUT is set. Needs transformers.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "gpu"))  # tests/gpu
from gpu_common import private_kilnd  # noqa: E402


def innermost_op(cpu_ops: list[dict[str, Any]], ts: float) -> str:
    """The innermost CPU op (of ``cpu_ops``, sorted by start) running at time ``ts``: a launch's
    caller."""
    best = None
    for o in cpu_ops:
        if o["ts"] > ts:
            break
        if o["ts"] + o["dur"] >= ts and (best is None or o["dur"] <= best["dur"]):
            best = o
    return best["name"] if best else "(none)"


def analyse(trace: dict[str, Any], steps: int) -> list[str]:
    ev = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    kernels = sorted((e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    runtime = {e["args"].get("correlation"): e for e in ev if e.get("cat") == "cuda_runtime" or e.get("cat") == "cuda_driver"}
    cpu_ops = sorted((e for e in ev if e.get("cat") == "cpu_op"), key=lambda e: e["ts"])
    lines = []
    if not kernels:
        return ["(no kernels in the trace)"]
    busy = sum(k["dur"] for k in kernels)
    span = kernels[-1]["ts"] + kernels[-1]["dur"] - kernels[0]["ts"]
    lines.append(f"GPU span {span / 1e3 / steps:.3f} ms per step, busy {busy / 1e3 / steps:.3f} ms, "
                 f"{len(kernels) / steps:.0f} kernels per step")
    gaps: collections.Counter[str] = collections.Counter()
    counts: collections.Counter[str] = collections.Counter()
    end = kernels[0]["ts"] + kernels[0]["dur"]

    def host_op(ts: float) -> str:
        return innermost_op(cpu_ops, ts)

    for k in kernels[1:]:
        gap = k["ts"] - end
        if gap > 5:
            rt = runtime.get(k["args"].get("correlation"))
            name = host_op(rt["ts"]) if rt else "(no launch record)"
            gaps[name] += gap
            counts[name] += 1
        end = max(end, k["ts"] + k["dur"])
    total = sum(gaps.values())
    lines.append(f"idle gaps over 5 us: {total / 1e3 / steps:.3f} ms per step")
    lines += ["", "| idle ms per step | gaps per step | kernel launched by |", "| ---: | ---: | --- |"]
    for name, g in gaps.most_common(20):
        lines.append(f"| {g / 1e3 / steps:.3f} | {counts[name] / steps:.1f} | `{name[:120]}` |")
    host: collections.Counter[str] = collections.Counter()
    nhost: collections.Counter[str] = collections.Counter()
    for o in cpu_ops:
        host[o["name"]] += o["dur"]
        nhost[o["name"]] += 1
    lines += ["", "| host ms per step (incl. children) | calls per step | host op |", "| ---: | ---: | --- |"]
    for name, d in host.most_common(25):
        lines.append(f"| {d / 1e3 / steps:.3f} | {nhost[name] / steps:.1f} | `{name[:120]}` |")
    return lines


def timeline(trace: dict[str, Any], count: int) -> list[str]:
    """The first ``count`` kernels of the step marked ``timeline_step``: host launch time and GPU
    start, both from the step's start on the host, the kernel's duration and the host op that
    launched it. Where a kernel starts right at its launch, the GPU was waiting for the host."""
    ev = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    marks = [e for e in ev if e.get("name") == "timeline_step" and e.get("cat") == "user_annotation"]
    if not marks:
        return ["(no timeline step in the trace)"]
    t0 = marks[0]["ts"]
    runtime = {e["args"].get("correlation"): e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    cpu_ops = sorted((e for e in ev if e.get("cat") == "cpu_op" and e["ts"] >= t0), key=lambda e: e["ts"])
    kernels = sorted((e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e["ts"] >= t0),
                     key=lambda e: e["ts"])[:count]

    def host_op(ts: float) -> str:
        return innermost_op(cpu_ops, ts)

    lines = [f"First {len(kernels)} kernels of one step from an idle GPU (µs from the step's start):", "",
             "| launched | GPU start | GPU µs | kernel | launched by |", "| ---: | ---: | ---: | --- | --- |"]
    for k in kernels:
        rt = runtime.get(k["args"].get("correlation"))
        launched = f"{rt['ts'] - t0:.0f}" if rt else "?"
        lines.append(f"| {launched} | {k['ts'] - t0:.0f} | {k['dur']:.0f} | `{k['name'][:60]}` | "
                     f"`{host_op(rt['ts'])[:60] if rt else '?'}` |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--backends", default="inductor,kiln")
    ap.add_argument("--timeline", type=int, default=0,
                    help="also list the first N kernels of one step started from an idle GPU: when each "
                         "was launched and when it ran, from the step's start")
    ap.add_argument("--warm", default="", help="sequence lengths run first (e.g. 128,96: the length becomes symbolic)")
    opts = ap.parse_args()
    import kiln.torch
    from transformers import BertConfig, BertModel

    daemon, work = private_kilnd("step_gaps.py", "kiln-gaps-")
    out = Path(os.environ.get("OUT") or work)
    lines = [f"# Idle GPU in a BERT-base inference step on {torch.cuda.get_device_name()}, batch 16, "
             f"sequence {opts.seq}" + (f" (after lengths {opts.warm})" if opts.warm else ""), ""]
    try:
        torch.manual_seed(0)
        model = BertModel(BertConfig()).cuda().eval()
        ids = torch.randint(0, 30522, (16, opts.seq), device="cuda")
        mask = torch.ones(16, opts.seq, dtype=torch.long, device="cuda")
        for be in opts.backends.split(","):
            torch._dynamo.reset()
            cm = torch.compile(model, backend=be)
            with torch.no_grad():
                for T in [int(t) for t in opts.warm.split(",") if t]:
                    cm(input_ids=ids[:, :1].expand(16, T).contiguous(), attention_mask=mask[:, :1].expand(16, T).contiguous())
                for _ in range(3):
                    cm(input_ids=ids, attention_mask=mask)
                kiln.torch.wait()
                from kiln.torch import native

                native.wait(600)  # the parts' native call path, not a build running beside
                for _ in range(10):
                    cm(input_ids=ids, attention_mask=mask)
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(20):
                    cm(input_ids=ids, attention_mask=mask)
                end.record()
                torch.cuda.synchronize()
                per = start.elapsed_time(end) / 20
                acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
                with torch.profiler.profile(activities=acts) as prof:
                    for _ in range(opts.steps):
                        cm(input_ids=ids, attention_mask=mask)
                    torch.cuda.synchronize()
                    if opts.timeline:  # one step from an idle GPU, as a timed step starts
                        with torch.profiler.record_function("timeline_step"):
                            cm(input_ids=ids, attention_mask=mask)
                        torch.cuda.synchronize()
            path = work / f"trace_{be}.json"
            prof.export_chrome_trace(str(path))
            lines += [f"## {be}: {per:.3f} ms per step unprofiled", ""]
            trace = json.loads(path.read_text())
            lines += analyse(trace, opts.steps)
            if opts.timeline:
                lines += [""] + timeline(trace, opts.timeline)
            lines.append("")
            print("\n".join(lines), flush=True)
    finally:
        daemon.stop()
        (out / "step_gaps.md").write_text("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
