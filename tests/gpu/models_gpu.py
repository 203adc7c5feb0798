#!/usr/bin/env python3
"""kiln's torch.compile backend on a dozen Hugging Face model families on a CUDA GPU (the model
zoo of tests/python/model_zoo.py: small configurations, random weights, nothing downloaded).

Checks, per model, against eager on the same GPU:
- inference outputs (f32); the gradients of a training step (randomly weighted sum of the
  first output, dropout off) against float64 eager's, next to eager f32's distance from them
  (``grad_error``), and the buffers it updates (batch norms' running statistics);
- bf16 inference: kiln's error against the f32 result no more than twice eager bf16's (plus a
  small floor);
- ``mode="reduce-overhead"`` inference outputs;
- three decoders at four sequence lengths with padding (one symbolic graph after the first);
- no kiln part falls back to torch anywhere.

Then times inference at a realistic size (hidden 768, 4 layers, batch 8, sequence 256 / 224x224
images) for a few families: eager, Inductor and kiln in the same process, interleaved rounds,
median of CUDA-event timings.

    KILND=... tests/gpu/with_pack.sh PACK python3 tests/gpu/models_gpu.py [--models a,b] [--no-timing]

Writes $OUT/models_gpu.md; exits 1 when a check fails.
"""
from __future__ import annotations

import argparse
import copy
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "python"))

import kiln.torch as kt  # noqa: E402
from gpu_common import interleaved_ms, kilnd_binary, local_client, report  # noqa: E402
from model_zoo import MODELS, build, inputs, tensors  # noqa: E402


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    if want.numel() == 0:
        return 0.0 if got.shape == want.shape else float("inf")
    return ((got.float() - want.float()).abs().max() / (1.0 + want.float().abs().max())).item()


def kiln_ran() -> int:
    """Part calls that ran kiln's kernels so far (directly or replayed in a CUDA graph)."""
    s = kt.stats()
    return s["kernel_calls"] + s["graph_replays"]


def compile_kiln(model: torch.nn.Module, client: Any, mode: str | None = None) -> Callable[..., Any]:
    # torch.compile takes a mode or options, not both: a mode goes through kiln's backend factory.
    if mode is not None:
        return torch.compile(model, backend=kt.backend(mode=mode, client=client))
    return torch.compile(model, backend="kiln", options={"client": client})


Maker = Callable[[Optional[torch.dtype]], tuple[torch.nn.Module, dict[str, torch.Tensor]]]


def zoo_maker(name: str, device: str = "cuda") -> Maker:
    """A model of tests/python/model_zoo.py and its inputs, in f32 or the dtype asked."""
    return lambda dtype: (build(name, device, dtype), inputs(name, device=device, dtype=dtype or torch.float32))


def training_step(model: torch.nn.Module, fn: Callable[..., Any], x: dict[str, torch.Tensor]
                  ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``fn(**x)`` (``model`` or a compiled form of it) and the backward of a randomly weighted
    sum of its first output: the parameters' gradients (then cleared) and the buffers after."""
    out = tensors(fn(**x))[0]
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(out.device, out.dtype)
    (out * weights).sum().backward()
    grads = {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads, {k: b.detach().clone() for k, b in model.named_buffers()}


def grad_error(grads: dict[str, torch.Tensor], exact: dict[str, torch.Tensor]) -> float:
    """The distance of all gradients from the float64 ones, over the float64 ones' norm.

    Not an element's worst error: a ReLU whose input lies within rounding of zero passes or
    stops that element's gradient depending on the last bits of the forward, and behind a
    batch norm of a narrow channel (its 1/std large) that one element moves the gradients of
    every layer before it. Any two f32 computations of a deep ReLU network differ that way
    (eager f32 against float64 eager: 1.2e-2 on a ResNeXt-50 at batch 4, 64x64, on the CPU);
    so the check compares with eager's own distance from float64."""
    num = sum(float(((grads[k].double() - v) ** 2).sum()) for k, v in exact.items() if k in grads)
    den = sum(float((v ** 2).sum()) for v in exact.values())
    return (num / den) ** 0.5 if den else 0.0


def check_model(name: str, client: Any, failures: list[str], make: Optional[Maker] = None,
                tol: float = 1e-4, grad_tol: float = 1e-4) -> list[str]:
    """One model's checks (the module docstring's list but the lengths) against eager; ``make``
    builds the model in eval mode with dropout off, and its inputs (default: the model zoo's).
    Gradients fail above ``grad_tol`` and four times eager's distance from float64
    (:func:`grad_error`); outputs and running statistics above ``tol`` of eager's."""
    make = make or zoo_maker(name)
    torch._dynamo.reset()
    kt.reset_stats()
    model, x = make(None)
    # Each check below compares eager with eager unless kiln ran in it: the phases whose kiln
    # run called no kiln kernel.
    idle: list[str] = []
    ran = kiln_ran()
    with torch.no_grad():
        want = tensors(model(**x))
        got = tensors(compile_kiln(model, client)(**x))
    fwd = max(rel_err(g, w) for g, w in zip(got, want))
    if kiln_ran() == ran:
        idle.append("f32 inference")

    # A training step: kiln's and eager's gradients against float64 eager's, and the running
    # statistics it updates against eager's. Every step starts from the weights and statistics
    # of the start (the later checks too).
    state = copy.deepcopy(model.state_dict())
    model.train()
    torch._dynamo.reset()
    ran = kiln_ran()
    kiln_grads, kiln_stats = training_step(model, compile_kiln(model, client), x)
    if kiln_ran() == ran:
        idle.append("training step")
    model.load_state_dict(state)
    eager_grads, eager_stats = training_step(model, model, x)
    model64 = copy.deepcopy(model).double()
    model64.load_state_dict(state)
    exact, _ = training_step(model64, model64, {k: v.double() if v.is_floating_point() else v for k, v in x.items()})
    del model64
    missing = set(eager_grads) - set(kiln_grads)
    grad, eager_grad = grad_error(kiln_grads, exact), grad_error(eager_grads, exact)
    stats = max((rel_err(kiln_stats[k], v) for k, v in eager_stats.items()), default=0.0)
    model.eval()
    model.load_state_dict(state)

    # bf16 inference against the f32 result.
    torch._dynamo.reset()
    mb, xb = make(torch.bfloat16)
    with torch.no_grad():
        ref = tensors(model(**x))[0]
        eager_bf = rel_err(tensors(mb(**xb))[0], ref)
        ran = kiln_ran()
        kiln_bf = rel_err(tensors(compile_kiln(mb, client)(**xb))[0], ref)
        if kiln_ran() == ran:
            idle.append("bf16 inference")

    # reduce-overhead inference (CUDA graphs), three calls.
    torch._dynamo.reset()
    ro = compile_kiln(model, client, "reduce-overhead")
    ran = kiln_ran()
    with torch.no_grad():
        for _ in range(3):
            got_ro = tensors(ro(**x))
    if kiln_ran() == ran:
        idle.append("reduce-overhead inference")
    ro_err = max(rel_err(g, w) for g, w in zip(got_ro, want))

    s = kt.stats()
    if fwd > tol:
        failures.append(f"{name}: inference error {fwd:.2e}")
    if grad > max(4 * eager_grad, grad_tol) or missing:
        failures.append(f"{name}: gradient error {grad:.2e} (eager's {eager_grad:.2e}), missing {sorted(missing)}")
    if stats > tol:
        failures.append(f"{name}: running statistics error {stats:.2e}")
    if kiln_bf > 2 * eager_bf + 4e-3:
        failures.append(f"{name}: bf16 error {kiln_bf:.2e} against eager bf16's {eager_bf:.2e}")
    if ro_err > tol:
        failures.append(f"{name}: reduce-overhead error {ro_err:.2e}")
    if s["failed"]:
        failures.append(f"{name}: {s['failed']} kiln parts fell back to torch")
    if s["compiled"] == 0 or idle:
        failures.append(f"{name}: no kiln part compiled ({s['compiled']} compiles) or ran in "
                        f"{', '.join(idle) or '-'} (those checks compared eager with eager)")
    return [name, f"{fwd:.1e}", f"{grad:.1e} / {eager_grad:.1e}; {stats:.1e}", f"{kiln_bf:.1e} / {eager_bf:.1e}", f"{ro_err:.1e}",
            str(s["compiled"]), str(s["failed"])]


# The columns of check_model's rows and of time_models' rows.
CHECK_COLUMNS = ["model", "f32 inference err", "grad err vs f64 kiln / eager; stats err", "bf16 err kiln / eager",
                 "reduce-overhead err", "parts", "fallbacks"]
TIMING_COLUMNS = ["model", "eager", "Inductor", "kiln", "kiln / Inductor", "kiln / eager", "Inductor first s",
                  "kiln first s", "parts", "fallbacks"]


def check_lengths(name: str, client: Any, failures: list[str]) -> list[str]:
    """Four lengths with padding: kiln's graphs against the graphs Dynamo alone makes (a
    backend that runs them as traced), so a recompile kiln causes is told from one the model's
    Python causes."""
    model = build(name, "cuda")
    traced = 0

    def dynamo_only(gm: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
        nonlocal traced
        traced += 1
        return gm.forward

    worst = 0.0
    for backend in ("dynamo", "kiln"):
        torch._dynamo.reset()
        kt.reset_stats()
        compiled = compile_kiln(model, client) if backend == "kiln" else torch.compile(model, backend=dynamo_only)
        ran = kiln_ran()
        with torch.no_grad():
            for length in (24, 17, 31, 9):
                x = inputs(name, length, device="cuda")
                mask = torch.ones_like(x["input_ids"])
                mask[1, length // 2:] = 0
                want = tensors(model(**x, attention_mask=mask))
                got = tensors(compiled(**x, attention_mask=mask))
                worst = max(worst, max(rel_err(g, w) for g, w in zip(got, want)))
    s = kt.stats()
    # kiln compiles an inference graph as one graph; Dynamo's count is per frame as well. The
    # last loop was kiln's: without a kiln graph and kernel calls it compared eager with eager.
    if worst > 1e-4 or s["failed"] or s["graphs"] > traced or s["graphs"] == 0 or kiln_ran() == ran:
        failures.append(f"{name} at four lengths: error {worst:.2e}, {s['graphs']} kiln graphs against "
                        f"Dynamo's {traced}, {s['failed']} fallbacks, {kiln_ran() - ran} kiln part calls")
    return [f"{name}, lengths 24/17/31/9", f"{worst:.1e}", f"{s['graphs']} graphs (Dynamo alone: {traced})",
            str(s["failed"])]


# ------------------------------------------------------------------------------------- timing

TIMED = {
    "bert": dict(hidden_size=768, num_hidden_layers=4, num_attention_heads=12, intermediate_size=3072, vocab_size=30522),
    "gpt2": dict(n_embd=768, n_layer=4, n_head=12, vocab_size=50257),
    "llama": dict(hidden_size=768, num_hidden_layers=4, num_attention_heads=12, num_key_value_heads=4,
                  intermediate_size=2048, vocab_size=32000),
    "t5": dict(d_model=768, d_ff=3072, num_layers=4, num_heads=12, d_kv=64, vocab_size=32128),
    "vit": dict(hidden_size=768, num_hidden_layers=4, num_attention_heads=12, intermediate_size=3072, image_size=224,
                patch_size=16),
    "convnext": dict(hidden_sizes=[96, 192, 384, 768], depths=[1, 1, 3, 1], image_size=224),
}


def timed_model(name: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    import transformers

    model_cls, config_cls, _, kind = MODELS[name]
    config = getattr(transformers, config_cls)(**TIMED[name])
    for key, value in list(vars(config).items()):
        if isinstance(value, float) and ("dropout" in key or key.endswith("_pdrop")):
            setattr(config, key, 0.0)
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).eval().cuda()
    gen = torch.Generator().manual_seed(1)
    if kind.startswith("image"):
        x = {"pixel_values": torch.randn(8, 3, 224, 224, generator=gen).cuda()}
    else:
        x = {"input_ids": torch.randint(0, config.vocab_size, (8, 256), generator=gen).cuda()}
        if kind == "seq2seq":
            x["decoder_input_ids"] = torch.randint(0, config.vocab_size, (8, 64), generator=gen).cuda()
    return model, x


def time_models(names: list[str], client: Any, rounds: int, iters: int,
                model_for: Callable[[str], tuple[torch.nn.Module, dict[str, torch.Tensor]]] = timed_model
                ) -> list[list[str]]:
    """Inference of each model (``model_for(name)``: the model in eval mode and its inputs):
    eager, Inductor and kiln in interleaved rounds, medians of CUDA-event timings."""
    rows = []
    for name in names:
        torch._dynamo.reset()
        kt.reset_stats()
        model, x = model_for(name)
        fns = {"eager": model}
        first: dict[str, float] = {}
        with torch.no_grad():
            for label, make in (("Inductor", lambda: torch.compile(model)), ("kiln", lambda: compile_kiln(model, client))):
                t0 = time.perf_counter()
                f = make()
                f(**x)
                torch.cuda.synchronize()
                first[label] = time.perf_counter() - t0
                fns[label] = f
            # The native part runner is built by kilnd on a process's first graph (its memo is
            # per cache folder): until it is loaded, parts are called through Python, and its
            # build competes for the host. Steady state is timed with it loaded.
            kt.wait()
            for f in fns.values():  # warm
                for _ in range(3):
                    f(**x)
            med = interleaved_ms({k: lambda r, f=f, x=x: f(**x) for k, f in fns.items()}, rounds, iters)
        s = kt.stats()
        rows.append([name, f"{med['eager']:.3f}", f"{med['Inductor']:.3f}", f"{med['kiln']:.3f}",
                     f"{med['kiln'] / med['Inductor']:.3f}", f"{med['kiln'] / med['eager']:.3f}",
                     f"{first['Inductor']:.1f}", f"{first['kiln']:.1f}", str(s["compiled"]), str(s["failed"])])
        print(" | ".join(rows[-1]), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--timed", default=",".join(TIMED))
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=10)
    opts = ap.parse_args()
    binary = kilnd_binary("models_gpu.py")
    if binary is None:
        return 2
    failures: list[str] = []
    rows: list[list[str]] = []
    warnings.simplefilter("ignore", UserWarning)
    # The checks compare f32 results: cuDNN's convolutions default to TF32 (10-bit mantissas),
    # and a convolution kiln hands torch channels-last may take another algorithm than eager's
    # (ViT's patch embedding differed by 2.7e-4 of the output's scale with TF32 on).
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    with local_client(binary, "kiln-models-") as client:
        for name in opts.models.split(","):
            try:
                rows.append(check_model(name, client, failures))
            except Exception as e:  # a crash is a failure of that model, the others still run
                failures.append(f"{name}: {type(e).__name__}: {str(e)[:300]}")
                rows.append([name, "error", "", "", "", "", ""])
            print(" | ".join(rows[-1]), flush=True)
        length_rows = [check_lengths(n, client, failures) for n in ("gpt2", "llama", "bart")]
        torch.backends.cudnn.allow_tf32 = True  # torch's defaults for the timings
        timing = [] if opts.no_timing else time_models(opts.timed.split(","), client, opts.rounds, opts.iters)
    rows += [[r[0], r[1], "", "", "", r[2], r[3]] for r in length_rows]
    if not rows:
        failures.append("no model was checked")
    status = report("Hugging Face models through kiln", CHECK_COLUMNS, rows, failures, "All checks passed.",
                    "models_gpu.md")
    if timing:
        report("Inference at hidden 768, 4 layers, batch 8, sequence 256 / 224x224 (ms, median)", TIMING_COLUMNS,
               timing, [], "", "models_gpu_timing.md")
    return status


if __name__ == "__main__":
    sys.exit(main())
