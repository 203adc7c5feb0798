"""Replaying models into kilnd: what ``kiln prewarm --model MODULE:FUNCTION`` runs.

A CI job that will serve a model warms the cluster for it by running the model once through
:func:`kiln.torch.compile` with ``precompile`` on: kilnd then holds the model's precompiled
record, its graphs' program records and every part's kernel, and a fresh process anywhere in
the cluster runs the model's compiled code without tracing it (:mod:`.precompile`).

``FUNCTION`` (imported from ``MODULE``, called without arguments) returns one example or a
list of them. An example is a ``(model, args)`` or ``(model, args, kwargs)`` tuple, or a dict:

- ``model``: the ``nn.Module`` (on the device it will be served on);
- ``args`` / ``kwargs``: the call's arguments, at the shapes and dtypes production calls with;
- ``train``: also run a backward pass through the outputs (a training step's graphs); the
  model's own ``training`` flag is left as the factory set it;
- ``grad``: whether the call runs with gradients enabled (default: ``train``; inference is
  replayed under ``torch.no_grad()``, as it is usually served);
- ``options`` / ``mode``: what production passes to :func:`kiln.torch.compile`
  (``precompile`` is added); they are part of the precompiled record's key, as are the torch
  thread count, grad mode and device, so prewarm where and as production runs.

Each example is reported as one JSON line on stdout: whether kilnd already held it (``hit``),
it was compiled and stored now (``stored``), or it runs through torch.compile instead
(``fallback``, with the reason), with its parts, how many of them kilnd compiled now
(``compiled``; the others it held already) and the seconds taken. Exit
status 1 if any example failed or fell back, 2 for a factory that cannot be imported or
returns nothing usable.

    python3 -m kiln.torch.prewarm [--server ADDR] MODULE:FUNCTION [...]
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

import torch

from ..client import Client
from . import counters
from .first_call import compile as kiln_compile


@dataclass
class Example:
    """One call of a model to replay (module docstring)."""

    model: torch.nn.Module
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    train: bool = False
    grad: Optional[bool] = None  # None: as train
    options: dict[str, Any] = field(default_factory=dict)
    mode: Optional[str] = None


def examples_of(value: Any) -> list[Example]:
    """A factory's result as examples; ValueError naming what is wrong with it."""
    if isinstance(value, (Example, dict)) or (isinstance(value, tuple) and value
                                              and isinstance(value[0], torch.nn.Module)):
        value = [value]
    if not isinstance(value, Iterable):
        raise ValueError(f"expected an example or a list of them, got {type(value).__name__}")
    out = []
    for i, v in enumerate(value):
        if isinstance(v, Example):
            ex = v
        elif isinstance(v, dict):
            unknown = sorted(set(v) - {"model", "args", "kwargs", "train", "grad", "options", "mode"})
            if unknown or "model" not in v:
                raise ValueError(f"example {i}: keys {unknown} unknown" if unknown else f"example {i}: no 'model'")
            ex = Example(v["model"], tuple(v.get("args", ())), dict(v.get("kwargs") or {}), bool(v.get("train")),
                         v.get("grad"), dict(v.get("options") or {}), v.get("mode"))
        elif isinstance(v, tuple) and len(v) in (2, 3):
            ex = Example(v[0], tuple(v[1]), dict(v[2]) if len(v) == 3 else {})
        else:
            raise ValueError(f"example {i}: expected (model, args[, kwargs]) or a dict, got {type(v).__name__}")
        if not isinstance(ex.model, torch.nn.Module):
            raise ValueError(f"example {i}: the model is a {type(ex.model).__name__}, not an nn.Module")
        out.append(ex)
    if not out:
        raise ValueError("the factory returned no examples")
    return out


def load_factory(spec: str) -> Any:
    """``MODULE:FUNCTION`` imported (ValueError for a malformed spec)."""
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"{spec!r}: expected MODULE:FUNCTION")
    fn: Any = importlib.import_module(module)
    for part in name.split("."):
        fn = getattr(fn, part)
    return fn


def _float_outputs(out: Any) -> list[torch.Tensor]:
    leaves = torch.utils._pytree.tree_leaves(out if not hasattr(out, "to_tuple") else out.to_tuple())
    return [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()]


def replay(ex: Example, client: Client) -> dict[str, Any]:
    """Runs one example through a precompiled model: kilnd holds it afterwards. What happened,
    as the JSON line the module docstring describes."""
    counters.reset_stats()
    options = {**ex.options, "precompile": True, "client": client}
    t0 = time.perf_counter()
    compiled = kiln_compile(ex.model, mode=ex.mode, options=options)
    with torch.set_grad_enabled(ex.train if ex.grad is None else ex.grad):
        out = compiled(*ex.args, **ex.kwargs)
    if ex.train:
        grads = _float_outputs(out)
        if not grads:
            raise ValueError("train is set but no output requires grad")
        sum(g.float().sum() for g in grads).backward()
    if any(isinstance(t, torch.Tensor) and t.is_cuda for t in torch.utils._pytree.tree_leaves((ex.args, ex.kwargs))):
        torch.cuda.synchronize()
    s = counters.snapshot()
    reason = getattr(compiled, "fallback_reason", None)
    outcome = ("fallback" if reason else "hit" if s["precompile_hits"]
               else "stored" if s["precompiles_stored"] else "not stored")
    # ``compiled`` counts every part made runnable; of those, kilnd already held ``cache_hits``
    # (looked up) or all of them (a precompiled hit adopts its parts without a lookup).
    new = 0 if s["precompile_hits"] else s["compiled"] - s["cache_hits"]
    return {"model": type(ex.model).__name__, "outcome": outcome, "reason": reason,
            "parts": s["parts"], "compiled": new, "failed": s["failed"],
            "seconds": round(time.perf_counter() - t0, 3)}


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m kiln.torch.prewarm", description=__doc__.split("\n\n")[0])
    ap.add_argument("specs", nargs="+", metavar="MODULE:FUNCTION")
    ap.add_argument("--server", default=None, help="daemon address (default: $KILN_SERVER, else localhost:50051)")
    opts = ap.parse_args(argv)
    client = Client(opts.server)  # TLS, token and trusted keys from the environment, as any client's
    status = 0
    for spec in opts.specs:
        try:
            examples = examples_of(load_factory(spec)())
        except Exception as e:  # the factory is user code: report it, go on with the next spec
            print(json.dumps({"spec": spec, "outcome": "error", "reason": f"{type(e).__name__}: {e}"}), flush=True)
            status = max(status, 2)
            continue
        for i, ex in enumerate(examples):
            try:
                row = replay(ex, client)
            except Exception as e:
                traceback.print_exc(file=sys.stderr)
                row = {"model": type(ex.model).__name__, "outcome": "error", "reason": f"{type(e).__name__}: {e}"}
            print(json.dumps({"spec": spec, "example": i, **row}), flush=True)
            if row["outcome"] not in ("hit", "stored") or row.get("failed"):
                status = max(status, 1)
    return status


if __name__ == "__main__":
    sys.exit(main())
