"""Dropout's draws seeded for kiln's kernels (stage 1): each float ``rand_like`` becomes
``kiln.uniform`` (:mod:`..rng` says how the numbers are made and why)."""

from __future__ import annotations

import torch
import torch.fx

from .. import rng as _rng  # noqa: F401  (defines torch.ops.kiln.uniform)

aten = torch.ops.aten


def seed_draws(gm: torch.fx.GraphModule) -> int:
    """Rewrites every float ``rand_like`` of ``gm`` into ``kiln.uniform`` of one seed per device
    (drawn where the graph's first draw was), streams numbered in graph order. Returns how many
    draws it rewrote. A draw with a generator, or without a FakeTensor to go by, stays torch's."""
    g = gm.graph
    seeds: dict[torch.device, torch.fx.Node] = {}
    stream = 0
    for n in list(g.nodes):
        if n.op != "call_function" or n.target is not aten.rand_like.default or n.kwargs.get("generator") is not None:
            continue
        val = n.meta.get("val")
        mode = getattr(val, "fake_mode", None)
        if mode is None or val.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            continue
        seed = seeds.get(val.device)
        if seed is None:
            with g.inserting_before(n):
                seed = g.call_function(aten.randint.default, (2**63 - 1, []),
                                       {"dtype": torch.int64, "device": val.device})
            with mode:
                seed.meta["val"] = torch.empty((), dtype=torch.int64, device=val.device)
            seeds[val.device] = seed
        with g.inserting_before(n):
            draw = g.call_function(torch.ops.kiln.uniform.default, (seed, n.args[0], stream, val.dtype))
        draw.meta["val"] = val
        n.replace_all_uses_with(draw)
        g.erase_node(n)
        stream += 1
    if stream:
        gm.recompile()
    return stream


__all__ = ["seed_draws"]
