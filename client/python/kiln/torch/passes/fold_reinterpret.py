"""Views of static shape on the torch side become :func:`reinterpreted_view` calls, made from the
traced size, strides and offset (:func:`fold_reinterpret`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from ..nodes import mutates, traced_value

_reinterpret = getattr(getattr(torch._C, "_dynamo", None), "guards", None)


_reinterpret = getattr(_reinterpret, "_reinterpret_tensor", None)


def reinterpreted_view(x: torch.Tensor, size: tuple[int, ...], stride: tuple[int, ...], delta: int,
                       in_stride: tuple[int, ...], method: str, args: tuple[Any, ...],
                       *more: tuple[str, tuple[Any, ...]]) -> torch.Tensor:
    """The view ``x.<method>(*args)`` of a static graph, made directly from its traced size,
    strides and storage offset (relative to ``x``'s): about 0.4 µs of host time against 1.1-1.3
    for the view op through the dispatcher. Only when ``x`` has the strides it was traced with;
    otherwise (a layout the trace did not foresee) the op itself runs. ``more``: further
    ``(method, args)`` views applied to that result, for a chain folded into one call
    (:func:`fold_reinterpret`); size, strides and delta are then the chain's last view's."""
    if x.stride() == in_stride:
        return _reinterpret(x, size, stride, delta)  # the offset is relative to x's
    # Another layout: the chain's own ops, ``view`` as ``reshape``. A kiln part may hand torch
    # a result in another layout than the trace's (contiguous), and an op after it may follow
    # its argument's layout (attention's output follows the query's), so a ``view`` the trace
    # allowed may not be one here; nothing writes to these views or returns them (see
    # :func:`fold_reinterpret`), so a copy where a view is impossible computes the same.
    x = _apply_view(x, method, args)
    for m, a in more:
        x = _apply_view(x, m, a)
    return x


def _apply_view(x: torch.Tensor, method: str, args: tuple[Any, ...]) -> torch.Tensor:
    return x.reshape(*args) if method == "view" else getattr(x, method)(*args)


_VIEW_METHODS = frozenset({"view", "permute", "expand", "t", "transpose", "unsqueeze", "squeeze", "select"})


def fold_reinterpret(g: torch.fx.Graph) -> int:
    """Rewrites the torch side's view calls of static shape into :func:`reinterpreted_view`
    calls (the size, strides and offset delta read from the trace); returns how many. A
    BERT-base step runs ~200 such views, a few hundred µs of host time in a host-bound step.
    Views whose result is a graph output keep their op (AOTAutograd regenerates outputs that
    alias inputs from real views), as do views read by an in-place op."""
    if _reinterpret is None:
        return 0
    count = 0
    for n in list(g.nodes):
        if n.op != "call_method" or n.target not in _VIEW_METHODS or n.kwargs or not n.args:
            continue
        x, v = n.args[0], traced_value(n)
        xv = traced_value(x)
        if not (isinstance(v, torch.Tensor) and isinstance(xv, torch.Tensor)):
            continue
        if any(not isinstance(d, int) for d in (*v.shape, *v.stride(), *xv.shape, *xv.stride())):
            continue  # symbolic sizes: the trace's numbers are not the run's
        if not isinstance(v.storage_offset(), int) or not isinstance(xv.storage_offset(), int):
            continue
        if any(u.op == "output" or mutates(u) for u in n.users):
            continue
        args = tuple(n.args[1:])
        with g.inserting_before(n):
            new = g.call_function(reinterpreted_view, (x, tuple(v.shape), tuple(v.stride()),
                                                       v.storage_offset() - xv.storage_offset(), tuple(xv.stride()),
                                                       n.target, args))
        new.meta = dict(n.meta)
        n.replace_all_uses_with(new)
        g.erase_node(n)
        count += 1
    return count + _chain_reinterpreted(g)


def _chain_reinterpreted(g: torch.fx.Graph) -> int:
    """Folds a reinterpreted view of a reinterpreted view that nothing else reads into one call
    (an attention head's ``view`` then ``permute``, and back: three calls become one): when the
    first view's input has its traced strides, the first view's result has its traced strides
    too, so one check on the chain's input covers the chain, and the offsets add up. Returns how
    many calls went."""
    count = 0
    for n in list(g.nodes):
        if n.op != "call_function" or n.target is not reinterpreted_view:
            continue
        inner = n.args[0]
        if not (isinstance(inner, torch.fx.Node) and inner.op == "call_function"
                and inner.target is reinterpreted_view and len(inner.users) == 1):
            continue
        x, _, _, d0, in_stride, m0, a0, *more0 = inner.args
        _, size, stride, d1, _, m1, a1, *more1 = n.args
        n.args = (x, size, stride, d0 + d1, in_stride, m0, a0, *more0, (m1, a1), *more1)
        g.erase_node(inner)
        count += 1
    return count


__all__ = ["fold_reinterpret", "reinterpreted_view"]
