"""Contiguous clones on the torch side become ``Tensor.contiguous`` calls (:func:`fold_clones`).
"""

from __future__ import annotations

import torch
import torch.fx

from ..nodes import mutates, traced_value


def _contiguous(v: torch.Tensor) -> bool:
    try:
        return bool(v.is_contiguous())
    except Exception:  # a symbolic layout the trace cannot decide
        return False


def fold_clones(g: torch.fx.Graph) -> int:
    """Rewrites the torch side's contiguous clones into ``Tensor.contiguous`` calls, which copy
    only a tensor that is not contiguous already; returns how many. AOTAutograd's graphs are
    functional, so a copy of a contiguous tensor is needed only where something writes to one
    of the two: clones read by an in-place op, of a tensor an in-place op writes, or that are
    graph outputs (fresh storage AOTAutograd may hand out) keep their op. (The matrix products
    of an attention block clone their operands after an expand that broadcasts nothing: a
    device copy per product in a training step.)"""
    count = 0
    for n in list(g.nodes):
        if n.op != "call_method" or n.target != "clone" or len(n.args) != 1 or set(n.kwargs) - {"memory_format"}:
            continue
        x, v = n.args[0], traced_value(n)
        # Only where the traced result is contiguous, which contiguous() gives too (a clone
        # that preserves a transposed layout keeps its op).
        if not isinstance(x, torch.fx.Node) or not isinstance(v, torch.Tensor) or not _contiguous(v):
            continue
        if any(u.op == "output" or mutates(u) for u in n.users) or any(mutates(u) for u in x.users):
            continue
        n.target, n.kwargs = "contiguous", {}
        count += 1
    return count


__all__ = ["fold_clones"]
