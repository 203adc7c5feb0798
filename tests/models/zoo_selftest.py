"""Models that test the sweep itself (``--list selftest``): each plants one failure the sweep
must report as what it is, and the sweep must go on after it.

- ``self/ok``: a small MLP kiln compiles whole: every mode ok.
- ``self/crash``: kiln's lowering of ReLU aborts the process: a crash, the worker replaced.
- ``self/hang``: kiln's lowering of ReLU sleeps: the model's time limit ends it.
- ``self/raise``: every kiln part raises when called: a crash with the exception, the worker
  going on.
- ``self/wrong``: kiln's GELU is the tanh approximation instead of erf (a relative error of
  about 1e-3 at most): a mismatch in f32 inference and training.
- ``self/refused``: kiln's lowering of ReLU emits an op kilnd does not know: the part falls back
  to torch, with kilnd's reason.

The plants are made in the worker process before a mode runs (``Spec.plant``) and never outlive
it: the sweep starts a fresh worker after every selftest model.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
from zoo import Spec


class Mlp(torch.nn.Module):
    """Linear, GELU, linear, ReLU, layer norm: a graph kiln compiles in parts around the mms."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(48, 96)
        self.fc2 = torch.nn.Linear(96, 48)
        self.norm = torch.nn.LayerNorm(48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        return self.norm(torch.relu(self.fc2(torch.nn.functional.gelu(self.fc1(x)))) + x)


def _relu_lowering(body: Any) -> Any:
    def plant(mode: str) -> None:
        import kiln.torch as kt

        kt.register_lowering(torch.ops.aten.relu.default)(body)

    return plant


def _abort(ctx: Any, x: Any) -> Any:
    os.abort()


def _sleep(ctx: Any, x: Any) -> Any:
    time.sleep(3600)


def _unknown_op(ctx: Any, x: Any) -> Any:
    v = ctx.value(x, ctx.out_dtype)
    return ctx.b.node("planted_no_such_op", [v], {}, v.dtype, v.shape)


def _raising_parts(mode: str) -> None:
    import kiln.torch as kt

    def call(self: Any, *args: Any) -> Any:
        raise RuntimeError("planted: a kiln part raised")

    kt.KilnPart.__call__ = call  # type: ignore[method-assign]


def _tanh_gelu(mode: str) -> None:
    import kiln.torch as kt

    def wrong(ctx: Any, x: Any, approximate: str = "none") -> Any:
        return ctx.b.gelu(ctx.value(x, ctx.out_dtype), approximate="tanh")

    kt.register_lowering(torch.ops.aten.gelu.default)(wrong)


def _spec(name: str, covers: str, **kw: Any) -> Spec:
    return Spec(f"self/{name}", "selftest", Mlp, side=4, covers=covers, **kw)


SELFTEST = [
    _spec("ok", "nothing planted"),
    _spec("crash", "kiln's ReLU lowering aborts the process", plant=_relu_lowering(_abort)),
    _spec("hang", "kiln's ReLU lowering sleeps an hour", plant=_relu_lowering(_sleep), time_limit=30),
    _spec("raise", "every kiln part raises", plant=_raising_parts),
    _spec("wrong", "kiln's GELU is the tanh approximation", plant=_tanh_gelu),
    _spec("refused", "kiln's ReLU emits an op kilnd lacks", plant=_relu_lowering(_unknown_op)),
]
