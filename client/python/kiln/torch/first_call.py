"""``kiln.torch.compile``: torch.compile with the kiln backend, whose first call need not trace.

``torch.compile(model, backend="kiln", options={"async": True})`` takes kilnd off the first
call's path, but not Dynamo and AOTAutograd: they trace the model on the caller's thread
before any backend is called (BERT-base: about 4 s, against 0.13 s for eager's first call),
and torch.compile gives a backend named by a string no hook before that trace. This module's
:func:`compile` takes torch.compile's arguments and, with ``options={"async": True}``,
returns an :class:`EagerFirst` wrapper instead:

- the first call runs the model eagerly on the caller's thread and returns its result;
- then (once the model is called again, or :data:`QUIET_S` seconds later) a background
  thread calls the ``torch.compile``'d model once on copies of that call's arguments (under
  the caller's grad, inference-mode and autocast settings, on its CUDA device and stream):
  Dynamo and AOTAutograd trace there, and kiln compiles as ``async`` does; the caller's next
  calls run eagerly until that trace is done, then go through the compiled model (whose parts
  switch to kiln's kernels once loaded).

The background call runs the model a second time, so it is made only when that cannot be
seen: if the first call wrote a parameter or buffer of the model (a training-mode batch norm's
running statistics, a cache kept in a buffer) or drew random numbers from torch's default
generators (dropout in training mode), the second call traces on the caller's thread instead,
as plain torch.compile does. Arguments are copied, so a model that writes its inputs writes
the caller's once. A plain function's globals are not checked: a function that writes global
tensors should use torch.compile directly.

With ``options={"precompile": True}`` (or ``$KILN_TORCH_PRECOMPILE=1``), a module is compiled
through kilnd's precompiled models instead (:mod:`.precompile`): on a warm cluster a fresh
process loads the compiled model without Dynamo or AOTAutograd tracing it.

Without ``async`` or ``precompile`` (or with ``disable=True``), :func:`compile` is
``torch.compile`` with ``backend="kiln"``. A shape or setting the trace's guards do not cover
later recompiles on the caller's thread, as with torch.compile.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any, Callable, Optional

import torch
import torch.utils._pytree as pytree

from .async_compile import wait as wait_for_compiles
from .dynamo_backend import BackendConfig, make_backend
from .precompile import Precompiled

#: Seconds after the first result before the background trace starts, unless the model is called
#: again (or waited for) sooner. Importing Dynamo and tracing hold the interpreter lock for up
#: to ~0.2 s at a time; started at once, they delayed what the caller did with its first result
#: (measured on an H200's host: the first result of an LSTM cell 0.23 s against eager's 0.12).
QUIET_S = 0.25


def compile(model: Optional[Callable[..., Any]] = None, *, fullgraph: bool = False, dynamic: Optional[bool] = None,
            backend: Any = "kiln", mode: Optional[str] = None, options: Optional[dict[str, Any]] = None,
            disable: bool = False, **kwargs: Any) -> Any:
    """``torch.compile`` with ``backend="kiln"`` by default; with ``options={"async": True}``
    the first call runs eagerly and the model is traced in the background (module docstring).
    Used as ``@kiln.torch.compile(options=...)`` it is a decorator."""
    if model is None:
        return lambda m: compile(m, fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode,
                                 options=options, disable=disable, **kwargs)
    def make() -> Any:
        return torch.compile(model, fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode,
                             options=options, disable=disable, **kwargs)

    if not disable and (options or {}).get("precompile", _precompile_default(model)) and backend == "kiln":
        opts = {k: v for k, v in (options or {}).items() if k != "precompile"}
        config = BackendConfig.from_args(mode, opts)
        return Precompiled(model, config, lambda: torch.compile(
            model, fullgraph=fullgraph, dynamic=dynamic, backend=make_backend(config), disable=disable, **kwargs))
    if disable or not (options or {}).get("async"):
        return make()
    return EagerFirst(model, make)


def _precompile_default(model: Any) -> bool:
    """``$KILN_TORCH_PRECOMPILE=1`` precompiles every module (not plain functions)."""
    return isinstance(model, torch.nn.Module) and os.environ.get("KILN_TORCH_PRECOMPILE", "0") not in ("", "0")


class EagerFirst:
    """A compiled model whose first call runs eagerly while it is traced in the background.

    Attributes not its own are the compiled model's, or the model's before it is compiled (an
    nn.Module's ``eval()``, ``parameters()`` and so on reach the model either way)."""

    def __init__(self, model: Callable[..., Any], make: Callable[[], Callable[..., Any]]) -> None:
        self._model = model
        # torch.compile is called where the model is first traced: its first call imports
        # Dynamo (about a second), which the first result does not wait for either.
        self._make = make
        self._compiled: Optional[Callable[..., Any]] = None
        self._make_lock = threading.Lock()  # not self._lock: a call must not wait for the import
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._traced = threading.Event()  # set: calls go through the compiled model
        self._go = threading.Event()  # set: the background trace may start now
        #: Why the model was traced on the caller's thread instead, if it was (for diagnostics).
        self.traced_here: Optional[str] = None
        #: What the background trace raised, if anything (the caller's next call traces again).
        self.error: Optional[BaseException] = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._traced.is_set():
            compiled = self._compiled  # no lock once it exists (truth of a module: its len())
            return (compiled if compiled is not None else self._compiled_model())(*args, **kwargs)
        with self._lock:
            first = self._thread is None and self.traced_here is None
            if first:
                self._thread = threading.Thread(target=lambda: None)  # claimed: one first call only
        if not first:
            self._go.set()
            return self._model(*args, **kwargs)  # the background trace is not done yet
        before = _footprint(self._model)
        try:
            out = self._model(*args, **kwargs)
        except BaseException:
            with self._lock:
                self._thread = None  # the next call is the first again
            raise
        seen = _footprint(self._model)
        if seen != before:
            self.traced_here = _what_changed(before, seen)
            self._traced.set()
            return out
        job_args, job_kwargs = pytree.tree_map(_copy, (args, kwargs))
        state = _ThreadState.capture(args, kwargs)
        thread = threading.Thread(target=self._trace, args=(job_args, job_kwargs, state), name="kiln-trace")
        with self._lock:
            self._thread = thread
        thread.start()
        return out

    def _trace(self, args: tuple[Any, ...], kwargs: dict[str, Any], state: "_ThreadState") -> None:
        self._go.wait(QUIET_S)
        try:
            compiled = self._compiled_model()
            with state.applied():
                compiled(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - the caller's next call meets it again
            self.error = e
        finally:
            self._traced.set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Blocks until the background trace is done and the compiles it started are loaded
        (:func:`kiln.torch.wait`); False if ``timeout`` seconds passed first. Before the first
        call there is nothing to wait for."""
        self._go.set()
        t0 = time.monotonic()
        with self._lock:
            thread = self._thread
        if thread is not None and thread.ident is not None:
            thread.join(timeout)
            if thread.is_alive():
                return False
        return wait_for_compiles(None if timeout is None else max(0.0, timeout - (time.monotonic() - t0)))

    def _compiled_model(self) -> Callable[..., Any]:
        with self._make_lock:
            if self._compiled is None:
                self._compiled = self._make()
            return self._compiled

    @property
    def traced(self) -> bool:
        """Whether calls now go through the compiled model."""
        return self._traced.is_set()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._compiled if self._compiled is not None else self._model, name)


def _copy(a: Any) -> Any:
    if not isinstance(a, torch.Tensor):
        return a
    c = a.detach().clone(memory_format=torch.preserve_format)
    return c.requires_grad_(a.requires_grad) if a.requires_grad else c


def _footprint(model: Any) -> tuple[Any, ...]:
    """What a call could change that a second run would change again: the version counters of
    the parameters and buffers of the model (:func:`_modules_of`), and the state of torch's
    default generators."""
    versions = tuple(t._version for m in _modules_of(model) for t in (*m.parameters(), *m.buffers()))
    rng: list[Any] = [bytes(torch.random.default_generator.get_state().numpy())]
    if torch.cuda.is_initialized():
        rng += [bytes(torch.cuda.get_rng_state(d).numpy()) for d in range(torch.cuda.device_count())]
    return versions, tuple(rng)


def _modules_of(fn: Any) -> list[torch.nn.Module]:
    """The modules a call of ``fn`` runs: ``fn`` itself, a bound method's object, or the
    modules a function closes over (``lambda ids: model(ids)``)."""
    if isinstance(fn, torch.nn.Module):
        return [fn]
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, torch.nn.Module):
        return [owner]
    cells = getattr(fn, "__closure__", None) or ()
    found = []
    for c in cells:
        try:
            v = c.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(v, torch.nn.Module):
            found.append(v)
    return found


def _what_changed(before: tuple[Any, ...], after: tuple[Any, ...]) -> str:
    if before[0] != after[0]:
        return "the first call wrote a parameter or buffer of the model"
    return "the first call drew random numbers"


class _ThreadState:
    """The caller's thread-local torch settings that Dynamo's guards read."""

    def __init__(self) -> None:
        self.grad = torch.is_grad_enabled()
        self.inference = torch.is_inference_mode_enabled()
        self.autocast = [(dt, torch.get_autocast_dtype(dt)) for dt in ("cpu", "cuda")
                         if torch.is_autocast_enabled(dt)]
        self.stream: Optional[torch.cuda.Stream] = None

    @staticmethod
    def capture(args: Any, kwargs: Any) -> "_ThreadState":
        s = _ThreadState()
        devices = {t.device for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        cuda = [d for d in devices if d.type == "cuda"]
        if cuda:
            s.stream = torch.cuda.current_stream(cuda[0])
        return s

    @contextlib.contextmanager
    def applied(self) -> Any:
        with contextlib.ExitStack() as stack:
            if self.stream is not None:
                torch.cuda.set_device(self.stream.device)
                stack.enter_context(torch.cuda.stream(self.stream))
            stack.enter_context(torch.inference_mode(self.inference))
            stack.enter_context(torch.set_grad_enabled(self.grad))
            for dt, dtype in self.autocast:
                stack.enter_context(torch.autocast(dt, dtype=dtype))
            yield


__all__ = ["EagerFirst", "compile"]
