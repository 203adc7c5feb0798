#!/usr/bin/env python3
"""What torch's random number generation does inside CUDA graphs (the facts kiln.torch's
``mode="reduce-overhead"`` rests on for graphs that draw random numbers):

1. ``torch.rand`` and ``torch.randint`` captured in a CUDA graph: does each replay draw new
   numbers (torch's Philox offset advanced per replay) or repeat the captured ones?
2. Attention with dropout (``aten._scaled_dot_product_efficient_attention``) captured: its Philox
   seed and offset come out as device tensors. Its backward op called with those tensors outside
   a capture, inside one after such a warm-up (child processes: they may crash), and outside a
   capture with the two copied to the host, then captured with the device ones.
3. kiln.torch's reduce-overhead mode on a linear layer with dropout: replays, a new mask per
   call, the kept fraction, the input's gradient against the one the call's mask gives.

    tests/gpu/with_pack.sh PACK python3 tests/gpu/random_graphs_gpu.py

Exits 1 when a replay repeats its numbers, the host-copied seed does not work, or kiln's check
fails (outside-a-capture crashes are findings, not failures). Writes $OUT/random_graphs_gpu.md.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

aten = torch.ops.aten


def replays_draw_new_numbers(rows: list[list[str]], failures: list[str]) -> None:
    for name, draw in [("rand", lambda: torch.rand(1 << 16, device="cuda")),
                       ("randint", lambda: torch.randint(2**62, (), device="cuda"))]:
        draw()  # warm up
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            x = draw()
        g.replay()
        a = x.clone()
        g.replay()
        same = torch.equal(a, x)
        rows.append([f"{name} in a CUDA graph, two replays", "the same numbers" if same else "new numbers"])
        if same:
            failures.append(f"{name}: a replay repeated the captured numbers")


def attention(mode: str) -> None:
    q, k, v = (torch.randn(2, 4, 64, 64, device="cuda", requires_grad=False) for _ in range(3))
    aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.1)  # warm up
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.1)
    g.replay()
    torch.cuda.synchronize()
    print(f"forward captured: seed on {seed.device}, offset on {offset.device}", flush=True)
    grad = torch.randn_like(out)

    def backward():
        return aten._scaled_dot_product_efficient_attention_backward(grad, q, k, v, None, out, lse, seed, offset, 0.1,
                                                                    [True, True, True, False])

    if mode == "outside":
        r = backward()
        torch.cuda.synchronize()
        print(f"backward outside a capture: ok, |dq| {float(r[0].abs().sum()):.3f}", flush=True)
    elif mode == "host-copy":
        seed_h, offset_h = seed.cpu(), offset.cpu()
        r = aten._scaled_dot_product_efficient_attention_backward(grad, q, k, v, None, out, lse, seed_h, offset_h, 0.1,
                                                                  [True, True, True, False])
        torch.cuda.synchronize()
        print(f"backward outside a capture, seed copied to the host: ok, |dq| {float(r[0].abs().sum()):.3f}", flush=True)
        g2 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g2):
            r2 = backward()
        g2.replay()
        torch.cuda.synchronize()
        same = torch.allclose(r[0], r2[0], rtol=1e-4, atol=1e-5)
        print(f"then inside a capture with the device seed: ok, same gradient as the host copy's: {same}", flush=True)
    else:
        backward()  # warm up (outside: the seed is on the device)
        g2 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g2):
            r = backward()
        g2.replay()
        torch.cuda.synchronize()
        print(f"backward inside a capture: ok, |dq| {float(r[0].abs().sum()):.3f}", flush=True)


def kiln_reduce_overhead(client: Any, rows: list[list[str]], failures: list[str]) -> None:
    """kiln.torch in reduce-overhead mode on a linear layer with dropout (kiln's own draws, from
    one torch ``randint`` per call): the graphs are captured and replayed, each replay draws a new
    mask, about 1 - p of the elements are kept, and the input's gradient is the one the step's
    own mask gives."""
    import kiln.torch as kt
    import torch.nn.functional as F

    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 256).cuda()
    p = 0.25

    def f(x: torch.Tensor) -> torch.Tensor:
        return F.dropout(lin(x), p, True) * 2.0

    cf = torch.compile(f, backend=kt.backend(mode="reduce-overhead", client=client))
    x = torch.randn(512, 256, device="cuda", requires_grad=True)
    g = torch.randn(512, 256, device="cuda")
    outs, worst = [], 0.0
    for _ in range(6):
        y = cf(x)
        (gx,) = torch.autograd.grad((y * g).sum(), [x])
        with torch.no_grad():
            keep = (y != 0).double()
            want = (g.double() * 2.0 * keep / (1 - p)) @ lin.weight.double()
        # Every element: |gx - want| <= atol + rtol * |want|, want in float64. gx is a float32
        # matmul over 256 terms (|want| up to ~7); PyTorch's own float32 product on the CPU stays
        # within 0.2 of rtol=atol=1e-5 (the atol covers elements that cancel to near 0).
        worst = max(worst, float(((gx.double() - want).abs() / (1e-5 + 1e-5 * want.abs())).max()))
        outs.append(y.detach().clone())
    kept = float(sum((o != 0).float().mean() for o in outs) / len(outs))
    distinct = all(not torch.equal(outs[i], outs[i + 1]) for i in range(len(outs) - 1))
    replays = kt.stats()["graph_replays"]
    rows.append([f"kiln reduce-overhead, linear + dropout p={p}, 6 training steps",
                 f"{replays} replays, every call a new mask: {distinct}, kept {kept:.3f}, "
                 f"input gradient's worst element at {worst:.2f} of 1e-5 + 1e-5 * |want|"])
    if not (replays > 0 and distinct and abs(kept - (1 - p)) < 0.01 and worst <= 1.0):
        failures.append("kiln reduce-overhead with dropout: " + rows[-1][1])


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--attention":
        attention(sys.argv[2])
        return 0
    from gpu_common import kilnd_binary, local_client, report

    binary = kilnd_binary("random_graphs_gpu")
    if binary is None:
        return 2
    rows: list[list[str]] = []
    failures: list[str] = []
    replays_draw_new_numbers(rows, failures)
    for mode in ("outside", "inside", "host-copy"):
        p = subprocess.run([sys.executable, __file__, "--attention", mode], capture_output=True, text=True,
                           timeout=300)
        tail = (p.stdout + p.stderr).strip().splitlines()[-2:]
        rows.append([f"attention backward with a captured forward's device seed, {mode}",
                     f"exit {p.returncode}: {' / '.join(t[:150] for t in tail)}"])
        if mode == "host-copy" and (p.returncode != 0 or "True" not in tail[-1]):
            failures.append("attention backward with the seed on the host: " + rows[-1][1])
    with local_client(binary, "kiln-random-gpu-") as client:
        kiln_reduce_overhead(client, rows, failures)
    return report("Random numbers in CUDA graphs", ["what", "result"], rows, failures,
                  "every check as expected", "random_graphs_gpu.md")


if __name__ == "__main__":
    sys.exit(main())
