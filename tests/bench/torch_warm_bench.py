#!/usr/bin/env python3
"""First compiled result of a model through torch.compile in a fresh process, with warm caches:
kiln against Inductor (its FX graph and AOTAutograd caches full), alternating fresh processes,
and where kiln's time goes. Workloads (``--workload``): a ``transformers`` BERT's inference
(``bert``) or training step with AdamW (``bert-train``), torchvision's resnet18 inference.
kiln runs as ``kiln`` (kilnd and the local artifact folder full), ``kiln-new`` (kilnd full, an
empty local folder per process: another machine of the cluster) and ``kiln-norec`` (program
records off). Every kiln process's output is compared with kiln's cold run's by digest.

Each measured process imports torch, transformers and kiln (not timed: a program pays those
imports anyway), builds the model, then times ``torch.compile(model)`` plus the first
compiled call (or training step). kiln's processes also report the backend's own counters
(:func:`kiln.torch.stats`): ``backend_s`` (inside the backend: AOTAutograd's trace, kiln's
partitioning, the parts' lookups and loads), ``partition_s`` and ``compile_s``; what is left
of the total is Dynamo's trace and the first call.

    PYTHONPATH=client/python python tests/bench/torch_warm_bench.py            # own kilnd
    ... --layers 12 --hidden 128 --repeat 5 --device cuda
    ... --profile 25      # cProfile of one more warm kiln process: the 25 costliest functions
    ... --site-a DIR      # also "kiln-a": kiln imported from DIR (another build), same daemon

On the CPU the model is small (hidden 128 by default) so that the cold compiles stay short;
the number of graphs and parts, which is what a warm start pays for, is BERT-base's at 12
layers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def child(opts: argparse.Namespace) -> None:
    import warnings

    import torch
    import transformers

    backend = opts.child
    if backend == "kiln":
        import kiln.torch  # noqa: F401
    torch.manual_seed(0)
    train = opts.workload == "bert-train"
    if opts.workload == "resnet18":
        import torchvision

        model = torchvision.models.resnet18().eval().to(opts.device)
        inputs = {"x": torch.randn(opts.batch, 3, 224, 224, device=opts.device)}
    else:
        config = transformers.BertConfig(hidden_size=opts.hidden, num_hidden_layers=opts.layers,
                                         num_attention_heads=max(1, opts.hidden // 64),
                                         intermediate_size=4 * opts.hidden,
                                         hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        model = transformers.BertModel(config).to(opts.device)
        model.train(train)
        inputs = {"input_ids": torch.randint(0, config.vocab_size, (opts.batch, opts.seq), device=opts.device)}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4) if train else None

    def first_output(out: Any) -> Any:
        return out if isinstance(out, torch.Tensor) else out.last_hidden_state

    def step(fn: Any) -> Any:
        """One inference call, or one training step (forward, backward, AdamW): its result."""
        if not train:
            with torch.no_grad():
                return first_output(fn(**inputs))
        out = first_output(fn(**inputs))
        out.float().pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return out.detach()

    if opts.device == "cuda":
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
    prof = None
    if opts.profile_child:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        f = torch.compile(model, backend=backend)
        out = step(f)
        if opts.device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
    if prof is not None:
        import pstats

        prof.disable()
        pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(opts.profile_child)
    if train:
        err = float("nan")  # the step changed the weights: compared by digest across runs instead
    else:
        with torch.no_grad():
            err = float((out - first_output(model(**inputs))).abs().max())
    import hashlib

    digest = hashlib.sha256(out.detach().float().cpu().numpy().tobytes()).hexdigest()[:16]
    extra: dict[str, Any] = {}
    if backend == "kiln":
        import kiln.torch as kt

        s = kt.stats()
        from kiln.torch import native

        native.wait(60)
        from kiln.torch.dynamo_backend import RECORD_EVENTS

        extra = {"runner": getattr(native, "FOUND", None), "runner_error": native.ERROR,
                 "records": list(RECORD_EVENTS)}
        extra.update({k: s.get(k, float("nan")) for k in ("graphs", "parts", "compiled", "failed", "cache_hits", "memo_hits",
                                   "backend_s", "partition_s", "compile_s", "lookup_s", "load_s", "prepare_s",
                                   "record_hits", "record_misses", "record_s")})
    print("RESULT " + json.dumps({"seconds": seconds, "max_err": err, "digest": digest, **extra}), flush=True)


def run_child(backend: str, env: dict[str, str], opts: argparse.Namespace, profile: int = 0) -> dict[str, Any]:
    child_backend = "kiln" if backend.startswith("kiln") else backend
    cmd = [sys.executable, __file__, "--child", child_backend, "--layers", str(opts.layers), "--hidden", str(opts.hidden),
           "--seq", str(opts.seq), "--batch", str(opts.batch), "--device", opts.device, "--workload", opts.workload]
    if backend == "kiln-new":  # another machine of the cluster: an empty local artifact folder
        env = dict(env, KILN_CACHE_DIR=tempfile.mkdtemp(prefix="kiln-new-machine-"))
    if profile:
        cmd += ["--profile-child", str(profile)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if profile:
        print(p.stderr[-12000:])
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if p.returncode != 0 or line is None:
        raise SystemExit(f"{backend} process failed:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
    return json.loads(line[len("RESULT "):])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeat", type=int, default=3, help="warm processes per backend")
    ap.add_argument("--workload", default="bert", choices=["bert", "bert-train", "resnet18"])
    ap.add_argument("--backends", default="kiln,kiln-new,kiln-norec,inductor",
                    help="kiln: warm daemon and local folder; kiln-new: warm daemon, empty local folder; "
                         "kiln-norec: kiln without program records; inductor")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile one more warm kiln process")
    ap.add_argument("--site-a", help="a folder holding another build of the kiln package, timed as kiln-a")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--profile-child", type=int, default=0, help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.child:
        child(opts)
        return 0

    sys.path.insert(0, str(HERE))
    from kilnd_proc import daemon

    backends = opts.backends.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="kiln-torch-warm-"))
    try:
        with daemon(workers=max(2, min(16, os.cpu_count() or 2))) as address:
            envs = {
                "kiln": dict(os.environ, KILN_SERVER=address, KILN_CACHE_DIR=str(tmp / "kiln")),
                "inductor": dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp / "inductor")),
            }
            envs["kiln-new"] = envs["kiln"]
            envs["kiln-norec"] = dict(envs["kiln"], KILN_TORCH_RECORDS="0")
            if opts.site_a:
                site = os.path.abspath(opts.site_a)
                envs["kiln-a"] = dict(envs["kiln"], PYTHONPATH=os.pathsep.join(
                    p for p in (site, os.environ.get("PYTHONPATH")) if p))
                backends.append("kiln-a")  # after kiln: its caches are warm by then
            rows: dict[str, list[dict[str, Any]]] = {b: [] for b in backends}
            colds: dict[str, dict[str, Any]] = {}
            for b in backends:
                if b in ("kiln-new", "kiln-norec"):
                    continue  # kiln's cold run warmed them
                cold = run_child(b, envs[b], opts)
                colds[b] = cold
                print(f"{b} cold: {cold['seconds']:.2f} s {json.dumps(cold)}", flush=True)
            for i in range(opts.repeat):
                for b in backends if i % 2 == 0 else reversed(backends):
                    r = run_child(b, envs[b], opts)
                    rows[b].append(r)
                    print(f"{b} warm {i}: {r['seconds']:.2f} s {json.dumps(r)}", flush=True)
            med = {b: statistics.median(r["seconds"] for r in rows[b]) for b in backends}
            if "kiln" in colds:
                for b in backends:
                    if b.startswith("kiln"):
                        same = all(r["digest"] == colds["kiln"]["digest"] for r in rows[b])
                        print(f"{b}: outputs equal to kiln's cold run's: {'yes' if same else 'NO'}")
            for b in backends:
                print(f"{b}: warm first result, median of {opts.repeat}: {med[b]:.2f} s")
            for b in ("kiln", "kiln-new", "kiln-norec", "kiln-a"):
                if b in med and "inductor" in med:
                    print(f"{b} / inductor: {med[b] / med['inductor']:.2f}")
                if b in med:
                    for key in ("backend_s", "partition_s", "compile_s", "lookup_s", "load_s", "prepare_s", "record_s"):
                        print(f"{b} {key}: median {statistics.median(r[key] for r in rows[b]):.2f} s")
            if opts.profile and "kiln" in backends:
                run_child("kiln", envs["kiln"], opts, profile=opts.profile)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
