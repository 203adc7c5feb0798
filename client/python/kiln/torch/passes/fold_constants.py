"""Constant folding on the ATen graph: values that read no graph input are computed once, at
compile time (:func:`fold_constant_subgraphs`).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.fx

from .. import lowering as L
from ..nodes import get_attr, pure, returns_alias, written_nodes

# A folded value larger than this (elements) is computed on every call instead of being held.
_MAX_CONSTANT_ELEMENTS = 1 << 24


# Ops that fill a tensor with one value: kept as they are by fold_constant_subgraphs.
_FILLS = frozenset({"full", "zeros", "ones", "scalar_tensor", "full_like", "zeros_like", "ones_like", "fill"})


def fold_constant_subgraphs(gm: torch.fx.GraphModule) -> int:
    """Computes once, now, the values of ``gm`` that read no graph input or parameter: a
    tensor made by ``full``/``arange`` and the trace's tensor constants and changed by
    functional ops, such as the shifted-window attention mask Swin builds in every forward
    from zeros by nine slice assignments (functional ``slice_scatter``s, run by torch: a clone
    and a copy each; on CUDA each assigned number is a 0-d tensor constant, copied once more)
    or a roll's index arithmetic. Each such value read by the rest of the graph becomes a
    buffer of ``gm``; returns how many.

    Only static shapes, ops :func:`pure` accepts (no random draws, no uninitialised memory),
    values nothing writes in place, never a graph output or a value an output views (the
    caller could write it, and would share it with the next call), and not a plain fill or a
    view of one: kiln computes those inside the parts that read them, for nothing, where a
    buffer would be read from memory."""
    g = gm.graph
    written = written_nodes(g)
    out = next((n for n in reversed(g.nodes) if n.op == "output"), None)
    returned = set(out.all_input_nodes) if out is not None else set()
    const: set[torch.fx.Node] = set()
    computed: set[torch.fx.Node] = set()  # const values that are more than a fill seen through views
    for n in g.nodes:
        if n.op == "get_attr" and n not in written and _tensor_constant(gm, n) is not None:
            const.add(n)  # a leaf, like a fill: folding it alone would gain nothing
            continue
        if n.op != "call_function" or not pure(n.target) or n in written:
            continue
        flat: list[Any] = []
        torch.fx.node.map_aggregate((n.args, n.kwargs), flat.append)
        leaves_ok = all(v in const if isinstance(v, torch.fx.Node)
                        else not isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool, torch.Tensor))
                        for v in flat)
        val = n.meta.get("val")
        vals = val if isinstance(val, (list, tuple)) else (val,)
        if leaves_ok and all(isinstance(v, torch.Tensor) and L.is_static_tensor(v) for v in vals):
            const.add(n)
            fill_or_view = returns_alias(n.target) or (isinstance(n.target, torch._ops.OpOverload)
                                                        and n.target.overloadpacket.__name__ in _FILLS)
            if not fill_or_view or any(v in computed for v in flat if isinstance(v, torch.fx.Node)):
                computed.add(n)
    frontier = [n for n in g.nodes if n in computed and any(u not in const for u in n.users)
                and isinstance(n.meta.get("val"), torch.Tensor)
                and n.meta["val"].numel() <= _MAX_CONSTANT_ELEMENTS
                and not any(_is_view_of(r, n) for r in returned)]
    if not frontier:
        return 0
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    # Only what the folded values are made of (a large fill a part reads is left alone, not
    # allocated here).
    needed: set[torch.fx.Node] = set()
    stack = list(frontier)
    while stack:
        n = stack.pop()
        if n not in needed:
            needed.add(n)
            stack.extend(a for a in n.all_input_nodes if a in const)
    values: dict[torch.fx.Node, Any] = {}
    with unset_fake_temporarily(), torch.no_grad():
        for n in g.nodes:
            if n not in needed:
                continue
            if n.op == "get_attr":
                values[n] = _tensor_constant(gm, n)
                continue
            args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: values[a])
            values[n] = n.target(*args, **kwargs)
    for i, n in enumerate(frontier):
        name = f"_kiln_constant_{i}"
        while hasattr(gm, name):
            name += "_"
        value = values[n]
        want = n.meta["val"]
        if tuple(value.stride()) != tuple(want.stride()):  # the traced layout, which the graph assumes
            value = torch.empty_strided(want.shape, want.stride(), dtype=want.dtype, device=want.device).copy_(value)
        gm.register_buffer(name, value)
        with g.inserting_before(n):
            attr = g.get_attr(name)
        attr.meta = dict(n.meta)
        n.replace_all_uses_with(attr, delete_user_cb=lambda u: u not in const)
    g.eliminate_dead_code()
    gm.recompile()
    return len(frontier)


def _tensor_constant(gm: torch.fx.GraphModule, n: torch.fx.Node) -> Optional[torch.Tensor]:
    """The value of a ``get_attr`` node that is a tensor constant of the trace (a tensor the
    traced code made, such as the 0-d tensor a Python number becomes when it is assigned into
    a CUDA tensor's slice), or None: parameters, tensors of symbolic or fake values, tensors
    that require gradients and other attributes are not constants."""
    try:
        v = get_attr(gm, n.target)
    except AttributeError:
        return None
    if not isinstance(v, torch.Tensor) or isinstance(v, torch.nn.Parameter) or v.requires_grad:
        return None
    from torch._subclasses.fake_tensor import is_fake

    return v if not is_fake(v) and L.is_static_tensor(v) else None


def _is_view_of(n: torch.fx.Node, base: torch.fx.Node) -> bool:
    """Whether ``n`` is ``base`` seen through a chain of view ops."""
    while isinstance(n, torch.fx.Node) and n is not base:
        if not returns_alias(n.target):
            return False
        n = n.args[0] if n.args else None
    return n is base


__all__ = ["fold_constant_subgraphs"]
