#!/usr/bin/env python3
"""The channels-last layout pass (kiln/torch/passes/channels_last.py) on an NVIDIA GPU, against eager.

torchvision's resnet18 at batch 16, 224x224, compiled with ``options={"layout": "channels_last"}``
(the pass forced on: with TF32 off the default keeps NCHW) and with ``{"layout": "keep"}``:
inference in eval mode, and a training step in train mode (batch statistics, a random weighting of
the logits as the loss). Checks, per variant: the logits, and for training the gradient of every
parameter, as the relative error of the whole tensor against a float64 run of the same step, which
must be at most 1e-4 or ten times the larger error of two eager f32 runs, one with the model and
input NCHW and one channels-last; and that no part fell back. TF32 is off. Why both eager runs: the
gradients of the deeper layers are sums of thousands of nearly cancelling terms, so any f32 run
whose arithmetic differs from another's by rounding lands far from it: cuDNN's NHWC algorithms sum
in another order than its NCHW ones, and eager channels-last is 4.7e-3 off on the worst of them
where eager NCHW is 6.4e-4; kiln's own batch-norm arithmetic (the training batch norm is decomposed
and fused) rounds differently from cuDNN's batch-norm kernel in the same way.
Exits non-zero on a failed check. Prints a table; with ``$OUT`` set also writes
``$OUT/layout_gpu.md``.

    tests/gpu/with_pack.sh PACK python3 tests/gpu/layout_gpu.py
"""

from __future__ import annotations

import copy
import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpu_common import private_kilnd  # noqa: E402
from torch_backend_gpu import resnet18_input, resnet18_model  # noqa: E402

TOL = 1e-4  # relative error of a whole tensor


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def run(layout: str, train: bool) -> tuple[list[tuple[str, float, float]], dict[str, int]]:
    import kiln.torch as kt

    torch._dynamo.reset()
    kt.reset_stats()
    model = resnet18_model().train(train)
    x = resnet18_input(1)[0]
    weights = torch.randn(16, 1000, device="cuda", generator=torch.Generator("cuda").manual_seed(3))
    f = torch.compile(model, backend=kt.backend(layout=layout))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    exact_model = copy.deepcopy(model).double()
    # Eager in both layouts (cuDNN's NHWC algorithms sum in another order than its NCHW ones):
    # two valid f32 runs of the step, whose errors say how well conditioned each tensor is.
    eager_cl = copy.deepcopy(model).to(memory_format=torch.channels_last)
    x_cl = x.contiguous(memory_format=torch.channels_last)

    def step(m: torch.nn.Module, fn: object, dtype: torch.dtype, inp: torch.Tensor = x
             ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        m.load_state_dict(state)  # the same running statistics before each step
        m.zero_grad(set_to_none=True)
        if not train:
            with torch.no_grad():
                return fn(inp.to(dtype)), []
        out = fn(inp.to(dtype))
        (out * weights.to(dtype)).sum().backward()
        return out.detach(), [p.grad.clone() for p in m.parameters()]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):  # the second call: through the native runner
            got = step(model, f, torch.float32)
    nchw = step(model, model, torch.float32)
    cl = step(eager_cl, eager_cl, torch.float32, x_cl)
    exact = step(exact_model, exact_model, torch.float64)
    names = ["logits"] + [n for n, _ in model.named_parameters()]
    # (name, kiln's error, eager NCHW's, eager channels-last's)
    errors = [(name, rel(g, e), rel(a, e), rel(b, e)) for name, g, a, b, e
              in zip(names, [got[0]] + got[1], [nchw[0]] + nchw[1], [cl[0]] + cl[1], [exact[0]] + exact[1])]
    s = kt.stats()
    s["warnings"] = sum(1 for w in caught if "kiln" in str(w.message))
    return errors, s


def main() -> int:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    private_kilnd("layout_gpu.py", "kiln-layout-gpu-")  # torch.compile(backend="kiln") reaches it by KILN_SERVER
    rows, failed = [], 0
    for train in (False, True):
        for layout in ("channels_last", "keep"):
            errors, s = run(layout, train)
            # Budget: ten times the larger of the two eager errors (1e-4 at least).
            bad = [f"{name} {k:.1e} ({a:.1e} / {b:.1e})" for name, k, a, b in errors if k > max(TOL, 10 * max(a, b))]
            ok = not bad and s["failed"] == 0 and s["eager_calls"] == 0
            failed += not ok
            worst = max(errors, key=lambda t: t[1])
            ratio = max(k / max(a, b, 1e-12) for _, k, a, b in errors)
            rows.append(f"| resnet18 {'training step' if train else 'inference'} | {layout} | {errors[0][1]:.1e} "
                        f"({errors[0][2]:.1e} / {errors[0][3]:.1e}) | {worst[0]}: {worst[1]:.1e} ({worst[2]:.1e} / "
                        f"{worst[3]:.1e}) | {ratio:.1f} | {len(errors)} | "
                        f"{s['parts']} | {s['layout_copies']} | {s['eager_calls']} | "
                        f"{'ok' if ok else 'FAILED: ' + ', '.join(bad)} |")
    table = "\n".join([
        f"# layout pass on {torch.cuda.get_device_name()}, torch {torch.__version__}", "",
        "Relative errors against float64, kiln (eager NCHW / eager channels-last in parentheses); the",
        "worst ratio of kiln's error to the larger eager one over all tensors.", "",
        "| workload | layout | logits | worst tensor (kiln) | worst ratio | tensors checked | kiln parts | layout copies | "
        "parts run in torch | check |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |", *rows, ""])
    print(table)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "layout_gpu.md"), "w") as fh:
            fh.write(table)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
