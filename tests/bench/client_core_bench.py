#!/usr/bin/env python3
"""The client core's cost on the Python hot paths, against another kiln package side by side.

Two measures, each in fresh processes that alternate between the two packages (medians of
``--rounds``):

- **store hit**: ``ArtifactCache.get`` of an artifact already verified in this process (the
  lookup every load makes), µs per call;
- **kernel call**: ``CpuKernel.run`` of a one-element kernel library (the per-call path of a
  compiled CPU result, without the work), µs per call.

Usage::

    git worktree add /tmp/kiln-before HEAD~1      # the package to compare with
    python tests/bench/client_core_bench.py --before /tmp/kiln-before/client/python
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

KERNEL = textwrap.dedent("""
    #include <stdint.h>
    uint32_t kiln_abi_version(void) { return 1; }
    int kiln_run(void* const* args, void* workspace, int threads) {
      *(float*)args[1] = *(const float*)args[0] * 2.0f; return 0; }
""")

CHILD = textwrap.dedent("""
    import hashlib, json, os, sys, time
    from pathlib import Path
    import numpy as np
    from kiln.cache import ArtifactCache
    from kiln import loader
    root, so, n = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    cache = ArtifactCache(root)
    data = os.urandom(1 << 20)
    digest, _ = cache.put_bytes(data)
    assert cache.get(digest) is not None
    t = time.perf_counter()
    for _ in range(n):
        cache.get(digest)
    hit = (time.perf_counter() - t) / n * 1e6
    image = so.read_bytes()
    k = loader.load_cpu_kernel(image, hashlib.sha256(image).hexdigest(), 1)
    x, y = np.ones(1, np.float32), np.zeros(1, np.float32)
    ptrs = [x.ctypes.data, y.ctypes.data]
    k.run(ptrs, None, 1)
    assert y[0] == 2.0
    t = time.perf_counter()
    for _ in range(n):
        k.run(ptrs, None, 1)
    call = (time.perf_counter() - t) / n * 1e6
    print(json.dumps({"hit_us": hit, "call_us": call}))
""")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="client/python folder of the package to compare with")
    ap.add_argument("--after", default=str(REPO / "client" / "python"))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=20000)
    opts = ap.parse_args()
    results: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        src, so = Path(tmp) / "k.c", Path(tmp) / "k.so"
        src.write_text(KERNEL)
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
        for r in range(opts.rounds):
            for name in ("before", "after"):
                env = dict(os.environ, PYTHONPATH=getattr(opts, name))
                root = Path(tmp) / f"{name}-{r}"
                out = subprocess.run([sys.executable, "-c", CHILD, str(root), str(so), str(opts.calls)], env=env,
                                     check=True, capture_output=True, text=True).stdout
                results[name].append(json.loads(out.splitlines()[-1]))
    print(f"{'measure':<14}{'before µs':>12}{'after µs':>12}{'after/before':>14}")
    for key, label in (("hit_us", "store hit"), ("call_us", "kernel call")):
        b = statistics.median(x[key] for x in results["before"])
        a = statistics.median(x[key] for x in results["after"])
        print(f"{label:<14}{b:>12.2f}{a:>12.2f}{a / b:>14.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
