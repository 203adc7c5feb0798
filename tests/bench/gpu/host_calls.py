#!/usr/bin/env python3
"""Host time of the torch calls a rewritten BERT-base step makes, one by one, on a CUDA GPU.

Each call is timed while the GPU is kept busy by a sleep kernel queued first, so that no call
waits for the device: the figure is what the host spends (Python, dispatcher, allocator,
cuBLAS setup, driver launch). Shapes are BERT-base's at batch 16, sequence 128 (2048 rows of
768, an FFN of 3072). Medians over rounds of 50 calls.

    python3 tests/bench/gpu/host_calls.py     # prints a table; writes $OUT/host_calls.md when OUT is set
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "gpu"))  # tests/gpu
from gpu_common import host_ms  # noqa: E402


def busy_us(fn: Callable[[], Any], calls: int = 50, rounds: int = 7) -> float:
    """Host µs per call of ``fn``, the GPU kept busy (gpu_common.host_ms's method)."""
    ms, _ = host_ms(lambda i: fn(), calls, rounds=rounds, step_ms=1.0)
    return ms * 1000


def main() -> None:
    dev = "cuda"
    x3 = torch.randn(16, 128, 768, device=dev)
    x2 = x3.view(2048, 768)
    w = torch.randn(3072, 768, device=dev)
    b = torch.randn(3072, device=dev)
    wt = w.t()
    out = torch.empty(2048, 3072, device=dev)
    q = torch.randn(16, 12, 128, 64, device=dev)
    mask = torch.zeros(16, 1, 128, 128, device=dev).expand(16, 12, 128, 128)
    from torch._C._dynamo.guards import _empty_strided_cuda, _reinterpret_tensor

    rows = [
        ("F.linear(x2d, w, b)", lambda: F.linear(x2, w, b)),
        ("F.linear(x2d, w)", lambda: F.linear(x2, w)),
        ("F.linear(x3d, w, b)", lambda: F.linear(x3, w, b)),
        ("F.linear(x3d, w)", lambda: F.linear(x3, w)),
        ("torch.addmm(b, x2d, w.t())", lambda: torch.addmm(b, x2, w.t())),
        ("torch.addmm(b, x2d, wt) wt prebuilt", lambda: torch.addmm(b, x2, wt)),
        ("torch.mm(x2d, wt)", lambda: torch.mm(x2, wt)),
        ("torch.mm(x2d, wt, out=)", lambda: torch.mm(x2, wt, out=out)),
        ("torch.addmm(b, x2d, wt, out=)", lambda: torch.addmm(b, x2, wt, out=out)),
        ("_reinterpret_tensor(w, (768, 3072), (1, 768), 0)", lambda: _reinterpret_tensor(w, (768, 3072), (1, 768), 0)),
        ("torch.mm(x2d, reinterpret(w))", lambda: torch.mm(x2, _reinterpret_tensor(w, (768, 3072), (1, 768), 0))),
        ("_empty_strided_cuda((2048, 3072), (3072, 1), f32)",
         lambda: _empty_strided_cuda((2048, 3072), (3072, 1), torch.float32)),
        ("torch.empty((2048, 3072), device=cuda)", lambda: torch.empty((2048, 3072), device=dev)),
        ("aten._scaled_dot_product_efficient_attention (mask)",
         lambda: torch.ops.aten._scaled_dot_product_efficient_attention.default(q, q, q, mask, False, scale=0.125)),
        ("F.scaled_dot_product_attention (mask)", lambda: F.scaled_dot_product_attention(q, q, q, attn_mask=mask)),
        ("x.view(16, 128, 12, 64).permute(0, 2, 1, 3)", lambda: x3.view(16, 128, 12, 64).permute(0, 2, 1, 3)),
        ("x + 1 (a pointwise launch)", lambda: x3 + 1),
    ]
    lines = [f"# Host µs per call, GPU kept busy ({torch.cuda.get_device_name()}, torch {torch.__version__})", "",
             "| call | host µs |", "| --- | ---: |"]
    with torch.no_grad():
        for name, fn in rows:
            fn()
            us = busy_us(fn)
            lines.append(f"| `{name}` | {us:.1f} |")
            print(lines[-1], flush=True)
    text = "\n".join(lines)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "host_calls.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
