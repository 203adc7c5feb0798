#!/usr/bin/env python3
"""Runs the GPU suite's op suite with no GPU: each artifact's CUDA source (kernel.cu) is built
as host C++ against the software model of the CUDA built-ins the unit tests use
(tests/unit/kernels/cuda_emulation.h) and run on CPU tensors, against the same PyTorch
references gpu_suite.py uses. It checks the references and the generated kernels' logic before
a GPU is at hand; it says nothing about CUDA's math library or speed.

  python3 tests/gpu/emulate_suite.py [GRAPH ...]     (needs g++ and PyTorch; after build_artifacts.sh)
  KILN_SEED=N picks the random inputs (default 1).
"""
import ctypes
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_suite  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


class EmulatedKernel:
    def __init__(self, folder, workdir):
        self.plan = json.loads((folder / "plan.json").read_text())
        self.outputs = sorted((b for b in self.plan["buffers"] if b["role"] == "output"), key=lambda b: b["index"])
        lib = Path(workdir) / (folder.name + ".so")
        subprocess.run(["g++", "-std=c++20", "-O1", "-fPIC", "-shared", "-w", "-DKILN_CUDA_EMULATION", "-include",
                        str(ROOT / "tests/unit/kernels/cuda_emulation.h"), "-I", str(ROOT / "kernels/runtime"),
                        "-x", "c++", str(folder / "kernel.cu"), "-o", str(lib)], check=True)
        self.lib = ctypes.CDLL(str(lib))
        self.lib.kiln_emu_launch.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint,
                                             ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
        self.workspace = torch.empty(max(self.plan["workspace_bytes"], 64), dtype=torch.uint8)

    def run(self, inputs, outputs):
        ptrs = []
        for b in self.plan["buffers"]:
            if b["role"] == "temp":
                ptrs.append(self.workspace.data_ptr() + b["offset"])
            else:
                t = (inputs if b["role"] == "input" else outputs)[b["index"]]
                assert t.is_contiguous() and t.data_ptr() % 16 == 0
                ptrs.append(t.data_ptr())
        for s in self.plan["steps"]:
            fn = ctypes.cast(getattr(self.lib, s["kernel"]), ctypes.c_void_p)
            args = (ctypes.c_void_p * max(len(s["args"]), 1))(*[ptrs[a] for a in s["args"]])
            self.lib.kiln_emu_launch(fn, s["grid"][0], s["block"][0], args, len(s["args"]))


def main():
    gpu_suite.DEVICE = "cpu"
    manifest = json.loads((gpu_suite.ART / "manifest.json").read_text())
    only = set(sys.argv[1:]) or None
    results = {}
    with tempfile.TemporaryDirectory() as work:
        seed = int(os.environ.get("KILN_SEED", "1"))
        ok = gpu_suite.run_suite(lambda folder: EmulatedKernel(folder, work), manifest, seed, results, only)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
