"""Reference workloads for the kiln backend, written in plain torch.

The tests and the GPU benchmark compile these with ``backend="kiln"`` and compare against
eager and Inductor: ``sin(x)**2 + cos(x)**2`` (forward and backward: the gradient is zero; a
benchmark only, since it cannot tell sin from cos) and ``sin_cos_mix`` for checks, the
LLTM cell, a transformer encoder block (attention through matmul and softmax, layer_norm,
gelu) and a k-means assignment step. Each ``make_*`` function returns the arguments for its
workload at a given size, on a given device, from a seeded generator.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.nn.functional as F


def sin2_cos2(x: torch.Tensor) -> torch.Tensor:
    """Equals 1 everywhere; its gradient is 0."""
    return torch.sin(x) ** 2 + torch.cos(x) ** 2


def sin_cos_mix(x: torch.Tensor) -> torch.Tensor:
    """x*sin(x) + cos(x)**2 - sin(x): the sin/cos workload for checks. Unlike ``sin2_cos2`` its
    value and gradient depend on x through every op, so swapped functions or a sign error in a
    derivative show."""
    return x * torch.sin(x) + torch.cos(x) ** 2 - torch.sin(x)


def lltm_cell(x: torch.Tensor, weights: torch.Tensor, bias: torch.Tensor, old_h: torch.Tensor,
              old_cell: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The LLTM cell of PyTorch's custom-extension tutorial: returns (new_h, new_cell)."""
    X = torch.cat([old_h, x], dim=1)
    gate_weights = F.linear(X, weights, bias)
    gates = gate_weights.chunk(3, dim=1)
    input_gate = torch.sigmoid(gates[0])
    output_gate = torch.sigmoid(gates[1])
    candidate_cell = F.elu(gates[2])
    new_cell = old_cell + candidate_cell * input_gate
    new_h = torch.tanh(new_cell) * output_gate
    return new_h, new_cell


def make_lltm(batch: int = 16, features: int = 32, state: int = 64, *, device: Any = "cpu",
              dtype: torch.dtype = torch.float32, requires_grad: bool = True, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    stdv = 1.0 / math.sqrt(state)

    def rnd(*shape: int, scale: float = 1.0) -> torch.Tensor:
        t = (torch.rand(*shape, generator=g, dtype=torch.float64) * 2 - 1) * scale
        return t.to(device=device, dtype=dtype).requires_grad_(requires_grad)

    return [rnd(batch, features), rnd(3 * state, features + state, scale=stdv), rnd(3 * state, scale=stdv),
            rnd(batch, state), rnd(batch, state)]


def encoder_block(x: torch.Tensor, wqkv: torch.Tensor, wo: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor,
                  w2: torch.Tensor, b2: torch.Tensor, g1: torch.Tensor, be1: torch.Tensor, g2: torch.Tensor,
                  be2: torch.Tensor, heads: int = 4) -> torch.Tensor:
    """A pre-norm transformer encoder block: multi-head self-attention (matmul, scaled softmax)
    and a gelu MLP, each behind a layer_norm and a residual connection."""
    B, T, C = x.shape
    hd = C // heads
    h = F.layer_norm(x, (C,), g1, be1)
    q, k, v = (h @ wqkv).split(C, dim=-1)
    q = q.view(B, T, heads, hd).transpose(1, 2)
    k = k.view(B, T, heads, hd).transpose(1, 2)
    v = v.view(B, T, heads, hd).transpose(1, 2)
    att = torch.softmax((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd)), dim=-1)
    o = (att @ v).transpose(1, 2).reshape(B, T, C)
    x = x + o @ wo
    h = F.layer_norm(x, (C,), g2, be2)
    return x + F.linear(F.gelu(F.linear(h, w1, b1)), w2, b2)


def make_encoder(batch: int = 2, seq: int = 16, dim: int = 32, *, device: Any = "cpu",
                 dtype: torch.dtype = torch.float32, requires_grad: bool = True, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int, scale: float = 1.0, offset: float = 0.0) -> torch.Tensor:
        t = torch.randn(*shape, generator=g, dtype=torch.float64) * scale + offset
        return t.to(device=device, dtype=dtype).requires_grad_(requires_grad)

    s = 1.0 / math.sqrt(dim)
    return [
        rnd(batch, seq, dim),
        rnd(dim, 3 * dim, scale=s), rnd(dim, dim, scale=s),
        rnd(4 * dim, dim, scale=s), rnd(4 * dim, scale=0.1),
        rnd(dim, 4 * dim, scale=0.5 * s), rnd(dim, scale=0.1),
        rnd(dim, scale=0.1, offset=1.0), rnd(dim, scale=0.1),
        rnd(dim, scale=0.1, offset=1.0), rnd(dim, scale=0.1),
    ]


def kmeans_step(X: torch.Tensor, means: torch.Tensor) -> torch.Tensor:
    """The index of the nearest mean for each point (the assignment step of k-means)."""
    return torch.argmin(torch.linalg.norm(X - means[:, None], dim=2), dim=0)


def make_kmeans(points: int = 20000, k: int = 8, dims: int = 2, *, device: Any = "cpu",
                dtype: torch.dtype = torch.float32, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(points, dims, generator=g, dtype=torch.float64)
    means = torch.randn(k, dims, generator=g, dtype=torch.float64) * 2
    return [X.to(device=device, dtype=dtype), means.to(device=device, dtype=dtype)]


def kmeans_labels_agree(labels: torch.Tensor, X: torch.Tensor, means: torch.Tensor,
                        reference: torch.Tensor, rtol: float = 1e-5) -> bool:
    """Whether two label vectors agree, counting a disagreement as fine where both means are
    equally near (within ``rtol``): rounding may break such ties either way."""
    if labels.shape != reference.shape:
        return False
    diff = labels != reference
    if not bool(diff.any()):
        return True
    Xd = X[diff].double()
    d_got = (Xd - means.double()[labels[diff]]).norm(dim=1)
    d_ref = (Xd - means.double()[reference[diff]]).norm(dim=1)
    return bool(torch.allclose(d_got, d_ref, rtol=rtol, atol=1e-6))


def make_sin(n: int = 4096, *, device: Any = "cpu", dtype: torch.dtype = torch.float32,
             requires_grad: bool = True, seed: int = 0, generator: Optional[torch.Generator] = None) -> list[torch.Tensor]:
    g = generator or torch.Generator().manual_seed(seed)
    return [(torch.randn(n, generator=g, dtype=torch.float64) * 3).to(device=device, dtype=dtype).requires_grad_(requires_grad)]


__all__ = [
    "encoder_block",
    "kmeans_labels_agree",
    "kmeans_step",
    "lltm_cell",
    "make_encoder",
    "make_kmeans",
    "make_lltm",
    "make_sin",
    "sin2_cos2",
    "sin_cos_mix",
]
