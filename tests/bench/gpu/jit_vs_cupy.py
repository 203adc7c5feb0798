#!/usr/bin/env python3
"""``kiln.jit(target="cuda")`` against CuPy running the same NumPy code op by op, on small
inputs: ten functions written against NumPy, each called on CUDA arrays. CuPy runs them through
NumPy's dispatch protocols (``np.exp`` on a CuPy array is CuPy's exp, one kernel per op); kiln
runs its compiled kernels, on PyTorch tensors and on the CuPy arrays themselves. Each call is
timed whole, host included (many calls, then one synchronise), in interleaved rounds in one
process; medians in µs per call. Results are checked against NumPy on the host first.

    tests/gpu/with_pack.sh PACK python3 tests/bench/gpu/jit_vs_cupy.py [--calls 500] [--rounds 7]

Writes $OUT/jit_vs_cupy.md; exits 1 when a result is wrong, 2 without CuPy or kilnd.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "gpu"))  # tests/gpu
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))  # tests/python

from gpu_common import kilnd_binary, local_client, report  # noqa: E402
from sample_fns import kmeans, numpy_fn  # noqa: E402


def softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def layer_norm(x, g, b):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * g + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(0.7978845608 * (x + 0.044715 * x ** 3)))


def sin2_cos2(x):
    return np.sin(x) ** 2 + np.cos(x) ** 2


def standardize_columns(x):
    return (x - x.mean(axis=0)) / x.std(axis=0)


def logsumexp_rows(x):
    m = x.max(axis=1)
    return m + np.log(np.exp(x - m[:, None]).sum(axis=1))


def leaky_clip(x):
    return np.clip(np.where(x > 0, x, 0.01 * x), -1.0, 1.0)


def cosine_rows(a, b):
    return (a * b).sum(axis=1) / (np.sqrt((a * a).sum(axis=1)) * np.sqrt((b * b).sum(axis=1)))


def rms_norm(x, w):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-6) * w


def workloads(rng: np.random.Generator) -> list[tuple[str, Callable[..., Any], tuple[np.ndarray, ...]]]:
    f32 = np.float32

    def r(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(f32)

    A = r(4096, 16)
    A[:, 2] = 5.0  # numpy_fn's masked assignment applies to a constant column
    return [
        ("kmeans 65536x2, k=8", kmeans, (r(65536, 2), r(8, 2))),
        ("numpy_fn 4096x16", numpy_fn, (A, (r(4096, 16) * 3 + 1).astype(f32))),
        ("softmax 256x1024", softmax, (r(256, 1024),)),
        ("layer norm 512x768", layer_norm, (r(512, 768), r(768), r(768))),
        ("gelu (tanh) 262144", gelu_tanh, (r(262144),)),
        ("sin^2+cos^2 262144", sin2_cos2, (r(262144),)),
        ("standardize columns 4096x64", standardize_columns, (r(4096, 64),)),
        ("logsumexp rows 1024x512", logsumexp_rows, (r(1024, 512),)),
        ("leaky relu + clip 262144", leaky_clip, (r(262144),)),
        ("cosine of rows 4096x128", cosine_rows, (r(4096, 128), r(4096, 128))),
        ("RMS norm 1024x1024", rms_norm, (r(1024, 1024), r(1024))),
    ]


def per_call_us(call: Callable[[], Any], sync: Callable[[], None], calls: int) -> float:
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    sync()
    return (time.perf_counter() - t0) / calls * 1e6


def close(got: np.ndarray, want: np.ndarray) -> bool:
    if got.dtype.kind in "iub":
        return bool((got == want).mean() > 0.999)  # k-means: a tie may go either way
    return bool(np.allclose(got, want, rtol=2e-4, atol=2e-5))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=7)
    opts = ap.parse_args()
    try:
        import cupy
    except ImportError:
        print("jit_vs_cupy: CuPy is not installed", file=sys.stderr)
        return 2
    import torch

    import kiln

    binary = kilnd_binary("jit_vs_cupy.py")
    if binary is None:
        return 2
    rng = np.random.default_rng(3)
    failures: list[str] = []
    rows: list[list[str]] = []
    torch_sync = torch.cuda.synchronize

    def cupy_sync() -> None:
        cupy.cuda.runtime.deviceSynchronize()

    with local_client(binary, "kiln-jit-cupy-") as client:
        from kiln.torch import native

        native.start(client)
        native.wait()  # torch tensors then take the native call path from the first call
        for name, fn, host in workloads(rng):
            jf = kiln.jit(fn, target="cuda", client=client)
            want = np.asarray(fn(*[a.astype(np.float64) if a.dtype.kind == "f" else a for a in host]))
            on_torch = [torch.from_numpy(a).cuda() for a in host]
            on_cupy = [cupy.asarray(a) for a in host]
            got = {
                "kiln, torch": jf(*on_torch).cpu().numpy(),
                "kiln, CuPy": cupy.asnumpy(jf(*on_cupy)),
                "CuPy": cupy.asnumpy(fn(*on_cupy)),
            }
            bad = [k for k, v in got.items() if v.shape != want.shape or not close(v, want.astype(v.dtype))]
            if bad:
                failures.append(f"{name}: {', '.join(bad)} differ from NumPy")
            calls = {
                "kiln, torch": (lambda: jf(*on_torch), torch_sync),
                "kiln, CuPy": (lambda: jf(*on_cupy), cupy_sync),
                "CuPy": (lambda: fn(*on_cupy), cupy_sync),
            }
            times: dict[str, list[float]] = {k: [] for k in calls}
            for _ in range(opts.rounds):
                for k, (call, sync) in calls.items():
                    times[k].append(per_call_us(call, sync, opts.calls))
            med = {k: statistics.median(v) for k, v in times.items()}
            rows.append([name, f"{med['CuPy']:.1f}", f"{med['kiln, torch']:.1f}", f"{med['kiln, CuPy']:.1f}",
                         f"{med['kiln, torch'] / med['CuPy']:.2f}", f"{med['kiln, CuPy'] / med['CuPy']:.2f}"])
            print(" | ".join(rows[-1]), flush=True)
    ratios = [float(r[4]) for r in rows]
    rows.append(["geometric mean", "", "", "", f"{statistics.geometric_mean(ratios):.2f}",
                 f"{statistics.geometric_mean([float(r[5]) for r in rows]):.2f}"])
    return report(f"kiln.jit(target='cuda') against CuPy {cupy.__version__}, µs per call, host included",
                  ["function", "CuPy µs", "kiln on torch µs", "kiln on CuPy µs", "kiln torch / CuPy",
                   "kiln CuPy / CuPy"], rows, failures, "every result matches NumPy", "jit_vs_cupy")


if __name__ == "__main__":
    sys.exit(main())
