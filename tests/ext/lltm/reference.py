"""The LLTM cell in plain PyTorch (autograd for the backward), and the autograd Function that
runs it through a compiled extension's forward/backward: what the extension tests compare."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def lltm_reference(input: torch.Tensor, weights: torch.Tensor, bias: torch.Tensor,
                   old_h: torch.Tensor, old_cell: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.cat([old_h, input], dim=1)
    gates = F.linear(x, weights, bias)
    i, o, c = gates.chunk(3, dim=1)
    new_cell = old_cell + F.elu(c) * torch.sigmoid(i)
    new_h = torch.tanh(new_cell) * torch.sigmoid(o)
    return new_h, new_cell


def make_function(module: Any) -> Any:
    """A torch.autograd.Function over ``module.forward`` / ``module.backward``."""

    class LltmFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, input: torch.Tensor, weights: torch.Tensor, bias: torch.Tensor,
                    old_h: torch.Tensor, old_cell: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            new_h, new_cell, *saved = module.forward(input, weights, bias, old_h, old_cell)
            ctx.save_for_backward(new_cell, *saved, weights)
            return new_h, new_cell

        @staticmethod
        def backward(ctx: Any, grad_h: torch.Tensor, grad_cell: torch.Tensor) -> Any:
            d_old_h, d_input, d_weights, d_bias, d_old_cell = module.backward(
                grad_h.contiguous(), grad_cell.contiguous(), *ctx.saved_tensors)
            return d_input, d_weights, d_bias, d_old_h, d_old_cell

    return LltmFunction


def random_inputs(batch: int, features: int, state: int, device: str = "cpu", dtype: torch.dtype = torch.float64,
                  seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(batch, features), (3 * state, features + state), (3 * state,), (batch, state), (batch, state)]
    return [torch.randn(s, generator=g, dtype=dtype).to(device).requires_grad_() for s in shapes]
