"""Custom kernels on a GPU machine, built by kilnd on a machine without a GPU.

The GPU-less CI flow, end to end:

1. ``record OUT.tar.gz`` (on the GPU machine, no kilnd needed): prepares the LLTM CUDA
   extension (tests/ext/lltm: lltm_cuda.cpp + lltm_cuda_kernel.cu) for this machine's PyTorch,
   Python and GPU arch, and a raw kernel, and writes them as a self-contained recording (the
   ``.kbuild`` files plus every input blob: PyTorch's and Python's headers included).
2. ``build REC.tar.gz PACKDIR`` (on the build machine, GPU-less): ``kiln prewarm`` of the
   recording against a kilnd there (``KILN_SERVER``), then fetches the module and the cubin
   into PACKDIR with a manifest of their digests and handles.
3. ``run PACKDIR`` (on the GPU machine): checks every artifact against its digest, imports
   the module, and compares the LLTM forward and backward with the plain PyTorch LLTM on CUDA
   (float32 and float64) and the raw kernel with PyTorch; times the LLTM step against the plain
   PyTorch one (CUDA events, median of 50).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.append(str(REPO / "client" / "python"))  # after an installed kiln (the carried wheel)
LLTM = REPO / "tests" / "ext" / "lltm"
sys.path.insert(0, str(LLTM))

RAW_SOURCE = r"""
template <typename T>
__global__ void axpy(const T* x, T* y, T a, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
"""
RAW_NAME = "axpy<float>"


def cmd_record(out: Path) -> None:
    import torch

    import kiln.ext as ext
    from kiln.torch import extension as kext
    from kiln.v1 import service_pb2

    major, minor = torch.cuda.get_device_capability(0)
    sm = major * 10 + minor
    prepared = kext.prepare("lltm_cuda", [LLTM / "lltm_cuda.cpp", LLTM / "lltm_cuda_kernel.cu"], cuda_archs_list=[sm])
    with tempfile.TemporaryDirectory() as d:
        rec = Path(d) / "rec"
        rec.mkdir()
        ext.bundle_blobs(rec, prepared.include_trees)
        (rec / "lltm_cuda.kbuild").write_text(json.dumps(prepared.record(), sort_keys=True))
        import base64

        raw = service_pb2.CompileRawKernelRequest(source=RAW_SOURCE, name=RAW_NAME, sm=sm)
        (rec / "axpy.kbuild").write_text(json.dumps({
            "kind": "raw_kernel", "name": RAW_NAME,
            "request": base64.b64encode(raw.SerializeToString(deterministic=True)).decode()}))
        with tarfile.open(out, "w:gz") as tar:
            tar.add(rec, arcname="rec")
    print(f"recorded for torch {torch.__version__}, sm_{sm}: {out} ({out.stat().st_size >> 20} MiB)")


def cmd_build(archive: Path, pack: Path) -> None:
    import kiln
    import kiln.ext as ext
    from kiln.v1 import service_pb2

    with tempfile.TemporaryDirectory() as d:
        with tarfile.open(archive) as tar:
            tar.extractall(d, filter="data")
        rec = Path(d) / "rec"
        client = kiln.Client()
        pack.mkdir(parents=True, exist_ok=True)
        manifest = {}
        for f in sorted(rec.glob("*.kbuild")):
            outcome = ext.replay_file(client, f)
            kind = service_pb2.SHARED_OBJECT if f.stem == "lltm_cuda" else service_pb2.CUBIN
            art = next(a for a in outcome.result.artifacts if a.kind == kind)
            data = client.read_verified(art.digest)
            name = f.stem + (".so" if kind == service_pb2.SHARED_OBJECT else ".cubin")
            (pack / name).write_bytes(data)
            manifest[f.stem] = {"file": name, "digest": art.digest, "handle": outcome.handle,
                                "cache_hit": outcome.cache_hit, "build_s": round(outcome.seconds, 2),
                                "entry": outcome.result.plan.steps[0].kernel if outcome.result.plan.steps else ""}
        (pack / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(json.dumps(manifest, indent=1))


def cmd_run(pack: Path) -> int:
    import torch

    import kiln.cuda
    from gpu_common import median_ms
    from kiln.torch import extension as kext
    from reference import lltm_reference, make_function

    manifest = json.loads((pack / "manifest.json").read_text())
    for entry in manifest.values():
        data = (pack / entry["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["digest"], f"{entry['file']} does not match its digest"
    module = kext._import_module("lltm_cuda", pack / manifest["lltm_cuda"]["file"])
    fn = make_function(module)
    failures = 0
    rows = []
    # Every element of the outputs and gradients against the plain PyTorch LLTM in float64:
    # |ext - ref| <= atol + rtol * |ref|. The weights are scaled by 1/sqrt(fan-in), as an LLTM's
    # initialisation does: with N(0, 1) weights over up to 768 inputs every gate saturates (the
    # gates' own float32 rounding is then 1e-3 of the largest gradient, and a check loose enough
    # for that checks small elements not at all). Float32: PyTorch's own float32 LLTM on the CPU
    # stays within 0.4 of rtol=1e-4, atol=2e-5 on these shapes and seeds (h, c and the input
    # gradients within 0.1; the weight gradients, sums of 64 batch rows up to ~100 in magnitude
    # that cancel to near 0 in places, need the atol), leaving 2x for the GPU's other summation
    # order. Float64: the same errors scaled by the epsilons (2^-53 / 2^-24, about 2e-9), with a
    # 500x margin.
    for dtype, rtol, atol in ((torch.float32, 1e-4, 2e-5), (torch.float64, 1e-10, 1e-11)):
        for batch, features, state in ((16, 32, 128), (1, 3, 5), (64, 256, 512)):
            g = torch.Generator().manual_seed(batch)
            shapes = [(batch, features), (3 * state, features + state), (3 * state,), (batch, state), (batch, state)]
            base = [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
            base[1] = base[1] * (features + state) ** -0.5
            outs = []
            for impl, dt in ((fn.apply, dtype), (lltm_reference, torch.float64)):
                xs = [t.to(dt).cuda().requires_grad_() for t in base]
                h, c = impl(*xs)
                (h.sum() + 0.5 * (c * c).sum()).backward()
                outs.append([h.detach(), c.detach()] + [x.grad for x in xs])
            # the worst element's error as a fraction of its allowance (<= 1 passes)
            err = max(((a.double() - b).abs() / (atol + rtol * b.abs())).max().item() for a, b in zip(*outs))
            ok = err <= 1.0
            failures += not ok
            rows.append(f"lltm {str(dtype)[6:]} {batch}x{features}x{state}: worst element at {err:.2f} of "
                        f"atol {atol:g} + rtol {rtol:g} * |ref| {'ok' if ok else 'FAIL'}")
    # Timing: one forward + backward step, extension vs plain PyTorch, float32.
    batch, features, state = 64, 256, 512
    xs = [torch.randn(s, device="cuda").requires_grad_() for s in
          [(batch, features), (3 * state, features + state), (3 * state,), (batch, state), (batch, state)]]

    def step(impl):
        def run(i: int) -> None:
            h, c = impl(*xs)
            (h.sum() + c.sum()).backward()
        return run

    t_ext, t_ref = median_ms(step(fn.apply), 50, warmup=5), median_ms(step(lltm_reference), 50, warmup=5)
    rows.append(f"lltm step 64x256x512 f32: extension {t_ext:.3f} ms, plain PyTorch {t_ref:.3f} ms (ratio {t_ref / t_ext:.2f}x)")
    # The raw kernel, from its cubin.
    raw = manifest["axpy"]
    k = kiln.cuda.RawKernel(RAW_SOURCE, RAW_NAME)
    major, minor = torch.cuda.get_device_capability(0)
    k._built[major * 10 + minor] = ((pack / raw["file"]).read_bytes(), raw["entry"])
    n = 1_000_003
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    want = 2.5 * x + y
    k(((n + 255) // 256,), (256,), (x, y, __import__("numpy").float32(2.5), n))
    torch.cuda.synchronize()
    ok = torch.allclose(y, want, rtol=1e-6, atol=1e-6)
    failures += not ok
    rows.append(f"raw kernel {RAW_NAME} ({raw['entry']}) n={n}: {'ok' if ok else 'FAIL'}")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    print("\n".join(rows))
    print(json.dumps({k: {f: v for f, v in e.items() if f != 'digest'} for k, e in manifest.items()}))
    return 1 if failures else 0


def main() -> int:
    cmd = sys.argv[1]
    if cmd == "record":
        cmd_record(Path(sys.argv[2]))
        return 0
    if cmd == "build":
        cmd_build(Path(sys.argv[2]), Path(sys.argv[3]))
        return 0
    if cmd == "run":
        return cmd_run(Path(sys.argv[2]))
    raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    raise SystemExit(main())
