"""What kiln.torch's passes, partitioner and stitching ask of FX nodes: whether an op returns a
view, may be merged with an identical call, writes its arguments or draws random numbers, and
the values the trace recorded.
"""

from __future__ import annotations

import operator
from typing import Any, Optional

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


__all__ = ["draws_random", "get_attr", "may_mutate", "mutates", "pure", "returns_alias", "static_shape", "traced_value", "written_nodes"]
