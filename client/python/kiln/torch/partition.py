"""Partitioning an ATen FX graph into kiln parts and torch parts.

The graph comes from the backend's first pass stage (:mod:`.passes`), whose last passes are
written for this partitioner: bias epilogues that kiln reads become ``mm`` plus an ``add`` in
kiln (:mod:`.passes.unfuse_addmm_epilogues`), and pads of zero widths go
(:mod:`.passes.drop_empty_pads`).

1. **Support.** Every call node is tried against the mapping table (:mod:`.lowering`) on its own,
   with graph inputs made from its arguments' FakeTensors. A node is supported when it lowers,
   its tensors have static shapes and kiln dtypes, and all of them live on one CPU or CUDA
   device; the device is the node's *color*. Unsupported nodes (matmul, convolution, random
   ops, indexing...) are colored ``None``: they run in torch.
2. **Views stay in torch when only torch reads them.** A view or a constant whose every user
   runs in torch is free there and would cost a copy in kiln, so it is recolored ``None``.
   A getitem always takes its producer's color.
3. **Scheduling.** A topological order is chosen that keeps nodes of one color together:
   among the ready nodes, those of the current color are taken first, and the color changes
   only when none is left. Maximal runs of one color in that order are the parts, cut where a
   kiln run's arguments would carry more distinct run-time sizes than one kiln graph takes
   (MAX_SYMBOLS); as each part is a contiguous run of a topological order, the parts form no
   cycle.
4. A kiln part that computes nothing (only views and constants, or zero-size tensors) runs in
   torch; so does one found to at :func:`build_part` (:class:`NothingToCompute`).

5. **Results that are views go to torch.** A part's result that is a chain of views of its
   argument, or (in no dense layout, where torch's views rely on its strides) of a contiguous
   tensor the part computes, is made by torch from that tensor (:func:`_views_to_torch`).

:func:`build_part` then turns a kiln part into a kiln graph plus the specs the runtime needs:
in graph order, each part declaring its arguments in the layouts earlier parts store them in.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import logging
import math
import operator
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.fx

from ..builder import GraphBuilder, Value
from ..strides import contiguous_strides, effective_strides, is_contiguous_layout, memory_order
from . import lowering as L
from .nodes import is_channels_last, reached, same_layout

log = logging.getLogger("kiln.torch")

Color = Optional[str]  # None: torch; else the device kiln runs the node on ("cpu", "cuda:0")

# The distinct run-time sizes one kiln graph may take (kernels/ir/symbols.h, kMaxSymbols: code
# for every size is generated at 3^k sample points). build_part gives each distinct size
# expression of its arguments one symbol; a node whose arguments carry more stays in torch,
# and a run of nodes whose arguments do is cut into parts that each carry at most this many.
MAX_SYMBOLS = 3


@dataclass
class Segment:
    """A run of nodes executed together: by torch (``color`` None) or as one kiln graph."""

    color: Color
    nodes: list[torch.fx.Node]
    inputs: list[torch.fx.Node] = field(default_factory=list)
    outputs: list[torch.fx.Node] = field(default_factory=list)
    # ``inputs`` holds the tensors first, then the run-time sizes (SymInt nodes) that views in
    # the segment take as arguments: the kiln graph reads the tensors only (kiln infers those
    # sizes), the torch fallback of the part all of them.
    num_tensor_inputs: int = 0
    # Results that are views of an argument (a chain of view nodes of the segment, first to
    # last): the torch side makes them from the argument instead of the part copying it.
    torch_views: dict[torch.fx.Node, list[torch.fx.Node]] = field(default_factory=dict)

    @property
    def is_kiln(self) -> bool:
        return self.color is not None


@dataclass
class TensorSpec:
    """The dtype, shape and (when not contiguous) strides of a part's argument or result."""

    dtype: torch.dtype
    shape: tuple[int, ...]  # symbolic sizes at their example values
    # Results of symbolic parts: the example strides of the dense layout they are stored in.
    strides: Optional[tuple[int, ...]] = None
    # Symbolic parts: each dimension's sympy expression (torch's dynamic shapes).
    exprs: Optional[tuple[Any, ...]] = None


@dataclass
class PartGraph:
    """A kiln part ready to compile.

    ``graph`` is the kiln.v1.Graph; ``inputs`` describe its arguments (``strides`` set where the
    graph declares a non-contiguous layout); ``outputs`` describe the part's results in the
    order of :attr:`Segment.outputs`, each produced by kiln output ``source`` or, where the
    result is an argument passed through unchanged, copied from input ``passthrough``.
    A result whose spec has ``strides`` is a kiln output in that (dense) layout: the kernel
    stores the result's dimensions in memory order (:func:`memory_order`), and the runtime
    allocates it with those strides (an argument passed through as a result in another layout
    is such an output too: the kernel copies it).
    """

    graph: Any
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    sources: list[tuple[str, int]]  # ("kiln", k) or ("input", i)
    num_kiln_outputs: int
    num_nodes: int
    symbolic: bool = False  # some argument has symbolic sizes (compiled with kiln symbols)


# ---------------------------------------------------------------------------------- support

def _device_color(t: torch.Tensor) -> Color:
    dev = t.device
    if dev.type == "cpu":
        return "cpu"
    if dev.type == "cuda":
        return f"cuda:{dev.index if dev.index is not None else torch.cuda.current_device()}"
    return None


def node_color(node: torch.fx.Node) -> tuple[Color, str]:
    """The device kiln would run ``node`` on, or None with the reason it cannot."""
    if node.op != "call_function":
        return None, node.op
    if node.target is operator.getitem:
        return None, "getitem takes its producer's color"
    if L.find_lowering(node.target) is None:
        return None, f"no lowering for {node.target}"
    meta = L.node_meta(node)
    outs = meta if isinstance(meta, (tuple, list)) else [meta]
    tensors = [m for m in outs if isinstance(m, torch.Tensor)]
    if not tensors:
        return None, "no tensor output"
    color = _device_color(tensors[0])
    if color is None:
        return None, f"device {tensors[0].device}"
    for m in tensors:
        if _device_color(m) != color:
            return None, "outputs on several devices"
    # A zero-size tensor (a key/value cache's empty start, concatenated with the first keys) is
    # nothing to compute; the node runs in torch, so the part around it does not have to (a
    # part with a zero-size argument or result runs in torch whole, step 4). Results no one
    # reads do not count: inference batch norm's statistics outputs are empty on the CPU.
    read = [m for i, m in enumerate(outs) if not isinstance(meta, (tuple, list)) or _output_read(node, i)]
    if any(_static_empty(L.node_meta(a)) for a in node.all_input_nodes) or any(map(_static_empty, read)):
        return None, "a zero-size tensor"
    sizes = _run_time_sizes(node.all_input_nodes)
    if len(sizes) > MAX_SYMBOLS:
        return None, (f"its arguments have {len(sizes)} distinct sizes known only at run time "
                      f"(a kiln part takes at most {MAX_SYMBOLS})")
    b = GraphBuilder()
    inputs: dict[torch.fx.Node, Value] = {}

    def env(n: torch.fx.Node) -> Any:
        v = inputs.get(n)
        if v is None:
            m = L.node_meta(n)
            if not (L.is_static_tensor(m) or L.is_symbolic_tensor(m)):
                raise L.Unsupported(f"argument {n.name} is not a tensor of static shape")
            if _device_color(m) != color:
                raise L.Unsupported(f"argument {n.name} is on {m.device}")
            v = b.input(n.name, L.kiln_dtype(m.dtype), L.example_shape(m))
            inputs[n] = v
        return v

    # The symbolic sizes the node takes as arguments (arange(n)): in this trial some argument of
    # the part has each (a part without one refuses the node when it is built). A value that is
    # not positive at the example (arange(t, -t, -1)'s -t) is no dimension's size: no argument
    # carries it, and a lowering that needs it refuses the node.
    extents: dict[Any, tuple[Value, int]] = {}
    for a in node.args:
        if isinstance(a, torch.fx.Node) and L.is_size_node(a) and isinstance(L.node_meta(a), torch.SymInt):
            m = L.node_meta(a)
            if L.size_hint(m) > 0:
                extents.setdefault(L.size_expr(m), (b.input(f"extent{len(extents)}", "i64", (L.size_hint(m),)), 0))
    try:
        L.lower_node(b, node, env, extents)
    except L.Unsupported as e:
        return None, str(e)
    except Exception as e:  # a lowering bug must not take the program down
        return None, f"{type(e).__name__}: {e}"
    return color, ""


def _run_time_sizes(args: Any) -> set[Any]:
    """The distinct symbolic size expressions of the tensors among ``args`` (FX nodes)."""
    out: set[Any] = set()
    for a in args:
        m = L.node_meta(a)
        if L.is_symbolic_tensor(m):
            out.update(e for e in map(L.size_expr, m.shape) if not e.is_number)
    return out


def _cut_at_symbol_limit(seg: Segment) -> list[Segment]:
    """``seg`` cut, in its own order, into runs whose arguments from outside the run carry at
    most MAX_SYMBOLS distinct run-time sizes (each node's own arguments do: node_color)."""
    if not seg.is_kiln:
        return [seg]
    runs: list[Segment] = []
    members: set[torch.fx.Node] = set()
    sizes: set[Any] = set()
    for n in seg.nodes:
        new = _run_time_sizes(a for a in n.all_input_nodes if a not in members)
        if not runs or len(sizes | new) > MAX_SYMBOLS:
            runs.append(Segment(seg.color, []))
            members, sizes, new = set(), set(), _run_time_sizes(n.all_input_nodes)
        runs[-1].nodes.append(n)
        members.add(n)
        sizes |= new
    return runs


def color_nodes(graph: torch.fx.Graph) -> dict[torch.fx.Node, Color]:
    """Steps 1 and 2 of the module docstring: the color of every node."""
    colors: dict[torch.fx.Node, Color] = {}
    reasons: dict[str, int] = {}
    for n in graph.nodes:
        if n.op == "call_function" and n.target is operator.getitem:
            continue
        c, why = node_color(n)
        colors[n] = c
        if c is None and n.op == "call_function":
            reasons[why] = reasons.get(why, 0) + 1
    # Views and constants read only by torch stay in torch (reverse order: chains recolor whole).
    for n in reversed(list(graph.nodes)):
        if colors.get(n) is None or (n.target not in L.VIEW_OPS and n.target not in L.SOURCE_OPS):
            continue
        if is_real_copy(n):
            continue  # a transposing copy: kiln's vectorised kernel does it (several in one launch)
        if relayouts(n) and colors.get(n.args[0]) == colors[n]:
            continue  # a kiln result wanted in another layout: the part stores it in that one
        if n.users and all(colors.get(u) is None or u.op == "output" for u in n.users):
            colors[n] = None
    for n in graph.nodes:
        if n.op == "call_function" and n.target is operator.getitem:
            colors[n] = colors.get(n.args[0])
    if reasons and log.isEnabledFor(logging.DEBUG):
        for why, count in sorted(reasons.items(), key=lambda kv: -kv[1]):
            log.debug("kiln.torch: %d node(s) stay in torch: %s", count, why)
    return colors


# A clone of at least this many elements whose source is not laid out as its result is a
# part of its own when torch alone reads it: torch's copy of a permuted tensor is a generic
# strided kernel (about half the bandwidth of kiln's vector loads along the contiguous
# dimension, on an H100/H200), and the copies of one step (an attention block's q, k and v
# before their matrix products) share one launch. Smaller ones stay in torch: a part call
# costs more host time than their copy takes.
REAL_COPY_ELEMENTS = 1 << 16


def relayouts(n: torch.fx.Node) -> bool:
    """Whether ``n`` is a clone of a tensor into another layout: a transposed view made
    contiguous, or a tensor made channels-last for a convolution (:mod:`.passes.channels_last`).
    Symbolic sizes and strides are compared at their example values (no guard): which
    dimension is inner to which does not change with the sizes."""
    if n.op != "call_function" or n.target is not torch.ops.aten.clone.default or not n.args:
        return False
    out = L.node_meta(n)
    src = L.node_meta(n.args[0]) if isinstance(n.args[0], torch.fx.Node) else None
    if not isinstance(src, torch.Tensor) or not isinstance(out, torch.Tensor):
        return False
    if not (L.is_static_tensor(src) or L.is_symbolic_tensor(src)):
        return False
    # The traced result's layout differs (a clone that preserves the layout is not this).
    try:
        shape = L.example_shape(src)
        src_strides = tuple(L.size_hint(s) for s in src.stride())
        out_strides = tuple(L.size_hint(s) for s in out.stride())
    except L.Unsupported:
        return False
    return effective_strides(shape, src_strides) != effective_strides(shape, out_strides)


def is_real_copy(n: torch.fx.Node) -> bool:
    """Whether ``n`` is a clone of a large, static tensor into another layout, or one of the
    layout pass's channels-last copies (:data:`.lowering.RELAYOUT`)."""
    return relayouts(n) and (math.prod(L.example_shape(L.node_meta(n))) >= REAL_COPY_ELEMENTS
                             or bool(n.meta.get(L.RELAYOUT)))


# ---------------------------------------------------------------------------------- scheduling

def schedule(graph: torch.fx.Graph, colors: dict[torch.fx.Node, Color]) -> list[Segment]:
    """Step 3: a color-grouping topological order cut into segments (placeholders and the
    output node are left out)."""
    nodes = [n for n in graph.nodes if n.op not in ("placeholder", "output")]
    index = {n: i for i, n in enumerate(graph.nodes)}
    deferred = _deferrable(nodes, colors)
    pending = {n: sum(1 for a in n.all_input_nodes if a.op != "placeholder" and a not in deferred) for n in nodes}
    ready: dict[Color, list[tuple[int, torch.fx.Node]]] = {}

    def push(n: torch.fx.Node) -> None:
        heapq.heappush(ready.setdefault(colors.get(n), []), (index[n], n))

    for n in nodes:
        if pending[n] == 0 and n not in deferred:
            push(n)
    order: list[tuple[Color, torch.fx.Node]] = []
    emitted: set[torch.fx.Node] = set()

    def emit(n: torch.fx.Node) -> None:
        for a in n.all_input_nodes:  # deferred inputs join the run of their first reader
            if a in deferred and a not in emitted:
                emit(a)
        order.append((colors.get(n), n))
        emitted.add(n)

    current: Color = None
    while any(ready.values()):
        if not ready.get(current):
            # Torch first: its results may unlock more of a kiln run; then the earliest kiln.
            if ready.get(None):
                current = None
            else:
                current = min((h[0][0], c) for c, h in ready.items() if h)[1]
        _, n = heapq.heappop(ready[current])
        emit(n)
        for u in n.users:
            if u in pending and u not in deferred:
                pending[u] -= 1
                if pending[u] == 0:
                    push(u)
    for n in nodes:  # deferred nodes no reader pulled in (none, by construction)
        if n not in emitted:
            emit(n)
    if len(order) != len(nodes):  # pragma: no cover - an FX graph is acyclic
        raise RuntimeError("kiln.torch: the graph has a cycle")
    segments = [Segment(c, [n for _, n in grp]) for c, grp in itertools.groupby(order, key=lambda cn: cn[0])]
    return _finish([run for seg in segments for run in _cut_at_symbol_limit(seg)])


def _deferrable(nodes: list[torch.fx.Node], colors: dict[torch.fx.Node, Color]) -> set[torch.fx.Node]:
    """Kiln nodes computed from graph inputs alone whose every reader kiln runs: scheduled
    with their first reader rather than as soon as they are ready. A backward graph recomputes
    activations (gelu, dropout scaling) of every layer from saved tensors; taken as soon as
    they are ready, they all land in the first part, which writes each one to memory for the
    layer's part to read back, instead of being fused into that part."""
    out: set[torch.fx.Node] = set()
    for n in nodes:  # topological: inputs first
        if n.op != "call_function" or colors.get(n) is None or n.target is operator.getitem:
            continue
        if not all(a.op in ("placeholder", "get_attr") or a in out for a in n.all_input_nodes):
            continue
        if n.users and all(u.op == "call_function" and colors.get(u) is not None for u in n.users):
            out.add(n)
    return out


def _finish(segments: list[Segment]) -> list[Segment]:
    """Step 4, then the inputs and outputs of every kiln segment; adjacent torch runs merge."""
    for s in segments:
        if s.is_kiln and all(n.target in L.NON_COMPUTE_OPS and not is_real_copy(n) for n in s.nodes):
            s.color = None
    for s in segments:
        if not s.is_kiln:
            continue
        members = set(s.nodes)
        sizes: list[torch.fx.Node] = []  # run-time sizes (SymInts) its views read: after the tensors
        for n in s.nodes:
            for a in n.all_input_nodes:
                if a not in members and a not in s.inputs and a not in sizes:
                    (sizes if L.is_size_node(a) else s.inputs).append(a)
            if isinstance(L.node_meta(n), (tuple, list)):
                if any(u not in members for u in n.users):
                    s.color = None  # a tuple leaving kiln: keep the whole run in torch
                    break
                continue
            if any(u not in members for u in n.users):
                s.outputs.append(n)
        s.num_tensor_inputs = len(s.inputs)
        s.inputs.extend(sizes)
        if s.is_kiln:
            _views_to_torch(s)
        if s.is_kiln and (not s.outputs or any(_empty(n) for n in s.inputs + s.outputs)):
            # Nothing to return, or zero-size tensors (nothing to compute, maybe no address).
            s.color = None
        if not s.is_kiln:
            s.inputs, s.outputs = [], []
    merged: list[Segment] = []
    for s in segments:
        if merged and not s.is_kiln and not merged[-1].is_kiln:
            merged[-1].nodes.extend(s.nodes)
        else:
            merged.append(s)
    return merged


def _views_to_torch(s: Segment) -> None:
    """Moves the results of ``s`` that are views of its arguments (the backward's incoming
    gradient reshaped for a matrix product, an alias of a saved [B, H, T, T] softmax) to
    ``s.torch_views``: a view costs torch nothing, where the part would write a copy.

    The same for a result that is a view in no dense layout (a head of a fused q/k/v
    projection: ``qkv.reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4)[0]``) of a contiguous
    tensor the segment computes, when a torch-side ``view`` relies on its strides (CoaT's
    factorised attention): a kernel cannot store a result in such a layout, so the part
    returns the tensor it is a view of (stored contiguous, its traced layout) and torch takes
    the view of that, strides and all."""
    members = set(s.nodes)
    args = set(s.inputs)
    for o in list(s.outputs):
        chain: list[torch.fx.Node] = []
        n = o
        while n in members and n.op == "call_function" and n.target in L.VIEW_OPS \
                and n.target is not torch.ops.aten.clone.default and n.args and isinstance(n.args[0], torch.fx.Node):
            chain.append(n)
            n = n.args[0]
        if not chain:
            continue
        if n not in args and not (n in members and _strided_view_of_dense(o, n, members)):
            continue
        if any(a in members and a not in chain and a is not n for c in chain for a in c.all_input_nodes):
            continue  # a size the segment computes
        s.torch_views[o] = chain[::-1]
        s.outputs.remove(o)
        if n in members and n not in s.outputs:
            s.outputs.append(n)


def _strided_view_of_dense(o: torch.fx.Node, base: torch.fx.Node, members: set[torch.fx.Node]) -> bool:
    """Whether the result ``o``, a view of ``base`` computed in the same segment, is in no dense
    layout while a torch-side view relies on its strides, and ``base`` is static and
    contiguous (what the part stores it as)."""
    m, mb = L.node_meta(o), L.node_meta(base)
    if not (L.is_static_tensor(m) and L.is_static_tensor(mb)):
        return False
    if not is_contiguous_layout(tuple(int(d) for d in mb.shape), tuple(int(st) for st in mb.stride())):
        return False
    if memory_order(tuple(int(d) for d in m.shape), tuple(int(st) for st in m.stride())) is not None:
        return False
    return _viewed_in_layout(o, frozenset(members))


def _output_read(node: torch.fx.Node, i: int) -> bool:
    """Whether a getitem user of the multi-output ``node`` reads its output ``i``."""
    return any(u.target is operator.getitem and u.args[1] == i for u in node.users)


def _static_empty(m: Any) -> bool:
    return isinstance(m, torch.Tensor) and L.is_static_tensor(m) and m.numel() == 0


def _empty(n: torch.fx.Node) -> bool:
    m = L.node_meta(n)
    return isinstance(m, torch.Tensor) and m.numel() == 0


def partition(gm: torch.fx.GraphModule) -> list[Segment]:
    """Colors, schedules and cuts ``gm``'s graph; see the module docstring."""
    return schedule(gm.graph, color_nodes(gm.graph))


# ---------------------------------------------------------------------------------- kiln graphs

@functools.lru_cache(maxsize=None)
def _view_tables() -> tuple[frozenset[Any], frozenset[Any]]:
    """The ops whose result depends on their argument's strides (``view`` is valid for some
    strides only; ``as_strided`` addresses raw storage), and the views whose strides follow
    their argument's."""
    aten = torch.ops.aten
    readers = frozenset(getattr(aten, o).default for o in ("view", "_unsafe_view", "_reshape_alias", "as_strided")
                        if hasattr(aten, o))
    passing = [aten.slice.Tensor, aten.permute.default, aten.transpose.int, aten.t.default,
               aten.expand.default, aten.select.int, aten.unsqueeze.default, aten.squeeze.dim,
               aten.squeeze.default, aten.alias.default, aten.narrow.default, aten.diagonal.default,
               aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int, operator.getitem]
    if hasattr(aten.squeeze, "dims"):
        passing.append(aten.squeeze.dims)
    return readers, frozenset(passing)


def _needs_layout(n: torch.fx.Node) -> bool:
    """Whether torch's graph relies on the strides of ``n``: a graph output, or read by a node
    that addresses raw storage."""
    return any(u.op == "output" or u.target is torch.ops.aten.as_strided.default for u in n.users)


def _viewed_in_layout(n: torch.fx.Node, inside: frozenset[torch.fx.Node]) -> bool:
    """Whether a ``view`` (or ``as_strided``) outside ``inside`` (the part's own nodes) reads
    ``n`` through other views (slice, permute...) that keep their argument's layout: AOTAutograd writes ``view``
    only where the traced strides allow it (a rotary embedding's add keeps its operand's
    head-transposed layout and the backward slices, permutes and views it as [B*T, C], which
    fails on a contiguous result). A ``view`` of ``n`` itself is valid on a contiguous result,
    so it does not count."""
    strided_readers, passing = _view_tables()
    return reached([u for u in n.users if u not in inside and u.op == "call_function" and u.target in passing],
                    lambda r: r.target in strided_readers,
                    lambda r: r.op == "call_function" and r.target in passing)


class NothingToCompute(L.Unsupported):
    """A kiln part whose every result is one of its arguments or a view of one (a lone
    ``copy`` of a tensor into a buffer of its own shape and dtype, once a neighbouring node ran
    in torch): its nodes run in torch, with no part and no warning."""


def build_part(seg: Segment, written: Optional[dict[torch.fx.Node, Optional[tuple[int, ...]]]] = None) -> PartGraph:
    """The kiln graph of a kiln segment; raises :class:`~.lowering.Unsupported` if a node does
    not lower in context.

    ``written`` maps the results of parts built before this one (in graph order) to the layout
    their kernels store them in (strides, or None: contiguous), and takes this part's. A result
    torch traced as a slice of a wider tensor (one half of a gated unit's split) but no reader
    needs in that layout is stored contiguous: a later part reading it declares that layout,
    not the traced one, or every call would copy the result into the traced layout."""
    b = GraphBuilder()
    env: dict[torch.fx.Node, Any] = {}
    in_specs: list[TensorSpec] = []
    symbols: dict[Any, str] = {}  # a size's expression -> its kiln symbol, within this part
    symbol_dims: dict[Any, tuple[Value, int]] = {}  # ... -> the first argument and dimension having it
    # A part with symbolic sizes is run with every argument contiguous (KilnPart._run_symbolic
    # copies an argument that is not; the native runner takes no declared layout for such a
    # part): its arguments of static shape declare no layout either. Declared, the kernel would
    # read the contiguous copy of a transposed argument with the traced strides (the
    # cross-attention bias gradients of encoder-decoder models, whose encoder length is static
    # where the decoder's is symbolic). Its results are allocated contiguous, or permuted where
    # torch relies on a dense layout of another order (below).
    symbolic = any(L.is_symbolic_tensor(L.node_meta(n)) for n in seg.inputs[:seg.num_tensor_inputs])
    for i, n in enumerate(seg.inputs[:seg.num_tensor_inputs]):
        m = L.node_meta(n)
        if L.is_symbolic_tensor(m):
            # torch's dynamic shapes: each distinct size expression is one kiln symbol (an
            # expression such as s0*s1 is a size like any other to the kernel). Symbolic
            # arguments are taken contiguous: the runtime copies one that is not (a transposed
            # view), since strides that are expressions of the sizes cannot be declared.
            exprs = tuple(L.size_expr(d) for d in m.shape)
            dims = tuple("" if e.is_number else symbols.setdefault(e, f"s{len(symbols)}") for e in exprs)
            shape = L.example_shape(m)
            in_specs.append(TensorSpec(m.dtype, shape, None, exprs))
            env[n] = b.input(n.name, L.kiln_dtype(m.dtype), shape, dims=dims)
            for d, e in enumerate(exprs):
                if not e.is_number:
                    symbol_dims.setdefault(e, (env[n], d))
            continue
        if not L.is_static_tensor(m):
            raise L.Unsupported(f"argument {n.name} is not a tensor of static shape")
        shape = tuple(int(d) for d in m.shape)
        strides = tuple(int(s) for s in m.stride())
        if written is not None and n in written:
            strides = written[n] or contiguous_strides(shape)
        declared = None if symbolic or is_contiguous_layout(shape, strides) else effective_strides(shape, strides)
        in_specs.append(TensorSpec(m.dtype, shape, declared))
        env[n] = b.input(n.name, L.kiln_dtype(m.dtype), shape, strides=declared)

    def lookup(n: torch.fx.Node) -> Any:
        try:
            return env[n]
        except KeyError:
            raise L.Unsupported(f"{n.name} is used before it is computed") from None

    for n in seg.nodes:
        env[n] = L.lower_node(b, n, lookup, symbol_dims)
    inside = frozenset(seg.nodes)

    input_ids = {id(v): i for i, v in enumerate(env[n] for n in seg.inputs[:seg.num_tensor_inputs])}
    kiln_outs: list[Value] = []
    sources: list[tuple[str, int]] = []
    out_specs: list[TensorSpec] = []
    out_keys: list[Any] = []  # per kiln output: (id of its value, memory order or None)
    stored: dict[torch.fx.Node, Optional[tuple[int, ...]]] = {}  # static kiln results: their strides or None

    def kiln_output(v: Value, order: Optional[tuple[int, ...]]) -> int:
        """The kiln output holding ``v`` in memory ``order`` (None: contiguous), added once. A
        result in a layout of its own is the permuted tensor (dims in memory order, contiguous),
        which is the result in that layout byte for byte: the runtime allocates it permuted
        back (static results: with their strides), with no copy after the kernel."""
        key = (id(v), order)
        if key not in out_keys:
            kiln_outs.append(v if order is None else b.permute(v, list(order)))
            out_keys.append(key)
        return out_keys.index(key)

    for n in seg.outputs:
        v = env[n]
        if not isinstance(v, Value):
            raise L.Unsupported(f"{n.name} is not a single tensor")
        m = L.node_meta(n)
        if L.is_symbolic_tensor(m):
            if not symbols:
                raise L.Unsupported(f"{n.name} has symbolic sizes but no argument of the part has")
            # A layout torch relies on that is dense but not contiguous (an NHWC-shaped result
            # stored in NCHW order, which a frame returns): stored permuted, as a static result
            # in a layout of its own below, with the order proven at every size.
            order = None
            if (_needs_layout(n) or _viewed_in_layout(n, inside)) and not L.is_contiguous_symbolic(m):
                order = L.symbolic_memory_order(m)
                if order is None:
                    raise L.Unsupported(f"{n.name} has symbolic sizes and strides {tuple(m.stride())} (not a "
                                        "dense layout), and torch relies on them")
            hints = tuple(L.size_hint(st) for st in m.stride()) if order is not None else None
            out_specs.append(TensorSpec(m.dtype, L.example_shape(m), hints, tuple(L.size_expr(d) for d in m.shape)))
            if order is None and id(v) in input_ids:
                sources.append(("input", input_ids[id(v)]))
                continue
            sources.append(("kiln", kiln_output(v, order)))
            continue
        shape = tuple(int(d) for d in m.shape)
        strides = tuple(int(s) for s in m.stride())
        contiguous = is_contiguous_layout(shape, strides)
        if symbolic and not contiguous:
            # Written contiguous (see above) unless torch relies on the traced strides: then
            # stored in that dense layout as below, or refused where it is none. An argument in
            # its own layout is copied by the torch side, layout and all.
            if id(v) in input_ids and same_layout(L.node_meta(seg.inputs[input_ids[id(v)]]), m):
                out_specs.append(TensorSpec(m.dtype, shape))
                sources.append(("input", input_ids[id(v)]))
                continue
            if not (_needs_layout(n) or _viewed_in_layout(n, inside)):
                contiguous = True
            elif memory_order(shape, strides) is None:
                raise L.Unsupported(f"{n.name} has strides {strides} (not a dense layout) in a part with symbolic "
                                    "sizes, and torch relies on them")
        order = None  # a dense layout the result must have, as the order of its dimensions in memory
        # A channels-last result (a convolution's, or computed from one) stays channels-last:
        # the next convolution reads it without a conversion.
        viewed = not contiguous and _viewed_in_layout(n, inside)
        if not contiguous and (viewed or _needs_layout(n) or is_channels_last(m)):
            order = memory_order(shape, strides)
            if order is None and viewed and id(v) not in input_ids:
                raise L.Unsupported(f"{n.name} has strides {strides} (not a dense layout) and a view relies on them")
        if id(v) in input_ids:
            # An argument passed through: torch copies it (layout and all) where the argument's
            # layout is the result's; else the kernel copies it into the result's layout (a
            # channels-last gradient made contiguous, say).
            declared = in_specs[input_ids[id(v)]].strides
            wanted = None if contiguous else effective_strides(shape, strides)
            if declared == wanted or (order is None and not contiguous):
                out_specs.append(TensorSpec(m.dtype, shape))
                sources.append(("input", input_ids[id(v)]))
                continue
            if order is None:
                order = tuple(range(len(shape)))
        sources.append(("kiln", kiln_output(v, order)))
        out_specs.append(TensorSpec(m.dtype, shape, strides if order is not None and not contiguous else None))
        stored[n] = out_specs[-1].strides
    if not kiln_outs:
        raise NothingToCompute("the part computes nothing")
    graph = b.build(kiln_outs)
    if written is not None:
        written.update(stored)
    return PartGraph(graph, in_specs, out_specs, sources, len(kiln_outs), len(graph.nodes),
                     symbolic=bool(symbols))


def eager_graph(seg: Segment) -> torch.fx.Graph:
    """A graph of ``seg``'s nodes, run by torch: arguments in ``seg.inputs`` order, returning a
    tuple in ``seg.outputs`` order. The fallback of a kiln part (a GraphModule made of it when
    first needed: generating its Python code for every part cost a warm start ~4 ms a part)."""
    g = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for i, n in enumerate(seg.inputs):
        p = g.placeholder(f"arg{i}")
        p.meta = dict(n.meta)
        env[n] = p
    for n in seg.nodes:
        env[n] = g.node_copy(n, lambda a: env[a])
    g.output(tuple(env[n] for n in seg.outputs))
    return g
