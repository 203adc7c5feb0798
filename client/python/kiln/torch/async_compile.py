"""The background compiles of ``options={"async": True}``: one worker thread that compiles graphs
in the order the program met them, :class:`AsyncGraph` (a compiled graph that runs eagerly until
its parts are loaded), and :func:`wait`.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any, Callable, Optional

from .. import native


# Compiles started with options={"async": True} that have not finished, for wait().
_pending: set[concurrent.futures.Future[Any]] = set()


_pending_lock = threading.Lock()


_async_pool: Optional[concurrent.futures.ThreadPoolExecutor] = None


def submit_compile(job: Callable[[], None]) -> concurrent.futures.Future[Any]:
    """Runs ``job`` (a graph's compile_parts) on the background pool; :func:`wait` sees it."""
    global _async_pool
    with _pending_lock:
        if _async_pool is None:
            # One thread: compile_parts itself compiles a graph's parts concurrently, and graphs
            # queued behind each other reach the kernels in the order the program met them.
            _async_pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="kiln-async")
        fut = _async_pool.submit(job)
        _pending.add(fut)
    fut.add_done_callback(_forget)
    return fut


def _forget(fut: concurrent.futures.Future[Any]) -> None:
    with _pending_lock:
        _pending.discard(fut)


def wait(timeout: Optional[float] = None) -> bool:
    """Blocks until every compile started with ``async`` has finished (its parts loaded or
    fallen back); returns False if ``timeout`` seconds passed first."""
    with _pending_lock:
        pending = list(_pending)
    t0 = time.monotonic()
    done, not_done = concurrent.futures.wait(pending, timeout=timeout)
    # The native part runner too (its first build on a cluster takes a few seconds).
    native.wait(None if timeout is None else max(0.0, timeout - (time.monotonic() - t0)))
    return not not_done


class AsyncGraph:
    """A compiled graph whose parts are still compiling: runs ``eager`` (the rewritten graph
    with every part in torch, or the traced ATen graph) until the compile is done, then the
    final function (``finish()``: CUDA graphs around it if asked).

    ``work`` is either the compile's future, or a job to start once the first call returned
    (:func:`compile_aten_graph`'s background partitioning: Python work that, started at once,
    would hold the interpreter lock against Dynamo's guard building and the first call, and
    delayed BERT-base's first result by ~2 s on an H200's host).

    The switch happens between calls, never inside one; a part loads its kernel before it is
    visible to callers (KilnPart.compile assigns it last)."""

    def __init__(self, eager: Callable[[list[Any]], Any],
                 work: "concurrent.futures.Future[Any] | Callable[[], None]",
                 finish: Callable[[], Callable[[list[Any]], Any]]) -> None:
        self._boxed_call = True  # AOTAutograd calls it with one list of arguments
        self._eager = eager
        self._future: Optional[concurrent.futures.Future[Any]] = None
        self._job: Optional[Callable[[], None]] = None
        if isinstance(work, concurrent.futures.Future):
            self._future = work
        else:
            self._job = work
        self._start = threading.Lock()
        self._finish = finish
        self._final: Optional[Callable[[list[Any]], Any]] = None

    def __call__(self, args: list[Any]) -> Any:
        final = self._final
        if final is None:
            future = self._future
            if future is None:
                try:
                    return self._eager(args)
                finally:
                    with self._start:
                        if self._future is None and self._job is not None:
                            self._future = submit_compile(self._job)
                            self._job = None
            if not future.done():
                return self._eager(args)
            final = self._final = self._finish()
        return final(args)


__all__ = ["AsyncGraph", "submit_compile", "wait"]
