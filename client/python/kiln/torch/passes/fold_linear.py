"""Matrix products of a transposed weight on the torch side become ``linear`` calls
(:func:`fold_linear`).
"""

from __future__ import annotations

from typing import Any, Sequence

import sympy
import torch
import torch.fx

from .. import lowering as L
from ..nodes import static_shape, traced_value


def fold_linear(g: torch.fx.Graph) -> int:
    """Rewrites the torch side's matrix products of a transposed 2-D operand into
    ``torch.nn.functional.linear``, which makes the same cuBLAS call (``mm``/``addmm`` of the
    transposed weight) from one Python call instead of several; returns how many it rewrote.

    - ``mm(a, b.permute(1, 0))`` -> ``linear(a, b)``; ``addmm(bias, a, b.permute(1, 0))`` with
      a 1-D bias -> ``linear(a, b, bias)`` (the transpose node goes when nothing else reads it);
    - when ``a`` is ``x.view(-1, K)`` of an N-D ``x`` and the product's only reader views it
      back to ``x``'s leading dimensions (a linear layer on [B, T, K], as AOTAutograd spells
      it), the views go too: ``linear(x, b)`` takes and gives N-D tensors. Symbolic sizes
      count as equal when their expressions are (no guard is added: the graph stays dynamic);
      a BERT-base forward at a run-time length then makes 72 fewer Python-level reshapes.

    A BERT-base layer runs 6 linear layers: this takes ~15 Python-level calls (views and
    transposes, ~3-5 µs of host time each on a GPU server) out of each layer's forward."""
    linear = torch.nn.functional.linear
    count = 0
    for n in list(g.nodes):
        if n.op != "call_function" or n.target not in (torch.mm, torch.addmm) or n.kwargs:
            continue
        if n.target is torch.mm:
            if len(n.args) != 2:
                continue
            bias, a, bt = None, n.args[0], n.args[1]
        else:
            bias_shape = static_shape(n.args[0]) if len(n.args) == 3 else None
            if bias_shape is None or len(bias_shape) != 1:
                continue
            bias, a, bt = n.args
        if not (isinstance(bt, torch.fx.Node) and bt.op == "call_method" and
                ((bt.target == "permute" and list(bt.args[1:]) in ([[1, 0]], [1, 0])) or
                 (bt.target == "t" and len(bt.args) == 1))):
            continue
        b = bt.args[0]
        bv = traced_value(b)
        if not isinstance(bv, torch.Tensor) or bv.dim() != 2:
            continue
        x, out_view = a, None
        # a = x.view(M, K) of an N-D x, and the product's only reader is .view(x's leading
        # dims + [N]): linear on x itself gives that shape.
        is_view = isinstance(a, torch.fx.Node) and a.op == "call_method" and a.target in _VIEWS
        xv = traced_value(a.args[0]) if is_view else None
        nv = traced_value(n)
        if isinstance(xv, torch.Tensor) and isinstance(nv, torch.Tensor) and xv.dim() >= 3 \
                and nv.dim() == 2 and len(n.users) == 1:
            (user,) = n.users
            uv = traced_value(user)
            if user.op == "call_method" and user.target in _VIEWS and isinstance(uv, torch.Tensor) \
                    and _same_sizes(uv.shape, [*xv.shape[:-1], nv.shape[-1]]) and _contiguous(xv):
                x, out_view = a.args[0], user
        with g.inserting_before(n):
            new = g.call_function(linear, (x, b) if bias is None else (x, b, bias))
        new.meta = dict((out_view or n).meta)
        (out_view or n).replace_all_uses_with(new)
        for dead in ([out_view] if out_view is not None else []) + [n, bt, a]:
            if dead is not None and isinstance(dead, torch.fx.Node) and not dead.users and dead.op != "placeholder":
                g.erase_node(dead)
        count += 1
    return count


_VIEWS = ("view", "reshape")


def _same_sizes(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Whether two shapes are equal for every value of their symbolic sizes (their expressions
    agree), asked without a guard."""
    return len(a) == len(b) and all(sympy.expand(L.size_expr(p) - L.size_expr(q)) == 0 for p, q in zip(a, b))


def _contiguous(v: torch.Tensor) -> bool:
    """Whether ``v`` is row-major for every value of its symbolic sizes: each stride is the
    product of the sizes after it (dimensions of size 1 may have any stride)."""
    inner = sympy.Integer(1)
    for d, st in reversed(list(zip(v.shape, v.stride()))):
        size = L.size_expr(d)
        if size != 1 and sympy.expand(L.size_expr(st) - inner) != 0:
            return False
        inner = inner * size
    return True


__all__ = ["fold_linear"]
