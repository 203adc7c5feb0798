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

    .venv/bin/python tests/bench/ext_bench.py [--repeat 3] [--sources N]

``--sources N`` builds a generated extension of N translation units instead (N - 1 parts, each
including ``torch/extension.h``, and the module's bindings), the case where cpp_extension's
ninja compiles objects in parallel; the kilnd rows then add the build time kilnd logged.

cpp_extension needs ninja (``pip install ninja``). Prints a table and writes nothing else.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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
sources = sys.argv[2].split(",")
name = "lltm_bench" if len(sources) == 1 else f"multi_bench_{len(sources)}"
if sys.argv[1] == "torch":
    import torch.utils.cpp_extension as cpp
    m = cpp.load(name, sources, verbose=False)
else:
    import kiln, kiln.torch
    c = kiln.Client(os.environ["KILN_SERVER"], cache_dir=sys.argv[3])
    m = kiln.torch.load(name, sources, client=c)
if len(sources) == 1:
    x = [torch.randn(4, 8), torch.randn(18, 14), torch.randn(18), torch.randn(4, 6), torch.randn(4, 6)]
    m.forward(*x)
else:
    assert torch.equal(m.part0(torch.ones(3)), torch.full((3,), 2.0))
print(json.dumps({"s": time.perf_counter() - t}))
"""


def child(env: dict[str, str], *args: str) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, *args], env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"child failed: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["s"]


def multi_sources(folder: Path, n: int) -> list[Path]:
    """An extension of ``n`` translation units: n - 1 parts and the bindings."""
    folder.mkdir(parents=True)
    parts = []
    for i in range(n - 1):
        p = folder / f"part{i}.cpp"
        p.write_text(f"#include <torch/extension.h>\n"
                     f"torch::Tensor part{i}(torch::Tensor x) {{ return x * {i + 1} + torch::relu(x); }}\n")
        parts.append(p)
    decls = "".join(f"torch::Tensor part{i}(torch::Tensor x);\n" for i in range(n - 1))
    defs = "".join(f'  m.def("part{i}", &part{i});\n' for i in range(n - 1))
    main = folder / "module.cpp"
    main.write_text(f"#include <torch/extension.h>\n{decls}PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{\n{defs}}}\n")
    return parts + [main]


def kilnd_build_seconds(daemon: "kiln.local.LocalDaemon") -> list[float]:
    """The build times kilnd logged ("extension NAME built in N ms")."""
    return [float(ms) / 1000 for ms in re.findall(r"extension \S+ built in (\d+) ms", daemon.log())]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sources", type=int, default=1, help="N > 1: a generated extension of N sources, not LLTM")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kiln-ext-bench-"))
    what = "the LLTM extension" if args.sources <= 1 else f"an extension of {args.sources} sources"
    sources = ",".join(str(p) for p in ([LLTM] if args.sources <= 1 else multi_sources(work / "src", args.sources)))
    env = dict(os.environ, KILN_CLIENT_DIR=str(REPO / "client" / "python"))
    rows: dict[str, list[float]] = {}
    try:
        # cpp_extension
        # cpp_extension builds through ccache when it finds one: a fresh node's ccache is empty.
        tenv = dict(env, TORCH_EXTENSIONS_DIR=str(work / "torch-ext"), CCACHE_DISABLE="1")
        rows["cpp_extension.load, cold"] = [child(tenv, "torch", sources)]
        rows["cpp_extension.load, warm (same machine)"] = [child(tenv, "torch", sources) for _ in range(args.repeat)]
        # kiln
        binary = kiln.local.find_kilnd()
        if binary is None:
            raise SystemExit("kilnd not found: build it (deploy/build.sh) or set KILND")
        (work / "kilnd").mkdir()
        daemon = kiln.local.LocalDaemon(binary, work / "kilnd", args=["--log-level", "info"])
        try:
            kenv = dict(env, KILN_SERVER=daemon.address)
            rows["kiln.torch.load, cold (empty kilnd)"] = [child(kenv, "kiln", sources, str(work / "c0"))]
            rows["kiln.torch.load, warm (new machine: empty local cache)"] = [
                child(kenv, "kiln", sources, str(work / f"fresh{i}")) for i in range(args.repeat)]
            rows["kiln.torch.load, warm (same machine)"] = [
                child(kenv, "kiln", sources, str(work / "c0")) for _ in range(args.repeat)]
            rows["kilnd's build of it (cold: compile and link in the sandbox)"] = kilnd_build_seconds(daemon)
        finally:
            daemon.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cold = rows["cpp_extension.load, cold"][0]
    print(f"| load of {what}, fresh process | median s | vs cpp_extension cold |")
    print("|---|---|---|")
    for name, vals in rows.items():
        med = statistics.median(vals)
        print(f"| {name} | {med:.3f} | {cold / med:.1f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
