#!/usr/bin/env python3
"""Runs the GPU suite's op suite with no GPU: each artifact's CUDA source (kernel.cu) is built
as host C++ against the software model of the CUDA built-ins the unit tests use
(tests/unit/kernels/cuda_emulation.h), and gpu_suite.py's own loader (the client core's CUDA
loader) runs it through the fake driver of those tests (libfake_cuda.so), on CPU tensors,
against the same PyTorch references. It checks the references, the generated kernels' logic
and the launcher before a GPU is at hand; it says nothing about CUDA's math library or speed.

  python3 tests/gpu/emulate_suite.py [GRAPH ...]     (needs g++ and PyTorch; after build_artifacts.sh)
  KILN_SEED=N picks the random inputs (default 1); KILN_BINARY_DIR the build tree (default build/).
"""
import ctypes
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The fake driver first: the client core then finds it as libcuda.so.1.
FAKE = ctypes.CDLL(str(Path(os.environ.get("KILN_BINARY_DIR", ROOT / "build")) / "tests/unit/kernels/libfake_cuda.so"))
FAKE.fake_cuda_use_library.argtypes = [ctypes.c_void_p]

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_suite  # noqa: E402


def emulated_kernel(folder, workdir):
    """gpu_suite's kernel for an artifact folder, its launches run in emulation."""
    lib = Path(workdir) / (folder.name + ".so")
    subprocess.run(["g++", "-std=c++20", "-O1", "-fPIC", "-shared", "-w", "-DKILN_CUDA_EMULATION", "-include",
                    str(ROOT / "tests/unit/kernels/cuda_emulation.h"), "-I", str(ROOT / "kernels/runtime"),
                    "-x", "c++", str(folder / "kernel.cu"), "-o", str(lib)], check=True)
    unit = ctypes.CDLL(str(lib))
    FAKE.fake_cuda_use_library(unit._handle)
    kernel = gpu_suite.KilnKernel(folder)
    kernel.unit = unit  # keeps the emulated library loaded while the kernel lives
    return kernel


def main():
    gpu_suite.DEVICE = "cpu"
    manifest = json.loads((gpu_suite.ART / "manifest.json").read_text())
    only = set(sys.argv[1:]) or None
    results = {}
    with tempfile.TemporaryDirectory() as work:
        seed = int(os.environ.get("KILN_SEED", "1"))
        ok = gpu_suite.run_suite(lambda folder: emulated_kernel(folder, work), manifest, seed, results, only)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
