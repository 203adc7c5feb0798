#!/usr/bin/env python3
"""kiln's GPU suite: runs kernels kiln compiled for the GPU (tests/gpu/artifacts, built by
build_artifacts.sh) through the CUDA driver API, checks them against PyTorch, and benchmarks
them against PyTorch eager and torch.compile (Inductor).

Needs Python, PyTorch with CUDA, the kiln package (for its client core, libkiln_core.so) and
the artifacts: each folder is loaded and its plan run by the client core's CUDA loader, the
one every kiln client uses, on PyTorch's current stream, with PyTorch's tensors as buffers.
Every run uses fresh random inputs and outputs poisoned so that an element the kernel fails to
write cannot pass.

  python3 tests/gpu/gpu_suite.py [--suite-only | --bench-only] [--iters N]

Prints a table; with OUT set, also writes it to $OUT/gpu_results.md. Exit status 1 when any
output is wrong.
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from gpu_common import event_times_ms

REPO = Path(__file__).resolve().parents[2]
try:
    import kiln.core as kcore
except ImportError:
    sys.path.insert(0, str(REPO / "client" / "python"))
    import kiln.core as kcore

ART = Path(__file__).resolve().parent / "artifacts"
DEVICE = "cuda"  # emulate_suite.py runs the op suite on the CPU through an emulation of the kernels
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "f64": torch.float64,
          "i8": torch.int8, "i16": torch.int16, "i32": torch.int32, "i64": torch.int64, "u8": torch.uint8,
          "bool": torch.bool}
# Default tolerances (rtol, atol) by output dtype: a couple of units in the last place.
TOL = {torch.float64: (1e-10, 1e-12), torch.float32: (1e-5, 1e-6), torch.float16: (2e-3, 1e-4),
       torch.bfloat16: (1.6e-2, 1e-3)}


class KilnKernel:
    """An artifact folder: its plan and module, run on PyTorch tensors (on the CPU for
    emulate_suite.py, whose fake driver's device memory is host memory)."""

    def __init__(self, folder):
        self.folder = folder
        text = (folder / "plan.json").read_text()
        self.plan = json.loads(text)
        ptx = folder / "kernel.ptx"
        device = torch.cuda.current_device() if DEVICE == "cuda" else -1
        self.module = kcore.CudaModule(device, (folder / "kernel.cubin").read_bytes(),
                                       ptx.read_bytes() if ptx.exists() else None, text)
        self.workspace = torch.empty(max(self.plan["workspace_bytes"], 16), dtype=torch.uint8, device=DEVICE)
        self.inputs = [b for b in self.plan["buffers"] if b["role"] == "input"]
        self.outputs = sorted((b for b in self.plan["buffers"] if b["role"] == "output"), key=lambda b: b["index"])

    def bytes_moved(self):
        return sum(b["bytes"] for b in self.inputs + self.outputs)

    def prepare(self, inputs, outputs):
        """The buffer pointers for these tensors (inputs, then outputs, in graph order),
        checked against the plan."""
        tensors = list(inputs) + list(outputs)
        n_in = len(self.inputs)
        for b in self.inputs + self.outputs:
            t = tensors[b["index"] + (n_in if b["role"] == "output" else 0)]
            if not t.is_contiguous() or t.data_ptr() % 16 or t.dtype != DTYPES[b["dtype"]] or \
                    t.numel() * t.element_size() != b["bytes"]:
                raise ValueError("%s: buffer %s does not match the plan" % (self.folder.name, b))
        return [t.data_ptr() for t in tensors]

    def launch(self, ptrs, stream=None):
        if stream is None:
            stream = torch.cuda.current_stream().cuda_stream if DEVICE == "cuda" else 0
        self.module.run(ptrs, self.workspace.data_ptr(), stream)

    def run(self, inputs, outputs):
        self.launch(self.prepare(inputs, outputs))


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def make_input(spec, gen):
    shape, dtype = spec["shape"], DTYPES[spec["dtype"]]
    kind = spec["gen"]
    kw = dict(device=DEVICE, generator=gen)
    if kind == "normal":
        return (torch.randn(shape, **kw) * 2).to(dtype)
    if kind == "near1":
        return (torch.rand(shape, **kw) * 0.2 + 0.9).to(dtype)
    if kind in ("int", "uint", "nonzero", "posint", "smallexp"):
        lo, hi = {"int": (-20, 21), "uint": (0, 41), "nonzero": (1, 21), "posint": (1, 21), "smallexp": (0, 5)}[kind]
        t = torch.randint(lo, hi, shape, **kw)
        if kind == "nonzero":
            t = t * (torch.randint(0, 2, shape, **kw) * 2 - 1)
        return t.to(dtype)
    p = {"bool": 0.5, "mostly_true": 0.999, "mostly_false": 0.001}[kind]
    return torch.rand(shape, **kw) < p


def convert(t, conv):
    if conv == "f64":
        return t.double()
    if conv == "auto" and t.dtype in (torch.float16, torch.bfloat16):
        return t.float()
    return t


def poison_like(ref):
    """A buffer that differs from `ref` everywhere, so unwritten elements cannot pass."""
    if ref.dtype == torch.bool:
        return ~ref
    if ref.is_floating_point():
        return torch.where(torch.isnan(ref), torch.full_like(ref, 12345.0), torch.full_like(ref, float("nan")))
    return ref + 1


def compare(got, want, rtol=None, atol=None):
    """Returns (ok, worst error text)."""
    if got.shape != want.shape:
        return False, "shape %s, want %s" % (tuple(got.shape), tuple(want.shape))
    if not want.is_floating_point():
        bad = (got != want).sum().item()
        return bad == 0, "%d mismatches" % bad if bad else "exact"
    r, a = TOL[want.dtype]
    r, a = max(r, rtol or 0), max(a, atol or 0)
    g, w = got.double(), want.double()
    nan_bad = (torch.isnan(g) != torch.isnan(w)).sum().item()
    both = ~torch.isnan(g) & ~torch.isnan(w)
    g, w = g[both], w[both]
    inf = torch.isinf(g) | torch.isinf(w)
    inf_bad = (g[inf] != w[inf]).sum().item()
    err = (g[~inf] - w[~inf]).abs()
    lim = a + r * w[~inf].abs()
    far = (err > lim).sum().item()
    worst = (err / lim).max().item() if err.numel() else 0.0
    ok = nan_bad == 0 and inf_bad == 0 and far == 0
    return ok, "nan %d, inf %d, out of tolerance %d, worst %.2f of tolerance" % (nan_bad, inf_bad, far, worst)


def philox_reference():
    """kiln's counter-based numbers computed with torch integer ops (kiln/torch/rng.py, loaded
    from the source tree by path: it needs torch alone, not the kiln package)."""
    global _PHILOX
    if _PHILOX is None:
        import importlib.util

        path = Path(__file__).resolve().parents[2] / "client" / "python" / "kiln" / "torch" / "rng.py"
        spec = importlib.util.spec_from_file_location("kiln_rng_reference", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _PHILOX = mod.philox_uniform
    return _PHILOX


_PHILOX = None


def run_suite(load, manifest, seed, results, only=None):
    """`load(folder)` gives an object with .outputs (plan output buffers) and .run(inputs, outputs)."""
    gen = torch.Generator(device=DEVICE)
    gen.manual_seed(seed)
    rows = []
    for entry in manifest["graphs"]:
        if entry["kind"] != "suite" or (only and entry["name"] not in only):
            continue
        kernel = load(ART / entry["name"])
        inputs = [make_input(s, gen) for s in entry["inputs"]]
        refs, outs = [], []
        for o, spec in zip(entry["outputs"], kernel.outputs):
            env = {i["name"]: convert(t, o["conv"]) for i, t in zip(entry["inputs"], inputs)}
            env.update(torch=torch, F=F, philox=philox_reference())
            ref = eval(o["ref"], env).to(DTYPES[spec["dtype"]]).reshape(spec["shape"]).contiguous()
            refs.append(ref)
            outs.append(poison_like(ref))
        kernel.run(inputs, outs)
        sync()
        for o, ref, got in zip(entry["outputs"], refs, outs):
            ok, detail = compare(got, ref, o.get("rtol"), o.get("atol"))
            rows.append((entry["name"], o["label"], str(ref.dtype).replace("torch.", ""), ok, detail))
    failed = [r for r in rows if not r[3]]
    results["suite"] = rows
    print("op suite: %d outputs in %d graphs, %d wrong (seed %d)" % (
        len(rows), len({r[0] for r in rows}), len(failed), seed))
    for r in failed:
        print("  WRONG %s / %s (%s): %s" % (r[0], r[1], r[2], r[4]))
    return not failed


def time_ms(fn, sets, iters, warmup=3):
    """Median of CUDA-event timings, rotating over the input sets. Launches run ahead of the
    GPU (events are recorded on the stream), so host overhead does not enter the timings."""
    return statistics.median(event_times_ms(lambda i: fn(sets[i % len(sets)]), iters, warmup))


def kmeans_ties(got, want, X, means):
    """Assignments may differ where two centres are equally far to within rounding (the two
    sides round the squared distances differently); anywhere else they must agree."""
    d = torch.linalg.vector_norm(X[None].double() - means[:, None].double(), dim=2)
    differ = got != want
    dg = d.gather(0, got[None].clamp(0, means.shape[0] - 1))[0][differ]
    dw = d.gather(0, want[None])[0][differ]
    near = ((dg - dw).abs() <= 1e-5 * dw.abs() + 1e-6).all().item() and bool(((got >= 0) & (got < means.shape[0])).all())
    return near, "%d assignment(s) differ, all between equidistant centres: %s" % (differ.sum().item(), near)


def lltm(gates, c):
    ig, og, cc = gates.chunk(3, dim=1)
    c_new = c + F.elu(cc) * torch.sigmoid(ig)
    return torch.tanh(c_new) * torch.sigmoid(og), c_new


BENCH = {
    "bench_sincos": ("sin(x)^2+cos(x)^2, 64M f32", lambda x: torch.sin(x) ** 2 + torch.cos(x) ** 2),
    "bench_add": ("x+y, 64M f32", lambda x, y: x + y),
    "bench_kmeans": ("k-means assign, 20M x 2 f32, K=8",
                     lambda X, means: torch.argmin(torch.linalg.vector_norm(X[None] - means[:, None], dim=2), dim=0)),
    "bench_softmax": ("softmax, 32768x4096 f32", lambda x: torch.softmax(x, dim=-1)),
    "bench_layernorm_gelu": ("layer_norm->gelu, 32768x4096 f32", lambda x: F.gelu(F.layer_norm(x, x.shape[-1:]))),
    "bench_lltm": ("LLTM tail, B=4096 S=1024 f32", lltm),
}


def copy_bandwidth(iters, n=256 * 1024 * 1024):
    """Device-to-device copy rate in GB/s (bytes read plus written) of ``n`` f32 (default
    1 GiB, the device's peak; a workload's own byte count gives what a copy of that size
    reaches, launch and tail included, the fair bar for a small kernel)."""
    src = [torch.empty(n, device="cuda") for _ in range(2)]
    dst = [torch.empty(n, device="cuda") for _ in range(2)]
    ms = time_ms(lambda i: dst[i].copy_(src[i]), [0, 1], iters)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n * 4 / (ms * 1e-3) / 1e9


def run_bench(manifest, seed, iters, results):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed + 1)
    copy_gbs = copy_bandwidth(iters)
    print("device-to-device copy: %.0f GB/s" % copy_gbs)
    compile_times = {}
    if (ART / "compile_times.json").exists():
        compile_times = json.loads((ART / "compile_times.json").read_text())
    rows, all_ok = [], True
    for entry in manifest["graphs"]:
        if entry["kind"] != "bench":
            continue
        title, fn = BENCH[entry["name"]]
        kernel = KilnKernel(ART / entry["name"])
        sets = [[make_input(s, gen) for s in entry["inputs"]] for _ in range(3)]
        # Correctness on the first set, outputs poisoned.
        want = fn(*sets[0])
        want = list(want) if isinstance(want, tuple) else [want]
        outs = [poison_like(w.contiguous()) for w in want]
        kernel.run(sets[0], outs)
        torch.cuda.synchronize()
        checks = [compare(g, w, o.get("rtol"), o.get("atol")) for g, w, o in zip(outs, want, entry["outputs"])]
        if entry["name"] == "bench_kmeans" and not checks[0][0]:
            checks = [kmeans_ties(outs[0], want[0], *sets[0])]
        ok = all(c[0] for c in checks)
        all_ok &= ok
        if not ok:
            print("  WRONG %s: %s" % (entry["name"], "; ".join(c[1] for c in checks)))
        # Timings, rotating over three input sets (each with its own outputs).
        out_sets = [[torch.empty(w.shape, dtype=w.dtype, device=w.device) for w in want] for _ in sets]
        launches = [kernel.prepare(s, o) for s, o in zip(sets, out_sets)]
        t_kiln = time_ms(lambda i: kernel.launch(launches[i]), [0, 1, 2], iters)
        t_eager = time_ms(lambda i: fn(*sets[i]), [0, 1, 2], iters)
        try:
            compiled = torch.compile(fn)
            t0 = time.perf_counter()
            compiled(*sets[0])
            torch.cuda.synchronize()
            first_call_s = time.perf_counter() - t0
            t_inductor = time_ms(lambda i: compiled(*sets[i]), [0, 1, 2], iters)
        except Exception as e:  # report the rest even if Inductor fails here
            print("  torch.compile failed on %s: %s" % (entry["name"], e))
            compiled, first_call_s, t_inductor = None, float("nan"), float("nan")
        gbs = kernel.bytes_moved() / (t_kiln * 1e-3) / 1e9
        # A copy moving the same bytes (half read, half written), timed here too.
        same_gbs = copy_bandwidth(iters, max(kernel.bytes_moved() // 8, 1))
        row = dict(name=entry["name"], title=title, kiln=t_kiln, eager=t_eager, inductor=t_inductor,
                   ratio=t_kiln / t_inductor, gbs=gbs, copy_frac=gbs / copy_gbs, same_size_frac=gbs / same_gbs, ok=ok,
                   inductor_first_call_s=first_call_s, kiln_compile_ms=compile_times.get(entry["name"]),
                   launches=len(kernel.plan["steps"]))
        rows.append(row)
        print("  %-36s kiln %8.3f ms  eager %8.3f ms  inductor %8.3f ms  kiln/inductor %.2f  %5.0f GB/s "
              "(%3.0f%% of copy, %3.0f%% of a copy of its size)%s"
              % (title, t_kiln, t_eager, t_inductor, row["ratio"], gbs, 100 * row["copy_frac"],
                 100 * row["same_size_frac"], "" if ok else "  WRONG"))
        del sets, out_sets, launches, compiled
        torch.cuda.empty_cache()
    results["bench"] = rows
    results["copy_gbs"] = copy_gbs
    return all_ok


def report(results):
    lines = ["# kiln on %s" % torch.cuda.get_device_name(),
             "",
             "PyTorch %s, CUDA %s. Median of CUDA-event timings over rotating inputs; kiln's client core "
             "launches its cubin on PyTorch's stream." % (torch.__version__, torch.version.cuda), ""]
    if "bench" in results:
        lines += ["Device-to-device copy bandwidth: %.0f GB/s." % results["copy_gbs"], "",
                  "| workload | kiln ms | eager ms | inductor ms | kiln / inductor | kiln GB/s | % of copy | "
                  "% of same-size copy | kiln compile ms | inductor 1st call s | correct |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|"]
        for r in results["bench"]:
            lines.append("| %s | %.3f | %.3f | %.3f | %.2f | %.0f | %.0f%% | %.0f%% | %s | %.1f | %s |" % (
                r["title"], r["kiln"], r["eager"], r["inductor"], r["ratio"], r["gbs"], 100 * r["copy_frac"],
                100 * r["same_size_frac"],
                "%.0f" % r["kiln_compile_ms"] if r["kiln_compile_ms"] is not None else "-",
                r["inductor_first_call_s"], "yes" if r["ok"] else "**no**"))
        lines.append("")
    if "suite" in results:
        rows = results["suite"]
        bad = [r for r in rows if not r[3]]
        lines += ["Op suite: %d outputs in %d graphs against PyTorch, %d wrong." % (
            len(rows), len({r[0] for r in rows}), len(bad)), ""]
        if bad:
            lines += ["| graph | output | dtype | detail |", "|---|---|---|---|"]
            lines += ["| %s | %s | %s | %s |" % (r[0], r[1], r[2], r[4]) for r in bad]
            lines.append("")
    text = "\n".join(lines)
    print("\n" + text)
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "gpu_results.md").write_text(text + "\n")
        (Path(out) / "gpu_results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--suite-only", action="store_true")
    ap.add_argument("--bench-only", action="store_true")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--seed", type=int, default=int.from_bytes(os.urandom(4), "little"))
    args = ap.parse_args()
    if not (ART / "manifest.json").exists():
        print("no %s: build the artifacts with tests/gpu/build_artifacts.sh and bring them here" % ART)
        return 2
    if not torch.cuda.is_available():
        print("PyTorch sees no CUDA device")
        return 2
    manifest = json.loads((ART / "manifest.json").read_text())
    results = {"device": torch.cuda.get_device_name(), "seed": args.seed}
    ok = True
    if not args.bench_only:
        ok &= run_suite(KilnKernel, manifest, args.seed, results)
    if not args.suite_only:
        ok &= run_bench(manifest, args.seed, args.iters, results)
    report(results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
