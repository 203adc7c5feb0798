#!/usr/bin/env python3
"""timm models at a realistic size on a CUDA GPU: batch 16, 224x224, inference, random weights.
For each model named on the command line: kiln's and Inductor's error against eager (relative
to the output's scale, TF32 off), then eager, Inductor and kiln in interleaved rounds (median
of CUDA-event timings over 10 calls), and kiln's parts and fallbacks. With ``--profile N``,
also each backend's N most expensive GPU kernels per call (torch.profiler, 10 calls) and the
GPU time and launches per call: where kiln's time goes against Inductor's.

    tests/gpu/with_pack.sh PACK python3 tests/bench/gpu/timm_quick.py [--profile 15] poolformer_s12 convnext_atto
"""
import argparse
import collections
import sys
import warnings
from pathlib import Path

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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--profile", type=int, default=0, help="kernels listed per backend (0: no profile)")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    with local_client(kilnd_binary("pf"), "pf-") as client, torch.no_grad():
        for name in args.models:
            torch._dynamo.reset()
            kt.reset_stats()
            m = timm.create_model(name, pretrained=False).cuda().eval()
            x = torch.randn(16, 3, 224, 224, device="cuda")
            fns = {"eager": m, "Inductor": torch.compile(m),
                   "kiln": torch.compile(m, backend="kiln", options={"client": client})}
            want = m(x)
            errs = {k: ((f(x) - want).abs().max() / want.abs().max()).item() for k, f in fns.items()}
            kt.wait()
            med = interleaved_ms({k: lambda r, f=f, x=x: f(x) for k, f in fns.items()}, 5, 10)
            st = kt.stats()
            print(f"{name}: err kiln {errs['kiln']:.1e} ind {errs['Inductor']:.1e} | eager {med['eager']:.3f} "
                  f"ind {med['Inductor']:.3f} kiln {med['kiln']:.3f} ms, kiln/ind {med['kiln']/med['Inductor']:.3f} "
                  f"| parts {st['parts']} failed {st['failed']}", flush=True)
            for k in ("Inductor", "kiln") if args.profile else ():
                print(f"  {k}:\n{kernel_profile(fns[k], x, args.profile)}", flush=True)


if __name__ == "__main__":
    main()
