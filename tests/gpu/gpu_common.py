"""What the GPU scripts share, the checks here and the benchmarks and probes of tests/bench/gpu:
finding kilnd, a private kilnd and a client of it, CUDA-event and host timing, and the markdown
report a script prints and writes to ``$OUT``.

A script in this folder finds this module next to itself; one in tests/bench/gpu puts this
folder on its path first:

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "gpu"))

kiln is imported by the functions that start kilnd, not here: gpu_suite.py times its kernels
with the client core alone.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch

# ---------------------------------------------------------------------------------- kilnd


def kilnd_binary(script: str) -> Optional[str]:
    """The kilnd binary (``kiln.local.find_kilnd``: ``$KILND``, else a build tree's), or None
    after saying so as ``script``."""
    import kiln.local

    binary = kiln.local.find_kilnd()
    if binary is None:
        print(f"{script}: kilnd not found: set KILND to a built kilnd binary", file=sys.stderr)
        return None
    return str(binary)


@contextlib.contextmanager
def local_client(binary: str, prefix: str) -> Iterator[Any]:
    """A client of a kilnd started from ``binary`` in a temporary folder, stopped on exit."""
    import kiln
    import kiln.local

    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        daemon = kiln.local.LocalDaemon(binary, Path(tmp), timeout=30)
        try:
            with kiln.Client(daemon.address, cache_dir=Path(tmp) / "client-cache") as client:
                yield client
        finally:
            daemon.stop()


def private_kilnd(script: str, prefix: str) -> tuple[Any, Path]:
    """:func:`kilnd_binary`'s kilnd (exits with status 1, as ``script``, when there is none)
    started in a new temporary folder, and the folder (its log is ``kilnd.log`` there). The
    process's clients use it: ``KILN_SERVER`` names it and ``KILN_CACHE_DIR`` a client cache in
    the folder, for ``torch.compile(backend="kiln")`` and for child processes alike. It is
    stopped when the process exits (a failed check too); a caller may stop it sooner."""
    binary = kilnd_binary(script)
    if binary is None:
        raise SystemExit(1)
    work = Path(tempfile.mkdtemp(prefix=prefix))
    os.environ["KILN_CACHE_DIR"] = str(work / "client-cache")
    import kiln.local

    daemon = kiln.local.LocalDaemon(binary, work)
    atexit.register(daemon.stop)
    os.environ["KILN_SERVER"] = daemon.address
    return daemon, work


# ---------------------------------------------------------------------------------- timing


def median_ms(step: Callable[[int], Any], iters: int, warmup: int) -> float:
    """Median ms of ``step(i)``, from CUDA events around each call after ``warmup`` calls; the
    host waits for each call's end before the next."""
    for i in range(warmup):
        step(i)
    torch.cuda.synchronize()
    times = []
    for i in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        step(i)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def event_times_ms(call: Callable[[int], Any], iters: int, warmup: int) -> list[float]:
    """CUDA-event intervals (ms) around ``iters`` back-to-back calls ``call(i)``, after ``warmup``
    calls. Launches run ahead of the GPU (events are recorded on the stream, the host waits
    once at the end), so host overhead does not enter the intervals."""
    for i in range(warmup):
        call(i)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        call(i)
        ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def interleaved_ms(calls: dict[str, Callable[[int], Any]], rounds: int, per_round: int = 1,
                   rotate: bool = False, warmup: int = 0) -> dict[str, float]:
    """Median ms per call of each label, timed in rounds: a round times ``per_round`` calls
    ``calls[label](round)`` of each label in turn between two CUDA events (the order rotating
    from round to round with ``rotate``), so that drift of a shared host falls on all labels
    alike. The first ``warmup`` rounds run and are not counted."""
    labels = list(calls)
    times: dict[str, list[float]] = {k: [] for k in labels}
    torch.cuda.synchronize()
    for r in range(warmup + rounds):
        order = labels[r % len(labels):] + labels[:r % len(labels)] if rotate else labels
        for k in order:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(per_round):
                calls[k](r)
            end.record()
            end.synchronize()
            if r >= warmup:
                times[k].append(start.elapsed_time(end) / per_round)
    return {k: statistics.median(v) for k, v in times.items()}


def graph_time_us(fn: Callable[[], Any], calls: int = 20, replays: int = 15) -> float:
    """Kernel time of one call: `calls` calls captured in a CUDA graph, median replay."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return float(statistics.median(times))


def host_ms(step: Callable[[int], Any], steps: int, rounds: int = 5, step_ms: float = 40.0) -> tuple[float, bool]:
    """Host time of one step, the GPU kept busy: a sleep kernel long enough for ``steps`` steps
    is queued first, so no launch waits for the device and the time is what the host spends
    enqueueing the step (Python, dispatcher, allocator, driver). Median over ``rounds``; the
    flag is False when the sleep ran out before the host finished (the figure then includes
    waiting, e.g. on a synchronizing op)."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    cycles_per_ms = 10_000_000 / max(start.elapsed_time(end), 1e-3)
    vals, valid = [], True
    for r in range(rounds):
        torch.cuda.synchronize()
        torch.cuda._sleep(int(cycles_per_ms * (step_ms * steps + 50.0)))  # step_ms: a generous host time per step
        slept = torch.cuda.Event()
        slept.record()
        t0 = time.perf_counter()
        for i in range(steps):
            step(r * steps + i)
        vals.append((time.perf_counter() - t0) * 1000 / steps)
        valid = valid and not slept.query()
        torch.cuda.synchronize()
    return statistics.median(vals), valid


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def per_call_us(fn: Callable[[], Any], calls: int = 2000, batches: int = 7) -> float:
    """Host µs per call of ``fn``: median of ``batches`` batches of ``calls`` calls on the host
    clock, the device synchronised only between batches (after 200 calls to warm up)."""
    for _ in range(200):
        fn()
    _sync()
    times = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
        _sync()
    return statistics.median(times)


# ---------------------------------------------------------------------------------- report


def report(title: str, head: list[str], rows: list[list[str]], failures: list[str], all_ok: str, name: str) -> int:
    """Prints a markdown table of `rows` under `title` (and writes it to $OUT/`name` when OUT is
    set), then the failures or `all_ok`; returns the exit status (1 when something failed)."""
    where = torch.cuda.get_device_name() if torch.cuda.is_available() else "the CPU"
    md = [f"# {title} on {where} (torch {torch.__version__})\n",
          "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    md += ["| " + " | ".join(r) + " |" for r in rows]
    md.append("\n" + ("FAILURES:\n" + "\n".join(failures) if failures else all_ok))
    text = "\n".join(md) + "\n"
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], name).write_text(text)
    return 1 if failures else 0
