#!/usr/bin/env python3
"""``kiln.torch.load_inline`` with CUDA sources on a GPU machine as it comes (its
``TORCH_CUDA_ARCH_LIST``, its nvcc, found as torch finds it), against
``torch.utils.cpp_extension.load_inline`` on the same sources in the same process.

Builds the LLTM extension (tests/ext/lltm: a C++ binding and a ``.cu`` kernel file) inline,
cold with each (an empty kilnd cache; an empty cpp_extension build folder), then kiln's again in
a fresh process with an empty local cache (answered from kilnd's cache), runs the modules'
forward against the plain PyTorch LLTM, and prints the build times.

    tests/gpu/with_pack.sh PACK python3 tests/gpu/load_inline_gpu.py

Writes $OUT/load_inline_gpu.md; exits 1 when a build fails or a result differs.
"""
from __future__ import annotations

import os
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

import kiln.torch as kt  # noqa: E402
from gpu_common import kilnd_binary, local_client, report  # noqa: E402


def lltm_check(module, label: str, failures: list[str]) -> str:
    from reference import lltm_reference, random_inputs  # tests/ext/lltm/reference.py

    x, w, bias, h, c = (t.detach() for t in random_inputs(32, 64, 128, device="cuda", dtype=torch.float32))
    got = module.forward(x, w, bias, h, c)
    want = lltm_reference(x, w, bias, h, c)
    err = max((g - r).abs().max().item() for g, r in zip(got[:2], want[:2]))
    if err > 1e-4:
        failures.append(f"{label}: LLTM forward off by {err:.2e}")
    return f"{err:.1e}"


def main() -> int:
    binary = kilnd_binary("load_inline_gpu.py")
    if binary is None:
        return 2
    from torch.utils import cpp_extension

    cpp = (LLTM / "lltm_cuda.cpp").read_text()
    cu = (LLTM / "lltm_cuda_kernel.cu").read_text()
    failures: list[str] = []
    rows: list[list[str]] = []
    env = f"TORCH_CUDA_ARCH_LIST={os.environ.get('TORCH_CUDA_ARCH_LIST', '(unset)')}, CUDA_HOME={os.environ.get('CUDA_HOME', '(unset)')}"
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        try:
            ref = cpp_extension.load_inline("lltm_ref", cpp_sources=[cpp], cuda_sources=[cu],
                                            build_directory=tempfile.mkdtemp(dir=tmp))
            rows.append(["cpp_extension, cold", f"{time.perf_counter() - t0:.1f}", lltm_check(ref, "cpp_extension", failures)])
        except Exception as e:  # the reference failing is reported, kiln still runs
            rows.append(["cpp_extension, cold", "failed", f"{type(e).__name__}: {str(e)[:120]}"])
        with local_client(binary, "kiln-inline-") as client:
            t0 = time.perf_counter()
            try:
                mod = kt.load_inline("lltm_kiln", cpp_sources=[cpp], cuda_sources=[cu], client=client)
                rows.append(["kiln, cold", f"{time.perf_counter() - t0:.1f}", lltm_check(mod, "kiln", failures)])
            except Exception as e:
                failures.append(f"kiln, cold: {type(e).__name__}: {str(e)[:400]}")
                rows.append(["kiln, cold", "failed", ""])
            # Warm: the same extension in a fresh process (another machine of the cluster would
            # do the same), answered from kilnd's cache; the module is downloaded and imported.
            code = ("import sys, time, torch; from pathlib import Path; import kiln.torch as kt; "
                    f"d = Path({str(LLTM)!r}); t0 = time.perf_counter(); "
                    "kt.load_inline('lltm_kiln', cpp_sources=[(d / 'lltm_cuda.cpp').read_text()], "
                    "cuda_sources=[(d / 'lltm_cuda_kernel.cu').read_text()]); print(time.perf_counter() - t0)")
            child_env = dict(os.environ, KILN_SERVER=client.address, KILN_CACHE_DIR=tempfile.mkdtemp(dir=tmp))
            done = subprocess.run([sys.executable, "-c", code], env=child_env, capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                failures.append(f"kiln, warm: {done.stderr[-400:]}")
                rows.append(["kiln, warm (fresh process, empty local cache)", "failed", ""])
            else:
                rows.append(["kiln, warm (fresh process, empty local cache)",
                             f"{float(done.stdout.split()[-1]):.1f}", "(imported)"])
    return report(f"load_inline with CUDA sources, the machine as it comes ({env})",
                  ["build", "seconds", "LLTM forward error"], rows, failures,
                  "every build ran and matched the plain PyTorch LLTM", "load_inline_gpu.md")


if __name__ == "__main__":
    sys.exit(main())
