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
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    scale = 16 if args.quick else 1
    n_km, k_km = 10_000_000 // scale, 8
    n_pw = 16 * 2**20 // scale
    rows, cols = 4096 // scale, 4096

    with daemon() as address:
        client = kiln.Client(address)
        target = os.environ.get("KILN_BENCH_TARGET", "cpu")
        X = rng.standard_normal((n_km, 2))
        M = rng.standard_normal((k_km, 2))
        x1 = rng.standard_normal(n_pw).astype(np.float32)
        x2 = rng.standard_normal((rows, cols)).astype(np.float32)
        work = [
            (f"k-means assign, X f64[{n_km},2], {k_km} means", kmeans_graph(n_km, k_km), (X, M),
             lambda: np.argmin(np.linalg.norm(X - M[:, None], axis=2), axis=0), 3),
            (f"sin^2+cos^2, f32[{n_pw}]", sincos_graph(n_pw), (x1,), lambda: np.sin(x1) ** 2 + np.cos(x1) ** 2, args.runs),
            (f"row softmax, f32[{rows},{cols}]", softmax_graph(rows, cols), (x2,), lambda: np_softmax(x2), args.runs),
            (f"layer_norm, f32[{rows},{cols}]", layernorm_graph(rows, cols), (x2,), lambda: np_layernorm(x2), args.runs),
        ]
        print(f"target {target}; NumPy {np.__version__}; {os.cpu_count()} CPUs")
        print(f"{'workload':44s} {'numpy ms':>9s} {'kiln 1t':>8s} {'x':>6s} {'kiln 2t':>8s} {'x':>6s}")
        for name, graph, inputs, ref, runs in work:
            compiled = client.compile(graph, target=target)
            want = ref()
            got = compiled(*inputs, num_threads=2)
            if got.dtype.kind == "f":
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
            else:
                assert (got == want).all(), name
            t_np = median_time(ref, runs)
            out = [np.empty_like(got)]
            t1 = median_time(lambda: compiled(*inputs, num_threads=1, out=out), runs)
            t2 = median_time(lambda: compiled(*inputs, num_threads=2, out=out), runs)
            print(f"{name:44s} {t_np*1e3:9.1f} {t1*1e3:8.1f} {t_np/t1:6.1f} {t2*1e3:8.1f} {t_np/t2:6.1f}")

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
