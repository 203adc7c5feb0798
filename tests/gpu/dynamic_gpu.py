#!/usr/bin/env python3
"""Dynamic shapes on an NVIDIA GPU: kernels compiled once for symbolic sizes, against the same
graphs compiled per shape and against PyTorch; then BERT-base under ``torch.compile`` at several
sequence lengths.

Part 1, kernels (``kiln.jit`` on torch CUDA tensors, f32): the memory-bound workloads of the
kernel table in BENCHMARKS.md, "GPU kernels" (sin²+cos² and x+y over a symbolic length, the
k-means assignment over a symbolic point count, row softmax and layer_norm→gelu over symbolic
rows, the LLTM cell tail over a symbolic batch), then row softmax with the row length symbolic
too (long and short rows), column sums (rows symbolic) and a whole-tensor sum (both symbolic).
Each is compiled once with symbolic sizes and checked against torch at several sizes (1,
primes, sizes no vector width divides, the benchmark size); then the dynamic and the static
kernel are timed at the benchmark size, side by side: 20 calls captured in a CUDA graph,
replayed, CUDA events, median of the replays (kernel time, no host overhead).

Part 2, BERT-base (Hugging Face ``BertModel(BertConfig())``, random weights, batch 16,
inference under ``no_grad``) with ``backend="kiln"`` and with Inductor, at sequence lengths
128, 96, 64, 200 in that order (torch's automatic dynamic shapes: the second length makes the
sequence dimension symbolic). Per length: first call (s), steady-state median (ms, CUDA events;
eager, Inductor and kiln timed in interleaved rounds), kiln parts compiled by the daemon, kiln
part calls that ran in torch, largest difference from eager.

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
from gpu_common import interleaved_ms, kilnd_binary  # noqa: E402

failures: list[str] = []
VARIANTS = False  # --variants: also time each tuning variant of the symbolic-length kernels


# ---------------------------------------------------------------------------------- kernels

def sin2cos2(x):
    return np.sin(x) ** 2 + np.cos(x) ** 2


def add(x, y):
    return x + y


def kmeans(X, means):
    return np.argmin(np.linalg.norm(X - means[:, None], axis=2), axis=0)


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _gelu(x):
    return 0.5 * x * (1.0 + np.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))


def ln_gelu(x):
    m = x.mean(axis=-1, keepdims=True)
    d = x - m
    v = (d * d).mean(axis=-1, keepdims=True)
    return _gelu(d / np.sqrt(v + 1e-5))


def lltm_tail(gates, c):
    S = c.shape[1]
    ig = 1.0 / (1.0 + np.exp(-gates[:, :S]))
    og = 1.0 / (1.0 + np.exp(-gates[:, S:2 * S]))
    z = gates[:, 2 * S:]
    c_new = c + np.where(z > 0, z, np.exp(z) - 1.0) * ig
    return np.tanh(c_new) * og, c_new


def column_sum(x):
    return x.sum(axis=0)


def total(x):
    return x.sum()


def t_lltm(gates: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    S = c.shape[1]
    c_new = c + torch.nn.functional.elu(gates[:, 2 * S:]) * torch.sigmoid(gates[:, :S])
    return torch.tanh(c_new) * torch.sigmoid(gates[:, S:2 * S]), c_new


def t_kmeans(X: torch.Tensor, means: torch.Tensor) -> torch.Tensor:
    return torch.argmin(torch.linalg.norm(X - means[:, None], dim=2), dim=0)


F = torch.nn.functional
# name: (function, torch reference, inputs for a size n (and m), symbolic axes per argument,
#        sizes checked, the benchmark size). The benchmark sizes are the memory-bound workloads
#        of BENCHMARKS.md's "GPU kernels" table, plus short rows (attention scores) and two
#        reductions.
KERNELS: dict[str, tuple[Any, ...]] = {
    "sin2+cos2": (sin2cos2, lambda x: torch.sin(x) ** 2 + torch.cos(x) ** 2, lambda n, m: [(n,)], {"x": (0,)},
                  [(1, 0), (7, 0), (1031, 0)], (64 << 20, 0)),
    "x+y": (add, lambda x, y: x + y, lambda n, m: [(n,), (n,)], {"x": (0,), "y": (0,)},
            [(1, 0), (7, 0), (1031, 0)], (64 << 20, 0)),
    "k-means K=8": (kmeans, t_kmeans, lambda n, m: [(n, 2), (8, 2)], {"X": (0,)}, [(1, 0), (7, 0), (1031, 0)],
                    (20 << 20, 0)),
    "row softmax (rows)": (softmax, lambda x: torch.softmax(x, -1), lambda n, m: [(n, 4096)], {"x": (0,)},
                           [(1, 0), (13, 0)], (32768, 0)),
    "row softmax (rows, length)": (softmax, lambda x: torch.softmax(x, -1), lambda n, m: [(n, m)], {"x": (0, 1)},
                                   [(1, 1), (7, 13), (300, 97), (5, 1031)], (32768, 4096)),
    "short rows softmax (rows, length)": (softmax, lambda x: torch.softmax(x, -1), lambda n, m: [(n, m)],
                                          {"x": (0, 1)}, [(1, 1), (7, 13), (2048, 97), (16 * 12 * 200, 200)],
                                          (16 * 12 * 128, 128)),
    # a length no vector width divides: the kernel's scalar body (rows start unaligned)
    "short rows softmax, odd length (rows, length)": (softmax, lambda x: torch.softmax(x, -1), lambda n, m: [(n, m)],
                                                      {"x": (0, 1)}, [(1, 1), (7, 13), (2048, 97)], (16 * 12 * 128, 127)),
    "layer_norm->gelu (rows)": (ln_gelu, lambda x: F.gelu(F.layer_norm(x, x.shape[-1:], eps=1e-5), approximate="tanh"),
                                lambda n, m: [(n, 4096)], {"x": (0,)}, [(1, 0), (13, 0)], (32768, 0)),
    "LLTM tail (batch)": (lltm_tail, t_lltm, lambda n, m: [(n, 3072), (n, 1024)], {"gates": (0,), "c": (0,)},
                          [(1, 0), (13, 0)], (4096, 0)),
    "column sums (rows)": (column_sum, lambda x: x.sum(0), lambda n, m: [(n, 1024)], {"x": (0,)},
                           [(1, 0), (13, 0), (1031, 0)], (32768, 0)),
    "whole sum (both)": (total, lambda x: x.sum(), lambda n, m: [(n, m)], {"x": (0, 1)}, [(1, 1), (13, 7), (1031, 999)],
                         (32768, 4096)),
}


# Elementwise tolerances against the float64 reference: |got - want| <= atol + rtol * |want|.
# kiln's CUDA code is built without fast math (correctly rounded division and sqrt, libm's
# 1-2 ulp functions), so the float32 kernels are off by rounding alone. NumPy float32 versions
# of the elementwise kernels and the row reductions (softmax, layer_norm over 4096, each row
# summed by one sequential loop, the worst order a kernel may take) stay within 0.22 of
# rtol=1e-5, atol=1e-6; the atol covers results near 0 (gelu, the LLTM cell) and softmax's
# ~1e-4 probabilities are held to 1e-5 of themselves, not to 1e-4 absolute.
RTOL, ATOL = 1e-5, 1e-6
# The kernels whose outputs are sums of many N(0, 1) elements (terms per output for sizes n, m):
# a float32 sum's rounding grows with the terms, and some outputs cancel to near 0, so their
# atol is 1e-4 * sqrt(terms) (the sum's typical magnitude is sqrt(terms)). A column of 32768
# summed in one sequential loop (NumPy float32) stays within 0.2 of that.
REDUCED_TERMS: dict[str, Callable[[int, int], int]] = {
    "column sums (rows)": lambda n, m: n,
    "whole sum (both)": lambda n, m: n * m,
}


def worst_element(got: torch.Tensor, want: torch.Tensor, atol: float) -> float:
    """The largest |got - want| / (atol + RTOL * |want|) (<= 1 passes); want is float64."""
    if not want.numel():
        return 0.0
    return float(((got.double() - want).abs() / (atol + RTOL * want.abs())).max())


def graph_ms(fn: Callable[..., Any], args: list[torch.Tensor], calls: int = 20, replays: int = 7) -> float:
    """Kernel time per call: `calls` calls captured in one CUDA graph, replayed."""
    for _ in range(2):
        fn(*args)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(*args)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn(*args)
    times = []
    for _ in range(replays + 1):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / calls)
    return statistics.median(times[1:])


def _tuple(v: Any) -> tuple[Any, ...]:
    return v if isinstance(v, tuple) else (v,)


def run_kernels(client: Any) -> list[list[Any]]:
    rows = []
    for name, (fn, ref_fn, shapes, axes, sizes, bench) in KERNELS.items():
        try:
            dyn = kiln.jit(fn, target="cuda", client=client, dynamic_dims=axes)
            static = kiln.jit(fn, target="cuda", client=client, dynamic=False)
            worst = 0.0
            for n, m in [bench] + sizes:  # the first call's sizes are the symbols' examples: not 1
                atol = 1e-4 * REDUCED_TERMS[name](n, m) ** 0.5 if name in REDUCED_TERMS else ATOL
                args = [torch.randn(shp, device="cuda") for shp in shapes(n, m)]
                got = _tuple(dyn(*args))
                want = _tuple(ref_fn(*[a.double() for a in args]))
                for g_, w_ in zip(got, want):
                    if not w_.is_floating_point():
                        bad = int((g_ != w_).sum())
                        # argmin of distances: a tie within rounding may pick the other centre
                        rel = bad / max(w_.numel(), 1)
                        if rel > 1e-4:
                            failures.append(f"{name} at {(n, m)}: {bad} indices differ")
                        continue
                    rel = worst_element(g_, w_, atol)
                    worst = max(worst, rel)
                    if rel > 1.0:
                        failures.append(f"{name} at {(n, m)}: an element off by {rel:.2f} of "
                                        f"atol {atol:.1e} + rtol {RTOL:g} * |torch f64|")
            # Symbolic sizes serve every size checked with the one kernel compiled at the first
            # call: more compiles mean the symbolic compile fell back to one compile per shape.
            if dyn.compile_count != 1:
                failures.append(f"{name}: {dyn.compile_count} compiles for {len(sizes) + 1} sizes, not 1 "
                                "(the symbolic kernel did not serve them all)")
            args = [torch.randn(shp, device="cuda") for shp in shapes(*bench)]
            symbols = [s.name for s in dyn.compiled_for(*args).plan.symbols]
            if not symbols:
                failures.append(f"{name}: the kernel compiled for the benchmark size has no symbolic size")
            t_dyn = graph_ms(dyn, args)
            t_static = graph_ms(static, args)
            t_torch = graph_ms(ref_fn, args)
            size = "x".join(str(d) for d in shapes(*bench)[0])
            if VARIANTS and "length" in name:  # each tuning variant of the symbolic kernel, same inputs
                for v in range(1, 8):
                    var = kiln.jit(fn, target="cuda", client=client, dynamic_dims=axes,
                                   options=kiln.make_options(variant=v))
                    got = _tuple(var(*args))
                    want = _tuple(ref_fn(*[a.double() for a in args]))
                    err = max(worst_element(g_, w_, ATOL) for g_, w_ in zip(got, want))
                    if err > 1.0:
                        failures.append(f"{name}, variant {v}: an element off by {err:.2f} of its tolerance")
                    handle = var.compiled_for(*args).handle
                    print(f"  {name}: variant {v} ({handle[:12]}): {graph_ms(var, args) * 1000:.1f} us "
                          f"(variant 0 {t_dyn * 1000:.1f}, static {t_static * 1000:.1f})", flush=True)
            rows.append([name, size, ",".join(symbols) or "-", dyn.compile_count, len(sizes) + 1, f"{worst:.1e}",
                         f"{t_static * 1000:.1f}", f"{t_dyn * 1000:.1f}", f"{t_dyn / t_static:.3f}",
                         f"{t_torch * 1000:.1f}"])
            print(rows[-1], flush=True)
        except Exception as e:
            failures.append(f"{name}: {type(e).__name__}: {e}")
            traceback.print_exc()
    return rows


# ---------------------------------------------------------------------------------- BERT

def run_bert(lengths: list[int], iters: int) -> list[list[Any]]:
    """BERT-base under kiln and Inductor (and eager), one model, the backends' compiled models
    met in turn at each length: torch's automatic-dynamic state is per code object and shared
    by both, so each backend compiles the first length static and the second symbolic, as it
    would alone. Per length, the steady state is timed in interleaved rounds (one step of each
    backend per round, the device synchronized between steps), medians of CUDA-event times."""
    from transformers import BertConfig, BertModel

    import kiln.torch as ktorch
    from kiln.torch import native

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = BertModel(BertConfig()).cuda().eval()
    fns = {"kiln": torch.compile(model, backend="kiln"), "inductor": torch.compile(model, backend="inductor"),
           "eager": model}
    rows = []
    for index, T in enumerate(lengths):
        ids = [torch.randint(0, 30522, (16, T), device="cuda") for _ in range(3)]
        mask = torch.ones(16, T, dtype=torch.long, device="cuda")
        with torch.no_grad():
            ref = model(input_ids=ids[0], attention_mask=mask).last_hidden_state
        first, err = {}, {}
        before = ktorch.stats()
        for backend in ("kiln", "inductor"):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.no_grad():
                out = fns[backend](input_ids=ids[0], attention_mask=mask).last_hidden_state
            torch.cuda.synchronize()
            first[backend] = time.perf_counter() - t0
            err[backend] = float((out - ref).abs().max())
            if err[backend] > 2e-3:
                failures.append(f"BERT {backend} T={T}: max difference from eager {err[backend]:.2e}")
            if backend == "kiln":
                native.wait(600)  # time the parts' native call path, not a build running beside
        mid = ktorch.stats()
        with torch.no_grad():
            ms = interleaved_ms({b: lambda r, fn=fn, ids=ids, mask=mask: fn(input_ids=ids[r % 3], attention_mask=mask)
                                 for b, fn in fns.items()}, iters, warmup=3)
        after = ktorch.stats()
        new = (mid["compiled"] - before["compiled"]) - (mid["cache_hits"] - before["cache_hits"]) - \
              (mid["memo_hits"] - before["memo_hits"])
        row = [T, f"{ms['eager']:.3f}", f"{ms['inductor']:.3f}", f"{ms['kiln']:.3f}",
               f"{ms['kiln'] / ms['inductor']:.3f}", f"{first['inductor']:.2f}", f"{first['kiln']:.2f}",
               f"{err['inductor']:.1e}", f"{err['kiln']:.1e}", mid["parts"] - before["parts"], new,
               after["eager_calls"] - mid["eager_calls"], after["failed"] - before["failed"]]
        if after["eager_calls"] - mid["eager_calls"] or after["failed"] - before["failed"]:
            failures.append(f"BERT kiln T={T}: parts ran in torch")
        # The second length made the sequence length symbolic: its parts serve every later
        # length without compiling again (a compile here is a per-shape fallback).
        if index >= 2 and new:
            failures.append(f"BERT kiln T={T}: {new} new kiln compiles after the sequence length became symbolic")
        if after["kernel_calls"] == mid["kernel_calls"]:
            failures.append(f"BERT kiln T={T}: no kiln kernel ran (the checks compared eager with eager)")
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
    ap.add_argument("--skip-kernels", action="store_true")
    ap.add_argument("--variants", action="store_true",
                    help="also time each tuning variant of the kernels whose row length is symbolic")
    opts = ap.parse_args()
    global VARIANTS
    VARIANTS = opts.variants
    binary = kilnd_binary("dynamic_gpu")
    if binary is None:
        return 2
    md = [f"# Dynamic shapes on {torch.cuda.get_device_name()} (torch {torch.__version__})\n"]
    with tempfile.TemporaryDirectory(prefix="kiln-dynamic-gpu-") as tmp:
        daemon = kiln.local.LocalDaemon(binary, Path(tmp), timeout=30)
        try:
            os.environ["KILN_SERVER"] = daemon.address
            with kiln.Client(daemon.address, cache_dir=Path(tmp) / "client-cache") as client:
                rows = [] if opts.skip_kernels else run_kernels(client)
            md.append("## Symbolic vs static CUDA kernels (kernel time per call, CUDA graph of 20 calls)\n")
            md.append(table(["kernel", "bench size", "symbols", "compiles", "sizes checked", "worst / tolerance",
                             "static us", "dynamic us", "dyn/static", "torch us"], rows))
            if not opts.skip_bert:
                lengths = [128, 96, 64, 200]
                iters = 10 if opts.quick else 30
                try:
                    brows = run_bert(lengths, iters)
                except Exception as e:
                    brows = []
                    failures.append(f"BERT: {type(e).__name__}: {e}")
                    traceback.print_exc()
                md.append("\n## BERT-base, batch 16, inference, sequence length changing (torch automatic dynamic), "
                          "interleaved rounds\n")
                md.append(table(["T", "eager ms", "Inductor ms", "kiln ms", "kiln / Inductor", "Inductor first s",
                                 "kiln first s", "Inductor max diff", "kiln max diff", "kiln parts",
                                 "new kiln compiles", "part calls in torch", "failed parts"], brows))
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
