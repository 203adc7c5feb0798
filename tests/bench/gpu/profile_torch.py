#!/usr/bin/env python3
"""Where kiln.torch spends a step on an NVIDIA GPU, beside eager and Inductor.

For each workload it measures the steady-state step time of eager, Inductor and
``backend="kiln"`` (median of CUDA-event timings over the same inputs), then profiles a few
kiln steps and a few Inductor steps with ``torch.profiler`` and reports, per step:

- GPU kernel time and launches, split into kiln's kernels (the names in the parts' launch
  plans) and everything else (cuBLAS/cuDNN, torch's own kernels);
- host time: the step's wall time, and the time spent inside kiln parts' Python call path
  (``KilnPart.forward``), with the number of part calls;
- layout copies and allocations torch recorded (``aten::copy_``, ``aten::clone``,
  ``aten::contiguous``, ``aten::empty*``) and driver launches (``cuLaunchKernel``);
- parts compiled, parts that fell back to torch, and ATen nodes placed in kiln vs torch.

Workloads: Hugging Face ``BertModel(BertConfig())`` (BERT-base, random weights, nothing
downloaded) at batch 16, sequence 128, inference under ``no_grad`` and a training step with
AdamW, and inference at sequence length 64, compiled for it (``bert_infer64``) or after
lengths 128 and 96 made the length symbolic (``bert_infer_dyn64``; ``bert_infer_dyn37`` after
128, 96, 64 and 200); layer_norm -> gelu forward+backward on f32[32768, 4096];
torch_backend_gpu.py's encoder block, LLTM cell (``encoder_infer``, ``encoder_train``,
``lltm_infer``, ``lltm_train``) and resnet18 (inference, and ``resnet18_train``: a training step);
models_gpu.py's timed Hugging Face models, inference (``llama_infer``, ``gpt2_infer``,
``t5_infer``, ``convnext_infer``).

``--interleave`` keeps every backend's compiled function side by side and times them in rounds
of one step each (the order rotating), so that drift of a shared host falls on all columns
alike; without it each backend is timed after the other.

    KILND=path/to/kilnd PYTHONPATH=client/python python3 tests/bench/gpu/profile_torch.py [--workloads ...]
        [--mode reduce-overhead]   # both backends in that torch.compile mode (CUDA graphs)

Writes ``$OUT/profile_torch.md`` and ``$OUT/profile_torch.json`` when ``OUT`` is set.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "gpu"))  # tests/gpu: the checks' workloads
from gpu_common import host_ms, interleaved_ms, median_ms, private_kilnd  # noqa: E402


def bert_workload(train: bool, seq: int = 128, warm: tuple[int, ...] = (),
                  mask: bool = True) -> tuple[Callable[[int], Any], list[torch.nn.Module]]:
    """Steps at sequence length ``seq``; the compiled model first sees the lengths ``warm``
    (128 then 96: torch's automatic dynamic shapes make the length symbolic). ``mask``: an
    attention mask of ones is passed (else none, as ``bert_lengths_gpu.py`` calls it)."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(BertConfig()).cuda()
    model.train(train)
    ids = [torch.randint(0, 30522, (16, seq), device="cuda") for _ in range(3)]
    masks = {"attention_mask": torch.ones(16, seq, dtype=torch.long, device="cuda")} if mask else {}
    weight = torch.randn(16, seq, 768, device="cuda")

    def make(backend: str | None) -> Callable[[int], Any]:
        fn = model if backend is None else torch.compile(model, backend=backend, mode=MODE)
        if backend is not None:
            with torch.no_grad():
                for t in warm:
                    fn(input_ids=torch.randint(0, 30522, (16, t), device="cuda"),
                       **({"attention_mask": torch.ones(16, t, dtype=torch.long, device="cuda")} if mask else {}))
        if not train:
            def step(i: int) -> Any:
                with torch.no_grad():
                    return fn(input_ids=ids[i % 3], **masks).last_hidden_state
            return step
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

        def train_step(i: int) -> Any:
            opt.zero_grad(set_to_none=True)
            out = fn(input_ids=ids[i % 3], **masks).last_hidden_state
            (out * weight).sum().backward()
            opt.step()
            return out
        return train_step
    return make, [model]


def ln_gelu_workload() -> tuple[Callable[[str | None], Callable[[int], Any]], list[torch.nn.Module]]:
    torch.manual_seed(0)
    xs = [torch.randn(32768, 4096, device="cuda", requires_grad=True) for _ in range(2)]
    w = torch.randn(4096, device="cuda", requires_grad=True)
    b = torch.randn(4096, device="cuda", requires_grad=True)
    g = torch.randn(32768, 4096, device="cuda")

    def f(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(torch.nn.functional.layer_norm(x, (4096,), w, b))

    def make(backend: str | None) -> Callable[[int], Any]:
        fn = f if backend is None else torch.compile(f, backend=backend, mode=MODE)

        def step(i: int) -> Any:
            out = fn(xs[i % 2], w, b)
            out.backward(g)
            return out
        return step
    return make, []


def example_workload(name: str, train: bool) -> tuple[Callable[[str | None], Callable[[int], Any]], list[torch.nn.Module]]:
    """torch_backend_gpu.py's workload ``name`` (``encoder``: the transformer encoder block,
    B16 T512 C768; ``lltm``: the LLTM cell, batch 4096; ``resnet18``: batch 16, inference only):
    inference under ``no_grad``, or (``train``) forward+backward with the loss a random
    weighting of the outputs."""
    from torch_backend_gpu import fn_and_args, workloads

    fn0, args = fn_and_args(name, workloads(quick=False)[name], seed=0, grad=train)
    with torch.no_grad():
        out = fn0(*args)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    weights = [torch.randn_like(o) for o in outs]

    def make(backend: str | None) -> Callable[[int], Any]:
        fn = fn0 if backend is None else torch.compile(fn0, backend=backend, mode=MODE)

        def step(i: int) -> Any:
            if not train:
                with torch.no_grad():
                    return fn(*args)
            r = fn(*args)
            rs = r if isinstance(r, (tuple, list)) else (r,)
            sum((o * wt).sum() for o, wt in zip(rs, weights)).backward()
            return r
        return step
    return make, []


def resnet18_train_workload() -> tuple[Callable[[str | None], Callable[[int], Any]], list[torch.nn.Module]]:
    """torchvision's resnet18 in training mode (batch statistics), batch 16, 224x224: forward and
    backward of a random weighting of the logits (the gradients cleared before each step; no
    optimizer: its update runs outside the compiled graphs for every backend alike)."""
    from torch_backend_gpu import resnet18_input, resnet18_model

    model = resnet18_model().train()
    x = resnet18_input(0)[0]
    weights = torch.randn(16, 1000, device="cuda")

    def make(backend: str | None) -> Callable[[int], Any]:
        fn = model if backend is None else torch.compile(model, backend=backend, mode=MODE)

        def step(i: int) -> Any:
            model.zero_grad(set_to_none=True)
            r = fn(x)
            (r * weights).sum().backward()
            return r
        return step
    return make, [model]


def hf_workload(name: str) -> tuple[Callable[[str | None], Callable[[int], Any]], list[torch.nn.Module]]:
    """Inference under ``no_grad`` of models_gpu.py's timed configuration of ``name``."""
    from models_gpu import timed_model

    model, x = timed_model(name)
    return inference_workload(model, lambda fn: fn(**x)[0])


def inference_workload(model: torch.nn.Module, run: Callable[[Callable[..., Any]], Any]
                       ) -> tuple[Callable[[str | None], Callable[[int], Any]], list[torch.nn.Module]]:
    """Steps of ``run(fn)`` under ``no_grad``, ``fn`` being ``model`` or its compiled form."""
    def make(backend: str | None) -> Callable[[int], Any]:
        fn = model if backend is None else torch.compile(model, backend=backend, mode=MODE)

        def step(i: int) -> Any:
            with torch.no_grad():
                return run(fn)
        return step
    return make, [model]


def vision_workload(name: str) -> tuple[Callable[[str | None], Callable[[int], Any]], list[torch.nn.Module]]:
    """Inference under ``no_grad`` of vision_gpu.py's torchvision model ``name`` at batch 16,
    224x224 (``--workloads tv_NAME``)."""
    from vision_gpu import build, images

    x = images(name, "cuda", 16, 224)["x"]
    return inference_workload(build(name, "cuda", side=224), lambda fn: fn(x))


# torch.compile's mode for both backends (``--mode``; None: the default mode).
MODE: str | None = None

WORKLOADS = {
    "bert_infer": lambda: bert_workload(train=False),
    "bert_train": lambda: bert_workload(train=True),
    "bert_infer64": lambda: bert_workload(train=False, seq=64),
    "bert_infer_dyn64": lambda: bert_workload(train=False, seq=64, warm=(128, 96)),
    "bert_infer_dyn37": lambda: bert_workload(train=False, seq=37, warm=(128, 96, 64, 200)),
    "bert_nomask_dyn37": lambda: bert_workload(train=False, seq=37, warm=(128, 96, 64, 200), mask=False),
    "ln_gelu_train": ln_gelu_workload,
    "encoder_train": lambda: example_workload("encoder", train=True),
    "lltm_train": lambda: example_workload("lltm", train=True),
    "encoder_infer": lambda: example_workload("encoder", train=False),
    "lltm_infer": lambda: example_workload("lltm", train=False),
    "resnet18": lambda: example_workload("resnet18", train=False),
    "resnet18_train": resnet18_train_workload,
    # models_gpu.py's timed Hugging Face models (hidden 768, 4 layers, batch 8, sequence 256).
    "llama_infer": lambda: hf_workload("llama"),
    "gpt2_infer": lambda: hf_workload("gpt2"),
    "t5_infer": lambda: hf_workload("t5"),
    "convnext_infer": lambda: hf_workload("convnext"),
}


_PARTS: list[Any] = []
TOP_KERNELS = 12  # --top


def track_parts() -> None:
    """Remembers every KilnPart built from now on (the compiled graphs hold them)."""
    from kiln.torch.runtime import KilnPart

    init = KilnPart.__init__

    def tracked(self: Any, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        _PARTS.append(self)

    KilnPart.__init__ = tracked  # type: ignore[method-assign]


def kiln_parts() -> list[Any]:
    return list(_PARTS)


def kiln_kernel_names() -> set[str]:
    names: set[str] = set()
    for p in kiln_parts():
        if p.compiled is not None:
            for s in getattr(p.compiled.plan, "steps", []):
                names.add(s.kernel)
    return names


def profile_steps(step: Callable[[int], Any], steps: int, kiln_names: set[str]) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    from kiln.torch.runtime import KilnPart

    part_calls: list[float] = []
    orig = KilnPart.forward

    def timed(self: Any, *a: Any) -> Any:
        t0 = time.perf_counter()
        r = orig(self, *a)
        part_calls.append(time.perf_counter() - t0)
        return r

    KilnPart.forward = timed  # type: ignore[method-assign]
    KilnPart.__call__ = timed  # type: ignore[method-assign]  (parts are called through __call__)
    try:
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            for i in range(steps):
                step(i)
            torch.cuda.synchronize()
            wall = (time.perf_counter() - t0) / steps
    finally:
        KilnPart.forward = orig  # type: ignore[method-assign]
        KilnPart.__call__ = orig  # type: ignore[method-assign]
    kern = collections.Counter()
    kern_ms = collections.Counter()
    per_kernel = collections.Counter()
    cpu_ops = collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            is_kiln = e.name in kiln_names
            if "memcpy" in e.name.lower() or "memset" in e.name.lower():
                kind = "memcpy/memset"
            else:
                kind = "kiln" if is_kiln else "torch"
            kern[kind] += 1
            ms = e.device_time / 1000.0 if hasattr(e, "device_time") else e.cuda_time / 1000.0
            kern_ms[kind] += ms
            per_kernel[("kiln " if is_kiln else "") + e.name[:90]] += ms
        elif e.name in ("aten::copy_", "aten::clone", "aten::contiguous", "aten::empty", "aten::empty_strided",
                        "cuLaunchKernel", "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaMemcpyAsync",
                        "aten::to", "aten::_to_copy"):
            cpu_ops[e.name] += 1
    return {
        "wall_ms": wall * 1000,
        "gpu_ms": {k: v / steps for k, v in kern_ms.items()},
        "launches": {k: v / steps for k, v in kern.items()},
        "cpu_ops": {k: v / steps for k, v in cpu_ops.items()},
        "top_kernels": [(k, v / steps) for k, v in per_kernel.most_common(TOP_KERNELS)],
        "part_calls": len(part_calls) / steps,
        "part_host_ms": sum(part_calls) * 1000 / steps,
        "part_call_us_median": statistics.median(part_calls) * 1e6 if part_calls else 0.0,
    }


def part_gpu_times(step: Callable[[int], Any], steps: int) -> list[tuple[float, Any]]:
    """GPU ms per step of each kiln part (CUDA events around its calls: in a GPU-bound step the
    events wait behind earlier work, so each pair brackets the part's own kernels), largest
    first, with the part."""
    from kiln.torch.runtime import KilnPart

    pending: list[tuple[Any, Any, Any]] = []
    orig = KilnPart.__call__

    def timed(self: Any, *a: Any) -> Any:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        r = orig(self, *a)
        end.record()
        pending.append((self, start, end))
        return r

    KilnPart.__call__ = timed  # type: ignore[method-assign]
    try:
        for i in range(steps):
            step(i)
        torch.cuda.synchronize()
    finally:
        KilnPart.__call__ = orig  # type: ignore[method-assign]
    per: dict[int, list[Any]] = {}
    for part, start, end in pending:
        per.setdefault(id(part), [0.0, part])[0] += start.elapsed_time(end) / steps
    return sorted(((ms, part) for ms, part in per.values()), key=lambda t: -t[0])


def part_lines(parts: list[tuple[float, Any]], top: int) -> list[str]:
    lines = ["kiln parts by GPU time per step (ms; ops; each kernel's strategy):", ""]
    for ms, p in parts[:top]:
        strategies = []
        if p.compiled is not None:
            try:
                strategies = [ln for ln in p.compiled.fusion_report().splitlines() if ln.startswith("cuda ")]
            except Exception as e:  # diagnostics only
                strategies = [f"(no report: {e})"]
        lines.append(f"- {ms:.3f} {p.part_name}: {' '.join(o for o in p.ops if o != '<built-in function getitem>')}")
        lines += [f"  - {st[:160]}" for st in strategies]
    lines.append("")
    return lines


def python_profile(step: Callable[[int], Any], steps: int) -> str:
    """The Python functions a kiln step spends its host time in (cProfile, top 30 by own time)."""
    import cProfile
    import io
    import pstats

    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for i in range(steps):
        step(i)
    torch.cuda.synchronize()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(30)
    return buf.getvalue()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--profile-steps", type=int, default=5)
    ap.add_argument("--tuned", action="store_true",
                    help="also time kiln with autotune=True (each part's variants timed on its first call)")
    ap.add_argument("--mode", default=None, help='torch.compile mode for kiln and Inductor, e.g. "reduce-overhead"')
    ap.add_argument("--top", type=int, default=12, help="kernels listed per step and backend")
    ap.add_argument("--no-py", action="store_true", help="skip the kiln row with Python part calls")
    ap.add_argument("--interleave", action="store_true",
                    help="time the backends in interleaved rounds (one compiled function per backend, "
                         "kept side by side) instead of one after the other")
    ap.add_argument("--part-times", action="store_true",
                    help="time each kiln part's kernels (CUDA events around its calls) and list the largest")
    ap.add_argument("--cprofile", action="store_true",
                    help="also run cProfile over kiln's and Inductor's steps and print the top Python functions")
    ap.add_argument("--host", action="store_true",
                    help="also measure each backend's host time per step with the GPU kept busy (host_ms)")
    opts = ap.parse_args()
    global MODE, TOP_KERNELS
    MODE = opts.mode
    TOP_KERNELS = opts.top
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 1
    daemon, _ = private_kilnd("profile_torch.py", "kiln-profile-")
    import kiln.torch
    from kiln.torch import native
    from kiln.torch import counters
    from kiln.torch import runtime as R

    track_parts()
    # The native part runner, built by this kilnd before any timing (kiln's first-call times
    # below then include loading it from the local cache, not building it).
    t0 = time.perf_counter()
    native.start(kiln.Client(daemon.address))
    if not native.wait():  # a kilnd without a working sandbox here: build it on this machine
        print(f"native part runner not built by kilnd ({native.ERROR}); building it here", flush=True)
        os.environ["KILN_TORCH_NATIVE"] = "local"
        native.RUNNER = native.build(None)
    print(f"native part runner loaded ({time.perf_counter() - t0:.1f} s)", flush=True)

    results: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": {}}
    lines = [f"# kiln.torch profile on {results['device']}, torch {torch.__version__}, mode {MODE or 'default'}", ""]
    try:
        for name in opts.workloads.split(","):
            make, _ = vision_workload(name[3:]) if name.startswith("tv_") else WORKLOADS[name]()
            row: dict[str, Any] = {}
            labels = (("eager", "inductor", "kiln") + (() if opts.no_py else ("kiln-py",))
                      + (("kiln-tuned",) if opts.tuned else ()))
            steps: dict[str, Callable[[int], Any]] = {}
            for label in labels:
                # kiln-tuned: kiln with every part's kernel variants timed on its first call.
                backend = {"eager": None, "kiln-py": "kiln",
                           "kiln-tuned": kiln.torch.backend(autotune=True)}.get(label, label)
                # kiln-py: kiln with its parts called through Python (no native part runner).
                os.environ["KILN_TORCH_NATIVE"] = "0" if label == "kiln-py" else "1"
                if not opts.interleave or not steps:  # interleaved: every backend's code kept
                    torch._dynamo.reset()
                counters.reset_stats()
                _PARTS.clear()
                t0 = time.perf_counter()
                step = steps[label] = make(backend)
                step(0)
                torch.cuda.synchronize()
                first = time.perf_counter() - t0
                if backend is not None and backend != "inductor":
                    kiln.torch.wait()
                ms = median_ms(step, opts.iters, warmup=3)
                row[label] = {"median_ms": ms, "first_s": first}
                if label == "kiln-tuned":
                    row[label]["stats"] = R.STATS.as_dict()
                    print(f"{name} {label}: {ms:.3f} ms (first call {first:.1f} s; "
                          f"{row[label]['stats']['tuned']} parts tuned, {row[label]['stats']['retuned']} "
                          f"not on the default variant)", flush=True)
                    continue
                if label == "kiln-py":
                    row["kiln-py"]["profile"] = profile_steps(step, opts.profile_steps, kiln_kernel_names())
                    print(f"{name} {label}: {ms:.3f} ms", flush=True)
                    continue
                if backend == "kiln":
                    row["kiln_stats"] = R.STATS.as_dict()
                    parts = kiln_parts()
                    row["kiln_parts"] = [{"name": p.part_name, "ops": p.ops, "kiln": p.kernel is not None,
                                          "native": p._native is not None, "error": p.error} for p in parts]
                if backend in ("kiln", "inductor") and opts.cprofile:
                    row[label]["cprofile"] = python_profile(step, opts.profile_steps)
                    print(f"{name} {label} cProfile:\n{row[label]['cprofile']}", flush=True)
                if opts.host:
                    per_round = 1 if name.endswith("train") else 4
                    row[label]["host_ms"], ok = host_ms(step, per_round)
                    print(f"{name} {label}: host {row[label]['host_ms']:.3f} ms per step"
                          f"{'' if ok else ' (the GPU caught up: includes waiting)'}", flush=True)
                if backend is not None:
                    names = kiln_kernel_names() if backend == "kiln" else set()
                    row[label]["profile"] = profile_steps(step, opts.profile_steps, names)
                if backend == "kiln" and opts.part_times:
                    row["part_lines"] = part_lines(part_gpu_times(step, opts.profile_steps), opts.top)
                print(f"{name} {label}: {ms:.3f} ms (first call {first:.1f} s)", flush=True)
            if opts.interleave:
                for label, ms in interleaved_ms(steps, opts.iters, rotate=True).items():
                    row[label]["sequential_ms"] = row[label]["median_ms"]
                    row[label]["median_ms"] = ms
                    print(f"{name} {label}: {ms:.3f} ms interleaved", flush=True)
            steps.clear()
            results["rows"][name] = row
            e, i, k = row["eager"]["median_ms"], row["inductor"]["median_ms"], row["kiln"]["median_ms"]
            if "kiln-py" not in row:  # --no-py: that column repeats kiln's
                row["kiln-py"] = {"median_ms": float("nan"), "profile": row["kiln"]["profile"]}
            kp = row["kiln-py"]["median_ms"]
            st = row["kiln_stats"]
            pk, pi, pp = row["kiln"]["profile"], row["inductor"]["profile"], row["kiln-py"]["profile"]
            n_native = sum(1 for p in row["kiln_parts"] if p["native"])
            lines += [f"## {name}", "",
                      f"steady state{' (interleaved rounds)' if opts.interleave else ''}: eager {e:.3f} ms, "
                      f"Inductor {i:.3f} ms, kiln {k:.3f} ms "
                      f"(kiln/Inductor {k / i:.2f}, kiln/eager {k / e:.2f}); kiln through Python part calls "
                      f"{kp:.3f} ms ({kp / i:.2f})" + (
                          f"; kiln tuned (autotune=True) {row['kiln-tuned']['median_ms']:.3f} ms "
                          f"(tuned/kiln {row['kiln-tuned']['median_ms'] / k:.3f}; "
                          f"{row['kiln-tuned']['stats']['retuned']} of {row['kiln-tuned']['stats']['tuned']} "
                          f"parts off the default variant)" if "kiln-tuned" in row else ""), "",
                      f"kiln parts: {st['parts']} ({st['compiled']} compiled, {st['failed']} fell back, "
                      f"{n_native} native); ATen nodes in kiln {st['kiln_nodes']}, in torch {st['torch_nodes']}; "
                      f"native runner: {'loaded' if native.RUNNER is not None else native.ERROR}", "",
                      "| per step | Inductor | kiln | kiln, Python part calls |", "| --- | ---: | ---: | ---: |",
                      f"| wall ms (profiled) | {pi['wall_ms']:.3f} | {pk['wall_ms']:.3f} | {pp['wall_ms']:.3f} |"]
            kinds = sorted(set(pi["gpu_ms"]) | set(pk["gpu_ms"]))
            for kd in kinds:
                lines.append(f"| GPU ms, {kd} kernels | {pi['gpu_ms'].get(kd, 0):.3f} | {pk['gpu_ms'].get(kd, 0):.3f} |")
                lines.append(f"| launches, {kd} | {pi['launches'].get(kd, 0):.1f} | {pk['launches'].get(kd, 0):.1f} |")
            ops = sorted(set(pi["cpu_ops"]) | set(pk["cpu_ops"]))
            for op in ops:
                lines.append(f"| {op} calls | {pi['cpu_ops'].get(op, 0):.1f} | {pk['cpu_ops'].get(op, 0):.1f} |")
            if "host_ms" in row["kiln"]:
                lines.append(f"| host ms per step, GPU kept busy (eager {row['eager']['host_ms']:.3f}) | "
                             f"{row['inductor']['host_ms']:.3f} | {row['kiln']['host_ms']:.3f} | |")
            lines.append(f"| kiln part calls | | {pk['part_calls']:.1f} | {pp['part_calls']:.1f} |")
            lines.append(f"| host ms inside kiln parts | | {pk['part_host_ms']:.3f} | {pp['part_host_ms']:.3f} |")
            lines.append(f"| host us per part call (median) | | {pk['part_call_us_median']:.1f} | "
                         f"{pp['part_call_us_median']:.1f} |")
            lines.append("")
            for label, prof in (("Inductor", pi), ("kiln", pk)):
                lines += [f"Top kernels per step, {label} (GPU ms):", ""]
                lines += [f"- {ms:.3f} {kname}" for kname, ms in prof["top_kernels"]]
                lines.append("")
            lines += row.get("part_lines", [])
            if name.startswith("ln_gelu"):  # small enough to show what kiln generated
                for p in kiln_parts():
                    if p.compiled is not None:
                        try:
                            rep = p.compiled.fusion_report()
                        except Exception as e:  # diagnostics only
                            rep = f"(no report: {e})"
                        lines += [f"Fusion report of {p.part_name}:", "", "```", rep.strip()[:3000], "```", ""]
            fell = [p for p in row["kiln_parts"] if not p["kiln"]]
            if fell:
                lines.append("fallbacks: " + "; ".join(f"{p['name']}: {p['error']}" for p in fell[:10]))
                lines.append("")
            del make
            gc.collect()
            torch.cuda.empty_cache()
    finally:
        daemon.stop()
    text = "\n".join(lines)
    print(text)
    out = os.environ.get("OUT")
    if out:
        Path(out, "profile_torch.md").write_text(text + "\n")
        Path(out, "profile_torch.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
