"""Clones on the torch side into a dense layout become ``Tensor.contiguous`` calls in that
layout (:func:`fold_clones`).
"""

from __future__ import annotations

import torch
import torch.fx

from ..nodes import dense_format, mutates, traced_value


def fold_clones(g: torch.fx.Graph) -> int:
    """Rewrites the torch side's clones whose result is dense in a memory format (contiguous,
    channels-last) into ``Tensor.contiguous`` calls in that format, which copy only a tensor
    not in that layout already; returns how many. AOTAutograd's graphs are
    functional, so a copy of a contiguous tensor is needed only where something writes to one
    of the two: clones read by an in-place op, of a tensor an in-place op writes, or that are
    graph outputs (fresh storage AOTAutograd may hand out) keep their op. (The matrix products
    of an attention block clone their operands after an expand that broadcasts nothing: a
    device copy per product in a training step. With convolutions made channels-last, the
    clones of a channels-last activation that a model's ``contiguous()`` or the layout pass
    left are the same case in that format.)"""
    count = 0
    for n in list(g.nodes):
        if n.op != "call_method" or n.target != "clone" or len(n.args) != 1 or set(n.kwargs) - {"memory_format"}:
            continue
        x, v = n.args[0], traced_value(n)
        # Only where the traced result is dense in a format, which contiguous(format) gives
        # too (a clone that preserves a transposed layout keeps its op).
        fmt = dense_format(v) if isinstance(v, torch.Tensor) else None
        if not isinstance(x, torch.fx.Node) or fmt is None:
            continue
        if any(u.op == "output" or mutates(u) for u in n.users) or any(mutates(u) for u in x.users):
            continue
        n.target = "contiguous"
        n.kwargs = {} if fmt == torch.contiguous_format else {"memory_format": fmt}
        count += 1
    return count


__all__ = ["fold_clones"]
