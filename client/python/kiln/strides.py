"""Strided layouts in elements: when two agree, whether one is contiguous, and the order of a
dense layout's dimensions in memory. Shared by kiln.torch's partitioner and part runtime and by
the native part runner, which allocates outputs in such layouts.
"""

from __future__ import annotations

from typing import Optional, Sequence


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The row-major strides of ``shape`` (a size-0 dimension counts as 1)."""
    strides = []
    acc = 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(strides))


def effective_strides(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...]:
    """Strides with those of size-1 axes zeroed: two layouts agree iff these agree."""
    return tuple(0 if d == 1 else s for d, s in zip(shape, strides))


def is_contiguous_layout(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    return effective_strides(shape, strides) == effective_strides(shape, contiguous_strides(shape))


def memory_order(shape: tuple[int, ...], strides: tuple[int, ...]) -> Optional[tuple[int, ...]]:
    """The dimensions of a dense, non-overlapping layout from outermost to innermost in memory
    (``(0, 2, 3, 1)`` for NCHW channels-last), or None when the layout is not one: a tensor in
    it is ``empty(shape permuted).permute(inverse)``. Dimensions of size 1 go where their
    position puts them (their stride is meaningless)."""
    order = tuple(sorted(range(len(shape)), key=lambda d: (-strides[d], d)))
    expect = 1
    for d in reversed(order):
        if shape[d] != 1 and strides[d] != expect:
            return None
        expect *= shape[d]
    return order


def inverse_order(order: Sequence[int]) -> list[int]:
    """The permutation undoing ``order``: ``t.permute(order).permute(inverse_order(order))`` is
    ``t`` (a tensor stored in memory order, viewed back in its own dimensions)."""
    back = [0] * len(order)
    for i, d in enumerate(order):
        back[d] = i
    return back


__all__ = ["contiguous_strides", "effective_strides", "inverse_order", "is_contiguous_layout", "memory_order"]
