"""The CUDA side of kiln.torch: launching kiln's CUDA kernels on torch's stream, and replaying
compiled graphs through CUDA graphs (``mode="reduce-overhead"``).

The driver API bindings, the per-device module cache and the plan launcher live in
:mod:`kiln.cuda`, which does not depend on torch; this module adds what is torch-specific:
devices given as ``torch.device``, torch's lazy CUDA initialisation, and CUDA graphs.

Kernel launches follow the launch plan of the compiled result (see :mod:`kiln.cuda`). The
cubin (or, failing that, the PTX) is loaded once per device into the device's primary context,
the one torch uses. Temporaries come from torch's caching allocator and kernels run on
``torch.cuda.current_stream()`` (the caller passes its handle to
:meth:`~kiln.cuda.CudaKernel.launch`), so kiln kernels order with torch's own work and torch's
memory reuse rules hold for them.
"""

from __future__ import annotations

import operator
import warnings
from typing import Any, Callable, Optional, Sequence

import torch

from .. import cuda as _kcuda
from ..cuda import CudaKernel
from . import native
from .runtime import STATS


def load_kernel(compiled: Any, device: torch.device) -> CudaKernel:
    """The kernels of ``compiled`` on ``device``: loaded once per process per device (the
    cache is :mod:`kiln.cuda`'s, shared with ``kiln.jit``)."""
    torch.cuda.init()
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _kcuda.load_kernel(compiled, int(index))


# ---------------------------------------------------------------------------------- CUDA graphs

def _storage_uses(t: torch.Tensor) -> int:
    """How many tensors (views included) share ``t``'s storage."""
    return int(torch._C._storage_Use_Count(t.untyped_storage()._cdata))


# Addresses of outputs that live in a captured graph's memory: stable for as long as the graph
# exists, so a graph that reads them (a backward reading saved activations) can read them in
# place instead of from copies.
_graph_outputs: set[int] = set()


class _Instance:
    """One capture of a graph: the CUDA graph, the copies it reads the moving arguments from,
    the addresses of the arguments it reads in place, and its outputs (with the use count of
    each output's storage while only this instance holds it).

    ``rt``: the native part runner when it was loaded at capture time; its C++ helpers then
    count the storage uses and hand out the outputs (one call each, not one per tensor)."""

    def __init__(self, graph: Any, static_in: list[Optional[torch.Tensor]], in_place: dict[int, int],
                 outputs: list[Any], rt: Any = None) -> None:
        self.graph = graph
        self.static_in = static_in  # None where the argument is read in place
        self.copies = [(i, t) for i, t in enumerate(static_in) if t is not None]
        self.in_place = in_place  # argument index -> the address captured
        idx = sorted(in_place)
        # fits() compares the in-place arguments' addresses in one C-level tuple comparison.
        self._pick = operator.itemgetter(*idx) if len(idx) >= 2 else (lambda ptrs: tuple(ptrs[i] for i in idx))
        self._want = tuple(in_place[i] for i in idx)
        self.outputs = outputs
        self.tensors = [o for o in outputs if isinstance(o, torch.Tensor)]
        self.rt = rt
        self.baseline = rt.storage_uses(self.tensors) if rt is not None else [_storage_uses(o) for o in self.tensors]
        for o in self.tensors:
            _graph_outputs.add(o.data_ptr())

    def fits(self, ptrs: Sequence[int]) -> bool:
        return self._pick(ptrs) == self._want

    def free(self) -> bool:
        """No result of an earlier replay is still in use (a replay would overwrite it)."""
        if self.rt is not None:
            return all(map(operator.le, self.rt.storage_uses(self.tensors), self.baseline))
        return all(_storage_uses(o) <= b for o, b in zip(self.tensors, self.baseline))

    def results(self) -> list[Any]:
        """The outputs as new tensor objects over the graph's memory."""
        if self.rt is not None:
            return self.rt.detach_all(self.outputs)
        return [o.detach() if isinstance(o, torch.Tensor) else o for o in self.outputs]


class CudaGraphRunner:
    """Replays a boxed compiled function (``fn(list_of_args) -> list``) through CUDA graphs,
    without copying what need not be copied.

    Per argument signature (shapes, strides, dtypes, devices), the first call runs ``fn`` as it
    is (a warm-up: lazy initialisation, library handles). Later calls replay a captured
    instance of the graph:

    - **Arguments** whose address has never moved between calls (parameters, buffers,
      persistent state), and arguments that are outputs of a captured graph (activations a
      backward graph reads), are read in place: the instance remembers their addresses and is
      replayed only for calls that pass the same ones. Arguments seen at another address once
      are copied into the instance's static inputs from then on.
    - **Results** are the instance's own output memory, returned as new tensor objects over it
      (no copy). An instance is replayed only when no result of its previous replay is still
      in use (the storage use counts say so); otherwise another instance is used or captured
      (at most ``MAX_INSTANCES`` per signature: a training step alternates between two; past
      that the oldest unpinned instance is replaced), and when every instance's results are
      still held the call runs ``fn`` directly. A result therefore stays valid for as long as
      the caller holds it, as in eager mode.

    Arguments that are not all CUDA tensors, or a capture that fails (an op that synchronises
    with the host), make it run ``fn`` directly from then on, after one warning.
    """

    MAX_INSTANCES = 3

    def __init__(self, fn: Callable[[list[Any]], Any], name: str = "graph") -> None:
        # An instance attribute: AOTAutograd looks for it on wrappers that copy __dict__ only.
        self._boxed_call = True
        self.fn = fn
        self.name = name
        self._instances: dict[Any, list[_Instance]] = {}
        self._last_ptrs: dict[Any, list[int]] = {}
        self._moving: dict[Any, set[int]] = {}  # per signature: arguments seen at another address
        self._disabled = False
        self._python_keyed = False  # signatures computed in Python (before the runner loaded)
        self.replays = 0  # diagnostics: calls served by a replay
        self.direct_calls = 0  # and calls that ran fn (warm-ups, all instances busy)

    def __call__(self, args: list[Any]) -> Any:
        if self._disabled:
            return self.fn(args)
        rt = native.RUNNER
        if rt is not None and self._python_keyed:
            # The runner loaded after captures keyed the Python way: those keys never match
            # again, so their instances go (with their graph memory, once no result holds it).
            self._python_keyed = False
            for d in (self._instances, self._last_ptrs, self._moving):
                for k in [k for k in d if not isinstance(k, bytes)]:
                    del d[k]
        if rt is not None:
            got = rt.graph_key(args)  # one C++ pass over every argument
            if got is None:
                return self.fn(args)
            sig, ptrs = got
        else:
            sig = self._signature(args)
            if sig is None:
                return self.fn(args)
            self._python_keyed = True
            ptrs = tuple(a.data_ptr() for a in args)
        last = self._last_ptrs.get(sig)
        self._last_ptrs[sig] = ptrs
        if last is None:
            self.direct_calls += 1
            return self.fn(args)
        moving = self._moving.setdefault(sig, set())
        if ptrs != last:
            moving.update(i for i, (p, q) in enumerate(zip(ptrs, last)) if p != q and p not in _graph_outputs)
        instances = self._instances.setdefault(sig, [])
        inst = next((i for i in instances if i.fits(ptrs) and i.free()), None)
        if inst is None:
            if len(instances) >= self.MAX_INSTANCES:
                # Replace the oldest instance nobody's results pin (its graph and memory go);
                # if every one is pinned, run without a graph.
                stale = next((i for i in instances if i.free()), None)
                if stale is None:
                    self.direct_calls += 1
                    return self.fn(args)
                instances.remove(stale)
            in_place = {i: p for i, p in enumerate(ptrs)
                        if p in _graph_outputs or (i not in moving and p == last[i])}
            try:
                inst = self._capture(args, in_place, rt)
            except Exception as e:
                self._disabled = True
                warnings.warn(f"kiln: CUDA graph capture of {self.name} failed; running without CUDA graphs: "
                              f"{type(e).__name__}: {e}", RuntimeWarning, stacklevel=2)
                return self.fn(args)
            instances.append(inst)
        for i, dst in inst.copies:
            dst.copy_(args[i])
        inst.graph.replay()
        self.replays += 1
        STATS.graph_replays += 1
        return inst.results()

    @staticmethod
    def _signature(args: Sequence[Any]) -> Any:
        sig = []
        for a in args:
            if not isinstance(a, torch.Tensor) or a.device.type != "cuda":
                return None
            sig.append((tuple(a.shape), a.stride(), a.dtype, a.device))
        return tuple(sig)

    def _capture(self, args: list[Any], in_place: dict[int, int], rt: Any = None) -> _Instance:
        static_in: list[Optional[torch.Tensor]] = [
            None if i in in_place else
            torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device).copy_(a)
            for i, a in enumerate(args)]
        feed = [a if s is None else s for a, s in zip(args, static_in)]
        # Warm up on a side stream with the buffers the graph will read, as torch's CUDA graph
        # notes advise.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.fn(list(feed))
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = self.fn(list(feed))
        return _Instance(graph, static_in, in_place, list(outputs), rt)


def philox_state_on_host(graph: Any) -> int:
    """Makes a graph safe to capture in a CUDA graph when it holds attention's backward with
    dropout: captured, the forward returns its Philox seed and offset as device memory, and the
    backward op reads them on the host whenever it runs outside a capture (a warm-up, a call
    while every captured instance is busy): a crash (exit -11, H200, torch 2.11,
    ``tests/gpu/random_graphs_gpu.py``). Each op taking ``philox_seed`` and ``philox_offset``
    is called through a wrapper that, outside a capture, copies device ones to the host first
    (a synchronisation on that rare path); inside a capture they pass as they are, which the op
    reads on the device (the same script: the same gradient either way). Returns how many nodes
    it wrapped. Random draws need nothing: torch's CUDA generator advances its Philox offset at
    every replay, so each replay draws new numbers (the same script)."""
    wrapped = 0
    for n in graph.nodes:
        target = n.target
        if n.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        names = [a.name for a in target._schema.arguments]
        if "philox_seed" in names and "philox_offset" in names:
            n.target = _philox_on_host(target)
            wrapped += 1
    return wrapped


_PHILOX_WRAPPERS: dict[Any, Callable[..., Any]] = {}


def _philox_on_host(op: Any) -> Callable[..., Any]:
    """``op`` called with its Philox seed and offset on the host unless a capture is running."""
    wrapper = _PHILOX_WRAPPERS.get(op)
    if wrapper is not None:
        return wrapper
    names = [a.name for a in op._schema.arguments]
    at = [names.index("philox_seed"), names.index("philox_offset")]

    def on_device(v: Any) -> bool:
        return isinstance(v, torch.Tensor) and v.is_cuda

    def call(*args: Any, **kwargs: Any) -> Any:
        positional = [i for i in at if i < len(args) and on_device(args[i])]
        named = [k for k in ("philox_seed", "philox_offset") if on_device(kwargs.get(k))]
        if (positional or named) and not torch.cuda.is_current_stream_capturing():
            args = tuple(a.cpu() if i in positional else a for i, a in enumerate(args))
            kwargs = {k: v.cpu() if k in named else v for k, v in kwargs.items()}
        return op(*args, **kwargs)

    call.__name__ = f"{str(op).replace('.', '_')}_philox_on_host"
    call.__qualname__ = call.__name__
    _PHILOX_WRAPPERS[op] = call
    return call


def draws_random(n: Any) -> bool:
    """Whether one FX node consumes the RNG: a seeded op (dropout, rand...), or attention with a
    nonzero dropout probability (the reordering passes keep such nodes in place and order)."""
    target = n.target
    if n.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    if torch.Tag.nondeterministic_seeded not in target.tags:
        return False
    names = [a.name for a in target._schema.arguments]
    if "dropout_p" not in names:
        return True
    i = names.index("dropout_p")
    p = n.args[i] if i < len(n.args) else n.kwargs.get("dropout_p", 0.0)
    return not isinstance(p, (int, float)) or p != 0


def wants_cuda_graphs(example_inputs: Sequence[Any]) -> bool:
    """Whether a graph's inputs are all on CUDA (CUDA graphs apply to GPU graphs only)."""
    tensors = [a for a in example_inputs if isinstance(a, torch.Tensor)]
    return bool(tensors) and all(t.device.type == "cuda" for t in tensors)


__all__ = ["CudaGraphRunner", "CudaKernel", "draws_random", "load_kernel", "philox_state_on_host",
           "wants_cuda_graphs"]
