#!/usr/bin/env python3
"""Host time of one kiln part call on an NVIDIA GPU, and what it is made of.

A ``torch.compile(backend="kiln")`` graph runs each kiln part through the native part runner
(kiln/torch/native: checks, allocation and launches in one C++ call) once it is loaded, else as
a Python call (``KilnPart.forward``: argument checks, output allocation, then the plan's
launches, one ctypes call into the client core); both are timed. On small tensors the GPU work
is a few microseconds, so the host path is the whole cost; this script times it per call
(median of batches of calls, host clock, the GPU synchronised only between batches), for a
static part and for a part compiled with symbolic sizes, beside the same function in eager
torch and the pieces of the path alone: ``CudaKernel.launch`` and ``torch.empty``.

    KILND=build/server/kilnd PYTHONPATH=client/python python3 tests/bench/gpu/part_overhead.py [--cpu]

``--cpu`` times the CPU path instead (f32[8, 32] tensors, the artifact's ``kiln_run``).

Writes ``$OUT/part_overhead.md`` when ``$OUT`` is set.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "gpu"))  # tests/gpu
from gpu_common import kilnd_binary, per_call_us  # noqa: E402


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="CPU tensors (f32[8, 32]): the CPU part call path")
    opts = ap.parse_args()
    dev = "cpu" if opts.cpu else "cuda"
    if not opts.cpu and not torch.cuda.is_available():
        print("no CUDA device")
        return 2
    binary = kilnd_binary("part_overhead.py")
    if binary is None:
        return 2
    import kiln.local
    import kiln.torch  # noqa: F401  (registers the backend)
    from kiln.torch import runtime as R

    parts: list[Any] = []
    init = R.KilnPart.__init__

    def tracked(self: Any, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        parts.append(self)

    R.KilnPart.__init__ = tracked  # type: ignore[method-assign]
    work = Path(tempfile.mkdtemp(prefix="kiln-overhead-"))
    daemon = kiln.local.LocalDaemon(binary, work)
    from kiln.torch import native

    native.start(kiln.Client(daemon.address))
    if not native.wait():  # a kilnd without a working sandbox here: build it on this machine
        print(f"native part runner not built by kilnd ({native.ERROR}); building it here", flush=True)
        os.environ["KILN_TORCH_NATIVE"] = "local"
        native.RUNNER = native.build(None)

    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x * 2 + y).sum(-1)

    shape = (8, 32) if opts.cpu else (64, 256)
    x = torch.randn(*shape, device=dev)
    y = torch.randn(*shape, device=dev)
    rows: list[tuple[str, float]] = [("eager f (3 ATen ops)", per_call_us(lambda: f(x, y)))]
    rows.append((f"torch.empty(({shape[0]},), {dev})", per_call_us(lambda: torch.empty((shape[0],), device=dev))))
    try:
        for dyn in (False, True):
            parts.clear()
            torch._dynamo.reset()
            cf = torch.compile(f, backend="kiln", options={"server": daemon.address}, dynamic=dyn)
            torch.testing.assert_close(cf(x, y), f(x, y), rtol=1e-5, atol=1e-5)
            p = parts[0]
            assert p.kernel is not None, p.error
            kind = "symbolic" if p.part.symbolic else "static"
            kiln.torch.wait()  # the native part runner
            torch.testing.assert_close(cf(x, y), f(x, y), rtol=1e-5, atol=1e-5)  # hands the part over
            assert p._native is not None, "the native part runner did not take the part"
            torch.testing.assert_close(cf(x, y), f(x, y), rtol=1e-5, atol=1e-5)
            rows.append((f"compiled f ({kind}, native part runner)", per_call_us(lambda: cf(x, y))))
            rows.append((f"KilnPart call ({kind}, native part runner)", per_call_us(lambda: p(x, y))))
            fast, p._native = p._native, None
            rows.append((f"compiled f ({kind}, Python part call)", per_call_us(lambda: cf(x, y))))
            rows.append((f"KilnPart call ({kind}, Python part call)", per_call_us(lambda: p(x, y))))
            p._native = fast
            if opts.cpu:
                continue
            out = torch.empty(64, device="cuda")
            ptrs = [x.data_ptr(), y.data_ptr(), out.data_ptr()]
            stream = torch.cuda.current_stream().cuda_stream
            k = p.kernel
            steps = len(p.compiled.plan.steps)
            if p.part.symbolic:
                sizes = tuple(int((x, y)[i].shape[a]) for i, a in p._sym_where)
                ws = torch.empty(max(k.workspace_bytes(sizes), 1), dtype=torch.uint8, device="cuda")
                rows.append((f"CudaKernel.launch ({kind}, {steps} kernels)",
                             per_call_us(lambda: k.launch(ptrs, ws.data_ptr(), stream, sizes))))
            else:
                ws = torch.empty(max(k.workspace_bytes(), 1), dtype=torch.uint8, device="cuda")
                rows.append((f"CudaKernel.launch ({kind}, {steps} kernels)",
                             per_call_us(lambda: k.launch(ptrs, ws.data_ptr(), stream))))
    finally:
        daemon.stop()
    where = "the CPU" if opts.cpu else torch.cuda.get_device_name()
    lines = [f"# Host time per call on {where} (torch {torch.__version__})", "",
             "| what | µs per call |", "| --- | ---: |"]
    lines += [f"| {name} | {us:.1f} |" for name, us in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "part_overhead.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
