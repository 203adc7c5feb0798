"""Stitching a partitioned ATen graph back together: :func:`rewrite` makes the graph that runs
each kiln part as a :class:`~.runtime.KilnPart` module between the torch nodes, then runs the
torch-side passes on it (:data:`.passes.TORCH_SIDE_PASSES`).
"""

from __future__ import annotations

import operator
from typing import Any, Optional, Sequence

import torch
import torch.fx

from . import lowering as L
from .nodes import draws_random, get_attr
from .partition import NothingToCompute, Segment, build_part
from .passes import run_torch_side_passes
from .program import direct_calls
from .runtime import KilnPart


def rewrite(gm: torch.fx.GraphModule, segments: Sequence[Segment]) -> tuple[torch.fx.GraphModule, list[KilnPart]]:
    """A GraphModule computing what ``gm`` does with each kiln segment replaced by a call to a
    :class:`KilnPart` (not compiled yet), and the parts in order."""
    g = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    root: dict[str, Any] = {}
    parts: list[KilnPart] = []
    output_node: Optional[torch.fx.Node] = None
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            env[n] = g.node_copy(n, lambda a: env[a])
        elif n.op == "output":
            output_node = n
    def in_torch(nodes: Sequence[torch.fx.Node]) -> None:
        for n in nodes:
            if n.op == "get_attr":
                root[n.target] = get_attr(gm, n.target)
            elif n.op == "call_module":
                root[n.target] = gm.get_submodule(n.target)
            env[n] = _direct_call(g.node_copy(n, lambda a: env[a]))

    written: dict[torch.fx.Node, Optional[tuple[int, ...]]] = {}  # build_part's: results' stored layouts
    for seg in segments:
        if not seg.is_kiln:
            in_torch(seg.nodes)
            continue
        name = f"kiln_part_{len(parts)}"
        error = None
        try:
            pg = build_part(seg, written)
        except NothingToCompute:
            in_torch(seg.nodes)
            continue
        except L.Unsupported as e:
            pg, error = None, f"lowering: {e}"
        assert seg.color is not None
        part = KilnPart(name, seg, pg, torch.device(seg.color), build_error=error)
        parts.append(part)
        root[name] = part
        call = g.call_module(name, tuple(env[a] for a in seg.inputs))
        for j, o in enumerate(seg.outputs):
            item = g.call_function(operator.getitem, (call, j))
            item.meta = dict(o.meta)
            env[o] = item
        for o, chain in seg.torch_views.items():  # views of its arguments or results: made here
            local: dict[torch.fx.Node, torch.fx.Node] = {}
            for c in chain:
                local[c] = _direct_call(g.node_copy(c, lambda a: local[a] if a in local else env[a]))
            env[o] = local[o]
    assert output_node is not None
    g.node_copy(output_node, lambda a: env[a])
    run_torch_side_passes(g)
    g.lint()
    outer = torch.fx.GraphModule(root, g, class_name="KilnGraphModule")
    # The generated forward reads each part as ``self.kiln_part_N``: found in the instance
    # dict, that skips nn.Module.__getattr__'s Python lookup in ``_modules`` on every call.
    for p in parts:
        outer.__dict__[p.part_name] = p
    return outer, parts


_DIRECT: Optional[dict[Any, tuple[str, Any]]] = None


def _direct_call(n: torch.fx.Node) -> torch.fx.Node:
    """``n`` (a copied torch-side node) rewritten to its direct call when it has one."""
    global _DIRECT
    if n.op != "call_function":
        return n
    if _DIRECT is None:
        _DIRECT = direct_calls()
    hit = _DIRECT.get(n.target)
    if hit is None or not n.args or not isinstance(n.args[0], torch.fx.Node):
        return n
    if n.target is torch.ops.aten.expand.default and n.kwargs:
        return n  # expand's ``implicit`` flag has no Tensor.expand spelling
    if draws_random(n):
        return n
    n.op, n.target = hit
    return n


__all__ = ["rewrite"]
