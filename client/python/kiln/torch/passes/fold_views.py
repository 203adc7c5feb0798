"""Chains of views on the torch side of a rewritten graph collapse into one view
(:func:`fold_views`).
"""

from __future__ import annotations

import torch
import torch.fx


def fold_views(g: torch.fx.Graph) -> int:
    """Collapses chains of views on the torch side whose inner link nothing else reads: a
    permute of a permute becomes one permute (or the tensor itself: a weight gradient's
    ``mm(...).permute(1, 0).permute(1, 0)`` as AOTAutograd spells it), a view of a view one
    view. Each removed link is a Python-level torch call (a few µs of host time); the result
    is the same view of the same memory. Returns how many links went."""
    count = 0
    for n in list(g.nodes):
        if n.op != "call_method" or n.target not in ("permute", "view") or len(n.args) != 2 or n.kwargs:
            continue
        inner = n.args[0]
        if not (isinstance(inner, torch.fx.Node) and inner.op == "call_method" and inner.target == n.target
                and len(inner.args) == 2 and not inner.kwargs and len(inner.users) == 1):
            continue
        base = inner.args[0]
        if n.target == "view":
            n.args = (base, n.args[1])
        else:
            p, q = inner.args[1], n.args[1]
            if not (isinstance(p, (list, tuple)) and isinstance(q, (list, tuple)) and len(p) == len(q)
                    and all(isinstance(i, int) for i in (*p, *q))):
                continue
            dims = len(p)
            composed = [p[i % dims] for i in q]
            if composed == list(range(dims)):
                n.replace_all_uses_with(base)
                g.erase_node(n)
                g.erase_node(inner)
                count += 2
                continue
            n.args = (base, composed)
        g.erase_node(inner)
        count += 1
    return count


__all__ = ["fold_views"]
