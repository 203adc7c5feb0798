#!/usr/bin/env python3
"""Warm-daemon first-call latency of kiln.jit from a fresh Python process.

Scenario: one process has compiled the k-means function (so the daemon's cache holds it); a
second, new process imports kiln and calls the jitted function on 2 x 1M points. Measured in
that second process: the time from the start of its first call until the result is back
(tracing, the Compile round trip answered from the cache, fetching and opening the shared
object, and running the kernel). The target is 100 ms.

By default the second process starts with an empty local artifact cache, so the fetch is
included (the worst case for a new machine); --warm-local reuses the first process's cache.

Usage::

    python tests/bench/python_warm_bench.py                 # starts its own kilnd
    python tests/bench/python_warm_bench.py --server HOST:PORT
    python tests/bench/python_warm_bench.py --kilnd build/server/kilnd --repeat 5

Prints one line per measured process and a summary; exit status 1 with --check when the
median exceeds the target.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TARGET_MS = 100.0

CHILD = textwrap.dedent(
    """
    import json, sys, time
    t_import = time.perf_counter()
    import numpy as np
    import kiln
    t_import = (time.perf_counter() - t_import) * 1e3

    def kmeans(X, means):
        return np.argmin(np.linalg.norm(X - means[:, None], axis=2), axis=0)

    n, k = int(sys.argv[1]), int(sys.argv[2])
    rng = np.random.default_rng(42)
    X = rng.standard_normal((n, 2))
    means = rng.standard_normal((k, 2))
    jf = kiln.jit(kmeans)

    t0 = time.perf_counter()
    labels = jf(X, means)
    first_ms = (time.perf_counter() - t0) * 1e3

    t1 = time.perf_counter()
    jf(X, means)
    steady_ms = (time.perf_counter() - t1) * 1e3
    c = jf.compiled_for(X, means)
    ok = bool((labels == kmeans(X, means)).mean() > 0.999) if sys.argv[3] == "1" else None
    print(json.dumps({"first_ms": first_ms, "steady_ms": steady_ms, "import_ms": t_import,
                      "cache_hit": c.cache_hit, "handle": c.handle, "ok": ok}))
    """
)


def run_child(env: dict[str, str], n: int, k: int, verify: bool) -> dict:
    p = subprocess.run([sys.executable, "-c", CHILD, str(n), str(k), "1" if verify else "0"],
                       env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f"child failed:\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", default=os.environ.get("KILN_SERVER"), help="a running daemon (default: start one)")
    ap.add_argument("--kilnd", default=None, help="the kilnd binary to start (default: $KILND, build/server/kilnd)")
    ap.add_argument("--points", type=int, default=1_000_000, help="number of 2-D points (default 1M)")
    ap.add_argument("--k", type=int, default=8, help="number of centres (default 8)")
    ap.add_argument("--repeat", type=int, default=3, help="second processes to measure (default 3)")
    ap.add_argument("--warm-local", action="store_true", help="reuse the warm-up process's local artifact cache")
    ap.add_argument("--check", action="store_true", help=f"exit 1 when the median first call exceeds {TARGET_MS:.0f} ms")
    args = ap.parse_args()

    sys.path.insert(0, str(REPO / "client" / "python"))
    import kiln.local

    tmp = Path(tempfile.mkdtemp(prefix="kiln-bench-"))
    daemon = None
    address = args.server
    if not address:
        binary = kiln.local.find_kilnd(args.kilnd)
        if binary is None:
            sys.exit("no kilnd: pass --server or --kilnd, or build build/server/kilnd")
        daemon = kiln.local.LocalDaemon(binary, tmp)
        address = daemon.address
    env = dict(os.environ, KILN_SERVER=address, KILN_CACHE_DIR=str(tmp / "local-0"))
    env.pop("KILN_RECORD_DIR", None)
    if importlib.util.find_spec("kiln") is None:  # not installed: use the source tree
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "client" / "python"), env.get("PYTHONPATH")]))
    try:
        warm = run_child(env, args.points, args.k, verify=True)
        print(f"warm-up process:  first call {warm['first_ms']:8.1f} ms  (cache_hit={warm['cache_hit']}, correct={warm['ok']})")
        firsts = []
        for i in range(args.repeat):
            if not args.warm_local:
                env["KILN_CACHE_DIR"] = str(tmp / f"local-{i + 1}")
            r = run_child(env, args.points, args.k, verify=False)
            if not r["cache_hit"]:
                print("warning: the second process was not a cache hit", file=sys.stderr)
            firsts.append(r["first_ms"])
            print(f"second process {i + 1}: first call {r['first_ms']:8.1f} ms  steady {r['steady_ms']:6.1f} ms  "
                  f"import {r['import_ms']:6.1f} ms  cache_hit={r['cache_hit']}")
        med = statistics.median(firsts)
        verdict = "PASS" if med <= TARGET_MS else "FAIL"
        print(f"kmeans on 2x{args.points} points, k={args.k}: median first call in a new process "
              f"{med:.1f} ms (target <= {TARGET_MS:.0f} ms): {verdict}")
        return 1 if args.check and med > TARGET_MS else 0
    finally:
        if daemon is not None:
            daemon.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
