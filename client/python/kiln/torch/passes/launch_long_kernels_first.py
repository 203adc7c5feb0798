"""The rewritten graph reordered so that long torch kernels are launched as early as their inputs
allow (:func:`launch_long_kernels_first`).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.fx

from ..nodes import draws_random, mutates


def _long_kernel(n: torch.fx.Node) -> bool:
    """Whether a torch-side node launches a long kernel: a matrix product, attention, or a
    convolution."""
    if n.op != "call_function":
        return False
    t = n.target
    if t in _LONG_TARGETS:
        return True
    name = str(getattr(t, "__name__", t))
    return "scaled_dot_product" in name or "convolution" in name


_LONG_TARGETS = frozenset({torch.nn.functional.linear, torch.mm, torch.bmm, torch.addmm, torch.matmul, torch.baddbmm,
                           torch.ops.aten.mm.default, torch.ops.aten.bmm.default, torch.ops.aten.addmm.default})


def launch_long_kernels_first(g: torch.fx.Graph) -> int:
    """Reorders the rewritten graph so that each long torch kernel (matrix products, attention,
    convolutions) is launched as soon as its inputs are, and the work nothing long waits for
    (an attention mask's preparation, say) right after it; returns how many nodes moved.

    A step timed or served from an idle GPU waits for the host until its first long kernel
    is queued; after that the host runs ahead. BERT-base's forward prepared the attention
    mask (an ``arange``, an advanced index, two copies) before its first linear layer, ~0.1 ms
    of host time at the start of every step that the GPU spent waiting. The order only changes
    between nodes that draw random numbers or write in place (those keep their place and
    their order), so results are the same."""
    nodes = list(g.nodes)
    moved = 0
    start = 0
    for end in range(len(nodes) + 1):
        if end < len(nodes):
            n = nodes[end]
            if not (n.op in ("placeholder", "output", "get_attr") or draws_random(n) or mutates(n)):
                continue
        moved += _long_first(nodes[start:end], nodes[start - 1] if start > 0 else None)
        start = end + 1
    return moved


def _long_first(span: list[torch.fx.Node], before: Optional[torch.fx.Node]) -> int:
    """Orders ``span`` (consecutive nodes, ``before`` the node ahead of them): each long kernel
    with its not yet placed ancestors in the span, in their order, then the rest in theirs."""
    if before is None or not any(_long_kernel(n) for n in span):
        return 0
    members = set(span)
    placed: set[torch.fx.Node] = set()
    order: list[torch.fx.Node] = []

    def place(root: torch.fx.Node) -> None:
        stack = [(root, False)]
        while stack:
            n, ready = stack.pop()
            if n in placed:
                continue
            if ready:
                placed.add(n)
                order.append(n)
                continue
            stack.append((n, True))
            for a in reversed(n.all_input_nodes):
                if a in members and a not in placed:
                    stack.append((a, False))

    for n in span:
        if _long_kernel(n):
            place(n)
    order += [n for n in span if n not in placed]
    moved = sum(1 for a, b in zip(order, span) if a is not b)
    anchor = before
    for n in order:
        anchor.append(n)
        anchor = n
    return moved


__all__ = ["launch_long_kernels_first"]
