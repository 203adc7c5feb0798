#!/usr/bin/env python3
"""The client core's CUDA loader (client/core/cuda_loader.h, through kiln.core's binding of
libkiln_core.so) on an NVIDIA GPU: static and symbolic (ABI version 2) plans, checked against
torch, the device queries, and its host cost per run.

The plans come from kilnc (on PATH, as with_pack.sh sets it; ``kilnc GRAPH --target
cuda:sm_NN --out DIR`` for the device's sm, or folders made elsewhere, named sym/ and static/
in LIB_DIR): softmax over the rows and a whole-tensor sum of an f32 matrix, once with both dimensions
symbolic (``dim_symbols: "R" "C"``) and once for 4096 x 1000. The symbolic plan is loaded
once and run at several sizes (1 x 1, sizes no vector width divides, a row longer than the
register cache, an empty matrix) on torch tensors, on torch's current stream, with a caller's
workspace of ``workspace_bytes(sizes)`` bytes; every output is compared with torch (float64
reference). Then the host time of one run (two kernel launches) is timed.

    python3 tests/gpu/cpp_loader_gpu.py [LIB_DIR]

kiln is imported from PYTHONPATH (with_pack.sh) or this checkout. Exit status 1 when a result
does not match.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import per_call_us  # noqa: E402  (the same host timing as the part call figures)

try:
    import kiln.core as kcore
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "client" / "python"))
    import kiln.core as kcore


GRAPH = """inputs { name: "x" type { dtype: F32 shape: %s } }
nodes { op: "softmax" inputs: 0 }
nodes { op: "sum" inputs: 0 }
outputs: 1 outputs: 2
"""


def make_plans(root: Path, sm: int) -> None:
    """sym/ and static/ under ``root``, compiled by kilnc for ``sm``."""
    for name, shape in (("sym", '300 shape: 1000 dim_symbols: "R" dim_symbols: "C"'), ("static", "4096 shape: 1000")):
        (root / f"{name}.txtpb").write_text(GRAPH % shape)
        subprocess.run(["kilnc", f"{name}.txtpb", "--target", f"cuda:sm_{sm}", "--out", name], cwd=root, check=True,
                       stdout=subprocess.DEVNULL)


def load_dir(folder: Path, device: int) -> kcore.CudaModule:
    ptx = folder / "kernel.ptx"
    return kcore.CudaModule(device, (folder / "kernel.cubin").read_bytes(),
                            ptx.read_bytes() if ptx.exists() else None, (folder / "plan.json").read_text())


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
    dev = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(dev)
    if len(sys.argv) > 1:
        root = Path(sys.argv[1]).resolve()
    else:
        root = Path(tempfile.mkdtemp(prefix="kiln-loader-"))
        make_plans(root, major * 10 + minor)
    ok = kcore.cuda_device_count() == torch.cuda.device_count() and kcore.cuda_device_sm(dev) == major * 10 + minor
    print(f"{'PASS' if ok else 'FAIL'} device queries: {kcore.cuda_device_count()} devices, sm_{kcore.cuda_device_sm(dev)}")
    rows_out = []
    stream = torch.cuda.current_stream().cuda_stream

    # Loaded before torch touches the device: the core goes into the device's primary context,
    # the one torch then uses.
    sym = load_dir(root / "sym", dev)
    assert sym.num_symbols == 2 and sym.num_inputs == 1 and sym.num_outputs == 2
    gen = torch.Generator(device="cuda").manual_seed(0)
    for r, c in [(300, 1000), (7, 130), (1, 1), (33, 4097), (4096, 1000), (5, 0)]:
        x = torch.randn(r, c, device="cuda", generator=gen)
        soft = torch.full_like(x, float("nan"))
        total = torch.full((1,), float("nan"), device="cuda")
        ws = torch.empty(max(sym.workspace_bytes([r, c]), 16), dtype=torch.uint8, device="cuda")
        try:
            sym.run([x.data_ptr(), soft.data_ptr(), total.data_ptr()], ws.data_ptr(), stream, [r, c])
        except kcore.CoreError as e:
            print(f"FAIL run {r}x{c}: {e}")
            ok = False
            continue
        torch.cuda.synchronize()
        if x.numel() == 0:
            total_ok = total.item() == 0.0
            print(f"{'PASS' if total_ok else 'FAIL'} symbolic {r}x{c}: empty, sum {total.item()}")
            ok &= total_ok
            continue
        ok &= check(f"symbolic {r}x{c}", x, soft, total)
    try:
        sym.workspace_bytes([1 << 20, 1 << 12])
        refused = False
    except kcore.CoreError as e:
        refused = "32-bit" in str(e) and e.code == kcore.INVALID_ARGUMENT
    print(f"{'PASS' if refused else 'FAIL'} sizes past the 32-bit index bound refused")
    ok &= refused

    st = load_dir(root / "static", -1)  # the thread's context: torch's, current by now
    x = torch.randn(4096, 1000, device="cuda", generator=gen)
    soft, total = torch.empty_like(x), torch.empty(1, device="cuda")
    ws = torch.empty(max(st.workspace_bytes(), 16), dtype=torch.uint8, device="cuda")
    ptrs_st = [x.data_ptr(), soft.data_ptr(), total.data_ptr()]
    st.run(ptrs_st, ws.data_ptr(), stream)
    torch.cuda.synchronize()
    ok &= check("static 4096x1000", x, soft, total)

    # Host cost of one run (two launches) through the binding, small sizes so the GPU keeps up.
    xs = torch.randn(8, 64, device="cuda")
    ss, ts = torch.empty_like(xs), torch.empty(1, device="cuda")
    wss = torch.empty(max(sym.workspace_bytes([8, 64]), 16), dtype=torch.uint8, device="cuda")
    ptrs = [xs.data_ptr(), ss.data_ptr(), ts.data_ptr()]
    wsp = wss.data_ptr()
    rows_out.append(("CudaModule.run, symbolic (2 launches)", per_call_us(lambda: sym.run(ptrs, wsp, stream, (8, 64)))))
    wsp_st = ws.data_ptr()
    rows_out.append(("CudaModule.run, static 4096x1000 (2 launches)",
                     per_call_us(lambda: st.run(ptrs_st, wsp_st, stream), calls=300)))
    lines = [f"# the client core's CUDA loader on {torch.cuda.get_device_name()}", "",
             "| what | µs per call (host) |", "| --- | ---: |"]
    lines += [f"| {n} | {us:.1f} |" for n, us in rows_out]
    text = "\n".join(lines) + "\n"
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "cpp_loader_gpu.md").write_text(text)
    print("all results match torch" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
