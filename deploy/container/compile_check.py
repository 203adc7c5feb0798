"""Asks a kilnd reached over the network (the container's, from build-and-run.sh) for its health
and two compiles, runs the kernels here and compares them with NumPy.

    python deploy/container/compile_check.py HOST:PORT [--metrics HOST:PORT]

The artifacts are fetched into a fresh cache folder, so what runs here is what the daemon
built, not a copy an earlier run left behind; the daemon's counters must show the compiles.
Exits non-zero, saying what failed, on any difference.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
import urllib.request

import kiln
import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("address", help="kilnd's gRPC address, HOST:PORT")
    ap.add_argument("--metrics", help="kilnd's metrics address, HOST:PORT: GET /healthz must answer")
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kiln-container-check-") as cache:
        # kiln.jit reads both when it first connects.
        os.environ["KILN_SERVER"] = opts.address
        os.environ["KILN_CACHE_DIR"] = cache
        try:
            with contextlib.closing(kiln.Client(opts.address, cache_dir=cache)) as client:
                _check(client, opts.metrics)
        except kiln.KilnError as e:
            raise SystemExit(f"compile check: {type(e).__name__}: {e}") from None
    return 0


def _check(client: kiln.Client, metrics: str | None) -> None:
    status = client.health()
    if status != "SERVING":
        raise SystemExit(f"compile check: health of {client.address} is {status}, not SERVING")
    if metrics:
        with urllib.request.urlopen(f"http://{metrics}/healthz", timeout=10) as r:
            if r.status != 200:
                raise SystemExit(f"compile check: GET /healthz answered {r.status}")

    # A graph written by hand: a row-wise softmax.
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (256, 64))
    y = b.input("y", "f32", (64,))
    z = b.exp(x - y)
    graph = b.build([z / b.sum(z, axes=[1], keepdim=True)])
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((256, 64), dtype=np.float32)
    ys = rng.standard_normal(64, dtype=np.float32)
    t0 = time.monotonic()
    got = client.compile(graph, target="cpu")(xs, ys)  # one output: the array itself
    took = time.monotonic() - t0
    e = np.exp(xs - ys)
    _expect("softmax (GraphBuilder)", got, e / e.sum(axis=1, keepdims=True))
    print(f"compile check: softmax compiled by {client.address} and run here in {took:.1f} s, matches NumPy")

    # A traced NumPy function, through kiln.jit and $KILN_SERVER.
    a = rng.standard_normal((128, 96), dtype=np.float32)
    t0 = time.monotonic()
    got = kiln.jit(_layer_norm)(a)
    took = time.monotonic() - t0
    _expect("layer norm (kiln.jit)", got, _layer_norm(a))
    print(f"compile check: layer norm traced, compiled and run in {took:.1f} s, matches NumPy")

    stats = client.stats()
    if stats.compiles < 2 or stats.compile_failures:
        raise SystemExit(f"compile check: the daemon counts {stats.compiles} compiles and "
                         f"{stats.compile_failures} failures; expected 2 and 0")
    print(f"compile check: ok (the daemon: {stats.compiles} compiles, {stats.workers} workers)")


def _layer_norm(a: np.ndarray) -> np.ndarray:
    mean = a.mean(axis=-1, keepdims=True)
    var = ((a - mean) ** 2).mean(axis=-1, keepdims=True)
    return np.tanh((a - mean) / np.sqrt(var + 1e-5))


def _expect(what: str, got: np.ndarray, want: np.ndarray) -> None:
    if got.shape != want.shape or not np.allclose(got, want, rtol=1e-4, atol=1e-5):
        worst = float(np.max(np.abs(got - want))) if got.shape == want.shape else float("nan")
        raise SystemExit(f"compile check: {what} differs from NumPy: shape {got.shape} vs "
                         f"{want.shape}, largest difference {worst}")


if __name__ == "__main__":
    sys.exit(main())
