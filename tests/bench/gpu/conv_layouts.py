#!/usr/bin/env python3
"""Which memory layout cuDNN's convolutions want, per kind of convolution, on this GPU.

For each timm model named (batch 16 at its own input size, inference), every convolution is
recorded with a forward hook and timed alone in NCHW (input and weight contiguous) and in NHWC
(both channels-last), in float32 with TF32 off (how the sweep and the benchmarks run), float32
with cuDNN's default TF32 on, and bfloat16. Convolutions are grouped by kind: ``dense``
(groups 1), ``depthwise`` (one input channel per group) and ``grouped`` (the rest: ResNeXt,
RegNet, NFNet blocks). Printed per model and kind: the summed time of its convolutions in each
layout and the ratio NHWC / NCHW; kiln's layout pass weighs convolutions by these ratios.

    tests/gpu/with_pack.sh PACK python3 tests/bench/gpu/conv_layouts.py regnetz_b16 resnet50 ...
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "gpu"))  # tests/gpu
import timm  # noqa: E402
from gpu_common import interleaved_ms  # noqa: E402


def conv_kind(conv: torch.nn.Conv2d) -> str:
    if conv.groups == 1:
        return "dense"
    return "depthwise" if conv.in_channels == conv.groups else "grouped"


def recorded_convolutions(name: str) -> list[tuple[torch.nn.Conv2d, torch.Size]]:
    m = timm.create_model(name, pretrained=False).cuda().eval()
    side = int(((getattr(m, "pretrained_cfg", None) or {}).get("input_size") or (3, 224, 224))[-1])
    seen: list[tuple[torch.nn.Conv2d, torch.Size]] = []
    hooks = [c.register_forward_hook(lambda mod, args, out: seen.append((mod, args[0].shape)))
             for c in m.modules() if isinstance(c, torch.nn.Conv2d)]
    with torch.no_grad():
        m(torch.randn(16, 3, side, side, device="cuda"))
    for h in hooks:
        h.remove()
    return seen


def time_layouts(conv: torch.nn.Conv2d, shape: torch.Size, dtype: torch.dtype) -> tuple[float, float]:
    x = torch.randn(shape, device="cuda", dtype=dtype)
    w = conv.weight.detach().to(dtype)
    xl, wl = x.contiguous(memory_format=torch.channels_last), w.contiguous(memory_format=torch.channels_last)
    args = dict(stride=conv.stride, padding=conv.padding, dilation=conv.dilation, groups=conv.groups)
    if isinstance(conv.padding, str):
        args["padding"] = conv.padding
    med = interleaved_ms({"nchw": lambda r: F.conv2d(x, w, **args), "nhwc": lambda r: F.conv2d(xl, wl, **args)},
                         rounds=5, per_round=10, warmup=1)
    return med["nchw"], med["nhwc"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = False
    modes = {"f32": (torch.float32, False), "f32+tf32": (torch.float32, True), "bf16": (torch.bfloat16, False)}
    overall: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    print("| model | mode | kind | convs | NCHW ms | NHWC ms | NHWC / NCHW |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for name in args.models:
        convs = recorded_convolutions(name)
        for mode, (dtype, tf32) in modes.items():
            torch.backends.cudnn.allow_tf32 = tf32
            sums: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
            for conv, shape in convs:
                a, b = time_layouts(conv, shape, dtype)
                s = sums[conv_kind(conv)]
                s[0], s[1], s[2] = s[0] + a, s[1] + b, s[2] + 1
            for kind, (a, b, count) in sorted(sums.items()):
                print(f"| {name} | {mode} | {kind} | {count} | {a:.3f} | {b:.3f} | {b / a:.2f} |", flush=True)
                overall[(mode, kind)][0] += a
                overall[(mode, kind)][1] += b
    print("\nAll models, summed:")
    for (mode, kind), (a, b) in sorted(overall.items()):
        print(f"  {mode:9s} {kind:10s} NCHW {a:8.3f} ms  NHWC {b:8.3f} ms  NHWC / NCHW {b / a:.2f}")


if __name__ == "__main__":
    main()
