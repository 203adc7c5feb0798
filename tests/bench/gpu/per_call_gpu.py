#!/usr/bin/env python3
"""The per-call floor on a CUDA GPU: the seed's experiments as its reader runs them (wall time
of many calls, the host included), for eager, Inductor and kiln, each in the default mode and
in ``mode="reduce-overhead"``, timed in interleaved rounds in one process (median µs per call):

- ``sin(x) + cos(x)`` on a one-element tensor, under ``torch.no_grad()`` and again with grad
  mode on (the input needs no gradient, so every compiled variant runs an inference graph);
- the seed's NumPy functions, k-means and ``numpy_fn`` (tests/python/sample_fns.py, verbatim),
  compiled as NumPy code and called on NumPy arrays, which torch.compile runs on the host's
  CPU ("eager" is NumPy itself). Run inside ``with torch.device("cuda")`` (torch's way of
  sending compiled NumPy code to the GPU), torch 2.11's Dynamo fails on them for every backend
  (``'ndarray' object has no attribute 'sub'``), so they are timed where the arrays are;
- a graph of several launches (a small MLP block: matrix products, layer norm, GELU), where a
  CUDA graph's replay is meant to win.

    tests/gpu/with_pack.sh PACK python3 tests/bench/gpu/per_call_gpu.py [--calls 2000] [--rounds 7]

Writes $OUT/per_call_gpu.md; exits 1 when a compiled result differs from eager or kiln ran
nothing.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import types
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "gpu"))  # tests/gpu
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))  # tests/python

import numpy as np  # noqa: E402

import kiln.torch as kt  # noqa: E402
from gpu_common import kilnd_binary, local_client, report  # noqa: E402
from sample_fns import kmeans, kmeans_inputs, numpy_fn, numpy_fn_inputs  # noqa: E402


def sin_cos(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) + torch.cos(x)


def mlp_block(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    h = F.gelu(F.layer_norm(x, x.shape[-1:]) @ w1)
    return x + torch.tanh(h @ w2)


def own_copy(fn):
    """``fn`` with a code object of its own."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def error(got, want) -> float:
    """The largest difference relative to the result's scale (NumPy results compared as tensors)."""
    got, want = torch.as_tensor(got).double().cpu(), torch.as_tensor(want).double().cpu()
    return ((got - want).abs().max() / (1 + want.abs().max())).item()


def per_call_us(fn, args, calls: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    opts = ap.parse_args()
    binary = kilnd_binary("per_call_gpu.py")
    if binary is None:
        return 2
    warnings.simplefilter("ignore", UserWarning)
    failures: list[str] = []
    rows: list[list[str]] = []
    gen = torch.Generator().manual_seed(0)
    one = (torch.randn(1, generator=gen).cuda(),)
    rng = np.random.default_rng(0)
    cases = {  # label: (function, arguments, grad mode)
        "sin(x)+cos(x), 1 element": (sin_cos, one, False),
        "sin(x)+cos(x), 1 element, grad mode on": (sin_cos, one, True),
        "k-means, NumPy arrays (host CPU), 1000 points": (kmeans, kmeans_inputs(rng), False),
        "numpy_fn, NumPy arrays (host CPU), 200x6": (numpy_fn, numpy_fn_inputs(rng), False),
        "MLP block 64x256": (mlp_block, tuple(t.cuda() for t in (torch.randn(64, 256, generator=gen),
                                                                    torch.randn(256, 512, generator=gen) / 16,
                                                                    torch.randn(512, 256, generator=gen) / 22)),
                             False),
    }
    with local_client(binary, "kiln-per-call-") as client:
        for label, (fn, args, grad) in cases.items():
            torch.set_grad_enabled(grad)
            torch._dynamo.reset()
            kt.reset_stats()
            # Each compiled variant gets its own copy of the function: Dynamo keeps compiled code
            # per code object, and variants sharing one would each pay for the others' cache
            # entries (in the order they were compiled) on every call.
            fns = {"eager": fn,
                   "Inductor": torch.compile(own_copy(fn)),
                   "Inductor ro": torch.compile(own_copy(fn), mode="reduce-overhead"),
                   "kiln": torch.compile(own_copy(fn), backend="kiln", options={"client": client}),
                   "kiln ro": torch.compile(own_copy(fn), backend=kt.backend(mode="reduce-overhead", client=client))}
            numpy_code = isinstance(args[0], np.ndarray)
            want = fn(*[a.copy() for a in args]) if numpy_code else fn(*args)
            for name, f in fns.items():
                for _ in range(5):  # compile, warm, capture
                    got = f(*args)
                err = error(got, want)
                if err > 1e-4:
                    failures.append(f"{label}, {name}: error {err:.2e}")
            kt.wait()
            s = kt.stats()
            if s["kernel_calls"] + s["graph_replays"] == 0:
                failures.append(f"{label}: kiln ran no kernel")
            if s["direct_graphs"] == 0:
                failures.append(f"{label}: kiln's graphs kept AOTAutograd's runtime wrapper")
            times: dict[str, list[float]] = {k: [] for k in fns}
            for r in range(opts.rounds):
                order = list(fns.items())
                order = order[r % len(order):] + order[:r % len(order)]
                for name, f in order:
                    times[name].append(per_call_us(f, args, opts.calls // 4 if numpy_code else opts.calls))
            med = {k: statistics.median(v) for k, v in times.items()}
            rows.append([label] + [f"{med[k]:.1f}" for k in fns] +
                        [f"{med['kiln ro'] / med['kiln']:.2f}", f"{med['kiln'] / med['eager']:.2f}"])
            print(" | ".join(rows[-1]), flush=True)
    return report("Per-call time, µs (wall, host included; median of interleaved rounds)",
                  ["graph", "eager", "Inductor", "Inductor reduce-overhead", "kiln", "kiln reduce-overhead",
                   "kiln ro / kiln", "kiln / eager"], rows, failures, "results match eager", "per_call_gpu.md")


if __name__ == "__main__":
    sys.exit(main())
