#!/usr/bin/env python3
"""``kiln.torch.load_inline`` with CUDA sources on a GPU machine as it comes (its
``TORCH_CUDA_ARCH_LIST``, its nvcc, found as torch finds it), against
``torch.utils.cpp_extension.load_inline`` on the same sources in the same process.

Builds the LLTM extension (tests/ext/lltm: a C++ binding and a ``.cu`` kernel file) inline,
cold with each (an empty kilnd cache; an empty cpp_extension build folder), then kiln's again in
a fresh process with an empty local cache (answered from kilnd's cache), runs the modules'
forward against the plain PyTorch LLTM, and prints the build times, with where kiln's cold build
spent them (the client's hashing and upload; kilnd's steps, from its log).

    tests/gpu/with_pack.sh PACK python3 tests/gpu/load_inline_gpu.py [--rounds N]

``--rounds N`` builds each cold N times, alternating which goes first: the two compete for the
same nvcc, and the machine's speed drifts over minutes.

Writes $OUT/load_inline_gpu.md; exits 1 when a build fails or a result differs.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
LLTM = HERE.parent / "ext" / "lltm"
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(LLTM))

import kiln.ext as kext  # noqa: E402
import kiln.local  # noqa: E402
import kiln.torch as kt  # noqa: E402
import kiln.torch_extension as ktx  # noqa: E402
from gpu_common import kilnd_binary, report  # noqa: E402


def timed(module, name: str, spent: dict[str, float]) -> None:
    """Wraps ``module.name`` so that its calls add their wall time to ``spent[name]``."""
    inner = getattr(module, name)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - t0

    wrapper.__wrapped__ = inner
    setattr(module, name, wrapper)


def lltm_check(module, label: str, failures: list[str]) -> str:
    from reference import lltm_reference, random_inputs  # tests/ext/lltm/reference.py

    x, w, bias, h, c = (t.detach() for t in random_inputs(32, 64, 128, device="cuda", dtype=torch.float32))
    got = module.forward(x, w, bias, h, c)
    want = lltm_reference(x, w, bias, h, c)
    err = max((g - r).abs().max().item() for g, r in zip(got[:2], want[:2]))
    if err > 1e-4:
        failures.append(f"{label}: LLTM forward off by {err:.2e}")
    return f"{err:.1e}"


def cpp_extension_cold(r: int, cpp: str, cu: str, tmp: str, failures: list[str]) -> tuple[float, str]:
    from torch.utils import cpp_extension

    t0 = time.perf_counter()
    ref = cpp_extension.load_inline(f"lltm_ref{r}", cpp_sources=[cpp], cuda_sources=[cu],
                                    build_directory=tempfile.mkdtemp(dir=tmp))
    return time.perf_counter() - t0, lltm_check(ref, "cpp_extension", failures)


def kiln_cold(r: int, binary: str, cpp: str, cu: str, tmp: str, failures: list[str]) -> tuple[float, str, list[str], str]:
    """A cold build on an empty kilnd: (seconds, error, where the time went, the kilnd's address;
    the daemon is left running for the warm case)."""
    daemon = kiln.local.LocalDaemon(binary, Path(tmp) / f"kilnd{r}", timeout=30)
    kiln_cold.daemons.append(daemon)
    client = kiln.Client(daemon.address, cache_dir=Path(tmp) / f"client-cache{r}")
    spent: dict[str, float] = {}
    for module, name in ((ktx, "prepare"), (kext, "_find_missing"), (kext, "_upload")):
        timed(module, name, spent)
    t0 = time.perf_counter()
    mod = kt.load_inline(f"lltm_kiln{r}", cpp_sources=[cpp], cuda_sources=[cu], client=client)
    took = time.perf_counter() - t0
    for module, name in ((ktx, "prepare"), (kext, "_find_missing"), (kext, "_upload")):
        setattr(module, name, getattr(module, name).__wrapped__)
    client.close()
    daemon.stop()  # flushes its log; restarted on the same folder for the warm case
    parts = [f"client {name.strip('_')} {s:.2f} s" for name, s in spent.items()]
    parts += [line.split(f"extension lltm_kiln{r}", 1)[1].strip(": ")
              for line in daemon.log().splitlines() if f"extension lltm_kiln{r}" in line]
    again = kiln.local.LocalDaemon(binary, Path(tmp) / f"kilnd{r}", timeout=30)
    kiln_cold.daemons.append(again)
    return took, lltm_check(mod, "kiln", failures), parts, again.address


kiln_cold.daemons = []


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=1,
                    help="cold builds of each, alternating which goes first (a new name and an empty kilnd each)")
    args = ap.parse_args()
    binary = kilnd_binary("load_inline_gpu.py")
    if binary is None:
        return 2
    cpp = (LLTM / "lltm_cuda.cpp").read_text()
    cu = (LLTM / "lltm_cuda_kernel.cu").read_text()
    failures: list[str] = []
    rows: list[list[str]] = []
    env = f"TORCH_CUDA_ARCH_LIST={os.environ.get('TORCH_CUDA_ARCH_LIST', '(unset)')}, CUDA_HOME={os.environ.get('CUDA_HOME', '(unset)')}"
    times: dict[str, list[float]] = {"cpp_extension": [], "kiln": []}
    address = ""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for r in range(args.rounds):
                order = ["cpp_extension", "kiln"] if r % 2 == 0 else ["kiln", "cpp_extension"]
                for who in order:
                    try:
                        if who == "cpp_extension":
                            took, err = cpp_extension_cold(r, cpp, cu, tmp, failures)
                            rows.append([f"round {r + 1}: cpp_extension, cold", f"{took:.1f}", err])
                        else:
                            took, err, parts, address = kiln_cold(r, binary, cpp, cu, tmp, failures)
                            rows.append([f"round {r + 1}: kiln, cold (empty kilnd): " + "; ".join(parts), f"{took:.1f}", err])
                        times[who].append(took)
                    except Exception as e:  # reported; the other still runs
                        failures.append(f"round {r + 1}, {who}, cold: {type(e).__name__}: {str(e)[:400]}")
                        rows.append([f"round {r + 1}: {who}, cold", "failed", ""])
            if times["kiln"] and times["cpp_extension"]:
                k, c = statistics.median(times["kiln"]), statistics.median(times["cpp_extension"])
                rows.append([f"median cold over {args.rounds} round(s): kiln {k:.1f} s / cpp_extension {c:.1f} s",
                             f"{k / c:.3f}x", ""])
            if address:
                # Warm: the same extension in a fresh process (another machine of the cluster
                # would do the same), answered from kilnd's cache; the module is downloaded and
                # imported.
                r = len(times["kiln"]) - 1
                code = ("import sys, time, torch; from pathlib import Path; import kiln.torch as kt; "
                        f"d = Path({str(LLTM)!r}); t0 = time.perf_counter(); "
                        f"kt.load_inline('lltm_kiln{r}', cpp_sources=[(d / 'lltm_cuda.cpp').read_text()], "
                        "cuda_sources=[(d / 'lltm_cuda_kernel.cu').read_text()]); print(time.perf_counter() - t0)")
                child_env = dict(os.environ, KILN_SERVER=address, KILN_CACHE_DIR=tempfile.mkdtemp(dir=tmp))
                done = subprocess.run([sys.executable, "-c", code], env=child_env, capture_output=True, text=True, timeout=300)
                if done.returncode != 0:
                    failures.append(f"kiln, warm: {done.stderr[-400:]}")
                    rows.append(["kiln, warm (fresh process, empty local cache)", "failed", ""])
                else:
                    rows.append(["kiln, warm (fresh process, empty local cache)",
                                 f"{float(done.stdout.split()[-1]):.1f}", "(imported)"])
        finally:
            for d in kiln_cold.daemons:
                d.stop()
    return report(f"load_inline with CUDA sources, the machine as it comes ({env})",
                  ["build", "seconds", "LLTM forward error"], rows, failures,
                  "every build ran and matched the plain PyTorch LLTM", "load_inline_gpu.md")


if __name__ == "__main__":
    sys.exit(main())
