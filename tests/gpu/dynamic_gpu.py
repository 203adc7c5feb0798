#!/usr/bin/env python3
"""Dynamic shapes on an NVIDIA GPU: kernels compiled once for symbolic sizes, against the same
graphs compiled per shape and against PyTorch; then BERT-base under ``torch.compile`` at several
sequence lengths.

Part 1, kernels (``kiln.jit`` on torch CUDA tensors, f32): row softmax (rows and row length
symbolic), layer_norm over 4096 (rows symbolic), a tanh-GELU (rows symbolic), column sums (rows
symbolic) and a whole-tensor sum. Each is compiled once with symbolic sizes and checked against
torch at several sizes (1, primes, sizes no vector width divides, the benchmark size); then the
dynamic and the static kernel are timed at the benchmark size, side by side: 20 calls captured
in a CUDA graph, replayed, CUDA events, median of the replays (kernel time, no host overhead).

Part 2, BERT-base (Hugging Face ``BertModel(BertConfig())``, random weights, batch 16,
inference under ``no_grad``) with ``backend="kiln"`` and with Inductor, at sequence lengths
128, 96, 64, 200 in that order (torch's automatic dynamic shapes: the second length makes the
sequence dimension symbolic). Per length: first call (s), steady-state median (ms, CUDA events),
kiln parts compiled by the daemon, kiln part calls that ran in torch, largest difference from
eager.

Starts its own kilnd from ``$KILND``; prints tables, writes ``$OUT/dynamic_gpu.md`` when
``$OUT`` is set. Exits 1 when a result does not match torch.

    KILND=build/server/kilnd PYTHONPATH=client/python python3 tests/gpu/dynamic_gpu.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kiln  # noqa: E402
import kiln.local  # noqa: E402
from torch_backend_gpu import median_ms  # noqa: E402

failures: list[str] = []


# ---------------------------------------------------------------------------------- kernels

def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def layer_norm(x):
    m = x.mean(axis=-1, keepdims=True)
    d = x - m
    v = (d * d).mean(axis=-1, keepdims=True)
    return d / np.sqrt(v + 1e-5)


def gelu(x):
    return 0.5 * x * (1.0 + np.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))


def column_sum(x):
    return x.sum(axis=0)


def total(x):
    return x.sum()


def torch_ref(name: str, x: torch.Tensor) -> torch.Tensor:
    if name == "softmax":
        return torch.softmax(x, -1)
    if name == "layer_norm":
        return torch.nn.functional.layer_norm(x, x.shape[-1:], eps=1e-5)
    if name == "gelu":
        return torch.nn.functional.gelu(x, approximate="tanh")
    if name == "column_sum":
        return x.sum(0)
    return x.sum()


# name: (function, symbolic axes, sizes checked, benchmark size)
KERNELS: dict[str, tuple[Callable[..., Any], tuple[int, ...], list[tuple[int, int]], tuple[int, int]]] = {
    "softmax": (softmax, (0, 1), [(1, 1), (7, 13), (2048, 97), (16 * 12 * 128, 128), (16 * 12 * 200, 200)], (16 * 12 * 128, 128)),
    "layer_norm": (layer_norm, (0,), [(1, 4096), (13, 4096), (1031, 4096)], (32768, 4096)),
    "gelu": (gelu, (0,), [(1, 4096), (13, 4096), (1031, 4096)], (32768, 4096)),
    "column_sum": (column_sum, (0,), [(1, 1024), (13, 1024), (1031, 1024)], (32768, 1024)),
    "total": (total, (0, 1), [(1, 1), (13, 7), (1031, 999)], (32768, 4096)),
}


def graph_ms(fn: Callable[[torch.Tensor], Any], x: torch.Tensor, calls: int = 20, replays: int = 7) -> float:
    """Kernel time per call: `calls` calls captured in one CUDA graph, replayed."""
    for _ in range(2):
        fn(x)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(x)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn(x)
    times = []
    for _ in range(replays + 1):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / calls)
    return statistics.median(times[1:])


def run_kernels(client: Any, quick: bool) -> list[list[Any]]:
    rows = []
    for name, (fn, axes, sizes, bench) in KERNELS.items():
        try:
            dyn = kiln.jit(fn, target="cuda", client=client, dynamic_dims={"x": axes})
            static = kiln.jit(fn, target="cuda", client=client, dynamic=False)
            worst = 0.0
            for shape in [bench] + sizes:  # the first call's sizes are the symbols' examples: not 1
                x = torch.randn(shape, device="cuda")
                got = dyn(x)
                ref = torch_ref(name, x.double())
                err = float((got.double() - ref).abs().max()) if ref.numel() else 0.0
                scale = float(ref.abs().max()) if ref.numel() else 1.0
                rel = err / max(scale, 1.0)
                worst = max(worst, rel)
                if rel > 1e-4:
                    failures.append(f"{name} at {shape}: relative error {rel:.2e}")
            compiles = dyn.compile_count
            x = torch.randn(bench, device="cuda")
            plan = dyn.compiled_for(x).plan
            symbolic = [s.name for s in plan.symbols]
            t_dyn = graph_ms(dyn, x)
            t_static = graph_ms(static, x)
            t_torch = graph_ms(lambda a: torch_ref(name, a), x)
            rows.append([name, f"{bench[0]}x{bench[1]}", ",".join(symbolic) or "-", compiles, len(sizes) + 1,
                         f"{worst:.1e}", f"{t_static * 1000:.1f}", f"{t_dyn * 1000:.1f}", f"{t_dyn / t_static:.3f}",
                         f"{t_torch * 1000:.1f}"])
            print(rows[-1], flush=True)
        except Exception as e:
            failures.append(f"{name}: {type(e).__name__}: {e}")
            traceback.print_exc()
    return rows


# ---------------------------------------------------------------------------------- BERT

def run_bert(backend: str, lengths: list[int], iters: int) -> list[list[Any]]:
    from transformers import BertConfig, BertModel

    import kiln.torch as ktorch

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = BertModel(BertConfig()).cuda().eval()
    fn = torch.compile(model, backend=backend)
    rows = []
    for T in lengths:
        ids = [torch.randint(0, 30522, (16, T), device="cuda") for _ in range(3)]
        mask = torch.ones(16, T, dtype=torch.long, device="cuda")
        before = ktorch.stats() if backend == "kiln" else {}
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = fn(input_ids=ids[0], attention_mask=mask).last_hidden_state
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        with torch.no_grad():
            ref = model(input_ids=ids[0], attention_mask=mask).last_hidden_state
        err = float((out - ref).abs().max())
        if err > 2e-3:
            failures.append(f"BERT {backend} T={T}: max difference from eager {err:.2e}")
        mid = ktorch.stats() if backend == "kiln" else {}

        def step(i: int) -> Any:
            with torch.no_grad():
                return fn(input_ids=ids[i % 3], attention_mask=mask).last_hidden_state

        ms = median_ms(step, iters, 3)
        after = ktorch.stats() if backend == "kiln" else {}
        row = [backend, T, f"{first:.2f}", f"{ms:.2f}", f"{err:.1e}"]
        if backend == "kiln":
            new = (mid["compiled"] - before["compiled"]) - (mid["cache_hits"] - before["cache_hits"]) - \
                  (mid["memo_hits"] - before["memo_hits"])
            row += [mid["parts"] - before["parts"], new, after["eager_calls"] - mid["eager_calls"],
                    after["failed"] - before["failed"], after["torch_nodes"], after["kiln_nodes"]]
            if after["eager_calls"] - mid["eager_calls"] or after["failed"] - before["failed"]:
                failures.append(f"BERT kiln T={T}: parts ran in torch")
        rows.append(row)
        print(row, flush=True)
    return rows


def table(headers: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip-bert", action="store_true")
    opts = ap.parse_args()
    binary = os.environ.get("KILND")
    if not binary or not Path(binary).is_file():
        print("dynamic_gpu: set KILND to a built kilnd binary", file=sys.stderr)
        return 2
    md = [f"# Dynamic shapes on {torch.cuda.get_device_name()} (torch {torch.__version__})\n"]
    with tempfile.TemporaryDirectory(prefix="kiln-dynamic-gpu-") as tmp:
        daemon = kiln.local.LocalDaemon(binary, Path(tmp), timeout=30)
        try:
            os.environ["KILN_SERVER"] = daemon.address
            with kiln.Client(daemon.address, cache_dir=Path(tmp) / "client-cache") as client:
                rows = run_kernels(client, opts.quick)
            md.append("## Symbolic vs static CUDA kernels (kernel time per call, CUDA graph of 20 calls)\n")
            md.append(table(["kernel", "bench size", "symbols", "compiles", "sizes checked", "max rel err",
                             "static us", "dynamic us", "dyn/static", "torch us"], rows))
            if not opts.skip_bert:
                lengths = [128, 96, 64, 200]
                iters = 10 if opts.quick else 30
                brows = []
                for backend in ("kiln", "inductor"):
                    try:
                        brows += run_bert(backend, lengths, iters)
                    except Exception as e:
                        failures.append(f"BERT {backend}: {type(e).__name__}: {e}")
                        traceback.print_exc()
                md.append("\n## BERT-base, batch 16, inference, sequence length changing (torch automatic dynamic)\n")
                md.append(table(["backend", "T", "first call s", "steady ms", "max diff vs eager", "parts",
                                 "new kiln compiles", "part calls in torch", "failed parts", "torch nodes",
                                 "kiln nodes"], brows))
        finally:
            daemon.stop()
            if failures:
                print("--- kilnd log (tail) ---\n" + daemon.log()[-3000:], flush=True)
    md.append("\n" + ("FAILURES:\n" + "\n".join(failures) if failures else "all results match torch"))
    text = "\n".join(md) + "\n"
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "dynamic_gpu.md").write_text(text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
