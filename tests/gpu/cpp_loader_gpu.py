#!/usr/bin/env python3
"""The C++ client's CUDA loader (client/cpp/cuda_loader.h, its C API in libkiln_core.so) on an
NVIDIA GPU: static and symbolic (ABI version 2) plans, checked against torch, and its host cost
per run.

The plans come from kilnc on the build machine (``kilnc GRAPH --target cuda:sm_90 --out DIR``):
softmax over the rows and a whole-tensor sum of an f32 matrix, once with both dimensions
symbolic (``dim_symbols: "R" "C"``) and once for 4096 x 1000. The symbolic plan is loaded
once and run at several sizes (1 x 1, sizes no vector width divides, a row longer than the
register cache) on torch tensors, on torch's current stream, with a caller's workspace of
``kiln_cuda_workspace_bytes_sized`` bytes; every output is compared with torch (float64
reference). Then the host time of one ``kiln_cuda_run_sized`` / ``kiln_cuda_run`` call (two
kernel launches each) is timed, beside one ctypes ``cuLaunchKernel`` of the Python client.

    cd tests/gpu && python3 cpp_loader_gpu.py LIB_DIR     # libkiln_core.so, sym/ and static/ inside

Exit status 1 when a result does not match.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

import torch

from part_overhead import per_call_us  # the same host timing as the part call figures


def load_lib(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    P = ctypes.c_void_p
    lib.kiln_cuda_load_dir.argtypes = [ctypes.c_char_p]
    lib.kiln_cuda_load_dir.restype = P
    lib.kiln_cuda_run.argtypes = [P, ctypes.POINTER(P), P, P]
    lib.kiln_cuda_run_sized.argtypes = [P, ctypes.POINTER(P), P, P, ctypes.POINTER(ctypes.c_int64), ctypes.c_int]
    lib.kiln_cuda_workspace_bytes_sized.argtypes = [P, ctypes.POINTER(ctypes.c_int64), ctypes.c_int]
    lib.kiln_cuda_workspace_bytes_sized.restype = ctypes.c_int64
    lib.kiln_cuda_workspace_bytes.argtypes = [P]
    lib.kiln_cuda_workspace_bytes.restype = ctypes.c_int64
    lib.kiln_cuda_num_symbols.argtypes = [P]
    lib.kiln_cuda_last_error.restype = ctypes.c_char_p
    return lib


def check(name: str, x: torch.Tensor, soft: torch.Tensor, total: torch.Tensor) -> bool:
    ref = torch.softmax(x.double(), -1)
    err = (soft.double() - ref).abs().max().item() if x.numel() else 0.0
    s_ref = x.double().sum().item()
    s_err = abs(total.double().item() - s_ref) / (1 + abs(s_ref))
    ok = err <= 1e-6 and s_err <= 1e-5
    print(f"{'PASS' if ok else 'FAIL'} {name}: softmax max abs err {err:.2e}, sum rel err {s_err:.2e}")
    return ok


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 2
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    torch.cuda.init()
    torch.empty(1, device="cuda")  # torch's primary context current on this thread
    lib = load_lib(root / "libkiln_core.so")
    ok = True
    rows_out = []
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

    sym = lib.kiln_cuda_load_dir(str(root / "sym").encode())
    if not sym:
        print("FAIL load sym:", lib.kiln_cuda_last_error().decode())
        return 1
    assert lib.kiln_cuda_num_symbols(sym) == 2
    gen = torch.Generator(device="cuda").manual_seed(0)
    for r, c in [(300, 1000), (7, 130), (1, 1), (33, 4097), (4096, 1000), (5, 0)]:
        x = torch.randn(r, c, device="cuda", generator=gen)
        soft = torch.full_like(x, float("nan"))
        total = torch.full((1,), float("nan"), device="cuda")
        sizes = (ctypes.c_int64 * 2)(r, c)
        wsb = lib.kiln_cuda_workspace_bytes_sized(sym, sizes, 2)
        if wsb < 0:
            print("FAIL workspace:", lib.kiln_cuda_last_error().decode())
            return 1
        ws = torch.empty(max(wsb, 16), dtype=torch.uint8, device="cuda")
        bufs = (ctypes.c_void_p * 3)(x.data_ptr(), soft.data_ptr(), total.data_ptr())
        rc = lib.kiln_cuda_run_sized(sym, bufs, ctypes.c_void_p(ws.data_ptr()), stream, sizes, 2)
        if rc != 0:
            print(f"FAIL run {r}x{c}:", lib.kiln_cuda_last_error().decode())
            ok = False
            continue
        torch.cuda.synchronize()
        if x.numel() == 0:
            total_ok = total.item() == 0.0
            print(f"{'PASS' if total_ok else 'FAIL'} symbolic {r}x{c}: empty, sum {total.item()}")
            ok &= total_ok
            continue
        ok &= check(f"symbolic {r}x{c}", x, soft, total)
    huge = (ctypes.c_int64 * 2)(1 << 20, 1 << 12)
    refused = lib.kiln_cuda_workspace_bytes_sized(sym, huge, 2) == -1 and b"32-bit" in lib.kiln_cuda_last_error()
    print(f"{'PASS' if refused else 'FAIL'} sizes past the 32-bit index bound refused")
    ok &= refused

    st = lib.kiln_cuda_load_dir(str(root / "static").encode())
    if not st:
        print("FAIL load static:", lib.kiln_cuda_last_error().decode())
        return 1
    x = torch.randn(4096, 1000, device="cuda", generator=gen)
    soft, total = torch.empty_like(x), torch.empty(1, device="cuda")
    ws = torch.empty(max(lib.kiln_cuda_workspace_bytes(st), 16), dtype=torch.uint8, device="cuda")
    bufs_st = (ctypes.c_void_p * 3)(x.data_ptr(), soft.data_ptr(), total.data_ptr())
    assert lib.kiln_cuda_run(st, bufs_st, ctypes.c_void_p(ws.data_ptr()), stream) == 0, lib.kiln_cuda_last_error()
    torch.cuda.synchronize()
    ok &= check("static 4096x1000", x, soft, total)

    # Host cost of one run (two launches) through the C API, small sizes so the GPU keeps up.
    xs = torch.randn(8, 64, device="cuda")
    ss, ts = torch.empty_like(xs), torch.empty(1, device="cuda")
    sizes = (ctypes.c_int64 * 2)(8, 64)
    wss = torch.empty(max(lib.kiln_cuda_workspace_bytes_sized(sym, sizes, 2), 16), dtype=torch.uint8, device="cuda")
    bs = (ctypes.c_void_p * 3)(xs.data_ptr(), ss.data_ptr(), ts.data_ptr())
    wsp = ctypes.c_void_p(wss.data_ptr())
    rows_out.append(("kiln_cuda_run_sized (symbolic, 2 launches)",
                     per_call_us(lambda: lib.kiln_cuda_run_sized(sym, bs, wsp, stream, sizes, 2))))
    wsp_st = ctypes.c_void_p(ws.data_ptr())
    rows_out.append(("kiln_cuda_run (static 4096x1000, 2 launches)",
                     per_call_us(lambda: lib.kiln_cuda_run(st, bufs_st, wsp_st, stream), calls=300)))
    lines = [f"# C++ CUDA loader on {torch.cuda.get_device_name()}", "", "| what | µs per call (host) |", "| --- | ---: |"]
    lines += [f"| {n} | {us:.1f} |" for n, us in rows_out]
    text = "\n".join(lines) + "\n"
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "cpp_loader_gpu.md").write_text(text)
    print("all results match torch" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
