"""Common subexpression elimination on the ATen graph (:func:`eliminate_common_subexpressions`).
"""

from __future__ import annotations

import operator
import struct
from typing import Any

import torch
import torch.fx

from ..nodes import may_mutate, pure, written_nodes


def eliminate_common_subexpressions(gm: torch.fx.GraphModule) -> int:
    """Merges identical pure ATen nodes (the same op on the same arguments) of ``gm`` in place;
    returns how many nodes went. Inference graphs reach the backend without this pass (AOTAutograd
    runs one on a training graph's joint graph): BERT at a symbolic sequence length padded its
    attention mask once per layer, 12 identical pads (each an allocation, a fill and a copy) that
    are now one.

    kiln's own pass rather than torch's ``fx_graph_cse``: torch's imports Inductor's pattern
    matcher, and with it most of Inductor (1.6 s of a warm start's first call on a 2-core
    machine, for a pass that takes milliseconds). The rules are the usual ones: only functional
    ATen ops and ``getitem``; never random ops (tagged ``nondeterministic_seeded``) nor
    uninitialised allocations; a node whose storage a graph output shares stays (two equal
    outputs must stay two tensors); and nodes merge only within the same mutation region (the
    stretch between two in-place ops), since an in-place op may change what equal arguments
    hold."""
    g = gm.graph
    out_node = next(n for n in reversed(g.nodes) if n.op == "output")
    outs = out_node.all_input_nodes
    out_storages = {st for a in outs for st in _storages(a)}
    # Outputs, and the tuple-valued nodes whose items an output is or views (an item's traced
    # value is another tensor than the tuple's, so storages do not tell).
    kept_apart = set(outs)
    for n in g.nodes:
        if n.target is operator.getitem and (n in kept_apart or not out_storages.isdisjoint(_storages(n))):
            kept_apart.add(n.args[0])
    written = written_nodes(g)
    seen: dict[Any, torch.fx.Node] = {}
    region = 0
    removed = 0
    for n in list(g.nodes):
        if n.op != "call_function":
            continue
        target = n.target
        if not pure(target):
            if may_mutate(target):
                region += 1
            continue
        if n in written or isinstance(n.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool)):
            continue  # a tensor written in place later; a size (merging could lose a symbol)
        if n in kept_apart or not out_storages.isdisjoint(_storages(n)):
            continue
        try:
            key = (target, _cse_key(n.args), _cse_key(n.kwargs), region)
            kept = seen.get(key)
        except TypeError:  # an argument kiln cannot compare by value
            continue
        if kept is None:
            seen[key] = n
            continue
        n.replace_all_uses_with(kept)
        g.erase_node(n)
        removed += 1
    if removed:
        gm.recompile()
    return removed


def _storages(n: Any) -> list[Any]:
    """The storages of a node's traced value (each tensor of a tuple-valued one); empty when
    there are none to compare."""
    val = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
    from torch.multiprocessing.reductions import StorageWeakRef

    out = []
    for v in val if isinstance(val, (list, tuple)) else (val,):
        if isinstance(v, torch.Tensor):
            try:
                out.append(StorageWeakRef(v.untyped_storage()))
            except Exception:  # sparse or otherwise storage-less values
                pass
    return out


def _cse_key(a: Any) -> Any:
    """An argument as a hashable value that equals another's only when the two mean the same:
    nodes by identity, sequences element by element, numbers with their type (1, 1.0 and True
    differ) and floats by their bits (0.0 and -0.0 differ, NaN equals NaN)."""
    if isinstance(a, torch.fx.Node):
        return a
    if isinstance(a, (list, tuple)):
        return (type(a).__name__,) + tuple(_cse_key(x) for x in a)
    if isinstance(a, dict):
        return ("dict",) + tuple((k, _cse_key(v)) for k, v in sorted(a.items()))
    if isinstance(a, float):
        return ("float", struct.pack("<d", a))
    if isinstance(a, (bool, int)):
        return (type(a).__name__, a)
    if a is None or isinstance(a, (str, torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return (type(a).__name__, a)
    raise TypeError(f"no CSE key for {type(a).__name__}")


__all__ = ["eliminate_common_subexpressions"]
