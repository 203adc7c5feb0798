"""Dynamic shapes benchmark: one kernel for every size against kernels compiled per shape.

Side by side in one process, on the same inputs: the seed's k-means (float points, int64 means
``[[5, 5], [10, 10]]``) compiled for the exact point count and compiled with the point count
symbolic; the median of several runs of each (1 and 2 threads) and their ratio, and NumPy's time.
Then ``kiln.jit`` called with 20 different point counts: how many compiles it asked for. Then
(with PyTorch) a transformer encoder block under ``torch.compile(backend="kiln")`` on CPU,
static against ``dynamic=True``: time per inference call at one size, and parts compiled over
several sequence lengths.

    python3 tests/bench/dynamic_bench.py [--n 10000000] [--runs 7]
"""

from __future__ import annotations

import argparse
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


def kmeans_graph(n: int, symbolic: bool):
    b = kiln.GraphBuilder()
    X = b.input("X", "f64", (n, 2), dims=("N", None) if symbolic else None)
    M = b.input("means", "i64", (2, 2))
    d = b.sub(X, b.unsqueeze(M, [1]))
    return b.build([b.argmin(b.norm(d, axes=[2]), axis=0)])


def numpy_kmeans(X, means):
    return np.argmin(np.linalg.norm(X - means[:, None], axis=2), axis=0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 15, (args.n, 2))
    means = np.array([[5, 5], [10, 10]])
    with daemon() as address:
        client = kiln.Client(address)
        static = client.compile(kmeans_graph(args.n, False))
        dynamic = client.compile(kmeans_graph(17, True))
        want = numpy_kmeans(X, means)
        for c in (static, dynamic):
            np.testing.assert_array_equal(c(X, means), want)
        t_np = median_time(lambda: numpy_kmeans(X, means), args.runs)
        print(f"k-means seed, X f64[{args.n},2], i64 means; NumPy {t_np * 1e3:.1f} ms")
        print("threads  static ms  dynamic ms  dynamic/static  NumPy/dynamic")
        for nt in (1, 2):
            t_s = median_time(lambda: static(X, means, num_threads=nt), args.runs)
            t_d = median_time(lambda: dynamic(X, means, num_threads=nt), args.runs)
            print(f"{nt:7d}  {t_s * 1e3:9.2f}  {t_d * 1e3:10.2f}  {t_d / t_s:14.3f}  {t_np / t_d:13.1f}")

        @kiln.jit(client=client)
        def kmeans(X, means):
            return np.argmin(np.linalg.norm(X - means[:, None], axis=2), axis=0)

        counts = [1000 + 37 * i for i in range(20)]
        for n in counts:
            x = rng.uniform(0, 15, (n, 2))
            np.testing.assert_array_equal(kmeans(x, means), numpy_kmeans(x, means))
        print(f"kiln.jit k-means at {len(counts)} point counts: {kmeans.compile_count} compiles, all equal to NumPy")
        encoder(client, args.runs)


def encoder(client, runs: int) -> None:
    try:
        import torch
    except ImportError:
        print("no PyTorch: encoder block skipped")
        return
    import kiln.torch as kt
    from kiln.torch import examples as E

    times = {}
    for dynamic in (False, True):
        torch._dynamo.reset()
        kt.reset_stats()
        kt.clear_memo()
        fn = torch.compile(E.encoder_block, backend="kiln", options={"client": client}, dynamic=dynamic)
        with torch.no_grad():
            if dynamic:
                for t in (64, 96, 200):  # other lengths first: the kernels must not depend on them
                    fn(*E.make_encoder(8, t, 256, requires_grad=False))
            args = E.make_encoder(8, 128, 256, requires_grad=False)
            torch.testing.assert_close(fn(*args), E.encoder_block(*args), rtol=1e-4, atol=1e-4)
            times[dynamic] = median_time(lambda: fn(*args), runs)
        s = kt.stats()
        print(f"encoder block B=8 C=256, dynamic={dynamic}: parts compiled {s['compiled']}, fell back {s['failed']}, "
              f"eager part calls {s['eager_calls']}; T=128 {times[dynamic] * 1e3:.2f} ms per call")
    print(f"encoder block dynamic/static at T=128: {times[True] / times[False]:.3f}")


if __name__ == "__main__":
    main()
