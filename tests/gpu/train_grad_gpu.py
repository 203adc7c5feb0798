#!/usr/bin/env python3
"""Per-parameter gradients of one training step under kiln against float64 eager, for zoo models
and small blocks, with the layout pass on and off: where a gradient goes wrong on one device,
which parameters and which layout.

    tests/gpu/with_pack.sh PACK python3 tests/gpu/train_grad_gpu.py [--device cuda] [MODEL ...]
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "models"))

import kiln  # noqa: E402
import kiln.local  # noqa: E402
import zoo  # noqa: E402


class SplitBlock(torch.nn.Module):
    """conv -> batch norm -> split along channels -> per-branch conv, as res2net's blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(16, 112, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(112)
        self.convs = torch.nn.ModuleList(torch.nn.Conv2d(14, 14, 3, padding=1, bias=False) for _ in range(7))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        parts = torch.split(y, 14, 1)
        outs, sp = [], None
        for i, conv in enumerate(self.convs):
            sp = parts[i] if sp is None else sp + parts[i]
            sp = conv(sp)
            outs.append(sp)
        outs.append(parts[-1])
        return torch.cat(outs, 1)


class PoolBlock(torch.nn.Module):
    """conv -> batch norm -> relu -> max pool, as inception's stem."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(16, 192, 3, bias=False)
        self.bn = torch.nn.BatchNorm2d(192)

    def forward(self, x):
        return torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 3, 2)


BLOCKS = {"block/split": (SplitBlock, (2, 16, 16, 16)), "block/pool": (PoolBlock, (2, 16, 20, 20))}


def build(name: str):
    if name in BLOCKS:
        make, shape = BLOCKS[name]
        torch.manual_seed(0)
        return make(), [torch.randn(shape)], {}
    spec = zoo.all_specs()[name]
    args, kwargs = zoo.inputs(spec, seed=1, batch=spec.train_batch)
    return zoo.build(spec), list(args), dict(kwargs)


def step(model, fn, args, kwargs, weights=None):
    outs = zoo.tensors(fn(*args, **kwargs))
    if weights is None:
        gen = torch.Generator().manual_seed(3)
        weights = [torch.randn(o.shape, generator=gen, dtype=torch.float64) for o in outs]
    loss = sum((o * w.to(o.device, o.dtype)).sum() for o, w in zip(outs, weights))
    loss.backward()
    grads = {k: p.grad.detach().double().cpu() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads, weights


def rel(a, b):
    return float((a - b).norm() / max(float(b.norm()), 1e-30))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layouts", default="channels_last,keep,eager-channels-last")
    ap.add_argument("--dynamic", action="store_true", help="compile with dynamic=True (symbolic sizes)")
    ap.add_argument("models", nargs="*", default=["block/split", "block/pool"])
    opts = ap.parse_args()
    dev = opts.device
    # Full float32, as the sweep checks: TF32 would blur every comparison below.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    work = Path(tempfile.mkdtemp())
    daemon = kiln.local.LocalDaemon(kiln.local.find_kilnd(), work / "kilnd")
    client = kiln.Client(daemon.address)
    bad = 0
    for name in opts.models:
        model, args, kwargs = build(name)
        model = model.to(dev).train()
        args = [a.to(dev) for a in args]
        kwargs = {k: v.to(dev) for k, v in kwargs.items()}
        state = copy.deepcopy(model.state_dict())
        m64 = copy.deepcopy(model).double()
        a64 = [a.double() if a.is_floating_point() else a for a in args]
        k64 = {k: v.double() if v.is_floating_point() else v for k, v in kwargs.items()}
        eager, weights = step(model, model, args, kwargs)
        model.load_state_dict(state)
        exact, _ = step(m64, m64, a64, k64, weights)
        for layout in opts.layouts.split(","):
            torch._dynamo.reset()
            if layout == "eager-channels-last":  # torch itself on channels-last tensors
                cl = copy.deepcopy(model).to(memory_format=torch.channels_last)
                cl_args = [a.to(memory_format=torch.channels_last) if a.dim() == 4 else a for a in args]
                got, _ = step(cl, cl, cl_args, kwargs, weights)
            else:
                fn = torch.compile(model, backend="kiln", options={"client": client, "layout": layout},
                                   dynamic=True if opts.dynamic else None)
                got, _ = step(model, fn, args, kwargs, weights)
            model.load_state_dict(state)
            diff = sum(float(((got[k] - exact[k]) ** 2).sum()) for k in exact if k in got) ** 0.5
            ediff = sum(float(((eager[k] - exact[k]) ** 2).sum()) for k in exact) ** 0.5
            norm = max(sum(float((exact[k] ** 2).sum()) for k in exact) ** 0.5, 1e-30)
            print(f"    all gradients: kiln {diff / norm:.2e} eager {ediff / norm:.2e}", flush=True)
            rows = sorted(((rel(got[k], exact[k]), rel(eager[k], exact[k]), k) for k in exact if k in got),
                          reverse=True)
            worst = rows[0] if rows else (0.0, 0.0, "")
            flag = "BAD " if worst[0] > 20 * max(worst[1], 1e-6) else "ok  "
            bad += flag == "BAD "
            print(f"{flag}{name} layout={layout}: worst {worst[2]} kiln {worst[0]:.2e} eager {worst[1]:.2e}", flush=True)
            for r in rows[:4]:
                print(f"      {r[2]}: kiln {r[0]:.2e} eager {r[1]:.2e}", flush=True)
    daemon.stop()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
