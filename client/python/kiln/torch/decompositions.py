"""The decomposition table AOTAutograd applies for the kiln backend: torch's core ATen
decompositions, with kiln's choices for attention, embeddings' gradients, F.fold, splits, batch
norm, masked assignments and dropout.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import torch

from .rng import dropout_decomposition


@functools.lru_cache(maxsize=2)
def decompositions(random_in_kiln: bool = True) -> Any:
    """The decomposition table AOTAutograd applies: torch's core ATen decompositions, which
    leave the ops kiln maps directly (softmax, layer_norm, gelu...) and break their backward
    ops into elementwise ops and reductions. ``random_in_kiln``: a dropout becomes a draw and
    a select that kiln fuses (kiln/torch/rng.py), else it stays torch's op."""
    from torch._decomp import core_aten_decompositions, get_decompositions

    table = core_aten_decompositions()
    # Attention stays one op, run by torch. Decomposing the CPU flash-attention forward into
    # matmuls and a softmax gives the right output, but AOTAutograd's backward is still the
    # fused op's, fed the logsumexp the decomposition computed: on torch 2.15 the gradients
    # of q, k and v come out wrong by orders of magnitude (tests/python/test_torch_backend.py,
    # ``test_attention_gradients_match_eager``). kiln fuses nothing across a matmul anyway.
    for name in ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention"):
        op = getattr(torch.ops.aten, name, None)
        if op is not None:
            table.pop(op.default, None)
    # An embedding's backward: torch's core decomposition is an index_put with accumulation,
    # which CUDA runs as a sort and a serial scatter per duplicate index (about 1 ms for
    # BERT-base's word embeddings at batch 16, sequence 128, on an H100/H200), and the op's own
    # kernel sorts too (0.23 ms per BERT-base step for its three tables, H200). On CUDA it is
    # a zero table and an index_add (atomic adds, as Inductor's kernel does: 0.03 ms),
    # unless deterministic algorithms are asked for; elsewhere the op stays torch's.
    table[torch.ops.aten.embedding_dense_backward.default] = _embedding_backward_by_atomic_adds
    # (index_add itself stays an op: the core table would make it an index_put, the sort.)
    table.pop(torch.ops.aten.index_add.default, None)
    # F.fold (col2im: overlapping patches summed into an image, VOLO's outlook attention) stays
    # torch's op, which sums the patches covering each output pixel. Its core decomposition is
    # an index_put with accumulation that kiln does not lower, so torch ran it as a sort and a
    # serial scatter: 1.05 ms per call for volo_d1 at batch 16 on an H200, against Inductor's
    # 0.06 ms atomic-add kernel. (Its backward, im2col, is a gather kiln fuses.)
    table.pop(torch.ops.aten.col2im.default, None)
    # Splits become slices of the split tensor. Kept as one split_with_sizes, the partitioner
    # (min-cut) saves each piece's consumers for the backward rather than the tensor the
    # pieces view: the LLTM cell's forward then wrote its sigmoids and the elu's input, three
    # [batch, state] tensors, where saving the gates (already written by the matmul) costs no
    # write at all, the backward recomputing the sigmoids as it reads them.
    table[torch.ops.aten.split_with_sizes.default] = _split_as_slices
    # A training batch norm (batch statistics, running statistics updated) becomes its
    # arithmetic: a variance and mean over N, H, W, the normalisation, and the running-statistic
    # updates, which kiln fuses with the ReLU and residual add around it. Left as the op, it ran
    # in torch with a clone of each running statistic and a kernel of its own per output.
    table.update(get_decompositions([torch.ops.aten._native_batch_norm_legit_functional.default]))
    # A batch norm without running statistics (``F.batch_norm(w, None, None, training=True)``):
    # the weight standardisation of NF-Nets' and BiT's convolutions, run on every forward.
    # As its arithmetic it is a mean and variance over each output channel's weights that
    # kiln fuses into one part; left as the op, torch ran three kernels per convolution.
    table.update(get_decompositions([torch.ops.aten._native_batch_norm_legit]))
    # A masked assignment (``x[mask] = v``; NumPy's ``X_std[X_std == 0] = 1`` through
    # torch.compile's NumPy support on torch 2.11) is an index_put with one boolean mask over
    # x's leading dimensions and a single value: as a where, kiln fuses it with its neighbours.
    # Left as the op, it cut the seed's numpy_fn into two parts with two torch ops between.
    table[torch.ops.aten.index_put.default] = _masked_assignment_as_where
    if random_in_kiln:
        table.update(dropout_decomposition())
    return table


def _masked_assignment_as_where(x: torch.Tensor, indices: Sequence[Any], values: torch.Tensor,
                                accumulate: bool = False) -> Any:
    """``index_put(x, [mask], v)`` with a boolean ``mask`` shaped as x's leading dimensions, on
    x's device, and a 0-d ``v``: ``where(mask, v, x)``, or ``where(mask, x + v, x)`` when
    accumulating (a mask names each element once). NotImplemented (torch's op) for anything
    else: integer indices, several indices, a value per selected element."""
    if len(indices) != 1 or indices[0] is None:
        return NotImplemented
    mask = indices[0]
    if (mask.dtype != torch.bool or mask.device != x.device or values.dim() != 0 or mask.dim() > x.dim()
            or tuple(mask.shape) != tuple(x.shape[:mask.dim()])):
        return NotImplemented
    aten = torch.ops.aten
    if values.dtype != x.dtype or values.device != x.device:
        values = aten._to_copy.default(values, dtype=x.dtype, device=x.device)
    for _ in range(x.dim() - mask.dim()):
        mask = aten.unsqueeze.default(mask, -1)
    return aten.where.self(mask, aten.add.Tensor(x, values) if accumulate else values, x)


def _embedding_backward_by_atomic_adds(grad_output: torch.Tensor, indices: torch.Tensor, num_weights: int,
                                       padding_idx: int, scale_grad_by_freq: bool) -> Any:
    """The gradient of an embedding table on CUDA: each row of ``grad_output`` added into the
    row its index names (``index_add``, atomic adds: the order of the additions, and so the
    last bits of a row read many times, may differ between runs, as Inductor's kernel does);
    rows at ``padding_idx`` contribute nothing. NotImplemented (torch's op) on other devices,
    with ``scale_grad_by_freq`` or under ``torch.use_deterministic_algorithms``."""
    if (grad_output.device.type != "cuda" or scale_grad_by_freq or torch.are_deterministic_algorithms_enabled()):
        return NotImplemented
    return embedding_grad(grad_output, indices, num_weights, padding_idx)


def embedding_grad(grad_output: torch.Tensor, indices: torch.Tensor, num_weights: int, padding_idx: int) -> torch.Tensor:
    """An embedding table's gradient as a zero table and an ``index_add`` (any device)."""
    aten = torch.ops.aten
    width = grad_output.shape[-1]
    ids = aten.reshape.default(indices, [-1])
    rows = aten.reshape.default(grad_output, [-1, width])
    if padding_idx >= 0:
        keep = aten.unsqueeze.default(aten.ne.Scalar(ids, padding_idx), 1)
        rows = aten.where.self(keep, rows, aten.scalar_tensor.default(0.0, dtype=rows.dtype, device=rows.device))
    table = aten.zeros.default([num_weights, width], dtype=grad_output.dtype, device=grad_output.device)
    return aten.index_add.default(table, 0, ids, rows)


def _split_as_slices(x: torch.Tensor, split_sizes: Sequence[Any], dim: int = 0) -> list[torch.Tensor]:
    """``split_with_sizes`` as slices along ``dim`` (views either way; kiln lowers slices)."""
    out, start = [], 0
    for size in split_sizes:
        out.append(torch.ops.aten.slice.Tensor(x, dim, start, start + size))
        start = start + size
    return out


__all__ = ["decompositions", "embedding_grad"]
