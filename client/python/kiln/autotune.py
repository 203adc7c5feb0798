"""Client-side tuning: time a graph's kernel variants on this machine's device, keep the fastest.

The daemon compiles a variant per ``CompileOptions.variant`` (0 is its default choice; the
others vary block sizes and threads per row on CUDA, tile widths, row unrolling and the thread
split on the CPU). :func:`autotune` compiles variants 0, 1, ... in turn, skips those whose
generated source repeats an earlier one (a knob that does not touch this graph), checks each
against variant 0 on the given inputs, and times them where they will run.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np

from .client import _as_options


@dataclass
class VariantTiming:
    variant: int
    handle: str
    median_ms: float


def _sync_for(inputs: Sequence[Any]) -> Callable[[], None]:
    """A function waiting for the device the inputs live on (nothing for host arrays)."""
    for a in inputs:
        mod = type(a).__module__.split(".")[0]
        if mod == "torch" and getattr(a, "is_cuda", False):
            import torch

            return torch.cuda.synchronize
        if mod == "cupy":
            import cupy

            return lambda: cupy.cuda.Device().synchronize()
    return lambda: None


def _host(a: Any) -> np.ndarray:
    if hasattr(a, "cpu"):
        return a.cpu().numpy()
    if type(a).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy.asnumpy(a)
    return np.asarray(a)


def autotune(client: Any, graph: Any, inputs: Sequence[Any], target: Any = "cpu", *, options: Any = None,
             max_variants: int = 8, iters: int = 10, num_threads: Optional[int] = None, rtol: float = 1e-4,
             atol: float = 1e-6) -> tuple[Any, list[VariantTiming]]:
    """Returns the fastest :class:`kiln.Compiled` of ``graph``'s variants on ``inputs`` and every
    distinct variant's median time (ms, ``iters`` calls after one warm-up, the device waited
    for after each call). ``options``: the other compile options (a kiln.v1.CompileOptions or
    a dict for :func:`kiln.make_options`). Raises AssertionError when a variant's outputs
    differ from variant 0's by more than ``atol + rtol * max|variant 0|`` (summation orders
    differ between variants; integers and bools: exactly)."""
    sync = _sync_for(inputs)
    base = _as_options(options)
    kw = {} if num_threads is None else {"num_threads": num_threads}
    seen: set[str] = set()
    best: Any = None
    timings: list[VariantTiming] = []
    reference: Optional[list[np.ndarray]] = None
    for v in range(max_variants):
        opts = type(base)()
        opts.CopyFrom(base)  # the caller's options stay as they were
        opts.variant = v
        compiled = client.compile(graph, target, opts)
        src = compiled.artifact("SOURCE")
        digest = src.digest if src is not None else compiled.handle
        if digest in seen:
            continue
        seen.add(digest)
        outs = compiled(*inputs, **kw)
        outs = [_host(o) for o in (outs if isinstance(outs, (list, tuple)) else [outs])]
        if reference is None:
            reference = outs
        for got, want in zip(outs, reference):
            if got.dtype.kind == "f":
                scale = float(np.nanmax(np.abs(want))) if want.size and not np.isnan(want).all() else 0.0
                np.testing.assert_allclose(got, want, rtol=rtol, atol=atol + rtol * scale, equal_nan=True,
                                           err_msg=f"variant {v}")
            else:
                np.testing.assert_array_equal(got, want, err_msg=f"variant {v}")
        ts = []
        for _ in range(iters):
            t0 = time.perf_counter()
            compiled(*inputs, **kw)
            sync()
            ts.append(time.perf_counter() - t0)
        timings.append(VariantTiming(v, compiled.handle, statistics.median(ts) * 1e3))
        if best is None or timings[-1].median_ms < best[1]:
            best = (compiled, timings[-1].median_ms)
    return best[0], timings


__all__ = ["autotune", "VariantTiming"]
