"""Models the ``kiln prewarm --model`` tests replay (test_prewarm.py): ``examples`` is the
factory the command imports; ``serve`` is what a production process of the cluster runs
afterwards (imported from this module, as the factory's models are, so both key the same
class), printing kiln.torch's counters and its largest difference from eager as JSON."""

from __future__ import annotations

import json
import sys

import torch

import kiln.torch as kt

BATCH = 29  # this file's own: no other test's records serve these graphs


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(24)
        self.up = torch.nn.Linear(24, 48)
        self.down = torch.nn.Linear(48, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.down(torch.nn.functional.gelu(self.up(self.norm(x))))) + x


def _model(train: bool) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return Mlp().train(train), torch.randn(BATCH, 24)


def examples() -> list[dict[str, object]]:
    """Inference (a tuple) and a training step (a dict with ``train``)."""
    model, x = _model(False)
    train_model, tx = _model(True)
    return [(model, (x,)), {"model": train_model, "args": (tx,), "train": True}]  # type: ignore[list-item]


def broken() -> object:
    raise RuntimeError("this factory fails on purpose")


def serve(kind: str) -> None:
    """One production process: the model compiled with precompile, one call (and a backward
    pass for ``train``)."""
    model, x = _model(kind == "train")
    fn = kt.compile(model, options={"precompile": True})
    if kind == "train":
        y = fn(x)
        y.float().sum().backward()
        want = model(x)
    else:
        with torch.no_grad():
            y = fn(x)
            want = model(x)
    print(json.dumps({"stats": kt.stats(), "max_err": float((y - want).abs().max())}))


if __name__ == "__main__":
    serve(sys.argv[1])
