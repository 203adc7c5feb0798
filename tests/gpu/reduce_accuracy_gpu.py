#!/usr/bin/env python3
"""Accuracy and speed of kiln's CUDA reductions on long f32 sums, against torch on the same GPU.

Each workload (row sums, column sums, a whole-tensor sum, variances, a batch-norm statistic
over N, H, W of an NCHW tensor, and the same over an NHWC one) is compiled with
``kiln.jit(target="cuda")`` and run on positive-biased random data (mean 0.5: the running sum
grows, which is what rounds its low bits away). The relative error of kiln's result and of
torch's against a float64 computation of the same data is reported, with their ratio; kiln
must stay within ``max(4 x torch's error, 2e-7)``. Kernel times: 20 calls captured in a CUDA
graph and replayed, CUDA events, median of the replays, kiln and torch side by side.

Starts its own kilnd from ``$KILND``; prints a table, writes ``$OUT/reduce_accuracy_gpu.md``
when ``$OUT`` is set. Exits 1 when a result is outside the bound.

    KILND=build/server/kilnd PYTHONPATH=client/python python3 tests/gpu/reduce_accuracy_gpu.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kiln  # noqa: E402
from gpu_common import graph_time_us, kilnd_binary, local_client, report  # noqa: E402


def rel_err(got: torch.Tensor, exact: np.ndarray) -> float:
    g = got.detach().double().cpu().numpy()
    return float(np.max(np.abs(g - exact) / np.maximum(np.abs(exact), 1e-30)))


WORKLOADS: list[tuple[str, tuple[int, ...], Callable[[Any], Any], Callable[[torch.Tensor], torch.Tensor],
                      Callable[[np.ndarray], np.ndarray]]] = [
    ("row sum", (64, 200_000), lambda a: a.sum(axis=1), lambda t: t.sum(1), lambda x: x.sum(1)),
    ("row sum", (4096, 1000), lambda a: a.sum(axis=1), lambda t: t.sum(1), lambda x: x.sum(1)),
    ("row var", (64, 200_000), lambda a: a.var(axis=1), lambda t: t.var(1, unbiased=False), lambda x: x.var(1)),
    ("column sum", (200_000, 64), lambda a: a.sum(axis=0), lambda t: t.sum(0), lambda x: x.sum(0)),
    ("column sum", (20_000, 1000), lambda a: a.sum(axis=0), lambda t: t.sum(0), lambda x: x.sum(0)),
    ("column sum", (1_000_000, 3), lambda a: a.sum(axis=0), lambda t: t.sum(0), lambda x: x.sum(0)),
    ("column var", (200_000, 64), lambda a: a.var(axis=0), lambda t: t.var(0, unbiased=False), lambda x: x.var(0)),
    ("whole sum", (16_000_000,), lambda a: a.sum(), lambda t: t.sum(), lambda x: x.sum()),
    ("NCHW sum over N,H,W", (16, 256, 14, 14), lambda a: a.sum(axis=(0, 2, 3)), lambda t: t.sum((0, 2, 3)),
     lambda x: x.sum((0, 2, 3))),
    ("NCHW sum over N,H,W", (64, 64, 56, 56), lambda a: a.sum(axis=(0, 2, 3)), lambda t: t.sum((0, 2, 3)),
     lambda x: x.sum((0, 2, 3))),
    ("NHWC sum over N,H,W", (64, 56, 56, 64), lambda a: a.sum(axis=(0, 1, 2)), lambda t: t.sum((0, 1, 2)),
     lambda x: x.sum((0, 1, 2))),
]


def main() -> int:
    binary = kilnd_binary("reduce_accuracy_gpu")
    if binary is None:
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    rng = np.random.default_rng(0)
    rows, failures = [], []
    with local_client(binary, "kiln-reduce-gpu-") as client:
        for name, shape, fn, tfn, exact_fn in WORKLOADS:
            host = (rng.standard_normal(shape) + 0.5).astype(np.float32)
            x = torch.from_numpy(host).cuda()
            exact = np.asarray(exact_fn(host.astype(np.float64)))
            f = kiln.jit(fn, target="cuda", client=client)
            got = f(x)
            e_kiln, e_torch = rel_err(got, exact), rel_err(tfn(x), exact)
            bound = max(4 * e_torch, 2e-7)
            ok = e_kiln <= bound
            if not ok:
                failures.append(f"{name} {shape}: kiln {e_kiln:.2e} > bound {bound:.2e}")
            t_kiln, t_torch = graph_time_us(lambda: f(x)), graph_time_us(lambda: tfn(x))
            rows.append([name, "x".join(map(str, shape)), f"{e_kiln:.1e}", f"{e_torch:.1e}",
                         f"{e_kiln / max(e_torch, 1e-30):.2f}", f"{t_kiln:.1f}", f"{t_torch:.1f}",
                         f"{t_kiln / t_torch:.2f}", "ok" if ok else "FAIL"])
            print(" | ".join(rows[-1]), flush=True)
    head = ["workload", "shape", "kiln rel err", "torch rel err", "kiln / torch", "kiln us", "torch us",
            "time kiln / torch", "check"]
    return report("f32 reductions", head, rows, failures, "every result within the bound", "reduce_accuracy_gpu.md")


if __name__ == "__main__":
    sys.exit(main())
