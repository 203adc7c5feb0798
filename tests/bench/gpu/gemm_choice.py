#!/usr/bin/env python3
"""Which cuBLAS kernel a BERT-base linear layer's matrix product gets, per way of calling it.

The same product (2048 rows; 768->768, 768->3072, 3072->768, f32) is called as ``F.linear``
with and without bias, ``torch.addmm`` (bias) and ``torch.mm`` of the transposed weight; each
call runs 20 times under the torch profiler and the kernels it launched are listed with their
mean GPU time. cuBLAS picks kernels by heuristics that see the call (bias epilogue or not, the
API path), so two spellings of one product can differ in speed.

    python3 tests/bench/gpu/gemm_choice.py     # writes $OUT/gemm_choice.md when OUT is set
"""

from __future__ import annotations

import collections
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile


def main() -> None:
    lines = [f"# cuBLAS kernels per call spelling ({torch.cuda.get_device_name()}, torch {torch.__version__})", "",
             "| K->N | call | kernels (mean µs) |", "| --- | --- | --- |"]
    for k, n in ((768, 768), (768, 3072), (3072, 768)):
        x = torch.randn(2048, k, device="cuda")
        x3 = x.view(16, 128, k)
        w = torch.randn(n, k, device="cuda")
        b = torch.randn(n, device="cuda")
        calls = {
            "F.linear(x, w)": lambda: F.linear(x, w),
            "F.linear(x, w, b)": lambda: F.linear(x, w, b),
            "F.linear(x3d, w, b)": lambda: F.linear(x3, w, b),
            "torch.mm(x, w.t())": lambda: torch.mm(x, w.t()),
            "torch.addmm(b, x, w.t())": lambda: torch.addmm(b, x, w.t()),
        }
        for name, fn in calls.items():
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    fn()
                torch.cuda.synchronize()
            us: collections.Counter[str] = collections.Counter()
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA:
                    us[e.name[:70]] += e.device_time / 20
            text = "; ".join(f"{kname} ({t:.1f})" for kname, t in us.most_common(3))
            lines.append(f"| {k}->{n} | `{name}` | {text} |")
            print(lines[-1], flush=True)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gemm_choice.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
