#!/usr/bin/env python3
"""The fusion reports of a timm model's kiln parts on CUDA: which kernels each part became,
their strategies and grids. For the parts whose ops include a given op name (default: every
part), prints the part's ops and kilnd's report.

    tests/gpu/with_pack.sh PACK python3 tests/bench/gpu/part_report.py poolformer_s12 --op native_group_norm --limit 2
"""
import argparse
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "gpu"))  # tests/gpu
import kiln.torch as kt  # noqa: E402
import timm  # noqa: E402
from gpu_common import kilnd_binary, local_client  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--op", default="", help="only parts with an op whose name contains this")
    ap.add_argument("--limit", type=int, default=3, help="parts printed")
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    with local_client(kilnd_binary("pr"), "pr-") as client, torch.no_grad():
        m = timm.create_model(args.model, pretrained=False).cuda().eval()
        x = torch.randn(args.batch, 3, 224, 224, device="cuda")
        torch.compile(m, backend="kiln", options={"client": client})(x)
        kt.wait()
        seen, shown = set(), 0
        for g in kt.last_graphs():
            for p in g["parts"]:
                if not p["handle"] or p["handle"] in seen or not any(args.op in o for o in p["ops"]):
                    continue
                seen.add(p["handle"])
                print(f"=== part {p['name']}: {len(p['ops'])} ops: {', '.join(p['ops'][:40])}")
                print(client.source(p["handle"]).fusion_report)
                shown += 1
                if shown >= args.limit:
                    return


if __name__ == "__main__":
    main()
