#!/usr/bin/env python3
"""NumPy-style functions under ``kiln.jit`` on the CPU against NumPy, side by side in one
process on the same inputs: each result is checked against a float64 NumPy run, then both are
timed (median of ``--runs`` calls).

The patterns are ones that once ran far slower than they should (each fixed; BENCHMARKS.md,
"CPU kernels against NumPy", has their figures): transposes and permutes, concatenation along
the last axis, row and whole-tensor argmax, row statistics over rows of a few thousand
elements, `any` over bool rows, a row sum of values compared with column means, an HWC image
normalisation, pooling written as a reshape.

    PYTHONPATH=client/python python3 tests/bench/numpy_patterns_bench.py [--runs 9] [--only NAME,...]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kiln  # noqa: E402
from cpu_bench import median_time  # noqa: E402
from kilnd_proc import daemon  # noqa: E402


def patterns(rng: np.random.Generator) -> list[tuple[str, Callable[..., Any], tuple[np.ndarray, ...]]]:
    a = rng.standard_normal((2048, 2048)).astype(np.float32)
    b = rng.standard_normal((2048, 2048)).astype(np.float32)
    x3 = rng.standard_normal((64, 128, 256)).astype(np.float32)
    u8 = rng.integers(0, 255, (3000, 3001)).astype(np.uint8)
    bools = rng.standard_normal((3000, 3001)) > 0.3
    img = rng.integers(0, 255, (1080, 1920, 3)).astype(np.uint8)
    nchw = rng.standard_normal((16, 64, 112, 112)).astype(np.float32)
    mean = np.array([0.485, 0.456, 0.406], np.float32)
    std = np.array([0.229, 0.224, 0.225], np.float32)
    return [
        ("a.T + 0, f32[2048,2048]", lambda v: v.T + 0, (a,)),
        ("a + a.T, f32[2048,2048]", lambda v: v + v.T, (a,)),
        ("x.transpose(2,0,1) * 2, f32[64,128,256]", lambda v: v.transpose(2, 0, 1) * 2, (x3,)),
        ("u8 a.T * 1, [3000,3001]", lambda v: v.T * 1, (u8,)),
        ("concatenate([a, b], axis=1)", lambda v, w: np.concatenate([v, w], axis=1), (a, b)),
        ("row argmax, f32[2048,2048]", lambda v: v.argmax(axis=1), (a,)),
        ("whole argmax, f32[2048,2048]", lambda v: v.argmax(), (a,)),
        ("row std, f32[2048,2048]", lambda v: v.std(axis=1), (a,)),
        ("row any, bool[3000,3001]", lambda v: v.any(axis=1), (bools,)),
        ("row sum of where(a > column mean)", lambda v: np.where(v > v.mean(axis=0), v, 0).sum(axis=1), (a,)),
        ("HWC u8 image normalise, [1080,1920,3]", lambda v: (v.astype(np.float32) / 255 - mean) / std, (img,)),
        ("2x2 max pool as reshape, f32[16,64,112,112]", lambda v: v.reshape(16, 64, 56, 2, 56, 2).max(axis=(3, 5)),
         (nchw,)),
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--only", default="", help="comma-separated substrings of pattern names to run")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    work = patterns(rng)
    if args.only:
        work = [w for w in work if any(o in w[0] for o in args.only.split(","))]
    with daemon() as address:
        client = kiln.Client(address)
        print(f"NumPy {np.__version__}; {os.cpu_count()} CPUs; kiln at its default thread count")
        print(f"{'pattern':46s} {'numpy ms':>9s} {'kiln ms':>8s} {'x':>6s}  rel err (kiln, NumPy) vs float64")
        for name, fn, inputs in work:
            jitted = kiln.jit(fn, client=client)
            got = np.asarray(jitted(*inputs))
            want = np.asarray(fn(*inputs))
            exact = np.asarray(fn(*[i.astype(np.float64) if i.dtype.kind == "f" else i for i in inputs]))
            if got.dtype.kind in "iub":
                assert np.array_equal(got, exact), name
                errs = "exact"
            else:
                scale = max(float(np.max(np.abs(exact))), 1e-30)
                e_kiln = float(np.max(np.abs(got - exact))) / scale
                e_np = float(np.max(np.abs(want - exact))) / scale
                assert e_kiln < 1e-5, f"{name}: {e_kiln:.2e}"
                errs = f"{e_kiln:.1e}, {e_np:.1e}"
            t_np = median_time(lambda: fn(*inputs), args.runs)
            t_k = median_time(lambda: jitted(*inputs), args.runs)
            print(f"{name:46s} {t_np * 1e3:9.2f} {t_k * 1e3:8.2f} {t_np / t_k:6.1f}  {errs}", flush=True)


if __name__ == "__main__":
    main()
