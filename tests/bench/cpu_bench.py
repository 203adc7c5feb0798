"""CPU benchmark: kiln's kernels against NumPy, side by side in one process.

For each workload: the median of several runs of the NumPy expression and of the kiln kernel
(1 and 2 threads) on the same inputs, and their ratio; the kiln result is checked against
NumPy first. Then the cold compile latency (graph in, .so out, server side) of each graph,
compiled several times under distinct keys (a row count changes by one each time).

    python3 tests/bench/cpu_bench.py [--runs 7] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kiln  # noqa: E402
from kilnd_proc import daemon  # noqa: E402


def median_time(fn, runs: int) -> float:
    fn()
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def kmeans_graph(n: int, k: int):
    b = kiln.GraphBuilder()
    X = b.input("X", "f64", (n, 2))
    M = b.input("means", "f64", (k, 2))
    d = b.sub(X, b.unsqueeze(M, [1]))
    return b.build([b.argmin(b.norm(d, axes=[2]), axis=0)])


def kmeans_seed_graph(n: int):
    """The seed's k-means as written: float points, int64 means ``[[5, 5], [10, 10]]``."""
    b = kiln.GraphBuilder()
    X = b.input("X", "f64", (n, 2))
    M = b.input("means", "i64", (2, 2))
    d = b.sub(X, b.unsqueeze(M, [1]))
    return b.build([b.argmin(b.norm(d, axes=[2]), axis=0)])


def column_graph(kind: str, r: int, c: int):
    """Reductions over the outer axis of a row-major f32[r, c] (and a transposed view)."""
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (r, c))
    if kind == "mean":
        out = b.mean(x, axes=[0])
    elif kind == "var":
        out = b.var(x, axes=[0])
    elif kind == "softmax":
        out = b.softmax(x, axis=0)
    elif kind == "count":
        out = b.sum(b.gt(x, 0.5), axes=[0])
    elif kind == "tsum":
        out = b.sum(b.permute(x, [1, 0]), axes=[1])
    else:  # batch-norm style: column statistics, then normalise
        mu = b.mean(x, axes=[0], keepdim=True)
        out = b.div(b.sub(x, mu), b.sqrt(b.add(b.var(x, axes=[0], keepdim=True), 1e-5)))
    return b.build([out])


def row_graph(kind: str, r: int, c: int):
    """Reductions along the contiguous axis whose output is one value per row."""
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (r, c))
    if kind == "argmax":
        return b.build([b.argmax(x, axis=1)])
    return b.build([b.sum(x, axes=[1]) if kind == "sum" else b.sqrt(b.sum(x * x, axes=[1]))])


def np_column(kind: str, x):
    if kind == "mean":
        return x.mean(axis=0)
    if kind == "var":
        return x.var(axis=0)
    if kind == "softmax":
        e = np.exp(x - x.max(axis=0, keepdims=True))
        return e / e.sum(axis=0, keepdims=True)
    if kind == "count":
        return (x > 0.5).sum(axis=0)
    if kind == "tsum":
        return x.T.sum(axis=1)
    return (x - x.mean(axis=0, keepdims=True)) / np.sqrt(x.var(axis=0, keepdims=True) + 1e-5)


def sincos_graph(n: int):
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (n,))
    s, c = b.sin(x), b.cos(x)
    return b.build([s * s + c * c])


def softmax_graph(r: int, c: int):
    b = kiln.GraphBuilder()
    return b.build([b.softmax(b.input("x", "f32", (r, c)), axis=-1)])


def layernorm_graph(r: int, c: int):
    b = kiln.GraphBuilder()
    return b.build([b.layer_norm(b.input("x", "f32", (r, c)), eps=1e-5)])


def np_softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def np_layernorm(x):
    mu = x.mean(axis=1, keepdims=True)
    return (x - mu) / np.sqrt(x.var(axis=1, keepdims=True) + 1e-5)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    ap.add_argument("--only", default="", help="comma-separated substrings of workload names to run")
    ap.add_argument("--no-compile-latency", action="store_true", help="skip the cold compile figures")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    scale = 16 if args.quick else 1
    n_km, k_km = 10_000_000 // scale, 8
    n_pw = 16 * 2**20 // scale
    rows, cols = 4096 // scale, 4096
    crows, ccols = 4096 // scale, 2560

    with daemon() as address:
        client = kiln.Client(address)
        target = os.environ.get("KILN_BENCH_TARGET", "cpu")
        X = rng.standard_normal((n_km, 2))
        M = rng.standard_normal((k_km, 2))
        x1 = rng.standard_normal(n_pw).astype(np.float32)
        x2 = rng.standard_normal((rows, cols)).astype(np.float32)
        Xs = rng.standard_normal((n_km, 2)) * 3 + 7.5
        Ms = np.array([[5, 5], [10, 10]])
        xc = rng.standard_normal((crows, ccols)).astype(np.float32)
        work = [
            (f"k-means seed, X f64[{n_km},2], i64 means", kmeans_seed_graph(n_km), (Xs, Ms),
             lambda: np.argmin(np.linalg.norm(Xs - Ms[:, None], axis=2), axis=0), 3),
            (f"k-means assign, X f64[{n_km},2], {k_km} means", kmeans_graph(n_km, k_km), (X, M),
             lambda: np.argmin(np.linalg.norm(X - M[:, None], axis=2), axis=0), 3),
            (f"sin^2+cos^2, f32[{n_pw}]", sincos_graph(n_pw), (x1,), lambda: np.sin(x1) ** 2 + np.cos(x1) ** 2, args.runs),
            (f"row softmax, f32[{rows},{cols}]", softmax_graph(rows, cols), (x2,), lambda: np_softmax(x2), args.runs),
            (f"layer_norm, f32[{rows},{cols}]", layernorm_graph(rows, cols), (x2,), lambda: np_layernorm(x2), args.runs),
        ]
        for kind, label in [("mean", "column mean"), ("var", "column var"), ("softmax", "column softmax"),
                            ("count", "column count x>0.5"), ("tsum", "x.T.sum(axis=1)"),
                            ("bnorm", "column-stat normalise")]:
            work.append((f"{label}, f32[{crows},{ccols}]", column_graph(kind, crows, ccols), (xc,),
                         lambda kind=kind: np_column(kind, xc), 3 * args.runs, 1e-3 if kind == "tsum" else 1e-5))
        for r, c in [(64, 200_000 // scale), (4096 // scale, 1000)]:
            xr = rng.standard_normal((r, c)).astype(np.float32)
            work.append((f"row sum, f32[{r},{c}]", row_graph("sum", r, c), (xr,), lambda xr=xr: xr.sum(axis=1),
                         3 * args.runs, 1e-3))
            work.append((f"row norm, f32[{r},{c}]", row_graph("norm", r, c), (xr,),
                         lambda xr=xr: np.sqrt((xr * xr).sum(axis=1)), 3 * args.runs))
            work.append((f"row argmax, f32[{r},{c}]", row_graph("argmax", r, c), (xr,), lambda xr=xr: xr.argmax(axis=1),
                         3 * args.runs))
        if args.only:
            work = [w for w in work if any(o in w[0] for o in args.only.split(","))]
        print(f"target {target}; NumPy {np.__version__}; {os.cpu_count()} CPUs")
        print(f"{'workload':44s} {'numpy ms':>9s} {'kiln 1t':>8s} {'x':>6s} {'kiln 2t':>8s} {'x':>6s}")
        for name, graph, inputs, ref, runs, *tol in work:
            compiled = client.compile(graph, target=target)
            want = ref()
            got = compiled(*inputs, num_threads=2)
            if got.dtype.kind == "f":
                # f32 sums of thousands of terms differ from NumPy's pairwise order by ~1e-4.
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=tol[0] if tol else 1e-5, err_msg=name)
            else:
                assert (got == want).all(), name
            t_np = median_time(ref, runs)
            out = [np.empty_like(got)]
            t1 = median_time(lambda: compiled(*inputs, num_threads=1, out=out), runs)
            t2 = median_time(lambda: compiled(*inputs, num_threads=2, out=out), runs)
            print(f"{name:44s} {t_np*1e3:9.1f} {t1*1e3:8.1f} {t_np/t1:6.1f} {t2*1e3:8.1f} {t_np/t2:6.1f}")

        if args.no_compile_latency:
            return
        print("\ncold compile, server side (graph in, .so out), distinct keys:")
        print(f"{'graph':20s} {'p50 ms':>8s} {'min':>7s} {'max':>7s}  (frontend / toolchain p50)")
        makers = [("k-means", lambda i: kmeans_graph(1000 + i, k_km)), ("sin^2+cos^2", lambda i: sincos_graph(4096 + i)),
                  ("row softmax", lambda i: softmax_graph(64 + i, 1000)), ("layer_norm", lambda i: layernorm_graph(64 + i, 768))]
        salt = int(time.time()) % 100000
        for name, make in makers:
            totals, fronts, tools = [], [], []
            for i in range(5 if args.quick else 9):
                c = client.compile(make(salt * 16 + i), target=target)
                assert not c.cache_hit
                totals.append(c.stats.total_ms)
                fronts.append(c.stats.frontend_ms)
                tools.append(c.stats.toolchain_ms)
            print(f"{name:20s} {statistics.median(totals):8.1f} {min(totals):7.1f} {max(totals):7.1f}  "
                  f"({statistics.median(fronts):.2f} / {statistics.median(tools):.1f})")


if __name__ == "__main__":
    main()
