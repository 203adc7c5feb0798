"""Graphs replayed through CUDA graphs read attention's Philox state on the host outside a capture
(:func:`philox_state_on_host`).
"""

from __future__ import annotations

from typing import Any, Callable

import torch


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
            n.target = philox_on_host(target)
            wrapped += 1
    return wrapped


PHILOX_WRAPPERS: dict[Any, Callable[..., Any]] = {}


def philox_on_host(op: Any) -> Callable[..., Any]:
    """``op`` called with its Philox seed and offset on the host unless a capture is running."""
    wrapper = PHILOX_WRAPPERS.get(op)
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

    call.__name__ = f"{str(op).replace('.', '_')}philox_on_host"
    call.__qualname__ = call.__name__
    PHILOX_WRAPPERS[op] = call
    return call


__all__ = ["PHILOX_WRAPPERS", "philox_on_host", "philox_state_on_host"]
