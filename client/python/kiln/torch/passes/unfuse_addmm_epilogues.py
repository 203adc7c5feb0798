"""Bias epilogues move to kiln (stage 1, last): an ``addmm`` whose result a kiln node reads
becomes ``mm`` plus an ``add`` that joins that node's part, and so does a ``convolution``'s
bias. Which node kiln reads is the partitioner's own question (:func:`..partition.node_color`),
asked here ahead of it."""

from __future__ import annotations

import torch
import torch.fx

from .. import lowering as L
from ..partition import is_real_copy, node_color


def unfuse_addmm_epilogues(graph: torch.fx.Graph) -> int:
    """``addmm(bias, a, b)`` (``beta`` = ``alpha`` = 1) whose result kiln reads next becomes
    ``mm(a, b)`` in torch plus ``add(., bias)`` in that kiln part, returning how many were
    rewritten.

    The bias add then costs nothing: it is fused into the part's kernel (the activation, the
    residual add and layer_norm after a linear layer), and the GEMM runs as a plain ``mm``.
    On CUDA that also changes which GEMM runs: torch sends ``addmm`` with a vector bias to
    cuBLASLt's bias epilogue, whose kernel choice for BERT-base's shapes is slower than the
    plain ``mm``'s (0.8 ms of 5.8 ms of GEMMs per inference step on an H100; Inductor unfuses
    the bias the same way). An addmm whose result only torch reads keeps its fused epilogue,
    unless it is a long reduction over a small output (:func:`_split_k_product`), whose add
    then runs in a kiln part of its own. So does one whose result the graph returns (a training
    forward saving a linear layer's output for the activation's backward): the GEMM's epilogue
    writes it at no cost, where the kiln part would write it a second time beside its own
    result (BERT-base's bias + gelu part: 22 µs against Inductor's 11 per layer, H200).
    Numerically the product is rounded to the output dtype before the bias is added (one
    extra rounding in f16/bf16; none in f32, where cuBLAS adds the bias in f32 too).
    """
    aten = torch.ops.aten
    done = 0
    for n in list(graph.nodes):
        if n.op != "call_function" or n.target is not aten.addmm.default or len(n.args) != 3:
            continue
        if any(n.kwargs.get(k, 1) != 1 for k in ("beta", "alpha")) or set(n.kwargs) - {"beta", "alpha"}:
            continue
        meta = L.node_meta(n)
        if not isinstance(meta, torch.Tensor) or not all(isinstance(x, torch.fx.Node) for x in n.args):
            continue
        bias, a, b = n.args
        # Views kiln cannot take (reshapes to a run-time size, in a dynamic-shape graph)
        # between the product and its reader: the add moves below the last of them, with the
        # bias viewed as the dimensions that view splits the last one into (an attention
        # projection's heads and head width), so that it adds to the same elements.
        links = _reshape_chain(n, meta)
        sunk = max((i for i, (v, _) in enumerate(links) if node_color(v)[0] is None), default=-1)
        chain = [v for v, _ in links[:sunk + 1]]
        anchor = chain[-1] if chain else n  # the node whose value the add replaces
        if (not _read_by_kiln(anchor) or _returned(anchor)) and not _split_k_product(meta, a):
            continue
        bias_shape = links[sunk][1] if chain else None
        if chain and not isinstance(L.node_meta(bias), torch.Tensor):
            continue
        with graph.inserting_before(anchor):
            mm = graph.call_function(aten.mm.default, (a, b))
            mm.meta.update(n.meta)  # same shape, dtype, device and (contiguous) layout
            base, addend = mm, bias
            for view in chain:
                base = graph.call_function(view.target, (base, *view.args[1:]), dict(view.kwargs))
                base.meta.update(view.meta)
            if bias_shape is not None and len(bias_shape) > 1:
                addend = graph.call_function(aten.view.default, (bias, list(bias_shape)))
                addend.meta["val"] = L.node_meta(bias).view(bias_shape)
            add = graph.call_function(aten.add.Tensor, (base, addend))
            add.meta.update(anchor.meta)
        anchor.replace_all_uses_with(add)
        for old in [*reversed(chain), n]:
            graph.erase_node(old)
        done += 1
    return done


def _split_k_product(out: torch.Tensor, a: torch.fx.Node) -> bool:
    """Whether an f32 CUDA ``addmm`` is one whose bias is better added apart even when only
    torch reads the result (a linear layer before dropout, in training): a long reduction
    (K >= 2N) over an output too small to fill the GPU with 128x128 tiles. There cuBLAS's plain
    GEMM splits the reduction (split-K) and its bias-epilogue path does not: BERT-base's
    3072->768 product over 2048 rows runs 209 µs as ``mm`` and 255 µs as ``addmm`` on an H200
    (``tests/bench/gpu/gemm_choice.py``), and the separate add costs ~6 µs. Elsewhere the epilogue
    is as fast or faster (768->768: 65 µs against 69), and the addmm stays."""
    am = L.node_meta(a)
    if not (isinstance(am, torch.Tensor) and out.device.type == "cuda" and out.dtype == torch.float32
            and out.ndim == 2 and am.ndim == 2):
        return False
    sizes = (out.shape[0], out.shape[1], am.shape[1])
    if not all(L._is_static_size(d) for d in sizes):
        return False
    m, n, k = (int(d) for d in sizes)
    try:
        sms = torch.cuda.get_device_properties(out.device).multi_processor_count
    except Exception:  # no device to ask (a graph traced for CUDA elsewhere)
        return False
    return k >= 2 * n and -(-m // 128) * -(-n // 128) < sms


def _reshape_chain(n: torch.fx.Node, src: torch.Tensor) -> list[tuple[torch.fx.Node, tuple[int, ...]]]:
    """The reshapes that follow ``n`` one after the other, each the only reader of the one
    before (the first, of ``n``) and each keeping ``src``'s last dimension in its trailing
    ones, with those trailing dimensions (:func:`_bias_shape_after`)."""
    chain: list[tuple[torch.fx.Node, tuple[int, ...]]] = []
    cur = n
    while len(cur.users) == 1:
        (v,) = cur.users
        shape = _bias_shape_after(v, src)
        if shape is None:
            break
        chain.append((v, shape))
        cur = v
    return chain


def _bias_shape_after(v: torch.fx.Node, src: torch.Tensor) -> tuple[int, ...] | None:
    """When ``v`` is a reshape of ``src`` whose trailing dimensions (static) hold exactly
    ``src``'s last one (itself, or split as ``[.., heads, width]``): those dimensions, the shape
    in which a bias along ``src``'s last dimension adds to the same elements after the
    reshape. None for any other node."""
    aten = torch.ops.aten
    if v.op != "call_function" or v.target not in (aten.view.default, aten._unsafe_view.default, aten.reshape.default):
        return None
    m = L.node_meta(v)
    if not isinstance(m, torch.Tensor) or m.ndim < 1 or src.ndim < 1 or not L._is_static_size(src.shape[-1]):
        return None
    want, have = int(src.shape[-1]), 1
    trailing: list[int] = []
    for d in reversed(m.shape):
        if have == want:
            break
        if not L._is_static_size(d) or int(d) == 0:
            return None
        trailing.insert(0, int(d))
        have *= int(d)
    return tuple(trailing) if have == want and trailing else None


def _returned(n: torch.fx.Node) -> bool:
    """Whether the graph returns ``n``, directly or through views."""
    todo, seen = list(n.users), set()
    while todo:
        u = todo.pop()
        if u in seen:
            continue
        seen.add(u)
        if u.op == "output":
            return True
        if u.op == "call_function" and u.target in L.VIEW_OPS:
            todo.extend(u.users)
    return False


def _read_by_kiln(n: torch.fx.Node) -> bool:
    """Whether some node that computes (not a view, or a copy into another layout) reads ``n``,
    directly or through views that kiln runs too, and lowers to kiln on its own: the bias add
    then lands in that node's part. (A view kiln cannot take, one with symbolic size arguments say, would leave the add
    alone in a part of its own: an extra kernel where addmm had none.)"""
    seen: set[torch.fx.Node] = set()
    todo = list(n.users)
    while todo:
        u = todo.pop()
        if u in seen or u.op != "call_function":
            continue
        seen.add(u)
        if node_color(u)[0] is None:
            continue
        if u.target in L.VIEW_OPS and not is_real_copy(u):
            todo.extend(u.users)
            continue
        return True  # a computing node, or a copy into another layout (a part of its own)
    return False


__all__ = ["unfuse_addmm_epilogues"]


def unfuse_convolution_bias(graph: torch.fx.Graph) -> int:
    """``convolution(x, w, bias, ...)`` whose result kiln reads next (and the graph does not
    return) becomes ``convolution(x, w, None, ...)`` in torch plus ``add(., bias)`` broadcast
    along the channels in that kiln part, returning how many were rewritten.

    torch runs a convolution's bias as a kernel of its own after cuDNN's (``add_`` over the
    whole output: a read and a write of it, a launch and four ATen calls on the host); in the
    part that reads the output next it is one more term of a kernel that runs anyway. ConvNeXt
    and PoolFormer have a bias on every convolution: 40 and 28 such kernels per inference call
    at batch 16 (H200), which Inductor also folds into the kernels after the convolution. The
    sum is the same one torch computes (the convolution rounded to its dtype, then the bias
    added), so results do not change. A result the graph returns (a training forward saves
    it) keeps its bias in torch: the kiln part would write it a second time."""
    aten = torch.ops.aten
    done = 0
    for n in list(graph.nodes):
        if n.op != "call_function" or n.target is not aten.convolution.default or len(n.args) != 9 or n.kwargs:
            continue
        bias = n.args[2]
        meta, bias_meta = L.node_meta(n), L.node_meta(bias)
        if not (isinstance(bias, torch.fx.Node) and isinstance(meta, torch.Tensor)
                and isinstance(bias_meta, torch.Tensor) and meta.ndim >= 3 and bias_meta.ndim == 1):
            continue
        if not _read_by_kiln(n) or _returned(n):
            continue
        channels = [-1] + [1] * (meta.ndim - 2)  # the bias along dimension 1 of the output
        with graph.inserting_before(n):
            conv = graph.call_function(aten.convolution.default, (n.args[0], n.args[1], None, *n.args[3:]))
            conv.meta.update(n.meta)  # the same shape, dtype, device and layout with or without a bias
            column = graph.call_function(aten.view.default, (bias, channels))
            column.meta["val"] = bias_meta.view(channels)
            add = graph.call_function(aten.add.Tensor, (conv, column))
            add.meta.update(n.meta)
        n.replace_all_uses_with(add)
        graph.erase_node(n)
        done += 1
    return done
