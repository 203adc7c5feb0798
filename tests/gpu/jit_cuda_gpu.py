#!/usr/bin/env python3
"""kiln.jit(target="cuda") on an NVIDIA GPU: the acceptance functions on PyTorch tensors and
CuPy arrays, checked against NumPy on host copies, with a short timing.

Checks (each prints a PASS/FAIL/SKIP line):

- a plain ``"cuda"`` target compiles for the device's sm (torch's and the driver's answers agree);
- ``kmeans`` (1M 2-D points, 8 centres, f32) and ``numpy_fn`` (f32 and f64), and a row softmax
  (on a transposed view, so the input is made contiguous first), under
  ``kiln.jit(target="cuda")`` on torch CUDA tensors and on CuPy arrays; outputs must be arrays
  of the inputs' kind; one jitted function serves both kinds without compiling again;
- ``Compiled.__call__`` of ``client.compile(graph, target="cuda:sm_XX")`` on torch tensors;
- an object offering only ``__cuda_array_interface__``, and one offering only ``__dlpack__``;
- kiln kernels captured in a torch CUDA graph and replayed on new data (they launch on torch's
  current stream) and run on a side stream.

Timing lines give, per workload, the first call (trace + compile on an empty daemon cache +
fetch + module load), the first call of a fresh jitted function against the now warm daemon,
and the steady-state median of a call followed by a device synchronisation.

It starts its own kilnd from ``$KILND`` (``--listen 127.0.0.1:0`` with a temporary cache) and
imports kiln from ``PYTHONPATH`` (or this checkout's client/python). Needs numpy, grpcio,
protobuf, PyTorch with CUDA; CuPy is optional (its checks are skipped without it). No network.

    KILND=build/server/kilnd PYTHONPATH=client/python python3 tests/gpu/jit_cuda_gpu.py

Exit status: 0 when every check passed, 1 when one failed, 2 when the setup is missing.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

REPO = Path(__file__).resolve().parents[2]
try:
    import kiln
except ImportError:
    sys.path.insert(0, str(REPO / "client" / "python"))
    import kiln

import kiln.core as kcore
import kiln.cuda as kcuda


# ---------------------------------------------------------------------------------- functions

# The acceptance functions, verbatim, shared with the Python test suite.
sys.path.insert(0, str(REPO / "tests" / "python"))
from sample_fns import kmeans, numpy_fn  # noqa: E402


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# ---------------------------------------------------------------------------------- daemon

# ---------------------------------------------------------------------------------- frameworks

class Framework:
    """Moving arrays to and from the device, and waiting for it, in one framework."""

    def __init__(self, name: str, mod: Any) -> None:
        self.name = name
        self.mod = mod

    def put(self, a: np.ndarray) -> Any:
        if self.name == "torch":
            return self.mod.from_numpy(np.ascontiguousarray(a)).cuda()
        return self.mod.asarray(a)

    def get(self, a: Any) -> np.ndarray:
        if self.name == "torch":
            return a.cpu().numpy()
        return self.mod.asnumpy(a)

    def owns(self, a: Any) -> bool:
        return isinstance(a, self.mod.Tensor if self.name == "torch" else self.mod.ndarray)

    def sync(self) -> None:
        if self.name == "torch":
            self.mod.cuda.synchronize()
        else:
            self.mod.cuda.Device().synchronize()


# ---------------------------------------------------------------------------------- checks

class Report:
    def __init__(self) -> None:
        self.failed = 0

    def line(self, status: str, name: str, detail: str = "") -> None:
        if status == "FAIL":
            self.failed += 1
        print(f"{status:4} {name}{': ' + detail if detail else ''}", flush=True)

    def check(self, name: str, fn: Callable[[], Optional[str]]) -> None:
        """Runs ``fn``; it returns a detail string on success and raises on failure."""
        try:
            detail = fn()
        except Exception as e:  # every failure is reported, then the next check runs
            tb = traceback.format_exc(limit=4).strip().splitlines()
            self.line("FAIL", name, f"{type(e).__name__}: {e}\n      " + "\n      ".join(tb[-6:]))
            return
        self.line("PASS", name, detail or "")


def labels_agree(got: np.ndarray, X: np.ndarray, means: np.ndarray) -> None:
    """k-means labels equal NumPy's, except where two centres are equally near within f32
    rounding (either answer is right there)."""
    want = kmeans(X, means)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    diff = np.nonzero(got != want)[0]
    if diff.size:
        Xd = X[diff].astype(np.float64)
        m = means.astype(np.float64)
        d = np.linalg.norm(Xd[None, :, :] - m[:, None, :], axis=2)
        idx = np.arange(diff.size)
        gap = np.abs(d[got[diff], idx] - d[want[diff], idx])
        assert np.all(gap <= 1e-5 * np.maximum(d[want[diff], idx], 1e-3)), \
            f"{diff.size} labels differ, worst distance gap {gap.max():.3g}"


def close(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def compiled_once(jf: Any) -> str:
    assert jf.compile_count == 1, f"{jf.compile_count} compiles"
    return f"{jf.signatures} signature(s)"


def median_ms(call: Callable[[], Any], sync: Callable[[], None], iters: int) -> float:
    call()
    sync()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def first_call_ms(call: Callable[[], Any], sync: Callable[[], None]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = call()
    sync()
    return out, (time.perf_counter() - t0) * 1e3


def run(client: kiln.Client, report: Report, iters: int) -> None:
    import torch

    if not torch.cuda.is_available():
        report.line("FAIL", "setup", "PyTorch sees no CUDA device")
        return
    # Calls on PyTorch tensors launch through kiln.torch's native part runner once it is
    # loaded: load it first, so that every check below runs that path.
    from kiln.torch import native

    native.start(client)
    report.line("PASS" if native.wait() else "FAIL", "native part runner loaded", native.ERROR or "")
    fws = [Framework("torch", torch)]
    try:
        import cupy

        fws.append(Framework("cupy", cupy))
    except ImportError:
        report.line("SKIP", "cupy", "CuPy is not installed; its checks are skipped")
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}"
          + (f", cupy {fws[1].mod.__version__}" if len(fws) > 1 else ""), flush=True)
    major, minor = torch.cuda.get_device_capability()
    sm = major * 10 + minor
    rng = np.random.default_rng(7)

    def target_check() -> str:
        drv_sm = kcore.cuda_device_sm(torch.cuda.current_device())
        assert drv_sm == sm, f"the driver says sm_{drv_sm}, torch sm_{sm}"
        assert kcuda.current_device_sm() == sm
        return f"cuda = cuda:sm_{sm}"

    report.check("target", target_check)

    # (name, function, host inputs, compare(got, host inputs))
    n_km, k_km = 1_000_000, 8
    X = rng.standard_normal((n_km, 2)).astype(np.float32)
    means = rng.standard_normal((k_km, 2)).astype(np.float32)

    def numpy_fn_inputs(dtype: Any) -> tuple[np.ndarray, np.ndarray]:
        A = rng.standard_normal((4096, 16)).astype(dtype)
        B = (rng.standard_normal((4096, 16)) * 3 + 1).astype(dtype)
        A[:, 2] = 5.0  # a constant column: its std is 0 and the masked assignment applies
        B[:, 0] = -1.0
        return A, B

    def numpy_fn_check(rtol: float, atol: float) -> Callable[[np.ndarray, tuple[np.ndarray, ...]], None]:
        return lambda got, args: close(got, numpy_fn(*[a.copy() for a in args]), rtol, atol)

    sm_x = rng.standard_normal((512, 2048)).astype(np.float32)
    workloads: list[tuple[str, Callable[..., Any], tuple[np.ndarray, ...], Callable[..., None], bool]] = [
        (f"kmeans f32 {n_km}x2 k={k_km}", kmeans, (X, means), lambda got, a: labels_agree(got, *a), False),
        ("numpy_fn f32 4096x16", numpy_fn, numpy_fn_inputs(np.float32), numpy_fn_check(5e-4, 5e-4), False),
        ("numpy_fn f64 4096x16", numpy_fn, numpy_fn_inputs(np.float64), numpy_fn_check(1e-9, 1e-12), False),
        ("softmax f32 512x2048 (transposed view)", softmax, (sm_x,), lambda got, a: close(got, softmax(a[0]), 1e-5, 1e-7), True),
    ]
    for name, fn, host, compare, transposed in workloads:
        jf = kiln.jit(fn, target="cuda", client=client)
        for fw in fws:
            def check(fw: Framework = fw, jf: Any = jf, fn: Any = fn, host: tuple[np.ndarray, ...] = host,
                      compare: Callable[..., None] = compare, transposed: bool = transposed) -> str:
                if transposed:  # a non-contiguous view of the same values
                    dev = [fw.put(np.ascontiguousarray(a.T)).T for a in host]
                else:
                    dev = [fw.put(a) for a in host]
                compiles = jf.compile_count
                out, first = first_call_ms(lambda: jf(*dev), fw.sync)
                assert fw.owns(out), f"got a {type(out).__module__}.{type(out).__name__}"
                compare(fw.get(out), host)
                detail = f"first call {first:.1f} ms"
                if jf.compile_count > compiles:
                    # A fresh jitted function: the daemon's cache answers, the module is loaded.
                    again = kiln.jit(fn, target="cuda", client=client)
                    _, warm = first_call_ms(lambda: again(*dev), fw.sync)
                    detail += f" (trace+compile+load), warm-daemon first call {warm:.1f} ms"
                else:
                    assert jf.compile_count == compiles
                    detail += " (no compile: same signature as the other framework)"
                steady = median_ms(lambda: jf(*dev), fw.sync, iters)
                return f"{detail}, steady {steady:.3f} ms median"

            report.check(f"{name} [{fw.name}]", check)
        report.check(f"{name}: one compile for every framework", lambda jf=jf: compiled_once(jf))

    def compiled_call() -> str:
        graph = kiln.jit(softmax, target=f"cuda:sm_{sm}").trace(sm_x).graph
        compiled = client.compile(graph, target=f"cuda:sm_{sm}")
        out = compiled(torch.from_numpy(sm_x).cuda())
        assert isinstance(out, torch.Tensor) and out.is_cuda
        close(out.cpu().numpy(), softmax(sm_x), 1e-5, 1e-7)
        return f"{compiled.handle[:12]}, {compiled.stats.num_kernels} kernel(s)"

    report.check("Compiled.__call__ on torch tensors", compiled_call)

    class CaiOnly:
        """Device memory offered only through __cuda_array_interface__."""

        def __init__(self, t: Any) -> None:
            self._t = t
            self.__cuda_array_interface__ = t.__cuda_array_interface__

    class DlpackOnly:
        """Device memory offered only through DLPack."""

        def __init__(self, t: Any) -> None:
            self._t = t

        def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
            return self._t.__dlpack__(*args, **kwargs)

        def __dlpack_device__(self) -> Any:
            return self._t.__dlpack_device__()

    def foreign(kind: str) -> str:
        t = torch.from_numpy(sm_x).cuda()
        obj = CaiOnly(t) if kind == "cai" else DlpackOnly(t)
        out = kiln.jit(softmax, target="cuda", client=client)(obj)
        torch.cuda.synchronize()
        host = out.get() if hasattr(out, "get") and not isinstance(out, torch.Tensor) else out.cpu().numpy()
        close(host, softmax(sm_x), 1e-5, 1e-7)
        return f"result is a {type(out).__module__}.{type(out).__name__}"

    report.check("__cuda_array_interface__-only input", lambda: foreign("cai"))
    report.check("__dlpack__-only input", lambda: foreign("dlpack"))

    def cuda_graph() -> str:
        jf = kiln.jit(softmax, target="cuda", client=client)
        static = torch.from_numpy(sm_x).cuda()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up (trace, compile, load) off the capture
            jf(static)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = jf(static)
        fresh = rng.standard_normal(sm_x.shape).astype(np.float32)
        static.copy_(torch.from_numpy(fresh))
        g.replay()
        torch.cuda.synchronize()
        close(out.cpu().numpy(), softmax(fresh), 1e-5, 1e-7)
        return "replayed on new data"

    report.check("torch CUDA graph capture", cuda_graph)

    def side_stream() -> str:
        jf = kiln.jit(kmeans, target="cuda", client=client)
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            Xd = torch.from_numpy(X).cuda() * 1.0  # produced on the side stream
            labels = jf(Xd, torch.from_numpy(means).cuda())
        s.synchronize()
        labels_agree(labels.cpu().numpy(), X, means)
        return "inputs made and consumed on a non-default stream"

    report.check("torch side stream", side_stream)

    def kernel_launch() -> str:
        # The Python launcher alone (kiln.cuda.CudaKernel over the client core's loader), as a
        # caller without the native part runner uses it: a multi-kernel result, the caller's
        # outputs and workspace, torch's current stream.
        A, B = numpy_fn_inputs(np.float32)
        compiled = kiln.jit(numpy_fn, target="cuda", client=client).compiled_for(A, B)
        k = compiled.load_cuda(torch.cuda.current_device())
        ins = [torch.from_numpy(a).cuda() for a in (A, B)]
        outs = [torch.from_numpy(np.full(s.shape, np.nan, kiln.dtypes.to_numpy(s.dtype))).cuda() for s in compiled.outputs]
        ws = torch.empty(max(k.workspace_bytes(), 16), dtype=torch.uint8, device="cuda")
        k.launch([t.data_ptr() for t in ins + outs], ws.data_ptr(), torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        close(outs[0].cpu().numpy(), numpy_fn(A.copy(), B.copy()), 5e-4, 5e-4)
        return f"{k.image_kind}, {len(compiled.plan.steps)} launches"

    report.check("CudaKernel.launch", kernel_launch)

    def raw_kernel() -> str:
        src = ('extern "C" __global__ void axpb(const float* x, float* y, float a, long long n) {\n'
               '  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n'
               '  if (i < n) y[i] = a * x[i] + 1.0f;\n}\n')
        k = kiln.cuda.RawKernel(src, "axpb", client=client)
        n = 100_003
        x = torch.randn(n, device="cuda")
        y = torch.full_like(x, float("nan"))
        k(((n + 255) // 256,), (256,), [x, y, np.float32(2.5), n])
        torch.cuda.synchronize()
        close(y.cpu().numpy(), 2.5 * x.cpu().numpy() + 1, 1e-6, 1e-6)
        return f"{n} elements, lowered name {k.lowered_name}"

    report.check("RawKernel launch", raw_kernel)


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description="kiln.jit(target='cuda') on a GPU: checks against NumPy, and timing")
    ap.add_argument("--iters", type=int, default=50, help="calls timed per workload (default 50)")
    opts = ap.parse_args()
    from gpu_common import kilnd_binary

    binary = kilnd_binary("jit_cuda_gpu")
    if binary is None:
        return 2
    report = Report()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kiln-jit-cuda-") as tmp:
        try:
            daemon = kiln.local.LocalDaemon(binary, Path(tmp), timeout=30)
        except RuntimeError as e:
            print(f"jit_cuda_gpu: {e}", file=sys.stderr)
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
