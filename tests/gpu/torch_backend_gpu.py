#!/usr/bin/env python3
"""The kiln torch.compile backend on an NVIDIA GPU: checks against eager, then benchmarks.

Checks (``backend="kiln"`` vs eager on CUDA tensors; outputs and gradients of a randomly
weighted loss, element by element within tolerance): ``x*sin(x) + cos(x)**2 - sin(x)`` forward
and backward (the check of the sin2+cos2 workload, whose own value and gradient are constant),
the LLTM cell forward and backward, torchvision's resnet18 inference at batch 16 (when torchvision is importable), a
transformer encoder block forward and backward, the k-means assignment step; and the same
sin/cos and encoder graphs under ``mode="reduce-overhead"`` (CUDA graphs). A check also says
how many kiln parts ran on the GPU and how many fell back to torch.

Benchmarks, against eager and the default backend (Inductor), same inputs:

- time to first result in a fresh process: cold (empty kiln daemon cache and local artifact
  cache; Inductor with empty caches) and warm (kiln's caches full; Inductor's caches warm);
- steady state: median per-call time from CUDA events over rotating inputs, for inference
  (``no_grad``) and, for the trainable workloads, a forward+backward step.

It starts its own kilnd from ``$KILND`` (a built binary) with a temporary cache and imports
kiln from ``PYTHONPATH``; it needs torch (with CUDA), numpy, grpcio and protobuf, and
torchvision for resnet18. Prints a table; with ``$OUT`` set also writes
``$OUT/torch_backend.md``. Exits 1 when a check does not match eager, or when any part kiln
claims fell back to torch (eager compared with eager proves nothing); ``--allow-fallback``
accepts fallbacks.

    KILND=build/server/kilnd PYTHONPATH=client/python python tests/gpu/torch_backend_gpu.py
    ... --quick        smaller sizes and fewer iterations
    ... --checks-only  no benchmarks
    ... --workloads sin2+cos2,kmeans --iters 20 --verbose
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import kilnd_binary, median_ms, private_kilnd  # noqa: E402


# ---------------------------------------------------------------------------------- workloads

def workloads(quick: bool) -> dict[str, dict[str, Any]]:
    """Name -> fn, make(seed) -> args, trainable, tolerance, and the sizes used."""
    from kiln.torch import examples as E

    dev = "cuda"
    n_sin = (1 << 22) if quick else (64 << 20)
    lltm = dict(batch=512, features=128, state=256) if quick else dict(batch=4096, features=256, state=1024)
    enc = dict(batch=4, seq=128, dim=256) if quick else dict(batch=16, seq=512, dim=768)
    heads = 4 if quick else 12
    km = (1 << 20) if quick else 20_000_000

    def encoder(*a: torch.Tensor) -> torch.Tensor:
        return E.encoder_block(*a, heads=heads)

    out: dict[str, dict[str, Any]] = {
        "sin2+cos2": dict(fn=E.sin2_cos2, check_fn=E.sin_cos_mix, make=lambda s: E.make_sin(n_sin, device=dev, seed=s),
                          trainable=True, tol=(1e-5, 1e-5), size=f"{n_sin} f32"),
        "lltm": dict(fn=E.lltm_cell, make=lambda s: E.make_lltm(**lltm, device=dev, seed=s), trainable=True,
                     tol=(1e-4, 1e-4), size=f"batch {lltm['batch']}, state {lltm['state']}"),
        "encoder": dict(fn=encoder, make=lambda s: E.make_encoder(**enc, device=dev, seed=s), trainable=True,
                        tol=(2e-3, 2e-3), size=f"B{enc['batch']} T{enc['seq']} C{enc['dim']} h{heads}"),
        "kmeans": dict(fn=E.kmeans_step, make=lambda s: E.make_kmeans(km, 8, device=dev, seed=s), trainable=False,
                       tol=None, size=f"{km} 2-D points, k=8"),
    }
    try:
        import torchvision  # noqa: F401

        out["resnet18"] = dict(fn=None, make=None, trainable=False, tol=(2e-3, 2e-3), size="batch 16, 224x224")
    except ImportError:
        pass
    try:
        import transformers  # noqa: F401

        out["bert"] = dict(fn=bert_base, make=bert_ids, trainable=False, tol=(2e-3, 2e-3),
                           size="BERT-base, batch 16, sequence 128")
    except ImportError:
        pass
    return out


_BERT: Optional[torch.nn.Module] = None


def bert_ids(seed: int) -> list[torch.Tensor]:
    """Token ids for :func:`bert_base`; builds the model first (outside any timing)."""
    global _BERT
    if _BERT is None:
        from transformers import BertConfig, BertModel

        torch.manual_seed(0)
        _BERT = BertModel(BertConfig()).eval().cuda()  # BERT-base, random weights
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 30522, (16, 128), generator=g).cuda()]


def bert_base(ids: torch.Tensor) -> torch.Tensor:
    assert _BERT is not None, "bert_ids builds the model"
    return _BERT(input_ids=ids).last_hidden_state


def resnet18_model() -> torch.nn.Module:
    import torchvision

    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None).eval().to("cuda")


def resnet18_input(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(16, 3, 224, 224, generator=g).to("cuda")]


def fn_and_args(name: str, w: dict[str, Any], seed: int = 0, grad: bool = False) -> tuple[Callable[..., Any], list[torch.Tensor]]:
    if name == "resnet18":
        return resnet18_model(), resnet18_input(seed)
    args = w["make"](seed)
    if not grad:
        args = [a.detach() for a in args]
    return w["fn"], args


# ---------------------------------------------------------------------------------- checks

VERBOSE = False  # --verbose: print every check's kiln parts

# The error a float type allows per element, on top of a workload's tolerance (torch.testing's
# defaults for each type).
DTYPE_TOL = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5), torch.float32: (1.3e-6, 1e-5),
             torch.float64: (1e-7, 1e-7)}


def elements_beyond_tolerance(got: torch.Tensor, eager: torch.Tensor, exact: torch.Tensor,
                              tol: tuple[float, float]) -> tuple[int, str]:
    """How many elements of ``got`` are wrong, judged against ``exact`` (a float64 run), and
    the worst one. Element i passes when |got - exact| <= atol + rtol * |exact| (the larger of
    the workload's and the dtype's tolerances) or when it is within twice eager's own error at
    that element. Each element is judged on its own scale: a small element may not hide behind
    the largest one."""
    rtol, atol = (max(a, b) for a, b in zip(tol, DTYPE_TOL.get(got.dtype, (0.0, 0.0))))
    exact = exact.double()
    err = (got.double() - exact).abs()
    allowed = torch.maximum(atol + rtol * exact.abs(), 2 * (eager.double() - exact).abs())
    bad = ~(err <= allowed)  # NaN errors are bad too
    bad &= ~(torch.isnan(got.double()) & torch.isnan(exact))
    n = int(bad.sum())
    if n == 0:
        return 0, ""
    i = int(torch.argmax(torch.where(bad, err - allowed, torch.zeros_like(err)).nan_to_num(float("inf"))))
    return n, (f"{n} element(s) beyond tolerance; worst at {i}: got {float(got.flatten()[i]):.6g}, "
               f"exact {float(exact.flatten()[i]):.6g}, eager {float(eager.flatten()[i]):.6g}")


def _close(a: torch.Tensor, b: torch.Tensor, tol: tuple[float, float]) -> Optional[str]:
    try:
        torch.testing.assert_close(a, b, rtol=tol[0], atol=tol[1])
        return None
    except AssertionError as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        return " ".join(ln for ln in lines if ln.startswith(("Mismatched", "Greatest absolute")))


def _results(fn: Callable[..., Any], args: Sequence[torch.Tensor], backward: bool,
             weights: Optional[list[torch.Tensor]] = None) -> tuple[list[torch.Tensor], list[Optional[torch.Tensor]], list[torch.Tensor]]:
    """Outputs of ``fn(*args)`` and, with ``backward``, the gradients of a weighted sum of them
    (the weights are returned, for a second run to reuse)."""
    out = fn(*args)
    outs = list(out) if isinstance(out, tuple) else [out]
    grads: list[Optional[torch.Tensor]] = []
    if backward:
        if weights is None:
            g = torch.Generator().manual_seed(123)
            weights = [torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.device) for o in outs]
        sum((o * wt.to(o.dtype)).sum() for o, wt in zip(outs, weights)).backward()
        grads = [a.grad for a in args]
    return [o.detach() for o in outs], grads, weights or []


def run_check(name: str, w: dict[str, Any], mode: Optional[str] = None) -> dict[str, Any]:
    """Compiled vs eager. Where the two differ by more than the tolerance, both are measured
    against a float64 eager run, element by element (elements_beyond_tolerance): long float32
    reductions legitimately differ from eager with the summation order, but each element must
    be right on its own scale."""
    import kiln.torch as kt
    from kiln.torch import examples as E

    torch._dynamo.reset()
    kt.reset_stats()
    label = name + (f" ({mode})" if mode else "")
    result: dict[str, Any] = {"check": label, "status": "ok", "detail": ""}
    try:
        backward = w["trainable"]
        fn, args = fn_and_args(name, w, seed=1, grad=backward)
        fn = w.get("check_fn") or fn
        compiled = torch.compile(fn, backend="kiln", mode=mode) if mode else torch.compile(fn, backend="kiln")

        def fresh(dtype: Optional[torch.dtype] = None) -> list[torch.Tensor]:
            return [a.detach().clone().to(dtype or a.dtype).requires_grad_(a.requires_grad) for a in args]

        problems: list[str] = []
        notes: list[str] = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.enable_grad() if backward else torch.no_grad():
                if mode:  # under reduce-overhead, calls after the second replay a CUDA graph
                    for _ in range(2):
                        compiled(*fresh())
                got_o, got_g, wts = _results(compiled, fresh(), backward)
                want_o, want_g, _ = _results(fn, fresh(), backward, wts)
            torch.cuda.synchronize()
            labels = [f"output {i}" for i in range(len(got_o))] + [f"grad {i}" for i in range(len(got_g))]
            pairs = list(zip(got_o + got_g, want_o + want_g))
            ref: Optional[list[Any]] = None
            for lab, (g, r) in zip(labels, pairs):
                if r is None:
                    continue
                if g is None:
                    problems.append(f"{lab}: missing")
                    continue
                if name == "kmeans":
                    if not E.kmeans_labels_agree(g, args[0], args[1], r):
                        problems.append("labels differ beyond ties")
                    continue
                p = _close(g, r, w["tol"])
                if p is None:
                    continue
                if ref is None:
                    f64 = fn
                    if isinstance(fn, torch.nn.Module):
                        import copy

                        f64 = copy.deepcopy(fn).double()
                    with torch.enable_grad() if backward else torch.no_grad():
                        ro, rg, _ = _results(f64, fresh(torch.float64), backward, wts)
                    ref = ro + rg
                exact = ref[labels.index(lab)]
                n_bad, worst = elements_beyond_tolerance(g, r, exact, w["tol"])
                if n_bad == 0:
                    notes.append(f"{lab}: differs from eager ({p}) but every element is within tolerance of float64")
                else:
                    problems.append(f"{lab}: {p}; against float64: {worst}")
        s = kt.stats()
        if VERBOSE:
            for g in kt.last_graphs():
                print(f"  {label}: {g['kind']} graph, {g['segments']} segments")
                for p in g["parts"]:
                    state = "kiln" if p["kiln"] else f"torch ({p['error']})"
                    print(f"    {p['name']}: {state}: {', '.join(p['ops'])}")
            for n in notes:
                print(f"  {label}: {n}")
        fallbacks = [str(c.message) for c in caught if issubclass(c.category, kt.KilnFallbackWarning)]
        result.update(parts=s["parts"], compiled=s["compiled"], failed=s["failed"], kernel_calls=s["kernel_calls"])
        if problems:
            result["status"] = "MISMATCH"
            result["detail"] = "; ".join(problems)[:400]
        elif s["compiled"] == 0 or s["kernel_calls"] == 0:
            result["status"] = "torch only"
            result["detail"] = (fallbacks[0] if fallbacks else "no kiln part ran")[:400]
        elif s["failed"] or s["eager_calls"] or s["compiled"] < s["parts"]:
            result["status"] = "ok, partial fallback"
            result["detail"] = (fallbacks[0] if fallbacks else
                                f"{s['compiled']}/{s['parts']} parts compiled, {s['eager_calls']} eager call(s)")[:400]
        elif notes:
            result["detail"] = f"{len(notes)} result(s) checked against float64 (--verbose shows them)"
    except Exception as e:
        result["status"] = "ERROR"
        result["detail"] = f"{type(e).__name__}: {e}"[:400]
        traceback.print_exc()
    return result


def run_held_results_check(name: str, w: dict[str, Any]) -> dict[str, Any]:
    """reduce-overhead returns results that live in a CUDA graph's memory, without copies: a
    result the caller still holds must not be overwritten by a later replay. Calls the compiled
    function on four different inputs, holding every result (and, when trainable, runs the
    backward of their weighted sum at the end, as gradient accumulation would), then compares
    each with eager. A graph of one kernel must not be replayed at all."""
    import kiln.torch as kt

    torch._dynamo.reset()
    kt.reset_stats()
    label = f"{name} (reduce-overhead, results held)"
    result: dict[str, Any] = {"check": label, "status": "ok", "detail": ""}
    # sin_cos_mix is one kiln kernel: reduce-overhead calls it without a CUDA graph, which
    # would cost a launch of its own (cudagraphs.replay_wins). The others replay.
    one_launch = name == "sin2+cos2"
    try:
        backward = w["trainable"]
        fn0, _ = fn_and_args(name, w, seed=1, grad=backward)
        fn = w.get("check_fn") or fn0
        compiled = torch.compile(fn, backend="kiln", mode="reduce-overhead")
        inputs = [fn_and_args(name, w, seed=10 + i, grad=backward)[1] for i in range(4)]
        problems: list[str] = []
        with torch.enable_grad() if backward else torch.no_grad():
            held = [compiled(*[a.detach().clone().requires_grad_(a.requires_grad) for a in args]) for args in inputs]
            for i, (got, args) in enumerate(zip(held, inputs)):
                want = fn(*[a.detach().clone() for a in args])
                for j, (g, r) in enumerate(zip(got if isinstance(got, tuple) else (got,),
                                               want if isinstance(want, tuple) else (want,))):
                    p = _close(g.detach(), r.detach(), w["tol"])
                    if p:
                        problems.append(f"call {i} output {j}: {p}")
        torch.cuda.synchronize()
        s = kt.stats()
        result.update(parts=s["parts"], compiled=s["compiled"], failed=s["failed"])
        if problems:
            result["status"] = "MISMATCH"
            result["detail"] = "; ".join(problems)[:400]
        elif one_launch and s["graph_replays"]:
            result["status"] = "replayed"
            result["detail"] = f"{s['graph_replays']} replays of a one-kernel graph (it must be called directly)"
        elif not one_launch and s["graph_replays"] == 0:
            result["status"] = "no replay"
            result["detail"] = "no call was served by a CUDA graph"
        elif one_launch:
            result["detail"] = "called directly (one kernel: no CUDA graph)"
        else:
            result["detail"] = f"{s['graph_replays']} replays"
    except Exception as e:
        result["status"] = "ERROR"
        result["detail"] = f"{type(e).__name__}: {e}"[:400]
        traceback.print_exc()
    return result


# ---------------------------------------------------------------------------------- timing

def steady_state(name: str, w: dict[str, Any], backend: str, train: bool, iters: int, warmup: int) -> float:
    """Median ms per call (inference) or per forward+backward step (``train``)."""
    torch._dynamo.reset()
    sets = []
    rotate = 1 if name in ("resnet18",) else 3
    model = None
    for s in range(rotate):
        fn, args = fn_and_args(name, w, seed=s, grad=train)
        model = fn if model is None else model
        sets.append(args)
    if name == "resnet18":
        sets = [resnet18_input(s) for s in range(3)]
    fn = model
    if backend == "eager":
        f = fn
    elif backend == "inductor":
        f = torch.compile(fn)
    elif backend == "inductor-ro":
        f = torch.compile(fn, mode="reduce-overhead")
    elif backend == "kiln":
        f = torch.compile(fn, backend="kiln")
    elif backend == "kiln-ro":
        f = torch.compile(fn, backend="kiln", mode="reduce-overhead")
    elif backend == "kiln-tuned":  # every part's kernel variants timed on its first call
        import kiln.torch

        f = torch.compile(fn, backend=kiln.torch.backend(autotune=True))
    else:
        raise ValueError(backend)

    if train:
        def step(i: int) -> None:
            args = sets[i % len(sets)]
            for a in args:  # a fresh gradient each step, as after optimizer.zero_grad()
                a.grad = None
            out = f(*args)
            out_t = out if isinstance(out, tuple) else (out,)
            sum(o.sum() for o in out_t).backward()
    else:
        def step(i: int) -> None:
            with torch.no_grad():
                f(*sets[i % len(sets)])

    if backend == "inductor-ro":
        # Inductor's CUDA graph trees reuse outputs across replays unless told a step began.
        plain = step

        def step(i: int) -> None:
            torch.compiler.cudagraph_mark_step_begin()
            plain(i)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if backend.startswith("kiln"):
            # Steady state means the native part runner in use: its first build on a kilnd
            # finishes in the background a few seconds after the first compile.
            import kiln.torch

            kiln.torch.reset_stats()
            step(0)
            kiln.torch.wait()
        ms = median_ms(step, iters, warmup)
        if backend == "kiln-tuned":
            s = kiln.torch.stats()
            print(f"{name}{' fwd+bwd' if train else ''} kiln-tuned: {s['tuned']} parts tuned, {s['retuned']} "
                  f"off the default variant", flush=True)
        return ms


def first_result_child(name: str, backend: str, quick: bool) -> None:
    """In a fresh process: seconds from torch.compile to the first (inference) result."""
    w = workloads(quick)[name]
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    fn, args = fn_and_args(name, w, seed=0, grad=False)
    if backend.startswith("kiln"):
        import kiln.torch  # noqa: F401  (registers the backend; not timed, as an entry point would)
    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        if backend == "eager":
            f = fn
        elif backend == "kiln-async":  # the first call in eager, traced in the background
            f = kiln.torch.compile(fn, options={"async": True})
        elif backend == "kiln-async-tc":  # torch.compile's own: Dynamo traces on this thread
            f = torch.compile(fn, backend="kiln", options={"async": True})
        else:
            f = torch.compile(fn, backend=backend)
        with torch.no_grad():
            f(*args)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
    extra: dict[str, Any] = {}
    if backend.startswith("kiln-async"):
        import kiln.torch as kt

        # Until the trace and the compiles are done, calls run in torch: count how many a
        # program calling in a loop makes before the kernels take over.
        eager_calls, ready = 0, getattr(f, "wait", kt.wait)
        with torch.no_grad():
            while not ready(0) and eager_calls < 10000:
                f(*args)
                eager_calls += 1
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            ready()
            f(*args)
            f(*args)
        torch.cuda.synchronize()
        s = kt.stats()
        extra = {"compiled": s["compiled"], "failed": s["failed"], "kernel_calls": s["kernel_calls"],
                 "calls_before_kernels": eager_calls, "kernels_after_s": t2 - t0}
    elif backend == "kiln":
        import kiln.torch as kt

        s = kt.stats()
        extra = {"compiled": s["compiled"], "failed": s["failed"], "cache_hits": s["cache_hits"]}
    print("RESULT " + json.dumps({"seconds": t1 - t0, **extra}), flush=True)


def time_to_first_result(name: str, backend: str, env: dict[str, str], quick: bool) -> dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", name, backend] + (["--quick"] if quick else [])
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    m = re.search(r"^RESULT (.*)$", p.stdout, re.M)
    if p.returncode != 0 or not m:
        return {"seconds": float("nan"), "error": (p.stderr or p.stdout)[-400:]}
    return json.loads(m.group(1))


# ---------------------------------------------------------------------------------- report

def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = "| " + " | ".join(h.ljust(widths[i]) for i, h in enumerate(headers)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = ["| " + " | ".join(r[i].ljust(widths[i]) for i in range(len(headers))) + " |" for r in cells]
    return "\n".join([line, sep, *body])


def fmt_ms(v: float) -> str:
    return "n/a" if v != v else (f"{v:.3f}" if v < 10 else f"{v:.1f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes, fewer iterations")
    ap.add_argument("--checks-only", action="store_true")
    ap.add_argument("--no-first-result", action="store_true", help="skip the fresh-process first-result timings")
    ap.add_argument("--first-result-only", action="store_true",
                    help="only the fresh-process first-result timings (no checks, no steady state)")
    ap.add_argument("--allow-fallback", action="store_true",
                    help="pass a check where kiln fell back to torch for some or all parts")
    ap.add_argument("--strict", action="store_true", help=argparse.SUPPRESS)  # the default now
    ap.add_argument("--iters", type=int, default=0, help="timed iterations per steady-state measurement")
    ap.add_argument("--workloads", default="", help="comma-separated subset (sin2+cos2,lltm,encoder,kmeans,resnet18)")
    ap.add_argument("--tuned", action="store_true",
                    help="also time kiln with autotune=True (each part's variants timed on its first call)")
    ap.add_argument("--child", nargs=2, metavar=("WORKLOAD", "BACKEND"), help=argparse.SUPPRESS)
    ap.add_argument("--verbose", action="store_true", help="print each check's kiln parts")
    opts = ap.parse_args()
    global VERBOSE
    VERBOSE = opts.verbose
    if opts.child:
        first_result_child(opts.child[0], opts.child[1], opts.quick)
        return 0

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to do")
        return 1
    binary = kilnd_binary("torch_backend_gpu.py")  # this run's kilnd, and the cold runs' below
    if binary is None:
        return 1
    torch.backends.cuda.matmul.allow_tf32 = False  # checks compare against eager in full f32
    torch.backends.cudnn.allow_tf32 = False

    daemon, work = private_kilnd("torch_backend_gpu.py", "kiln-torch-gpu-")
    import kiln.local
    import kiln.torch  # noqa: F401

    name_dev = torch.cuda.get_device_name()
    cap = torch.cuda.get_device_capability()
    report: list[str] = [f"# kiln torch.compile backend on {name_dev} (sm_{cap[0]}{cap[1]})", "",
                         f"torch {torch.__version__}" + (", quick sizes" if opts.quick else ""), ""]
    failed = False
    try:
        work_items = workloads(opts.quick)
        if opts.workloads:
            wanted = opts.workloads.split(",")
            work_items = {k: v for k, v in work_items.items() if k in wanted}
        # ------------------------------------------------------------------ checks
        checks = [] if opts.first_result_only else [run_check(n, w) for n, w in work_items.items()]
        for n in ("sin2+cos2", "encoder", "resnet18"):
            if n in work_items and not opts.first_result_only:
                checks.append(run_check(n, work_items[n], mode="reduce-overhead"))
                checks.append(run_held_results_check(n, work_items[n]))
        rows = [(c["check"], c["status"], f"{c.get('compiled', 0)}/{c.get('parts', 0)}", c["detail"]) for c in checks]
        t = table(["check vs eager", "status", "kiln parts compiled", "detail"], rows)
        print(t, flush=True)
        report += ["## Checks against eager", "", t, ""]
        for c in checks:
            if c["status"] in ("MISMATCH", "ERROR") or (not opts.allow_fallback and c["status"] != "ok"):
                failed = True

        if not opts.checks_only:
            iters = opts.iters or (20 if opts.quick else 50)
            warmup = 5 if opts.quick else 10
            # ------------------------------------------------------------------ first result
            cold_rows = []
            ind_dir = work / "inductor-cache"
            for n in ([] if opts.no_first_result else work_items):
                env_k = dict(os.environ)
                # Cold: a daemon with an empty cache and an empty local artifact cache.
                cold_d = kiln.local.LocalDaemon(binary, work / f"kilnd-cold-{n}")
                try:
                    env_k.update(KILN_SERVER=cold_d.address, KILN_CACHE_DIR=str(work / f"client-cold-{n}"))
                    k_cold = time_to_first_result(n, "kiln", env_k, opts.quick)
                    k_warm = time_to_first_result(n, "kiln", env_k, opts.quick)  # caches now full
                finally:
                    cold_d.stop()
                cold_async = {}  # each async variant against a daemon of its own, caches empty
                for be in ("kiln-async", "kiln-async-tc"):
                    async_d = kiln.local.LocalDaemon(binary, work / f"kilnd-{be}-{n}")
                    try:
                        env_a = dict(os.environ)
                        env_a.update(KILN_SERVER=async_d.address, KILN_CACHE_DIR=str(work / f"client-{be}-{n}"))
                        cold_async[be] = time_to_first_result(n, be, env_a, opts.quick)
                    finally:
                        async_d.stop()
                k_async, k_async_tc = cold_async["kiln-async"], cold_async["kiln-async-tc"]
                eager_first = time_to_first_result(n, "eager", dict(os.environ), opts.quick)
                env_i = dict(os.environ)
                d = ind_dir / n
                shutil.rmtree(d, ignore_errors=True)
                env_i.update(TORCHINDUCTOR_CACHE_DIR=str(d), TRITON_CACHE_DIR=str(d / "triton"))
                i_cold = time_to_first_result(n, "inductor", env_i, opts.quick)
                i_warm = time_to_first_result(n, "inductor", env_i, opts.quick)
                note = ""
                for r in (k_cold, k_warm, i_cold, i_warm, k_async, k_async_tc, eager_first):
                    if "error" in r:
                        note = r["error"].strip().splitlines()[-1][:120] if r["error"].strip() else "error"
                if not note and k_cold.get("failed"):
                    note = f"kiln: {k_cold['failed']} part(s) fell back to torch"
                if not note and (k_async.get("failed") or not k_async.get("kernel_calls")):
                    note = f"kiln async: {k_async.get('failed')} fallback(s), {k_async.get('kernel_calls')} kernel calls after wait()"
                cold_rows.append((n, f"{eager_first['seconds']:.2f}", f"{k_async['seconds']:.2f}",
                                  f"{k_async.get('kernels_after_s', float('nan')):.2f} "
                                  f"({k_async.get('calls_before_kernels')} calls)",
                                  f"{k_async_tc['seconds']:.2f}", f"{k_cold['seconds']:.2f}", f"{k_warm['seconds']:.2f}",
                                  f"{i_cold['seconds']:.2f}", f"{i_warm['seconds']:.2f}", note))
                print(cold_rows[-1], flush=True)
            t = table(["workload", "eager s", "kiln async cold s", "kiln async: kernels from s",
                       "torch.compile async cold s", "kiln cold s", "kiln warm s", "inductor cold s",
                       "inductor warm s", "note"], cold_rows)
            print(t, flush=True)
            report += [] if opts.no_first_result else ["## Time to first result (fresh process, inference)", "",
                       "Eager: the first eager call in a fresh process. Kiln async: kiln.torch.compile with "
                       "options={\"async\": True}, cold caches (the first call runs eagerly; Dynamo traces "
                       "and kilnd compiles in the background); then the time until the kernels took over "
                       "and how many calls ran in torch before, calling in a loop. torch.compile async: "
                       "torch.compile(backend=\"kiln\", options={\"async\": True}) (Dynamo traces on "
                       "the caller's thread). "
                       "Cold: empty kiln daemon and artifact caches / empty Inductor caches. Warm: a new "
                       "process with kiln's caches full / Inductor's caches warm. From torch.compile to the "
                       "first result on the host, CUDA already initialised.", "", t, ""]
            # ------------------------------------------------------------------ steady state
            ss_rows = []
            for n, w in ({} if opts.first_result_only else work_items).items():
                for train in ([False, True] if w["trainable"] else [False]):
                    res = {}
                    for be in ("eager", "inductor", "kiln", "inductor-ro", "kiln-ro") + (("kiln-tuned",) if opts.tuned else ()):
                        try:
                            res[be] = steady_state(n, w, be, train, iters, warmup)
                        except Exception as e:
                            print(f"{n} {be}: {type(e).__name__}: {e}", flush=True)
                            res[be] = float("nan")
                    ratio = res["kiln"] / res["inductor"] if res["inductor"] == res["inductor"] else float("nan")
                    ss_rows.append((n + (" fwd+bwd" if train else ""), w["size"], fmt_ms(res["eager"]),
                                    fmt_ms(res["inductor"]), fmt_ms(res["kiln"]), f"{ratio:.2f}x",
                                    fmt_ms(res["inductor-ro"]), fmt_ms(res["kiln-ro"]))
                                   + ((fmt_ms(res["kiln-tuned"]), f"{res['kiln-tuned'] / res['kiln']:.3f}")
                                      if opts.tuned else ()))
                    print(ss_rows[-1], flush=True)
            t = table(["workload", "size", "eager ms", "inductor ms", "kiln ms", "kiln/inductor",
                       "inductor r-o ms", "kiln r-o ms"] + (["kiln tuned ms", "tuned/kiln"] if opts.tuned else []),
                      ss_rows)
            print(t, flush=True)
            report += ["## Steady state (median ms per call, CUDA events, rotating inputs)", "",
                       "r-o: mode=\"reduce-overhead\" (CUDA graphs).", "", t, ""]
    finally:
        daemon.stop()
        out_dir = os.environ.get("OUT")
        if out_dir:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            (Path(out_dir) / "torch_backend.md").write_text("\n".join(report))
            shutil.copy(work / "kilnd.log", Path(out_dir) / "torch_backend_kilnd.log")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
