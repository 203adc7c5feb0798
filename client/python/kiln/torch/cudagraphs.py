"""CUDA-graph replay of compiled graphs (``mode="reduce-overhead"``): :class:`CudaGraphRunner`
captures a compiled graph's calls into CUDA graphs and replays them, copying the moving
arguments into the captured inputs.
"""

from __future__ import annotations

import operator
import warnings
from typing import Any, Callable, Optional, Sequence

import torch

from .. import native
from .counters import STATS


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


def launches_per_call(outer: torch.fx.GraphModule, parts: Sequence[Any]) -> Optional[int]:
    """Kernel launches one call of a rewritten graph makes: its kiln parts' launch steps (one
    per choice of a symbolic plan's guarded steps) and its torch nodes that compute (views
    launch nothing). None while a part has no compiled kernels (it runs in torch: unknown)."""
    torch_ops = sum(1 for n in outer.graph.nodes
                    if n.op == "call_function" and n.target is not operator.getitem
                    and not getattr(n.target, "is_view", False))
    kernels = 0
    for p in parts:
        compiled = getattr(p, "compiled", None)
        if compiled is None or getattr(p, "kernel", None) is None:
            return None
        steps = compiled.plan.steps
        plain = sum(1 for st in steps if not (st.guard_min or st.guard_max))
        kernels += plain + (1 if plain < len(steps) else 0)
    return torch_ops + kernels


def replay_wins(outer: torch.fx.GraphModule, parts: Sequence[Any]) -> bool:
    """Whether replaying a CUDA graph beats calling the graph's kernels: not for one launch,
    where a graph's replay costs a launch of its own plus the copies of moving arguments (the
    seed's ``sin(x) + cos(x)``: one kiln kernel). Unknown counts replay."""
    n = launches_per_call(outer, parts)
    return n is None or n >= 2


def wants_cuda_graphs(example_inputs: Sequence[Any]) -> bool:
    """Whether a graph's inputs are all on CUDA (CUDA graphs apply to GPU graphs only)."""
    tensors = [a for a in example_inputs if isinstance(a, torch.Tensor)]
    return bool(tensors) and all(t.device.type == "cuda" for t in tensors)


__all__ = ["CudaGraphRunner", "launches_per_call", "replay_wins", "wants_cuda_graphs"]
