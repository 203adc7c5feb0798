"""Extension builds: kiln.torch.load against torch.utils.cpp_extension.load, cold and warm.

Builds the LLTM C++ extension (tests/ext/lltm/lltm.cpp) both ways, each load in a fresh Python
process (what a new container or CI job pays), timing the load call only (PyTorch is imported
before the clock starts):

- cpp_extension cold: an empty TORCH_EXTENSIONS_DIR, ccache off (g++ and ninja on this machine);
  warm: the same folder again (ninja finds nothing to do).
- kiln cold: an empty kilnd (upload of the header trees, then the build on kilnd);
  warm, new machine: kilnd has it, the process has an empty local cache (what a second node
  pays: hash the header trees, one BuildExtension hit, fetch the module);
  warm, same machine: the local cache is kept too.

    .venv/bin/python tests/bench/ext_bench.py [--repeat 3]

cpp_extension needs ninja (``pip install ninja``). Prints a table and writes nothing else.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "client" / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import kiln  # noqa: E402

LLTM = REPO / "tests" / "ext" / "lltm" / "lltm.cpp"

CHILD = r"""
import json, os, sys, time
import torch
sys.path.insert(0, os.environ["KILN_CLIENT_DIR"])
t = time.perf_counter()
if sys.argv[1] == "torch":
    import torch.utils.cpp_extension as cpp
    m = cpp.load("lltm_bench", [sys.argv[2]], verbose=False)
else:
    import kiln, kiln.torch
    c = kiln.Client(os.environ["KILN_SERVER"], cache_dir=sys.argv[3])
    m = kiln.torch.load("lltm_bench", [sys.argv[2]], client=c)
x = [torch.randn(4, 8), torch.randn(18, 14), torch.randn(18), torch.randn(4, 6), torch.randn(4, 6)]
m.forward(*x)
print(json.dumps({"s": time.perf_counter() - t}))
"""


def child(env: dict[str, str], *args: str) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, *args], env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"child failed: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["s"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kiln-ext-bench-"))
    env = dict(os.environ, KILN_CLIENT_DIR=str(REPO / "client" / "python"))
    rows: dict[str, list[float]] = {}
    try:
        # cpp_extension
        # cpp_extension builds through ccache when it finds one: a fresh node's ccache is empty.
        tenv = dict(env, TORCH_EXTENSIONS_DIR=str(work / "torch-ext"), CCACHE_DISABLE="1")
        rows["cpp_extension.load, cold"] = [child(tenv, "torch", str(LLTM))]
        rows["cpp_extension.load, warm (same machine)"] = [child(tenv, "torch", str(LLTM)) for _ in range(args.repeat)]
        # kiln
        binary = kiln.local.find_kilnd()
        if binary is None:
            raise SystemExit("kilnd not found: build it (deploy/build.sh) or set KILND")
        (work / "kilnd").mkdir()
        daemon = kiln.local.LocalDaemon(binary, work / "kilnd", args=["--log-level", "warn"])
        try:
            kenv = dict(env, KILN_SERVER=daemon.address)
            rows["kiln.torch.load, cold (empty kilnd)"] = [child(kenv, "kiln", str(LLTM), str(work / "c0"))]
            rows["kiln.torch.load, warm (new machine: empty local cache)"] = [
                child(kenv, "kiln", str(LLTM), str(work / f"fresh{i}")) for i in range(args.repeat)]
            rows["kiln.torch.load, warm (same machine)"] = [
                child(kenv, "kiln", str(LLTM), str(work / "c0")) for _ in range(args.repeat)]
        finally:
            daemon.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cold = rows["cpp_extension.load, cold"][0]
    print(f"| load of the LLTM extension, fresh process | median s | vs cpp_extension cold |")
    print("|---|---|---|")
    for name, vals in rows.items():
        med = statistics.median(vals)
        print(f"| {name} | {med:.3f} | {cold / med:.1f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
