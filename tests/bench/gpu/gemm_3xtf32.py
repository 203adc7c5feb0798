#!/usr/bin/env python3
"""Float32 matrix products on tensor cores at float32's accuracy: the split-TF32 scheme, measured.

Without TF32, cuBLAS runs float32 products as SIMT FFMA kernels; a BERT-base training step's
GEMMs are ~25 ms of its ~34 ms on an H200, at 60-65% of the chip's FP32 FFMA peak, for kiln
and Inductor alike. Split TF32 ("3xTF32") writes each operand as big + small, where big is the
operand rounded to TF32 and small the (exact) remainder, and sums three TF32 tensor-core
products, big*big + big*small + small*big: the dropped small*small term is ~2^-22 of the result,
so the error stays at float32's level. This script measures, per BERT-base product shape, the
SIMT float32 time, one TF32 product's time (a fused split-TF32 kernel costs about three), the
three-product emulation through torch (splits included), and each result's error against
float64; it decides whether a kiln GEMM path built on the scheme is worth building.

    python3 tests/bench/gpu/gemm_3xtf32.py     # writes $OUT/gemm_3xtf32.md when OUT is set
"""
from __future__ import annotations

import os
import statistics
from pathlib import Path

import torch


def split_tf32(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x as big + small: big rounded to TF32's 10-bit mantissa (nearest), small the exact rest."""
    bits = x.view(torch.int32)
    big = ((bits + 0x1000) & -0x2000).view(torch.float32)
    return big, x - big


def mm_3xtf32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    (ab, as_), (bb, bs) = split_tf32(a), split_tf32(b)
    return torch.mm(ab, bs).addmm_(as_, bb).addmm_(ab, bb)


def time_ms(fn, iters: int = 30) -> float:
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for _ in range(5):
        fn()
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).abs().max() / want.abs().max()).item()


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    shapes = {  # label: (a shape, b shape, a transposed)
        "X[2048,768] W[768,768]": ((2048, 768), (768, 768), False),
        "X[2048,768] W[768,3072]": ((2048, 768), (768, 3072), False),
        "X[2048,3072] W[3072,768]": ((2048, 3072), (3072, 768), False),
        "dW: X^T[768,2048] dY[2048,768]": ((2048, 768), (2048, 768), True),
        "dW: X^T[768,2048] dY[2048,3072]": ((2048, 768), (2048, 3072), True),
    }
    rows = []
    for label, (sa, sb, t) in shapes.items():
        a = torch.randn(sa, device="cuda", generator=gen)
        b = torch.randn(sb, device="cuda", generator=gen)
        a = a.t() if t else a
        want = torch.mm(a.double(), b.double())
        torch.backends.cuda.matmul.allow_tf32 = False
        f32 = torch.mm(a, b)
        t_f32 = time_ms(lambda: torch.mm(a, b))
        torch.backends.cuda.matmul.allow_tf32 = True
        tf32 = torch.mm(a, b)
        t_tf32 = time_ms(lambda: torch.mm(a, b))
        x3 = mm_3xtf32(a, b)
        t_x3 = time_ms(lambda: mm_3xtf32(a, b))
        torch.backends.cuda.matmul.allow_tf32 = False
        flop = 2 * a.shape[0] * a.shape[1] * b.shape[1]
        rows.append([label, f"{t_f32:.3f} ({flop / t_f32 / 1e9:.0f})", f"{t_tf32:.3f}", f"{3 * t_tf32 / t_f32:.2f}",
                     f"{t_x3:.3f}", f"{t_x3 / t_f32:.2f}", f"{rel_err(f32, want):.1e}", f"{rel_err(tf32, want):.1e}",
                     f"{rel_err(x3, want):.1e}"])
        print(" | ".join(rows[-1]), flush=True)
    head = ["product", "f32 SIMT ms (TFLOP/s)", "TF32 ms", "3 x TF32 / f32", "split-TF32 via torch ms",
            "/ f32", "f32 error", "TF32 error", "split-TF32 error"]
    lines = [f"# Split-TF32 against float32 GEMMs on {torch.cuda.get_device_name()} (torch {torch.__version__})", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gemm_3xtf32.md").write_text(text)


if __name__ == "__main__":
    main()
