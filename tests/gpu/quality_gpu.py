#!/usr/bin/env python3
"""Kernel quality on an NVIDIA GPU: reduced broadcast products and the seed's ``numpy_fn``,
kiln with and without the algebraic rewrite, side by side with PyTorch eager and Inductor.

Workloads (f32, on torch CUDA tensors):

- ``sum(X[:, :, None] * Y[:, None, :], axis=(-2, -1))``, X and Y [1024, 64]: the rewrite
  computes ``X.sum(1) * Y.sum(1)``; without it, one reduction of 4096 products per row;
- the same with ``exp`` of the product (no rewrite applies: the row strategy alone);
- the seed's ``numpy_fn`` at 1024 x 640 (its broadcast product has 419M elements; eager
  materializes it, Inductor fuses it into a reduction of 409600 per row, the rewrite leaves
  two row sums of 640).

Each runs through ``kiln.jit`` three ways: default options, without the algebraic rewrite,
and ``mode="max-autotune"`` (the first call times the kernel variants on the GPU and keeps the
fastest).

Checks (PASS/FAIL lines; the exit status is 1 when one fails): every kiln variant matches a
float64 NumPy reference within tolerance, and so does eager (the reference's sanity). Timings
are medians of CUDA-event intervals around each call (kiln launches on torch's current
stream), every column of a workload timed in the same rounds (each a tenth of its calls per
round, in turn), printed as a table with the ratios the issue asks for; they are figures, not
checks.

It starts its own kilnd from ``$KILND`` (temporary cache, ``--listen 127.0.0.1:0``) and imports
kiln from ``PYTHONPATH`` (or this checkout's client/python). Needs numpy, grpcio, protobuf,
PyTorch with CUDA (Inductor for its column; skipped with a SKIP line when it fails to build).

    KILND=build/server/kilnd PYTHONPATH=client/python python3 tests/gpu/quality_gpu.py [--iters 100]

Exit status: 0 when every check passed, 1 when one failed, 2 when the setup is missing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

REPO = Path(__file__).resolve().parents[2]
try:
    import kiln
except ImportError:
    sys.path.insert(0, str(REPO / "client" / "python"))
    import kiln

sys.path.insert(0, str(REPO / "tests" / "python"))
from sample_fns import numpy_fn  # noqa: E402  (the seed's function, verbatim)


def bps(X, Y):
    return np.sum(X[:, :, None] * Y[:, None, :], axis=(-2, -1))


def bps_exp(X, Y):
    return np.sum(np.exp(X[:, :, None] * Y[:, None, :]), axis=(-2, -1))


def bps_torch(X, Y):
    import torch

    return torch.sum(X[:, :, None] * Y[:, None, :], dim=(-2, -1))


def bps_exp_torch(X, Y):
    import torch

    return torch.sum(torch.exp(X[:, :, None] * Y[:, None, :]), dim=(-2, -1))


def numpy_fn_torch(X, Y):
    """numpy_fn in torch: NumPy's std is the population one (correction 0)."""
    import torch

    X_mean, X_std = X.mean(dim=0), X.std(dim=0, correction=0)
    Y_mean, Y_std = Y.mean(dim=0), Y.std(dim=0, correction=0)
    X_std = torch.where(X_std == 0, torch.ones_like(X_std), X_std)
    Y_std = torch.where(Y_std == 0, torch.ones_like(Y_std), Y_std)
    Xn = (X - X_mean) / X_std
    Yn = (Y - Y_mean) / Y_std
    r = torch.sum(Xn[:, :, None] * Yn[:, None, :], dim=(-2, -1))
    r = torch.exp(torch.clamp(r, -1, 1))
    return r + 0.001 * torch.sum(Xn ** 2 + Yn ** 2, dim=1)


def seed_inputs(rng: np.random.Generator, n: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    X = rng.standard_normal((n, d)).astype(np.float32)
    Y = (rng.standard_normal((n, d)) * 3 + 1).astype(np.float32)
    X[:, 2] = 5.0  # a constant column: its std is 0 and the masked assignment applies
    Y[:, 0] = -1.0
    return X, Y


class Report:
    def __init__(self) -> None:
        self.failed = 0

    def line(self, status: str, name: str, detail: str = "") -> None:
        if status == "FAIL":
            self.failed += 1
        print(f"{status:4} {name}{': ' + detail if detail else ''}", flush=True)

    def check(self, name: str, fn: Callable[[], Optional[str]]) -> None:
        try:
            detail = fn()
        except Exception as e:  # every failure is reported, then the next check runs
            tb = traceback.format_exc(limit=4).strip().splitlines()
            self.line("FAIL", name, f"{type(e).__name__}: {e}\n      " + "\n      ".join(tb[-6:]))
            return
        self.line("PASS", name, detail or "")


def interleaved_ms(calls: dict[str, Callable[[], Any]], iters: int, rounds: int = 10) -> dict[str, float]:
    """Median event interval per call of each function, timed in rounds (each function a
    share of its calls per round, in turn): at tens of microseconds per call the host sets the
    time, and its drift over a run falls on every column alike."""
    from gpu_common import event_times_ms

    samples: dict[str, list[float]] = {k: [] for k in calls}
    per = max(1, iters // rounds)
    for _ in range(rounds):
        for label, call in calls.items():
            samples[label] += event_times_ms(lambda i, call=call: call(), per, warmup=2)
    return {k: statistics.median(v) for k, v in samples.items()}


SECOND_PROCESS = """
import json, sys
import numpy as np, torch, kiln
sys.path.insert(0, {here!r})
import quality_gpu as q
client = kiln.Client({address!r}, cache_dir={cache!r})
compiles = []
real = client.compile
client.compile = lambda *a, **k: compiles.append(1) or real(*a, **k)
host = [np.load(p) for p in {inputs!r}]
dev = [torch.from_numpy(h).cuda() for h in host]
fn = kiln.jit(getattr(q, {fn!r}), target="cuda", client=client, mode="max-autotune")
out = fn(*dev)
torch.cuda.synchronize()
print(json.dumps({{"handle": fn.compiled_for(*dev).handle, "compiles": len(compiles)}}))
"""


def second_process_tuning(address: str, fn_name: str, host: Sequence[np.ndarray], handle: str) -> str:
    """A fresh process (empty local cache) asks for the same tuned function: kilnd's shared
    tuning record gives it the winning variant, which it compiles once, timing nothing."""
    with tempfile.TemporaryDirectory(prefix="kiln-tuned-") as tmp:
        paths = []
        for i, h in enumerate(host):
            paths.append(str(Path(tmp) / f"in{i}.npy"))
            np.save(paths[-1], np.ascontiguousarray(h))
        script = SECOND_PROCESS.format(here=str(Path(__file__).resolve().parent), address=address,
                                       cache=str(Path(tmp) / "cache"), inputs=paths, fn=fn_name)
        p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            raise AssertionError(p.stderr[-2000:])
        got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["handle"] == handle, f"second process got {got['handle'][:12]}, the tuner {handle[:12]}"
    assert got["compiles"] == 1, f"{got['compiles']} compiles: the second process tuned again"
    return f"same variant ({handle[:12]}), 1 compile"


def python_launch(jf: Any, dev: Sequence[Any]) -> Any:
    """A call of ``jf`` with kiln.cuda's native path switched off (the Python launch path)."""
    import kiln.cuda

    native_call = kiln.cuda._native_call
    kiln.cuda._native_call = lambda compiled, arrays: None
    try:
        return jf(*dev)
    finally:
        kiln.cuda._native_call = native_call


def run(client: kiln.Client, report: Report, iters: int) -> None:
    import torch

    if not torch.cuda.is_available():
        report.line("FAIL", "setup", "PyTorch sees no CUDA device")
        return
    major, minor = torch.cuda.get_device_capability()
    target = f"cuda:sm_{major * 10 + minor}"
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, target {target}", flush=True)
    # kiln.jit launches through kiln.torch's native part runner once it is loaded (kilnd builds
    # it in the background on the first call with PyTorch tensors); load it before timing.
    import kiln.cuda
    from kiln.torch import native

    native.start(client)
    print(f"native part runner: {'loaded' if native.wait() else native.ERROR}", flush=True)
    rng = np.random.default_rng(11)

    x64, y64 = rng.standard_normal((1024, 64)).astype(np.float32), rng.standard_normal((1024, 64)).astype(np.float32)
    xs, ys = seed_inputs(rng, 1024, 640)
    # (name, numpy function, torch function, host inputs, rtol, atol)
    work = [
        ("broadcast-product sum, f32 [1024,64]", bps, bps_torch, (x64, y64), 1e-4, 2e-3),
        ("exp broadcast-product sum, f32 [1024,64]", bps_exp, bps_exp_torch, (x64 * 0.25, y64 * 0.25), 1e-4, 1e-2),
        ("seed numpy_fn, f32 [1024,640]", numpy_fn, numpy_fn_torch, (xs, ys), 2e-3, 2e-3),
    ]
    rows = []
    for name, np_fn, torch_fn, host, rtol, atol in work:
        want = np_fn(*[h.astype(np.float64) for h in host])
        dev = [torch.from_numpy(np.ascontiguousarray(h)).cuda() for h in host]
        times: dict[str, Optional[float]] = {}
        calls: dict[str, Callable[[], Any]] = {}  # the checked ones, timed together below

        def checked(label: str, fn: Callable[[], Any]) -> None:
            def body() -> str:
                got = fn()
                torch.cuda.synchronize()
                g = got.cpu().numpy() if hasattr(got, "cpu") else np.asarray(got)
                np.testing.assert_allclose(g.astype(np.float64), want, rtol=rtol, atol=atol)
                calls[label] = fn
                return "matches"

            report.check(f"{name}: {label}", body)

        checked("eager", lambda: torch_fn(*dev))
        try:
            compiled_torch = torch.compile(torch_fn)
            compiled_torch(*dev)
            checked("inductor", lambda: compiled_torch(*dev))
        except Exception as e:  # an environment without a working Inductor still checks kiln
            report.line("SKIP", f"{name}: inductor", f"{type(e).__name__}: {e}")
            times["inductor"] = None
        for rewrites in (True, False):
            label = "kiln" if rewrites else "kiln, no rewrite"
            jf = kiln.jit(np_fn, target=target, client=client, options=kiln.make_options(algebraic_rewrites=rewrites))
            checked(label, lambda jf=jf: jf(*dev))
            if rewrites:  # the same kernels launched through kiln.cuda's Python path
                checked("kiln, Python launch", lambda jf=jf: python_launch(jf, dev))
        # Tuned: the first call times the kernel variants on these tensors and keeps the fastest.
        tuned = kiln.jit(np_fn, target=target, client=client, mode="max-autotune")
        checked("kiln, tuned", lambda: tuned(*dev))
        for label, ms in interleaved_ms(calls, iters).items():
            times[label] = ms
            print(f"{name}: {label}: {ms:.4f} ms", flush=True)
        report.check(f"{name}: tuning served to a second process without timing",
                     lambda: second_process_tuning(client.address, np_fn.__name__, host, tuned.compiled_for(*dev).handle))
        rows.append((name, times))

    print("\n| workload | eager ms | Inductor ms | kiln ms | kiln, no rewrite ms | kiln, tuned ms | kiln / Inductor | "
          "no rewrite / Inductor | tuned / Inductor | Inductor / kiln | kiln, Python launch ms | tuned / kiln |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    fmt = lambda v: "-" if v is None else f"{v:.4f}"  # noqa: E731
    ratio = lambda a, b: "-" if a is None or b is None else f"{a / b:.2f}"  # noqa: E731
    for name, t in rows:
        e, i, k, kn, kt, kp = (t.get(x) for x in ("eager", "inductor", "kiln", "kiln, no rewrite", "kiln, tuned",
                                                  "kiln, Python launch"))
        print(f"| {name} | {fmt(e)} | {fmt(i)} | {fmt(k)} | {fmt(kn)} | {fmt(kt)} | {ratio(k, i)} | {ratio(kn, i)} | "
              f"{ratio(kt, i)} | {ratio(i, k)} | {fmt(kp)} | {ratio(kt, k)} |")
    print("\ntargets: broadcast-product sum kiln / Inductor <= 1.0; seed numpy_fn Inductor / kiln >= 20", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description="kernel quality on a GPU: kiln vs eager and Inductor")
    ap.add_argument("--iters", type=int, default=100, help="calls timed per variant (default 100)")
    opts = ap.parse_args()
    from gpu_common import kilnd_binary

    binary = kilnd_binary("quality_gpu")
    if binary is None:
        return 2
    report = Report()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kiln-quality-gpu-") as tmp:
        try:
            daemon = kiln.local.LocalDaemon(binary, Path(tmp), timeout=30)
        except RuntimeError as e:
            print(f"quality_gpu: {e}", file=sys.stderr)
            return 2
        try:
            with kiln.Client(daemon.address, cache_dir=Path(tmp) / "client-cache") as client:
                run(client, report, opts.iters)
        except Exception:
            report.line("FAIL", "setup", traceback.format_exc())
        finally:
            daemon.stop()
            if report.failed:
                print("--- kilnd log (tail) ---\n" + daemon.log(), flush=True)
    print(f"{'FAILED' if report.failed else 'OK'}: {report.failed} failure(s) in {time.perf_counter() - t0:.1f} s", flush=True)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
