#!/usr/bin/env python3
"""NumPy-style functions under ``kiln.jit(target="cuda")`` on torch CUDA tensors: results
against NumPy on host copies, and kernel time against the same function written in torch.

The patterns are the ones the CPU benchmarks found slow or wrong at some point (row reductions
whose output is one value per row, argmax over rows and over a whole tensor, transposes and
permutes, concatenation along the last axis, a row sum of values compared with column means,
pooling written as a reshape and a reduction), so that the shared scheduler's choices for them
are proven on the GPU as well. Kernel time: 20 calls captured in a CUDA graph and replayed,
CUDA events, median replay; kiln and torch side by side.

Starts its own kilnd from ``$KILND``; prints a table, writes ``$OUT/numpy_patterns_gpu.md``
when ``$OUT`` is set. Exits 1 when a result differs from NumPy.

    KILND=build/server/kilnd PYTHONPATH=client/python python3 tests/gpu/numpy_patterns_gpu.py
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

# (name, input shape, kiln/NumPy function, torch function)
PATTERNS: list[tuple[str, tuple[int, ...], Callable[[Any], Any], Callable[[torch.Tensor], torch.Tensor]]] = [
    ("row sum", (64, 200_000), lambda a: a.sum(axis=1), lambda t: t.sum(1)),
    ("row std", (2048, 2048), lambda a: a.std(axis=1), lambda t: t.std(1, unbiased=False)),
    ("row argmax", (4096, 1000), lambda a: a.argmax(axis=1), lambda t: t.argmax(1)),
    ("whole argmax", (2048, 2048), lambda a: a.argmax(), lambda t: t.argmax()),
    ("a.T + 0", (4096, 4096), lambda a: a.T + 0, lambda t: t.t().contiguous()),
    ("a + a.T", (4096, 4096), lambda a: a + a.T, lambda t: t + t.t()),
    ("permute (2, 0, 1) * 2", (64, 128, 256), lambda a: a.transpose(2, 0, 1) * 2, lambda t: t.permute(2, 0, 1) * 2),
    ("concat [a, 2a] on the last axis", (2048, 2048), lambda a: np.concatenate([a, a * 2], axis=1),
     lambda t: torch.cat([t, t * 2], 1)),
    ("row sum of where(a > column mean)", (4096, 4096), lambda a: np.where(a > a.mean(axis=0), a, 0).sum(axis=1),
     lambda t: torch.where(t > t.mean(0), t, 0).sum(1)),
    ("2x2 max pool as reshape", (16, 64, 112, 112), lambda a: a.reshape(16, 64, 56, 2, 56, 2).max(axis=(3, 5)),
     lambda t: t.reshape(16, 64, 56, 2, 56, 2).amax((3, 5))),
]


def main() -> int:
    binary = kilnd_binary("numpy_patterns_gpu")
    if binary is None:
        return 2
    rng = np.random.default_rng(0)
    rows, failures = [], []
    with local_client(binary, "kiln-patterns-gpu-") as client:
        for name, shape, fn, tfn in PATTERNS:
            host = rng.standard_normal(shape).astype(np.float32)
            x = torch.from_numpy(host).cuda()
            f = kiln.jit(fn, target="cuda", client=client)
            got = f(x).cpu().numpy()
            want = np.asarray(fn(host.astype(np.float64)))
            if got.dtype.kind in "iu":
                ok = np.array_equal(got, want)
                err = 0.0 if ok else 1.0
            else:
                err = float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))
                ok = err < 1e-5
            if not ok:
                failures.append(f"{name}: {err:.2e}")
            t_kiln, t_torch = graph_time_us(lambda: f(x)), graph_time_us(lambda: tfn(x))
            rows.append([name, "x".join(map(str, shape)), f"{err:.1e}", f"{t_kiln:.1f}", f"{t_torch:.1f}",
                         f"{t_kiln / t_torch:.2f}", "ok" if ok else "FAIL"])
            print(" | ".join(rows[-1]), flush=True)
    head = ["function", "shape", "rel err vs NumPy", "kiln us", "torch us", "kiln / torch", "check"]
    return report("NumPy patterns under kiln.jit", head, rows, failures, "every result matches NumPy",
                  "numpy_patterns_gpu.md")


if __name__ == "__main__":
    sys.exit(main())
