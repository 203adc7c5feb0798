"""One fresh process of the program-record tests (test_torch_records.py): compiles a small model
with the kiln backend, runs it once, and writes its outputs (and gradients) and kiln.torch's
counters to files. Arguments: MODE (infer | train | conv | helper), OUT_DIR, then KEY=VALUE
settings: batch, dtype, sealed (0, 1, raise), records (0 or 1), device (cpu, cuda), compile_mode
(torch.compile's mode, e.g. reduce-overhead), precompile (1: kiln.torch.compile's precompiled
models, test_torch_precompile.py), seed (the weights), eps (the LayerNorm's).
``helper`` is ``infer`` with a function from the module ``kiln_test_helper`` (found on
PYTHONPATH) applied to the output. The result holds the largest difference from eager.
tests/gpu/records_gpu.sh runs it on a GPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

import kiln
import kiln.torch as kt


class Block(torch.nn.Module):
    def __init__(self, width: int = 32, eps: float = 1e-5, helper: object = None) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width, eps=eps)
        self.helper = helper
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.down(torch.nn.functional.gelu(self.up(self.norm(x))))
        # A value of no input (as a transformer's attention mask): folded into a constant of
        # the compiled graph, which its record carries.
        bias = torch.triu(torch.full((x.shape[-1], x.shape[-1]), -0.5, dtype=x.dtype, device=x.device), 1).sum(0)
        y = torch.softmax((x + h) * self.scale + bias, dim=-1)
        return self.helper.shift(y) if self.helper is not None else y


class Conv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3))


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    opts = dict(a.split("=", 1) for a in sys.argv[3:])
    dtype = getattr(torch, opts.get("dtype", "float32"))
    batch = int(opts.get("batch", "4"))
    device = opts.get("device", "cpu")
    torch.manual_seed(int(opts.get("seed", "0")))
    if mode == "conv":
        model: torch.nn.Module = Conv().eval().to(dtype)
        x = torch.randn(batch, 3, 8, 8, dtype=dtype)
    else:
        helper = None
        if mode == "helper":
            import kiln_test_helper as helper  # type: ignore[import-not-found, no-redef]
        model = Block(eps=float(opts.get("eps", "1e-5")), helper=helper).to(dtype)
        x = torch.randn(batch, 16, 32, dtype=dtype)
    model, x = model.to(device), x.to(device)
    if opts.get("sealed", "0") != "0":
        kt.seal(raise_on_miss=opts["sealed"] == "raise")
    client = kiln.Client()
    if opts.get("precompile") == "1":
        fn = kt.compile(model, mode=opts.get("compile_mode"), options={"client": client, "precompile": True})
    else:
        fn = torch.compile(model, backend="kiln", mode=opts.get("compile_mode"),
                           options=None if opts.get("compile_mode") else
                           {"client": client, "records": opts.get("records", "1") == "1"})
    calls = 3 if opts.get("compile_mode") else 1  # a CUDA graph is captured after a warm-up call
    result: dict[str, object] = {}
    try:
        for _ in range(calls):
            if mode == "train":
                model.zero_grad(set_to_none=True)
                y = fn(x)
                (y * torch.arange(y.numel(), dtype=dtype, device=device).reshape(y.shape)).sum().backward()
                tensors = {"y": y.detach().clone(), **{f"grad.{k}": p.grad for k, p in model.named_parameters()}}
            else:
                with torch.no_grad():
                    tensors = {"y": fn(x).clone()}
        tensors = {k: v.cpu() for k, v in tensors.items()}
        torch.save(tensors, out / "tensors.pt")
        with torch.no_grad():
            result["max_err"] = float((model(x).cpu() - tensors["y"]).abs().max())
    except Exception as e:  # torch.compile wraps the backend's SealedError in its own error
        if "kiln.torch is sealed" not in str(e):
            raise
        result["sealed_error"] = str(e)
    result["stats"] = kt.stats()
    result["graphs"] = [{k: v for k, v in g.items() if not k.startswith("_")} for g in kt.last_graphs()]
    from kiln.torch.records import RECORD_EVENTS

    result["events"] = list(RECORD_EVENTS)
    (out / "result.json").write_text(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
