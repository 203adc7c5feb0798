"""What result verification costs the Python client on a cache hit.

Makes a test PKI (openssl, kilnd keygen), starts kilnd with mTLS, tokens and signing, warms one
key, then times ``Client.compile`` hits for ``--seconds`` with verification off (no trusted
key) and on (the daemon's public key trusted), and the check alone in thread CPU time: the full
check (canonical bytes + Ed25519) and the repeat of a record already verified.

    KILN_BINARY_DIR=build PYTHONPATH=client/python python3 tests/bench/trust_python_bench.py

A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))  # the test PKI helper

import kiln  # noqa: E402
from pki import make_pki  # noqa: E402


def time_hits(c: kiln.Client, graph, seconds: float) -> list[float]:
    ms = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        c._known.clear()  # a hit from kilnd each time, not the client's memory of results
        t0 = time.perf_counter()
        r = c.compile(graph, "cpu", {"opt_level": 0})
        ms.append((time.perf_counter() - t0) * 1e3)
        assert r.cache_hit
    return ms


def cpu_us(fn, n: int) -> float:
    t0 = time.thread_time()
    for _ in range(n):
        fn()
    return (time.thread_time() - t0) / n * 1e6


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    binary = kiln.local.find_kilnd()
    if binary is None:
        print("kilnd is not built", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        pki = make_pki(Path(tmp) / "pki", binary)
        b = kiln.GraphBuilder()
        x = b.input("x", "f32", (1024,))
        graph = b.build(b.exp(x) + 1.0)
        with kiln.local.LocalDaemon(binary, Path(tmp) / "d", args=[*pki.server_args(), "--log-level", "warn"],
                                    probe_options=pki.client_options()) as d:
            rows = []
            for name, keys in (("mtls+token, verify off", []), ("mtls+token, verify on", [pki.signing[1]])):
                with kiln.Client(d.address, **pki.client_options("compiler"), trusted_keys=keys) as c:
                    warm = c.compile(graph, "cpu", {"opt_level": 0})
                    ms = time_hits(c, graph, args.seconds)
                    rows.append((name, statistics.median(ms), sorted(ms)[int(0.99 * len(ms))], statistics.mean(ms), len(ms)))
            with kiln.Client(d.address, **pki.client_options("compiler"), trusted_keys=[pki.signing[1]]) as c:
                full = cpu_us(lambda: c.trust._verify(warm.handle, warm.result), 2000)
                repeat = cpu_us(lambda: c.trust.check(warm.handle, warm.result), 2000)
    print(f"{'Python Client.compile hit':<28} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8} {'calls':>7}")
    for name, p50, p99, mean, n in rows:
        print(f"{name:<28} {p50:8.3f} {p99:8.3f} {mean:8.3f} {n:7d}")
    print(f"check CPU time per result: full {full:.1f} us, repeat of a verified record {repeat:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
