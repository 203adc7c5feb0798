"""Bias epilogues move to kiln (stage 1, last): an ``addmm`` whose result a kiln node reads
becomes ``mm`` plus an ``add`` that joins that node's part, and so does a ``convolution``'s
bias. Which node kiln reads is the partitioner's own question (:func:`..partition.node_color`),
asked here ahead of it."""

from __future__ import annotations

import torch
import torch.fx

from .. import lowering as L
from ..partition import node_color


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
        users = list(n.users)
        view = users[0] if len(users) == 1 and _keeps_last_dim(users[0], meta) else None
        # A view kiln cannot take (a reshape to a run-time size, in a dynamic-shape graph)
        # between the product and its reader: the add moves below it, where it still
        # broadcasts the same way (the view keeps the last dimension).
        sink = view is not None and node_color(view)[0] is None
        anchor = view if sink else n  # the node whose value the add replaces
        if (not _read_by_kiln(anchor) or _returned(anchor)) and not _split_k_product(meta, a):
            continue
        with graph.inserting_before(anchor):
            mm = graph.call_function(aten.mm.default, (a, b))
            mm.meta.update(n.meta)  # same shape, dtype, device and (contiguous) layout
            base = mm
            if sink:
                base = graph.call_function(view.target, (mm, *view.args[1:]), dict(view.kwargs))
                base.meta.update(view.meta)
            add = graph.call_function(aten.add.Tensor, (base, bias))
            add.meta.update(anchor.meta)
        anchor.replace_all_uses_with(add)
        graph.erase_node(anchor)
        if sink:
            graph.erase_node(n)
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


def _keeps_last_dim(v: torch.fx.Node, src: torch.Tensor) -> bool:
    """Whether ``v`` is a reshape of ``src`` whose last dimension is ``src``'s (a bias along
    that dimension broadcasts the same before and after it)."""
    aten = torch.ops.aten
    if v.op != "call_function" or v.target not in (aten.view.default, aten._unsafe_view.default, aten.reshape.default):
        return False
    m = L.node_meta(v)
    if not isinstance(m, torch.Tensor) or m.ndim < 1 or src.ndim < 1:
        return False
    last, want = m.shape[-1], src.shape[-1]
    return L._is_static_size(last) and L._is_static_size(want) and int(last) == int(want)


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
    """Whether some node that computes (not a view) reads ``n``, directly or through views
    that kiln runs too, and lowers to kiln on its own: the bias add then lands in that node's
    part. (A view kiln cannot take, one with symbolic size arguments say, would leave the add
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
        if u.target in L.VIEW_OPS:
            todo.extend(u.users)
            continue
        return True
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
