#!/usr/bin/env python3
"""The matrix products and attention calls a compiled BERT-base training step makes, per
backend (Inductor and kiln), with shapes, strides, storage offsets, dtypes and 256-byte
alignment of each operand, and the GPU time of the step's GEMM and attention kernels by name
(torch profiler): where kiln's step gets a slower GEMM kernel than Inductor's, this shows
whether the call itself differs (layouts kiln hands to torch) or only the kernel chosen.

    tests/gpu/with_pack.sh PACK python3 tests/bench/gpu/matmul_calls.py [--batch 16 --seq 128]
        [--infer] [--no-mask] [--warm 128,96,64,200]

``--infer``: an inference step (no_grad) instead of a training step; ``--no-mask``: no attention
mask passed; ``--warm``: lengths each compiled model sees first (two or more make the sequence
length symbolic, as a server of variable-length batches meets it); ``--shared``: both backends
compile one model, eager running it first at each length (as ``bert_lengths_gpu.py`` does).

Writes $OUT/matmul_calls.md when $OUT is set. Needs transformers.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "gpu"))  # tests/gpu
from gpu_common import private_kilnd  # noqa: E402


def operand(a: Any) -> str:
    if not isinstance(a, torch.Tensor):
        return repr(a)
    return (f"{str(a.dtype).replace('torch.', '')}{list(a.shape)} s{list(a.stride())} o{a.storage_offset()}"
            f"{'' if a.data_ptr() % 256 == 0 else ' unaligned'}")


class Calls(TorchDispatchMode):
    """Logs matmul-like and attention ATen calls."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = str(func)
        if "mm" in name or "attention" in name or "linear" in name or "matmul" in name:
            self.rows.append(f"{name}({', '.join(operand(a) for a in args)})")
        return func(*args, **(kwargs or {}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--infer", action="store_true")
    ap.add_argument("--no-mask", action="store_true")
    ap.add_argument("--warm", default="")
    ap.add_argument("--shared", action="store_true")
    opts = ap.parse_args()
    import kiln.torch
    from transformers import BertConfig, BertModel

    daemon, _ = private_kilnd("matmul_calls.py", "kiln-mm-")
    lines = [f"# Matrix products of a BERT-base {'inference' if opts.infer else 'training'} step on "
             f"{torch.cuda.get_device_name()}, batch {opts.batch}, sequence {opts.seq}"
             f"{', no mask' if opts.no_mask else ''}{', after lengths ' + opts.warm if opts.warm else ''}", ""]
    logged: dict[str, list[str]] = {}
    shared = BertModel(BertConfig()).cuda().train(not opts.infer) if opts.shared else None
    try:
        for be in ("inductor", "kiln"):
            if shared is None:
                torch._dynamo.reset()
            torch.manual_seed(0)
            model = shared if shared is not None else BertModel(BertConfig()).cuda().train(not opts.infer)
            weight = torch.randn(opts.batch, opts.seq, 768, device="cuda")
            cm = torch.compile(model, backend=be)

            def call(n: int) -> Any:
                ids = torch.randint(0, 30522, (opts.batch, n), device="cuda")
                mask = {} if opts.no_mask else {"attention_mask": torch.ones_like(ids)}
                if shared is not None:
                    with torch.no_grad():
                        model(input_ids=ids, **mask)
                return cm(input_ids=ids, **mask).last_hidden_state

            def step() -> None:
                if opts.infer:
                    with torch.no_grad():
                        call(opts.seq)
                else:
                    (call(opts.seq) * weight).sum().backward()

            for n in (int(v) for v in opts.warm.split(",") if v):
                with torch.no_grad():
                    call(n)

            for _ in range(3):
                step()
            kiln.torch.wait()
            step()
            torch.cuda.synchronize()
            log = Calls()
            with log:
                step()
            torch.cuda.synchronize()
            logged[be] = log.rows
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                step()
                torch.cuda.synchronize()
            kernels: collections.Counter[str] = collections.Counter()
            counts: collections.Counter[str] = collections.Counter()
            for ev in prof.key_averages():
                n = ev.key
                if any(k in n.lower() for k in ("gemm", "sgemm", "cutlass", "xmma", "attention", "fmha", "flash")):
                    kernels[n] += ev.device_time_total / 1e3
                    counts[n] += ev.count
            lines += [f"## {be}: {len(log.rows)} calls", "", "| calls | call |", "| ---: | --- |"]
            for call, n in collections.Counter(log.rows).most_common():
                lines.append(f"| {n} | `{call}` |")
            lines += ["", "| GPU ms | launches | kernel |", "| ---: | ---: | --- |"]
            for k, ms in kernels.most_common():
                lines.append(f"| {ms:.3f} | {counts[k]} | `{k[:160]}` |")
            lines.append("")
            print("\n".join(lines[-(len(kernels) + 3):]), flush=True)
        only_k = collections.Counter(logged["kiln"]) - collections.Counter(logged["inductor"])
        only_i = collections.Counter(logged["inductor"]) - collections.Counter(logged["kiln"])
        lines += ["## Calls kiln's step makes and Inductor's does not", ""]
        lines += [f"- {n}x `{c}`" for c, n in only_k.most_common()] or ["(none)"]
        lines += ["", "## Calls Inductor's step makes and kiln's does not", ""]
        lines += [f"- {n}x `{c}`" for c, n in only_i.most_common()] or ["(none)"]
    finally:
        daemon.stop()
        text = "\n".join(lines)
        print(text)
        if os.environ.get("OUT"):
            (Path(os.environ["OUT"]) / "matmul_calls.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
