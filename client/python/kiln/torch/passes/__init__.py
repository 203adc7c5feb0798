"""kiln.torch's FX passes, one per file, and the order the backend runs them in.

Three stages, each a list below; :mod:`..dynamo_backend` runs the first and the last,
:func:`.stitch.rewrite` the second.

1. :func:`run_aten_passes`, on the ATen graph AOTAutograd hands the backend, before it is
   partitioned: common subexpressions merged (CSE first, so the passes after it see each value
   once), dropout's draws seeded for kiln's kernels, convolutions made channels-last, and
   constants folded (after the layout pass, which propagates fake tensors through the graph:
   a folded value must be a real tensor). Last, two rewrites for the partitioner: pads of zero
   widths dropped, and the bias epilogues of matrix products and convolutions that kiln reads
   unfused (a question the partitioner's colors answer, so on the graph it will see).
2. :data:`TORCH_SIDE_PASSES`, on the rewritten graph (kiln parts as modules between torch
   nodes), in order: view chains collapse before the matrix products are matched (a folded
   transpose is what ``fold_linear`` looks for), products become ``linear`` before views are
   made reinterpretations (``fold_linear`` takes the views around a product away), the views
   left become ``reshape``, clones and index adds are made cheaper, and the long kernels are
   moved to the front last, once the nodes they would move past are final.
3. :data:`CUDAGRAPH_PASSES`, on the rewritten graph of a graph replayed through CUDA graphs.

Each pass changes the graph in place and returns how many rewrites it made.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch
import torch.fx

from ..counters import bump
from .channels_last import channels_last_convolutions, report_output_strides, saved_outputs, wants_channels_last
from .cse import eliminate_common_subexpressions
from .drop_empty_pads import drop_empty_pads
from .fold_clones import fold_clones
from .fold_constants import fold_constant_subgraphs
from .fold_fresh_index_add import fold_fresh_index_add
from .fold_linear import fold_linear
from .fold_reinterpret import fold_reinterpret, reinterpreted_view
from .fold_views import fold_views
from .launch_long_kernels_first import launch_long_kernels_first
from .philox_on_host import philox_state_on_host
from .reshape_other_views import reshape_other_views
from .seed_draws import seed_draws
from .unfuse_addmm_epilogues import unfuse_addmm_epilogues, unfuse_convolution_bias

GraphPass = Callable[[torch.fx.Graph], int]

#: Stage 2, in order: the passes on the torch side of a rewritten graph.
TORCH_SIDE_PASSES: tuple[GraphPass, ...] = (
    fold_views,
    fold_linear,
    fold_reinterpret,
    reshape_other_views,
    fold_clones,
    fold_fresh_index_add,
    launch_long_kernels_first,
)

#: Stage 3, in order: the passes on a rewritten graph that CUDA graphs will replay.
CUDAGRAPH_PASSES: tuple[GraphPass, ...] = (
    philox_state_on_host,
)


def run_aten_passes(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *, random_in_kiln: bool,
                    layout: str, kind: str, user_outputs: Optional[int]) -> None:
    """Stage 1 on ``gm`` in place, each pass's count added to the counters.

    ``random_in_kiln``: dropout's draws are kiln's (``random="kiln"``); ``layout``: the
    backend's layout option; ``kind`` and ``user_outputs``: which of a training graph's outputs
    the layout pass may hand out in another layout."""
    eliminate_common_subexpressions(gm)
    if random_in_kiln:
        bump(random_draws=seed_draws(gm))
    if wants_channels_last(gm, layout):
        free = saved_outputs(gm, kind, user_outputs)
        copies = channels_last_convolutions(gm, free, example_inputs)
        if copies and free:
            report_output_strides(gm)
        bump(layout_copies=copies)
    bump(constants=fold_constant_subgraphs(gm))
    if drop_empty_pads(gm.graph) + unfuse_addmm_epilogues(gm.graph) + unfuse_convolution_bias(gm.graph):
        gm.recompile()


def run_torch_side_passes(g: torch.fx.Graph) -> None:
    """Stage 2 on ``g`` in place."""
    for graph_pass in TORCH_SIDE_PASSES:
        graph_pass(g)


def run_cudagraph_passes(g: torch.fx.Graph) -> int:
    """Stage 3 on ``g`` in place; returns how many rewrites were made (the module's code must
    then be regenerated)."""
    return sum(graph_pass(g) for graph_pass in CUDAGRAPH_PASSES)


__all__ = [
    "CUDAGRAPH_PASSES",
    "TORCH_SIDE_PASSES",
    "channels_last_convolutions",
    "drop_empty_pads",
    "eliminate_common_subexpressions",
    "fold_clones",
    "fold_constant_subgraphs",
    "fold_fresh_index_add",
    "fold_linear",
    "fold_reinterpret",
    "fold_views",
    "launch_long_kernels_first",
    "philox_state_on_host",
    "reinterpreted_view",
    "reshape_other_views",
    "run_aten_passes",
    "run_cudagraph_passes",
    "run_torch_side_passes",
    "seed_draws",
    "unfuse_addmm_epilogues",
    "unfuse_convolution_bias",
]
