#!/usr/bin/env python3
"""BERT-base (``BertModel(BertConfig())``, random weights, batch 16, inference) at sequence lengths
128, 96, 64, 200 and 37 in that order, as a user serving variable-length batches meets them:
kiln (``backend="kiln"``, default mode) against Inductor (``torch.compile`` default) in one
process. From the second length on both compile one symbolic graph.

Checks: every length's output matches eager f32 (relative to the output's scale, TF32 off), and
kiln leaves no part to torch at any length (``kiln.torch.stats()["failed"] == 0``). Then times
each length: interleaved rounds of kiln and Inductor, median of CUDA-event timings.

    tests/gpu/with_pack.sh PACK python3 tests/gpu/bert_lengths_gpu.py [--rounds 7] [--no-timing]

Writes $OUT/bert_lengths_gpu.md; exits 1 when a check fails.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import kiln.torch as kt  # noqa: E402
from gpu_common import interleaved_ms, kilnd_binary, local_client, report  # noqa: E402

LENGTHS = (128, 96, 64, 200, 37)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--no-timing", action="store_true")
    opts = ap.parse_args()
    binary = kilnd_binary("bert_lengths_gpu.py")
    if binary is None:
        return 2
    from transformers import BertConfig, BertModel

    warnings.simplefilter("ignore", UserWarning)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    failures: list[str] = []
    rows: list[list[str]] = []
    gen = torch.Generator().manual_seed(0)
    model = BertModel(BertConfig()).cuda().eval()
    inputs = {L: torch.randint(0, 30000, (opts.batch, L), generator=gen).cuda() for L in LENGTHS}
    with local_client(binary, "kiln-bert-lengths-") as client, torch.no_grad():
        kt.reset_stats()
        fns = {"Inductor": torch.compile(model),
               "kiln": torch.compile(model, backend="kiln", options={"client": client})}
        errs: dict[int, float] = {}
        for L in LENGTHS:
            want = model(input_ids=inputs[L]).last_hidden_state
            before = kt.stats()["failed"]
            for label, f in fns.items():
                got = f(input_ids=inputs[L]).last_hidden_state
                err = ((got - want).abs().max() / want.abs().max()).item()
                if label == "kiln":
                    errs[L] = err
                if err > 1e-4:
                    failures.append(f"{label} at length {L}: error {err:.2e} of the output's scale")
            if kt.stats()["failed"] != before:
                failures.append(f"kiln at length {L}: {kt.stats()['failed'] - before} parts fell back to torch")
        kt.wait()
        s = kt.stats()
        if s["kernel_calls"] + s["native_calls"] == 0:
            failures.append("kiln ran no part: eager was compared with eager")
        for L in LENGTHS:
            med = {}
            if not opts.no_timing:
                for f in fns.values():
                    for _ in range(3):
                        f(input_ids=inputs[L])
                med = interleaved_ms({k: lambda r, f=f, L=L: f(input_ids=inputs[L]) for k, f in fns.items()},
                                     opts.rounds, opts.iters)
            ratio = med["kiln"] / med["Inductor"] if med else float("nan")
            rows.append([str(L), f"{errs[L]:.1e}", f"{med.get('Inductor', float('nan')):.3f}",
                         f"{med.get('kiln', float('nan')):.3f}", f"{ratio:.3f}"])
            print(" | ".join(rows[-1]), flush=True)
        if os.environ.get("OUT"):
            Path(os.environ["OUT"], "bert_lengths_graphs.json").write_text(json.dumps(kt.last_graphs(), default=str))
        per_graph = ", ".join(str(len(g["parts"])) for g in kt.last_graphs())
        s = kt.stats()
        rows.append(["all", "", "", "", f"graphs {s['graphs']} (parts {per_graph}), fallbacks {s['failed']}, "
                     f"part calls native {s['native_calls']} / Python {s['kernel_calls'] - s['native_calls']}"])
    return report(f"BERT-base at five sequence lengths, batch {opts.batch}",
                  ["length", "kiln error", "Inductor ms", "kiln ms", "kiln / Inductor"], rows, failures,
                  "every length ran in kiln and matched eager", "bert_lengths_gpu.md")


if __name__ == "__main__":
    sys.exit(main())
