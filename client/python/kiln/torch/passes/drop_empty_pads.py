"""Pads of zero widths go where nothing can tell them from their argument (stage 1, last but
one: the partitioner then sees the argument)."""

from __future__ import annotations

import torch
import torch.fx

from .. import lowering as L
from ..nodes import returned_through_views, returns_alias, same_layout, written_nodes


def drop_empty_pads(graph: torch.fx.Graph) -> int:
    """A ``constant_pad_nd`` whose widths are all zero is replaced by its argument, where
    nothing can tell the two apart; returns how many went.

    Torch computes such a pad as a copy (Swin pads every feature map up to a multiple of its
    window: at 224x224 fifteen copies per inference step). The graph is functional, so the
    copy is needed only where the result and its argument could be seen as two tensors: the
    pad stays when an in-place op writes either of them or a tensor they share memory with,
    when the graph returns the result (directly or through views: the caller's tensor would
    share memory with the argument), and when the two are not laid out alike (a ``view`` of
    the result relies on its traced strides). A pad kept for its layout lowers into a part
    like any other op (:func:`..lowering._constant_pad_nd`: nothing to compute); one kept as a
    tensor of its own (:data:`..lowering.DISTINCT`) stays in torch."""
    pads = [n for n in graph.nodes if n.op == "call_function" and n.target is torch.ops.aten.constant_pad_nd.default
            and len(n.args) >= 2 and isinstance(n.args[0], torch.fx.Node) and isinstance(n.args[1], (list, tuple))
            and all(isinstance(p, int) and p == 0 for p in n.args[1])]
    if not pads:
        return 0

    def root(n: torch.fx.Node) -> torch.fx.Node:  # the tensor whose memory ``n`` views
        while n.op == "call_function" and returns_alias(n.target) and n.args and isinstance(n.args[0], torch.fx.Node):
            n = n.args[0]
        return n

    written = {root(n) for n in written_nodes(graph)}
    done = 0
    for pad in pads:
        x = pad.args[0]
        if root(x) in written or root(pad) in written or returned_through_views(pad):
            pad.meta[L.DISTINCT] = True  # torch's copy, not a part's alias of its argument
            continue
        if not same_layout(L.node_meta(pad), L.node_meta(x)):
            continue
        pad.replace_all_uses_with(x)
        graph.erase_node(pad)
        done += 1
    return done


__all__ = ["drop_empty_pads"]
