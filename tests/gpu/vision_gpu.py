#!/usr/bin/env python3
"""kiln's torch.compile backend on torchvision's model families (random weights, nothing
downloaded): the checks of models_gpu.py per model, on a CUDA GPU or (``--device cpu``, small
images) on this machine's CPU.

The families cover what the Hugging Face zoo lacks: batch norm in training and inference,
depthwise and grouped convolutions (MobileNet, EfficientNet, RegNet, ResNeXt), squeeze-excitation
gates, hardswish and SiLU, channel shuffles (ShuffleNet: view, transpose, view), dense
concatenations (DenseNet), ceil-mode and adaptive pooling (SqueezeNet, GoogLeNet), layer norms over
permuted channels-last activations (ConvNeXt), shifted windows with rolls and relative position
tables (Swin), and a plain ViT. Per model, against eager on the same device (TF32 off):
- f32 inference; a training step's gradients (randomly weighted output) against float64
  eager's, next to eager f32's, and the running statistics it updates; bf16 inference
  against f32; ``mode="reduce-overhead"``;
- no kiln part falls back to torch.

Then (GPU, unless ``--no-timing``) times inference at batch 16, 224x224 for a few families:
eager, Inductor and kiln in one process, interleaved rounds, medians of CUDA events.

    KILND=... tests/gpu/with_pack.sh PACK python3 tests/gpu/vision_gpu.py [--models a,b] [--no-timing]
    KILND=build/server/kilnd python3 tests/gpu/vision_gpu.py --device cpu --models mobilenet_v3_small

Writes $OUT/vision_gpu.md (and vision_gpu_timing.md); exits 1 when a check fails.
"""
from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any, Optional

import torch

from models_gpu import CHECK_COLUMNS, TIMING_COLUMNS, check_model, time_models
from gpu_common import kilnd_binary, local_client, report

# name -> extra constructor arguments; every family runs at any image side the script uses but
# ViT, which needs its configured 224.
FAMILIES: dict[str, dict[str, Any]] = {
    "resnet50": {},
    "resnext50_32x4d": {},
    "mobilenet_v2": {},
    "mobilenet_v3_small": {},
    "efficientnet_b0": {},
    "regnet_y_400mf": {},
    "shufflenet_v2_x1_0": {},
    "squeezenet1_1": {},
    "densenet121": {},
    "googlenet": {"aux_logits": False, "init_weights": True},
    "mnasnet0_5": {},
    "convnext_tiny": {},
    "swin_t": {},
    "vit_b_16": {},
}
TIMED = ("resnet50", "mobilenet_v3_small", "efficientnet_b0", "densenet121", "convnext_tiny", "swin_t")


def build(name: str, device: str, dtype: Optional[torch.dtype] = None, side: int = 64) -> torch.nn.Module:
    """The family's model with random weights, in eval mode, dropout and stochastic depth off
    (eager and kiln must see one network in training too).

    Calibrated so that its outputs are of order one, or the inference checks would compare
    zeros: a classifier head initialised to zeros (ViT's) gets random weights, and the batch
    norms' running statistics are those of a batch of random images of ``side``."""
    import torchvision

    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None, **FAMILIES[name])
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout) or type(m).__name__ == "StochasticDepth":
            m.p = 0.0
        if isinstance(m, torch.nn.Linear) and not m.weight.any():
            m.reset_parameters()
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if norms:
        for m in norms:
            m.reset_running_stats()
            m.momentum = None  # a cumulative average: one batch's statistics
        with torch.no_grad():
            model.train()(images(name, "cpu", 8, side, seed=2)["x"])
        for m in norms:
            m.momentum = 0.1
    model = model.eval().to(device)
    return model if dtype is None else model.to(dtype)


def images(name: str, device: str, batch: int, side: int, dtype: Optional[torch.dtype] = None,
           seed: int = 1) -> dict[str, torch.Tensor]:
    side = 224 if name.startswith("vit") else side
    gen = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(batch, 3, side, side, generator=gen).to(device, dtype or torch.float32)}


class Wrapped(torch.nn.Module):
    """Takes the keyword input models_gpu.py's checks pass (``x=``)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(FAMILIES))
    ap.add_argument("--timed", default=",".join(TIMED))
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--side", type=int, default=0, help="image side of the checks (default 128 on a GPU, 64 on the CPU)")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=10)
    opts = ap.parse_args()
    binary = kilnd_binary("vision_gpu.py")
    if binary is None:
        return 2
    dev = opts.device
    side = opts.side or (128 if dev == "cuda" else 64)
    warnings.simplefilter("ignore", UserWarning)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    failures: list[str] = []
    rows: list[list[str]] = []
    with local_client(binary, "kiln-vision-") as client:
        for name in [n for n in opts.models.split(",") if n]:
            def make(dtype: Optional[torch.dtype], name: str = name) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
                return Wrapped(build(name, dev, dtype, side)), images(name, dev, opts.batch, side, dtype)

            try:
                # ReLU networks with batch norms: a few elements on a ReLU's kink move the
                # gradients by up to ~1e-2 between any two f32 computations (grad_error).
                rows.append(check_model(name, client, failures, make, tol=2e-4, grad_tol=1e-2))
            except Exception as e:  # a crash fails that model; the others still run
                failures.append(f"{name}: {type(e).__name__}: {str(e)[:300]}")
                rows.append([name, "error", "", "", "", "", ""])
            print(" | ".join(rows[-1]), flush=True)
        timing = []
        if dev == "cuda" and not opts.no_timing:
            torch.backends.cudnn.allow_tf32 = True  # torch's defaults for the timings
            torch.backends.cuda.matmul.allow_tf32 = False
            timing = time_models([n for n in opts.timed.split(",") if n], client, opts.rounds, opts.iters,
                                 lambda n: (Wrapped(build(n, dev, side=224)), images(n, dev, 16, 224)))
    title = f"torchvision models through kiln ({dev}, batch {opts.batch}, {side}x{side})"
    if not rows:
        failures.append("no model was checked")
    status = report(title, CHECK_COLUMNS, rows, failures, "All checks passed.", "vision_gpu.md")
    if timing:
        report("torchvision inference at batch 16, 224x224 (ms, median)", TIMING_COLUMNS, timing, [], "",
               "vision_gpu_timing.md")
    return status


if __name__ == "__main__":
    sys.exit(main())
