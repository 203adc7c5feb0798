"""Random numbers drawn inside kiln parts (dropout in the kernels around it).

torch runs each dropout as a kernel of its own (a read of the input, writes of the output and of
the mask), and a kiln part can neither call torch's generator nor reproduce its stream. kiln draws
counter-based numbers instead (the ``uniform`` op, kernels/ir/OPS.md): a Philox function of a
seed, the element's position and a stream, computed in whichever kernel reads the number, so a
dropout joins the bias add before it and the residual add and layer_norm after it (as Inductor's
generated kernels draw theirs).

Contract:

- With random numbers in kiln (the default for CUDA graphs; CPU graphs keep torch's generator,
  whose vectorised draws cost about 1 ns a number against ~6 for a Philox per element in a
  vectorised CPU loop), :func:`dropout_decomposition` is in the backend's
  decomposition table: a training ``native_dropout`` becomes ``rand_like(x) > p`` and a scaled
  select (torch's own decomposition), so AOTAutograd's backward multiplies by the saved mask.
- The pass :mod:`.passes.seed_draws` rewrites an ATen graph: each float ``rand_like`` becomes
  ``kiln.uniform(seed, x, stream, dtype)``. ``seed`` is one ``randint`` per device per call of the
  graph, drawn from torch's generator (``torch.manual_seed`` makes a run repeatable; two calls
  draw different numbers); streams number the graph's draws.
- ``torch.ops.kiln.uniform`` is a torch op as well: where a draw runs in torch (its part fell back,
  or the node stayed out of kiln) torch computes the same Philox numbers with integer tensor ops.
- The numbers are not eager's (nor Inductor's). ``options={"random": "torch"}`` keeps torch's
  ``native_dropout`` and generator: eager's masks under the same seed, a kernel per dropout.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.fx

aten = torch.ops.aten

_MASK32 = 0xFFFFFFFF
# Philox4x32's multipliers and Weyl key increments (Salmon, Moraes, Dror and Shaw, SC'11).
_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
# Uniform numbers take only as many bits as the dtype's significand holds, so none rounds to 1.
_BITS = {torch.float32: 24, torch.float16: 11, torch.bfloat16: 8}


def philox_uniform(seed: torch.Tensor, shape: Sequence[int], stream: int, dtype: torch.dtype) -> torch.Tensor:
    """kiln's ``uniform`` numbers in torch: [0, 1) of ``dtype`` and ``shape`` (contiguous), the
    element at row-major position ``p`` from Philox4x32-10 of key ``seed`` (one integer, as
    u64) and counter ``(p, stream, 0)``. Words live in int64 tensors below 2^32; a product of
    two wraps past 2^63 and its high word is read back masked."""
    device = seed.device
    key = seed.reshape(()).to(torch.int64)
    n = 1
    for d in shape:
        n *= int(d)
    pos = torch.arange(n, dtype=torch.int64, device=device)
    c0, c1 = pos & _MASK32, (pos >> 32) & _MASK32
    c2 = torch.full_like(pos, int(stream))
    c3 = torch.zeros_like(pos)
    k0, k1 = key & _MASK32, (key >> 32) & _MASK32
    for _ in range(10):
        p0, p1 = c0 * _M0, c2 * _M1
        n0 = ((p1 >> 32) & _MASK32) ^ c1 ^ k0
        n2 = ((p0 >> 32) & _MASK32) ^ c3 ^ k1
        c1, c3, c0, c2 = p1 & _MASK32, p0 & _MASK32, n0, n2
        k0, k1 = (k0 + _W0) & _MASK32, (k1 + _W1) & _MASK32
    if dtype == torch.float64:
        u = ((c0 << 21) | (c1 >> 11)).to(torch.float64) * 2.0**-53
    else:
        bits = _BITS[dtype]
        u = ((c0 >> (32 - bits)).to(torch.float32) * 2.0**-bits).to(dtype)
    return u.reshape(tuple(int(d) for d in shape))


@torch.library.custom_op("kiln::uniform", mutates_args=())
def uniform(seed: torch.Tensor, like: torch.Tensor, stream: int, dtype: torch.dtype) -> torch.Tensor:
    """Random numbers in [0, 1) of ``like``'s shape and strides (its values are not read): kiln's
    ``uniform`` op, computed by torch where it runs outside kiln (see the module docstring)."""
    out = torch.empty_like(like, dtype=dtype)
    out.copy_(philox_uniform(seed, like.shape, stream, dtype))
    return out


@uniform.register_fake
def _uniform_fake(seed: torch.Tensor, like: torch.Tensor, stream: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty_like(like, dtype=dtype)


def dropout_decomposition() -> dict[Any, Any]:
    """``native_dropout`` as torch decomposes it (``rand_like(x) > p``, then a scaled select),
    for the backend's table when random numbers are drawn in kiln."""
    from torch._decomp import get_decompositions

    return get_decompositions([aten.native_dropout.default])


__all__ = ["dropout_decomposition", "philox_uniform", "uniform"]
