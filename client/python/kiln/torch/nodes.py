"""What kiln.torch's passes, partitioner and stitching ask of FX nodes: whether an op returns a
view, may be merged with an identical call, writes its arguments or draws random numbers, the
values the trace recorded, their layouts, and which nodes a walk over users reaches.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Optional

import torch
import torch.fx

_UNINITIALISED = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                            "empty_permuted"})


def returns_alias(target: Any) -> bool:
    """Whether ``target`` is an ATen op whose result shares memory with an argument (a view)."""
    return isinstance(target, torch._ops.OpOverload) and any(r.alias_info is not None
                                                             for r in target._schema.returns)


def pure(target: Any) -> bool:
    """Whether a call of ``target`` may be merged with an identical one."""
    if target is operator.getitem:
        return True
    if not isinstance(target, torch._ops.OpOverload) or target.namespace not in ("aten", "prims"):
        return False
    schema = target._schema
    if schema.is_mutable or any(r.alias_info is not None and r.alias_info.is_write for r in schema.returns):
        return False
    if torch.Tag.nondeterministic_seeded in target.tags:
        return False
    return target.overloadpacket.__name__ not in _UNINITIALISED


def may_mutate(target: Any) -> bool:
    """Whether a call of ``target`` (not :func:`pure`) may write a tensor other nodes read."""
    if isinstance(target, torch._ops.OpOverload):
        return bool(target._schema.is_mutable)
    return not (target is operator.getitem or getattr(target, "__module__", "") in ("_operator", "math"))


def mutates(n: torch.fx.Node) -> bool:
    """Whether a node may write to its arguments (an in-place op)."""
    t = n.target
    if isinstance(t, torch._ops.OpOverload):
        return bool(t._schema.is_mutable)
    return getattr(t, "__name__", str(t)).endswith("_")


def written_nodes(g: torch.fx.Graph) -> set[torch.fx.Node]:
    """The nodes an in-place op of ``g`` writes, and the nodes those view: merging a fresh
    tensor that is later written with an equal one would let the write reach both."""
    out: set[torch.fx.Node] = set()
    for n in g.nodes:
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
            continue
        schema = n.target._schema
        if not schema.is_mutable:
            continue
        for i, arg in enumerate(schema.arguments):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            value = n.args[i] if i < len(n.args) else n.kwargs.get(arg.name)
            for x in value if isinstance(value, (list, tuple)) else (value,):
                while isinstance(x, torch.fx.Node) and x not in out:
                    out.add(x)
                    # Through views back to the tensor they share memory with.
                    x = x.args[0] if returns_alias(x.target) and x.args else None
    return out


def draws_random(n: Any) -> bool:
    """Whether one FX node consumes the RNG: a seeded op (dropout, rand...), or attention with a
    nonzero dropout probability (the reordering passes keep such nodes in place and order)."""
    target = n.target
    if n.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    if torch.Tag.nondeterministic_seeded not in target.tags:
        return False
    names = [a.name for a in target._schema.arguments]
    if "dropout_p" not in names:
        return True
    i = names.index("dropout_p")
    p = n.args[i] if i < len(n.args) else n.kwargs.get("dropout_p", 0.0)
    return not isinstance(p, (int, float)) or p != 0


def traced_value(n: Any) -> Any:
    return n.meta.get("val") if isinstance(n, torch.fx.Node) else None


def static_shape(n: Any) -> Optional[tuple[int, ...]]:
    v = traced_value(n)
    if not isinstance(v, torch.Tensor) or any(not isinstance(d, int) for d in v.shape):
        return None
    return tuple(v.shape)


def get_attr(root: torch.nn.Module, target: str) -> Any:
    """The attribute ``target`` (dotted) of ``root``: what a get_attr node reads."""
    obj: Any = root
    for atom in target.split("."):
        obj = getattr(obj, atom)
    return obj


#: torch's channels-last memory format per number of dimensions.
CHANNELS_LAST_FORMATS = {4: torch.channels_last, 5: torch.channels_last_3d}


def is_channels_last(m: torch.Tensor) -> bool:
    """Whether ``m`` (a 4-D or 5-D tensor) is in torch's channels-last format."""
    fmt = CHANNELS_LAST_FORMATS.get(m.ndim)
    try:
        return fmt is not None and bool(m.is_contiguous(memory_format=fmt))
    except Exception:  # a symbolic layout the trace cannot decide
        return False


def dense_format(m: torch.Tensor) -> Optional[torch.memory_format]:
    """The memory format ``m`` is dense in, contiguous first (a tensor dense in both, with a
    dimension of size 1, counts as contiguous), else channels-last; None for neither, or for a
    symbolic layout the trace cannot decide."""
    try:
        if m.is_contiguous():
            return torch.contiguous_format
        fmt = CHANNELS_LAST_FORMATS.get(m.ndim)
        return fmt if fmt is not None and m.is_contiguous(memory_format=fmt) else None
    except Exception:
        return None


def same_layout(a: Any, b: Any) -> bool:
    """Whether two traced tensors have the same dtype, device, sizes and strides (symbolic
    ones compared as expressions, which installs no guard)."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.layout != torch.strided \
            or b.layout != torch.strided or a.dtype != b.dtype or a.device != b.device or a.dim() != b.dim():
        return False
    try:
        return all(_size_expr(p) == _size_expr(q) for p, q in zip((*a.shape, *a.stride()), (*b.shape, *b.stride())))
    except Exception:  # sizes the trace cannot express
        return False


def _size_expr(v: Any) -> Any:
    """A size as a comparable value: an int, or a SymInt's expression (reading it installs no
    guard, where comparing SymInts would)."""
    return v.node.expr if isinstance(v, torch.SymInt) else int(v)


def reached(start: list[torch.fx.Node], found: Callable[[torch.fx.Node], bool],
            through: Callable[[torch.fx.Node], bool]) -> bool:
    """Whether a user of ``start``'s nodes, or of the users ``through`` lets the walk pass
    (transitively), is one ``found`` accepts."""
    todo, seen = list(start), set()
    while todo:
        u = todo.pop()
        if u in seen:
            continue
        seen.add(u)
        for r in u.users:
            if found(r):
                return True
            if through(r):
                todo.append(r)
    return False


def returned_through_views(n: torch.fx.Node) -> bool:
    """Whether the graph returns ``n`` or a tensor that views it."""
    return reached([n], lambda r: r.op == "output",
                   lambda r: r.op == "call_function" and (r.target is operator.getitem or returns_alias(r.target)))


__all__ = ["CHANNELS_LAST_FORMATS", "dense_format", "draws_random", "get_attr", "is_channels_last", "may_mutate", "mutates", "pure", "reached", "returned_through_views",
           "returns_alias", "same_layout", "static_shape", "traced_value", "written_nodes"]
