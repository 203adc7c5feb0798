#!/usr/bin/env python3
"""What torch's random number generation does inside CUDA graphs (the facts kiln.torch's
``mode="reduce-overhead"`` rests on for graphs that draw random numbers):

1. ``torch.rand`` and ``torch.randint`` captured in a CUDA graph: does each replay draw new
   numbers (torch's Philox offset advanced per replay) or repeat the captured ones?
2. Attention with dropout (``aten._scaled_dot_product_efficient_attention``) captured: its Philox
   seed and offset come out as device tensors. Its backward op called outside a capture with
   those tensors (in a child process, which may crash), and inside a capture after a warm-up.
3. With ``--kiln`` (the kiln wheel, and a kilnd binary at $KILND, e.g. through with_pack.sh):
   kiln.torch's reduce-overhead mode on a linear layer with dropout.

    python3 tests/gpu/random_graphs_gpu.py
    tests/gpu/with_pack.sh PACK python3 tests/gpu/random_graphs_gpu.py --kiln

Writes $OUT/random_graphs_gpu.md when $OUT is set.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

aten = torch.ops.aten


def replays_draw_new_numbers() -> list[str]:
    out = []
    for name, draw in [("rand", lambda: torch.rand(1 << 16, device="cuda")),
                       ("randint", lambda: torch.randint(2**62, (), device="cuda"))]:
        draw()  # warm up
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            x = draw()
        g.replay()
        a = x.clone()
        g.replay()
        b = x.clone()
        out.append(f"| {name} in a graph: two replays {'differ' if not torch.equal(a, b) else 'are EQUAL'} |")
    return out


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


def kiln_reduce_overhead() -> list[str]:
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

    cf = torch.compile(f, backend="kiln", mode="reduce-overhead")
    x = torch.randn(512, 256, device="cuda", requires_grad=True)
    g = torch.randn(512, 256, device="cuda")
    outs, worst = [], 0.0
    for _ in range(6):
        y = cf(x)
        (gx,) = torch.autograd.grad((y * g).sum(), [x])
        with torch.no_grad():
            keep = (y != 0).float()
            want = (g * 2.0 * keep / (1 - p)) @ lin.weight
        worst = max(worst, float((gx - want).abs().max() / want.abs().max()))
        outs.append(y.detach().clone())
    kept = float(sum((o != 0).float().mean() for o in outs) / len(outs))
    distinct = all(not torch.equal(outs[i], outs[i + 1]) for i in range(len(outs) - 1))
    s = kt.stats()
    return [f"| kiln reduce-overhead, dropout p={p}: {s['graph_replays']} replays, calls differ: {distinct}, "
            f"kept {kept:.3f}, gradient off by {worst:.1e} (relative) |"]


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--attention":
        attention(sys.argv[2])
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--kiln":
        import tempfile

        import kiln.local

        with tempfile.TemporaryDirectory(prefix="kiln-random-gpu-") as tmp:
            daemon = kiln.local.LocalDaemon(os.environ["KILND"], Path(tmp), timeout=30)
            try:
                os.environ["KILN_SERVER"] = daemon.address
                print("\n".join(kiln_reduce_overhead()))
            finally:
                daemon.stop()
        return 0
    lines = [f"# Random numbers in CUDA graphs on {torch.cuda.get_device_name()} (torch {torch.__version__})", "",
             "| finding |", "| --- |"]
    lines += replays_draw_new_numbers()
    for mode in ("outside", "inside", "host-copy"):
        p = subprocess.run([sys.executable, __file__, "--attention", mode], capture_output=True, text=True,
                           timeout=300)
        tail = (p.stdout + p.stderr).strip().splitlines()[-2:]
        lines.append(f"| attention backward {mode} a capture, device seed: exit {p.returncode}: "
                     f"{' / '.join(t[:150] for t in tail)} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "random_graphs_gpu.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
