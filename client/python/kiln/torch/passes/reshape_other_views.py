"""The torch side's remaining ``view`` calls become ``reshape`` (:func:`reshape_other_views`).
"""

from __future__ import annotations

import torch
import torch.fx

from ..nodes import mutates


def reshape_other_views(g: torch.fx.Graph) -> int:
    """The ``view`` calls left on the torch side (sizes known only at run time) become
    ``reshape``, which is the view wherever the strides allow one and a copy elsewhere: a kiln
    part hands torch contiguous results, and an op after one may follow its argument's layout
    (attention's output follows the query's), so a view the trace allowed may not exist at run
    time. As in :func:`.fold_reinterpret.fold_reinterpret`, views a graph output or an in-place op reads keep
    their op. Returns how many."""
    count = 0
    for n in g.nodes:
        if n.op == "call_method" and n.target == "view" and not n.kwargs and len(n.args) >= 2 \
                and not any(isinstance(a, torch.dtype) for a in n.args[1:]) \
                and not any(u.op == "output" or mutates(u) for u in n.users):
            n.target = "reshape"
            count += 1
    return count


__all__ = ["reshape_other_views"]
