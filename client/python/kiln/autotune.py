"""Client-side tuning: time a graph's kernel variants on this machine's device, keep the fastest.

The daemon compiles a variant per ``CompileOptions.variant`` (0 is its default choice; the
others vary block sizes and threads per row on CUDA, tile widths, row unrolling and the thread
split on the CPU). :func:`autotune` compiles variants 0, 1, ... in turn, skips those whose
generated source repeats an earlier one (a knob that does not touch this graph), checks each
against variant 0 on the given inputs, and times them where they will run.

Tunings are shared through the daemon: the winner is recorded under the graph and the device
model (``RecordTuning``), and a later :func:`autotune` of the same graph on the same model, in
any process on any machine served by that store, compiles the recorded variant at once without
timing anything (``LookupTuning``). ``kiln prewarm --autotune`` tunes recorded graphs from CI.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np

from .connection import as_options


@dataclass
class VariantTiming:
    """One variant's timing: ``median_ms`` per call in a loop of calls (throughput);
    ``latency_ms``, for device targets, the median time a single call keeps its device busy
    from its first kernel to its last (CUDA events around each call, the device's L2 cache
    evicted before it), None elsewhere."""

    variant: int
    handle: str
    median_ms: float
    latency_ms: Optional[float] = None


def device_name(target: Any, inputs: Sequence[Any] = ()) -> str:
    """The device model a tuning is for: the GPU's name and compute capability for a CUDA
    target (of the inputs' device), the CPU's model name and the target's ISA level otherwise."""
    t = str(target)
    if t.startswith("cuda"):
        import torch

        dev = next((a.device for a in inputs if getattr(a, "is_cuda", False)), torch.device("cuda"))
        major, minor = torch.cuda.get_device_capability(dev)
        return f"{torch.cuda.get_device_name(dev)} sm_{major}{minor}"
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model} {t}"


def _device_tools(inputs: Sequence[Any]) -> tuple[Callable[[], None],
                                                   Optional[tuple[Callable[[], Any], Callable[[], None]]]]:
    """For the device the inputs live on (PyTorch or CuPy): a function waiting for it, and a
    factory of timing events with one evicting the device's L2 cache (it writes a buffer
    twice the cache's size); for host arrays, a no-op and None."""
    for a in inputs:
        mod = type(a).__module__.split(".")[0]
        if mod == "torch" and getattr(a, "is_cuda", False):
            import torch

            l2 = int(getattr(torch.cuda.get_device_properties(a.device), "L2_cache_size", 0) or 64 << 20)
            scratch = torch.empty(2 * l2, dtype=torch.uint8, device=a.device)
            return torch.cuda.synchronize, ((lambda: torch.cuda.Event(enable_timing=True)), scratch.zero_)
        if mod == "cupy":
            import cupy

            scratch = cupy.empty(2 * cupy.cuda.Device().attributes.get("L2CacheSize", 64 << 20), dtype=cupy.uint8)
            return (lambda: cupy.cuda.Device().synchronize()), (cupy.cuda.Event, lambda: scratch.fill(0))
    return (lambda: None), None


def _elapsed_ms(start: Any, end: Any) -> float:
    if hasattr(start, "elapsed_time"):  # torch.cuda.Event
        return float(start.elapsed_time(end))
    import cupy

    return float(cupy.cuda.get_elapsed_time(start, end))


def _host(a: Any) -> np.ndarray:
    if hasattr(a, "cpu"):
        return a.cpu().numpy()
    if type(a).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy.asnumpy(a)
    return np.asarray(a)


def autotune(client: Any, graph: Any, inputs: Sequence[Any], target: Any = "cpu", *, options: Any = None,
             max_variants: int = 8, iters: int = 10, num_threads: Optional[int] = None, rtol: float = 1e-4,
             atol: float = 1e-6, share: bool = True, device: Optional[str] = None) -> tuple[Any, list[VariantTiming]]:
    """Returns the fastest :class:`kiln.Compiled` of ``graph``'s variants on ``inputs`` and every
    distinct variant's median time per call (ms, ``iters`` samples after one warm-up; a sample
    is one call, or for calls under a millisecond or two a burst of up to 16 back-to-back
    calls, the device waited for at the end of each). ``options``: the other compile options
    (a kiln.v1.CompileOptions or a dict for :func:`kiln.make_options`). Raises AssertionError when a variant's outputs
    differ from variant 0's by more than ``atol + rtol * max|variant 0|`` (summation orders
    differ between variants; integers and bools: exactly).

    ``share`` (default on): first ask the daemon for a tuning recorded on this device model
    (``device``, default :func:`device_name`); when there is one, compile that variant and
    return it with the recorded timings (their ``handle`` empty: those variants were not
    compiled here), timing nothing; otherwise tune and record the winner."""
    base = as_options(options)
    if share:
        device = device or device_name(target, inputs)
        known = client.lookup_tuning(graph, target, device, base)
        if known.found:
            opts = type(base)()
            opts.CopyFrom(base)
            opts.variant = known.variant
            compiled = client.compile(graph, target, opts)
            return compiled, [VariantTiming(t.variant, "", t.median_ms) for t in known.timings]
    best, timings = _tune(client, graph, inputs, target, base, max_variants, iters, num_threads, rtol, atol)
    if share:
        client.record_tuning(graph, target, device, _variant_of(best, timings),
                             [(t.variant, t.median_ms) for t in timings], base)
    return best, timings


def _variant_of(best: Any, timings: list[VariantTiming]) -> int:
    return next(t.variant for t in timings if t.handle == best.handle)


# A variant other than the default must beat it by this fraction of its time to be chosen:
# differences below it are within what repeated timings of one kernel vary by.
MIN_GAIN = 0.03
# Calls per timed sample, at most, and the duration a burst of short calls aims for.
BURST = 16
BURST_SECONDS = 0.002


def _pick(timings: list[VariantTiming]) -> VariantTiming:
    """The winner: the default (``timings[0]``) unless another variant is at least MIN_GAIN
    faster per call in a loop and, where latencies were measured, per single call too (so a
    tuned kernel is never slower either way it is used); among those, the one whose worse
    ratio to the default is best."""
    default = timings[0]

    def ratio(t: VariantTiming) -> float:
        r = t.median_ms / default.median_ms if default.median_ms > 0 else 1.0
        if t.latency_ms is not None and default.latency_ms:
            r = max(r, t.latency_ms / default.latency_ms)
        return r

    best = min(timings, key=ratio)
    return best if ratio(best) <= 1 - MIN_GAIN else default


def _tune(client: Any, graph: Any, inputs: Sequence[Any], target: Any, base: Any, max_variants: int, iters: int,
          num_threads: Optional[int], rtol: float, atol: float) -> tuple[Any, list[VariantTiming]]:
    """Compiles and checks the distinct variants, then times them in rounds (one sample of
    each variant per round, after a warm-up of each: a burst of back-to-back calls for short
    ones), so that a drift of the device's clocks or of the machine's load during tuning falls
    on every variant alike; :func:`_pick` chooses from the medians."""
    sync, device_timing = _device_tools(inputs)
    kw = {} if num_threads is None else {"num_threads": num_threads}
    seen: set[str] = set()
    candidates: list[tuple[int, Any]] = []
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
        candidates.append((v, compiled))
    samples: dict[int, list[float]] = {v: [] for v, _ in candidates}
    latencies: dict[int, list[float]] = {v: [] for v, _ in candidates}
    warm: list[float] = []
    for _, compiled in candidates:  # warm-up
        t0 = time.perf_counter()
        compiled(*inputs, **kw)
        sync()
        warm.append(time.perf_counter() - t0)
    # Short calls are timed in bursts of back-to-back calls with one wait at the end: that is
    # how a loop runs them (the host queues the next launch while the device runs this one), so
    # a variant that launches more kernels pays for them where the host is the bottleneck, and
    # one whose kernels are faster gains where the device is. Calls of a millisecond or more
    # are timed one by one.
    burst = max(1, min(BURST, int(BURST_SECONDS / max(min(warm), 1e-7))))
    # On a device, each variant's latency is timed too: events around single calls, each
    # after the device's L2 cache was evicted. A variant can queue faster (fewer launches) and
    # still keep the device busy longer per call (one slower kernel), which a caller waiting on
    # each result sees; and the same inputs called again and again stay in L2, where in a
    # model's step a kernel's inputs mostly come from memory: a variant faster only on cached
    # data would make the step slower.
    events: list[tuple[Any, Any]] = []
    evict: Optional[Callable[[], None]] = None
    if device_timing is not None:
        make_event, evict = device_timing
        events = [(make_event(), make_event()) for _ in range(burst)]
    for _ in range(iters):
        for v, compiled in candidates:
            t0 = time.perf_counter()
            for _ in range(burst):
                compiled(*inputs, **kw)
            sync()
            samples[v].append((time.perf_counter() - t0) / burst)
            if evict is not None:
                for start, end in events:
                    evict()
                    start.record()
                    compiled(*inputs, **kw)
                    end.record()
                sync()
                latencies[v].append(statistics.median(_elapsed_ms(s, e) for s, e in events))
    timings = [VariantTiming(v, c.handle, statistics.median(samples[v]) * 1e3,
                             statistics.median(latencies[v]) if latencies[v] else None) for v, c in candidates]
    best = _pick(timings)
    return next(c for v, c in candidates if v == best.variant), timings


__all__ = ["autotune", "device_name", "VariantTiming"]
