"""Memory layouts around convolutions: activations channels-last, as cuDNN and oneDNN want them.

Contract: :func:`channels_last_convolutions` takes one ATen graph with static shapes and
rewrites it in place so that every 2-D and 3-D convolution reads its input and weight in
channels-last order (NHWC / NDHWC), then propagates the FakeTensors again so that every node's
``meta["val"]`` tells the layout it will really have. Nothing else changes: the graph computes
the same values, and its outputs keep the layouts they had (a result torch's caller sees, or
AOTAutograd saves for the backward, is restored to its traced layout where the pass changed
it). A graph the pass cannot handle is left exactly as it was.

Why: convolutions in NCHW make cuDNN convert every input and weight to NHWC and back (on a
resnet18 inference step on an H200, ``nchwToNhwcKernel`` took 0.2 ms of 0.93 ms on the GPU),
and torch's pointwise ops keep whatever layout their inputs have. The pass inserts a
``clone(memory_format=channels_last)`` where a convolution's operand is not channels-last
already: the graph's image input and the weights (one copy each per call, which Inductor's
layout optimisation makes too), and nothing else, because a convolution's output is then
channels-last and everything computed from it follows. Where such a clone lands in a kiln part
it costs nothing: :func:`..partition.build_part` makes a part write a channels-last result in
that layout directly (the permutation is part of the kernel's store), so batch norm, ReLU and
the residual add between two convolutions read and write NHWC in one kernel.

Training: a forward graph's outputs past the caller's (the activations AOTAutograd saves for
the backward) keep the pass's layout, and the forward's channels-last copies of its weights
are saved in place of the weights; :func:`report_output_strides` tells AOTAutograd those
strides (as Inductor does after its own layout choices), and the backward graph, whose
placeholders still carry the traced strides, is propagated again from the example inputs
AOTAutograd restrided. Its ``convolution_backward`` nodes get the same treatment as
convolutions; the weight gradients it returns are copied back to the weights' layout.

The backend's ``layout`` option: ``"auto"`` (the default) runs the pass on every graph with
convolutions, on CUDA and on the CPU alike (oneDNN's convolutions take NHWC natively: a stem,
two basic blocks and the head of resnet18 at batch 8, 224x224, ran 49 ms a call against 73 ms
with the traced layouts on a 2-core x86 host), except float32 on CUDA with TF32 off, where
cuDNN's NCHW kernels are faster (:func:`nchw_is_faster`); ``"channels_last"`` runs it there
too; ``"keep"`` turns it off.
"""

from __future__ import annotations

import logging
import operator
from typing import Any, Optional, Sequence

import torch
import torch.fx
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from .. import lowering as L
from ..nodes import CHANNELS_LAST_FORMATS as _FORMATS
from ..nodes import dense_format, is_channels_last

log = logging.getLogger("kiln.torch")
aten = torch.ops.aten

# Marks the copies the pass inserts: the partitioner keeps them in kiln whatever their size,
# where they share a part (the weights' copies are all ready at the start of the graph: one
# part call instead of a torch copy per weight).
RELAYOUT = L.RELAYOUT

# The convolution ops and which of their arguments are activations or weights in NC... order.
_CONVOLUTIONS = {aten.convolution.default: (0, 1), aten.convolution_backward.default: (0, 1, 2)}
# Ops whose CUDA kernels refuse operands in any layout but the contiguous one (``native_group_norm``
# checks ``X.is_contiguous()`` on CUDA, where its CPU kernel takes channels-last too), with the
# arguments that must be contiguous. The pass gives them a contiguous copy, on every device
# (one graph, whatever runs it): in a kiln part with its consumer the copy is never written.
_CONTIGUOUS_ONLY = {aten.native_group_norm.default: (0,), aten.native_group_norm_backward.default: (0, 1)}
# Of those, the ops whose first result goes back to the layout their first operand had: torch
# writes it contiguous, and everything computed from it would follow (PoolFormer's pooling,
# subtraction and residual add between two group norms), reading the residual stream strided
# and handing the next group norm an operand it reduces across the memory order. In a kiln part
# the copy is the part's store order; after torch's kernel it is one copy.
_RESULT_KEEPS_LAYOUT = frozenset({aten.native_group_norm.default})


def _static_tensor(n: Any) -> Optional[torch.Tensor]:
    m = L.node_meta(n)
    return m if L.is_static_tensor(m) else None


def _is_format(m: torch.Tensor, fmt: torch.memory_format) -> bool:
    return bool(m.is_contiguous(memory_format=fmt))


def _output(g: torch.fx.Graph) -> torch.fx.Node:
    return next(n for n in reversed(g.nodes) if n.op == "output")


def _set_outputs(output: torch.fx.Node, fn: Any) -> None:
    """Replaces each value ``a`` at index ``i`` of the graph's (flat) outputs by ``fn(i, a)``."""
    outs = output.args[0]
    if isinstance(outs, (tuple, list)):
        output.args = (type(outs)(fn(i, a) for i, a in enumerate(outs)),) + tuple(output.args[1:])
    else:
        output.args = (fn(0, outs),) + tuple(output.args[1:])


def nchw_is_faster(x: torch.Tensor) -> bool:
    """Whether cuDNN runs convolutions of ``x``'s dtype and device faster in NCHW: float32 on
    CUDA with TF32 off (``torch.backends.cudnn.allow_tf32 = False``, as accuracy checks and
    benchmarks run). Measured on an H200 with cuDNN 9.19 over the convolutions of twelve timm
    models at batch 16 (tests/bench/gpu/conv_layouts.py), summed time NHWC / NCHW: float32
    dense 1.22, depthwise 1.74, grouped 0.99; with TF32 0.94, 1.56, 0.63; bfloat16 0.89, 0.93,
    0.70. Channels-last stays for TF32 and the 16-bit types (dense and grouped convolutions,
    most of the time, are faster there) and on the CPU (oneDNN)."""
    return x.device.type == "cuda" and x.dtype == torch.float32 and not torch.backends.cudnn.allow_tf32


def wants_channels_last(gm: torch.fx.GraphModule, layout: str) -> bool:
    """Whether the pass applies to ``gm`` under the backend's ``layout`` option: a graph with a
    2-D or 3-D convolution, every tensor of static shape; under ``"auto"`` also none of its
    convolutions faster in NCHW (:func:`nchw_is_faster`)."""
    if layout not in ("auto", "channels_last"):
        return False
    found = False
    for n in gm.graph.nodes:
        if n.op == "placeholder" and L.is_symbolic_tensor(L.node_meta(n)):
            return False
        if n.op != "call_function" or n.target not in _CONVOLUTIONS:
            continue
        x = _static_tensor(n.args[0])
        if x is None or x.ndim not in _FORMATS or (layout == "auto" and nchw_is_faster(x)):
            return False
        found = True
    return found


def channels_last_convolutions(gm: torch.fx.GraphModule, free_outputs: frozenset[int] = frozenset(),
                               example_inputs: Sequence[Any] = ()) -> int:
    """Rewrites ``gm`` (see the module docstring); returns the number of layout copies it
    inserted (0: the graph is unchanged). Outputs whose index is in ``free_outputs`` (a training
    forward's saved activations, whose layouts the caller reports to AOTAutograd, see
    :func:`report_output_strides`) keep the layout the pass gives them. ``example_inputs`` are
    the FakeTensors AOTAutograd compiles the graph for: a backward graph's saved activations
    come with the strides its forward reported, while the graph's own placeholders still
    carry the traced ones; the graph is propagated from the example inputs' layouts."""
    g = gm.graph
    placeholders = [n for n in g.nodes if n.op == "placeholder"]
    fake_inputs = [n.meta.get("val") for n in placeholders]
    mode = torch._guards.detect_fake_mode(fake_inputs)
    if mode is None:
        return 0
    before = {n: n.meta.get("val") for n in g.nodes}
    output = _output(g)
    restrided = False
    for i, ex in enumerate(example_inputs[:len(fake_inputs)]):
        v = fake_inputs[i]
        if (L.is_static_tensor(ex) and L.is_static_tensor(v) and ex.shape == v.shape and ex.stride() != v.stride()
                and torch._guards.detect_fake_mode([ex]) is mode):
            fake_inputs[i] = ex
            restrided = True

    inserted: list[torch.fx.Node] = []

    def propagate() -> None:
        """Propagates the layouts; a view the new layout of its operand cannot express (it
        was traced on a contiguous tensor) gets a contiguous copy of that operand, and the
        propagation starts again."""
        for _ in range(_MAX_VIEW_COPIES + 1):
            try:
                with mode:
                    _Propagation(gm, mode=mode).propagate_dont_convert_inputs(*fake_inputs)
                return
            except _ViewNeedsCopy as e:
                if len([c for c in inserted if c.meta.get(_VIEW_COPY)]) >= _MAX_VIEW_COPIES:
                    raise RuntimeError(f"more than {_MAX_VIEW_COPIES} views need contiguous copies") from None
                view = e.node
                with g.inserting_before(view):
                    c = g.call_function(aten.clone.default, (view.args[0],), {"memory_format": torch.contiguous_format})
                c.meta[RELAYOUT] = c.meta[_VIEW_COPY] = True
                view.replace_input_with(view.args[0], c)
                inserted.append(c)

    try:
        if restrided:
            propagate()
        made: dict[torch.fx.Node, torch.fx.Node] = {}
        for conv in list(g.nodes):
            if conv.op != "call_function" or conv.target not in _CONVOLUTIONS:
                continue
            for a in (conv.args[i] for i in _CONVOLUTIONS[conv.target]):
                m = _static_tensor(a)
                if m is None or m.ndim not in _FORMATS or is_channels_last(m):
                    continue
                c = made.get(a)
                if c is None:
                    with g.inserting_before(conv):
                        c = g.call_function(aten.clone.default, (a,), {"memory_format": _FORMATS[m.ndim]})
                    c.meta[RELAYOUT] = True
                    made[a] = c
                    inserted.append(c)
                conv.replace_input_with(a, c)
        if not inserted and not restrided:
            return 0
        propagate()
        # A copy was put before every convolution whose operand was not channels-last as
        # traced; with the first convolution's output channels-last, most operands now are
        # (everything computed from it follows its layout), and their copies go.
        for c in list(inserted):
            if _is_format(L.node_meta(c.args[0]), c.kwargs["memory_format"]):
                c.replace_all_uses_with(c.args[0])
                g.erase_node(c)
                inserted.remove(c)
        inserted += _contiguous_operands(g)
        _save_channels_last_copies(output, made, inserted, free_outputs)
        _restore_output_layouts(g, output, before, free_outputs)
        propagate()
        g.lint()
    except Exception as e:  # the graph goes back to what it was
        # One line: FX appends the traced source of the failing node to the message, a dozen
        # lines per graph for a model whose views of a convolution's output (MobileViT's
        # patches) forbid the layout, which is the pass declining, not a fault.
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        log.warning("kiln.torch: channels-last layout pass skipped: %s: %s", type(e).__name__, first)
        # Every node the pass added is a clone of its first argument: each gives its uses back.
        for n in reversed([n for n in g.nodes if n not in before]):
            n.replace_all_uses_with(n.args[0])
            g.erase_node(n)
        for n, v in before.items():
            if v is not None:
                n.meta["val"] = v
        return 0
    gm.recompile()
    return len(inserted)


# Views of a tensor whose strides must allow them (``reshape`` decomposes to one where they do).
_VIEWS = frozenset({aten.view.default, aten._unsafe_view.default})
# A view's contiguous copy (see ``propagate`` in :func:`channels_last_convolutions`), and how
# many a graph may get before the pass declines it.
_VIEW_COPY = "kiln_view_copy"
_MAX_VIEW_COPIES = 64


class _ViewNeedsCopy(Exception):
    def __init__(self, node: torch.fx.Node) -> None:
        super().__init__(node.name)
        self.node = node


class _Propagation(FakeTensorProp):
    """FakeTensorProp that names a view its operand's new layout cannot express."""

    def run_node(self, n: torch.fx.Node) -> Any:
        try:
            return super().run_node(n)
        except Exception:
            if n.op == "call_function" and n.target in _VIEWS:
                m = _static_tensor(n.args[0])
                if m is not None and not _is_format(m, torch.contiguous_format):
                    raise _ViewNeedsCopy(n) from None
            raise


def _contiguous_operands(g: torch.fx.Graph) -> list[torch.fx.Node]:
    """Contiguous copies of the operands of ops in ``_CONTIGUOUS_ONLY`` that the new layouts
    made non-contiguous, and for ops in ``_RESULT_KEEPS_LAYOUT`` a copy of the first result in
    the first operand's layout; returns the copies."""
    made: dict[torch.fx.Node, torch.fx.Node] = {}
    restored: list[torch.fx.Node] = []
    for n in list(g.nodes):
        if n.op != "call_function" or n.target not in _CONTIGUOUS_ONLY:
            continue
        for i in _CONTIGUOUS_ONLY[n.target]:
            a = n.args[i]
            m = _static_tensor(a)
            if m is None:
                continue
            if i == 0 and n.target in _RESULT_KEEPS_LAYOUT:
                # The operand's layout before any contiguous copy: the pass's own, or the one the
                # trace already has (on CUDA, torch's group_norm copies its input contiguous).
                sm = _static_tensor(L.copy_source(a))
                fmt = _FORMATS.get(sm.ndim) if sm is not None else None
                if fmt is not None and _is_format(sm, fmt) and not _is_format(sm, torch.contiguous_format):
                    restored += _result_in_format(g, n, fmt)
            if _is_format(m, torch.contiguous_format):
                continue
            if a not in made:
                with g.inserting_before(n):
                    made[a] = g.call_function(aten.clone.default, (a,), {"memory_format": torch.contiguous_format})
                made[a].meta[RELAYOUT] = True
            n.replace_input_with(a, made[a])
    return list(made.values()) + restored


def _result_in_format(g: torch.fx.Graph, n: torch.fx.Node, fmt: torch.memory_format) -> list[torch.fx.Node]:
    """A ``fmt`` copy of ``n``'s first result (its ``getitem(n, 0)``), read by all its users in
    its place; returns the copy (none when nothing reads the result)."""
    first = [u for u in n.users if u.target is operator.getitem and u.args[1] == 0]
    copies = []
    for item in first:
        with g.inserting_after(item):
            c = g.call_function(aten.clone.default, (item,), {"memory_format": fmt})
        c.meta[RELAYOUT] = True
        item.replace_all_uses_with(c, delete_user_cb=lambda u, c=c: u is not c)
        copies.append(c)
    return copies


def _save_channels_last_copies(output: torch.fx.Node, made: dict[torch.fx.Node, torch.fx.Node],
                               inserted: list[torch.fx.Node], free: frozenset[int]) -> None:
    """A training forward saves its weights (and its image input) for the backward, which would
    copy them channels-last again for its convolutions; the forward's own channels-last
    copies are saved in their place (equal values, in the layout the forward reports)."""
    live = set(inserted)
    _set_outputs(output, lambda i, a: made[a] if i in free and isinstance(a, torch.fx.Node) and made.get(a) in live
                 else a)


def _restore_output_layouts(g: torch.fx.Graph, output: torch.fx.Node, before: dict[torch.fx.Node, Any],
                            free: frozenset[int]) -> None:
    """Graph outputs whose layout the pass changed, but for those in ``free``, get a copy back
    to the traced layout (the caller's tensors, and gradients, stay as they were)."""
    made: dict[torch.fx.Node, torch.fx.Node] = {}

    def restore(i: int, a: Any) -> Any:
        if i in free or not isinstance(a, torch.fx.Node):
            return a
        old, new = before.get(a), L.node_meta(a)
        if not L.is_static_tensor(old) or not L.is_static_tensor(new) or old.stride() == new.stride():
            return a
        fmt = dense_format(old)
        if fmt is None:  # a traced layout no memory format names: left as the pass made it
            return a
        if a not in made:
            with g.inserting_before(output):
                made[a] = g.call_function(aten.clone.default, (a,), {"memory_format": fmt})
        return made[a]

    _set_outputs(output, restore)


def saved_outputs(gm: torch.fx.GraphModule, kind: str, user_outputs: Optional[int]) -> frozenset[int]:
    """The outputs of a training forward graph that only its backward reads (the activations
    AOTAutograd saves): they may keep the pass's layout, since AOTAutograd compiles the
    backward for the strides the forward reports. Empty where that cannot be told (an
    inference graph, a backward graph, no tracing context): every output keeps its layout.
    ``user_outputs`` is the number of outputs of Dynamo's graph; AOTAutograd's forward
    returns the mutated inputs first, then those, then the saved activations."""
    tc = torch._guards.TracingContext.try_get()
    if kind != "forward" or user_outputs is None or tc is None or tc.output_strides is None or not tc.fw_metadata:
        return frozenset()
    outs = _output(gm.graph).args[0]
    if not isinstance(outs, (tuple, list)):
        return frozenset()
    first = int(tc.fw_metadata.num_mutated_inp_runtime_indices) + user_outputs
    return frozenset(range(first, len(outs)))


def report_output_strides(gm: torch.fx.GraphModule) -> None:
    """Tells AOTAutograd the strides of every output of a forward graph (what Inductor reports
    after its own layout choices): the backward graph's placeholders for saved activations are
    then traced with those strides, so its kiln parts are compiled for the layouts they get."""
    tc = torch._guards.TracingContext.try_get()
    if tc is None or tc.output_strides is None:
        return
    outs = _output(gm.graph).args[0]
    for a in outs if isinstance(outs, (tuple, list)) else (outs,):
        m = L.node_meta(a)
        tc.output_strides.append(tuple(m.stride()) if isinstance(m, torch.Tensor) else None)
