#!/usr/bin/env python3
"""First compiled result of a model through torch.compile in a fresh process, with warm caches:
kiln against Inductor (its FX graph and AOTAutograd caches full), alternating fresh processes,
and where kiln's time goes. Workloads (``--workload``): a ``transformers`` BERT's inference
(``bert``) or training step with AdamW (``bert-train``), torchvision's resnet18 inference.
kiln runs as ``kiln`` (kilnd and the local artifact folder full), ``kiln-new`` (kilnd full, an
empty local folder per process: another machine of the cluster), ``kiln-norec`` (program
records off) and ``kiln-pre`` / ``kiln-pre-new`` (``kiln.torch.compile`` with
``precompile``: no Dynamo or AOTAutograd trace on a warm start; ``kiln-pre-replica``: the same
through another kilnd replica on a shared Redis that never served the model, which this
script starts with ``redis-server``). PyTorch's own fastest warm
path runs beside them as ``torch-aot``: its AOT precompile with Inductor, saved to a file by the
cold process and loaded by the warm ones. Every process's output is compared by digest with
its backend's cold run's.

Each measured process imports torch, transformers and kiln (not timed: a program pays those
imports anyway), builds the model, then times ``torch.compile(model)`` (or the precompiled
model's load) plus the first compiled call (or training step). kiln's processes also report the backend's own counters
(:func:`kiln.torch.stats`): ``backend_s`` (inside the backend: AOTAutograd's trace, kiln's
partitioning, the parts' lookups and loads), ``partition_s`` and ``compile_s``; what is left
of the total is Dynamo's trace and the first call.

    PYTHONPATH=client/python python tests/bench/torch_warm_bench.py            # own kilnd
    ... --layers 12 --hidden 128 --repeat 5 --device cuda
    ... --profile 25      # cProfile of one more warm kiln-pre (or kiln) process: the 25 costliest functions
    ... --site-a DIR      # also "kiln-a": kiln imported from DIR (another build), same daemon

On the CPU the model is small (hidden 128 by default) so that the cold compiles stay short;
the number of graphs and parts, which is what a warm start pays for, is BERT-base's at 12
layers.
"""

from __future__ import annotations

import argparse
import contextlib
import io
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
    if backend.startswith("kiln"):
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
        f = compiled(model, backend, inputs, opts)
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
    if backend.startswith("kiln"):
        import kiln.torch as kt

        s = kt.stats()
        from kiln.torch import native

        native.wait(60)
        from kiln.torch.records import RECORD_EVENTS

        extra = {"runner": getattr(native, "FOUND", None), "runner_error": native.ERROR,
                 "records": list(RECORD_EVENTS)}
        extra.update({k: s.get(k, float("nan")) for k in ("graphs", "parts", "compiled", "failed", "cache_hits", "memo_hits",
                                   "backend_s", "partition_s", "compile_s", "lookup_s", "load_s", "prepare_s",
                                   "record_hits", "record_misses", "record_s", "precompile_hits",
                                   "precompile_misses", "precompile_s")})
    print("RESULT " + json.dumps({"seconds": seconds, "max_err": err, "digest": digest, **extra}), flush=True)


def compiled(model: Any, backend: str, inputs: dict[str, Any], opts: argparse.Namespace) -> Any:
    """The compiled model a child times: ``torch.compile``'d, kiln's precompiled model
    (``kiln-pre``), or PyTorch's own AOT precompile with Inductor (``torch-aot``: compiled and
    saved to a file by the cold process, loaded from it by the warm ones)."""
    import torch

    if backend == "kiln-pre":
        import kiln.torch as kt

        return kt.compile(model, options={"precompile": True})
    if backend == "torch-aot":
        # torch's public precompile API, with what BERT needs on torch 2.11 and transformers 5
        # (kiln's precompile does the same): the decorated forward's closure passed as external
        # data, builtins and the globals Dynamo installs for its bytecode given back on load,
        # and the guards torch cannot serialize (object identities) dropped, as its precompile
        # users do (vLLM skips every guard).
        import builtins
        import importlib
        import re

        forward = model.forward.__func__
        closure = {f"c{i}": c.cell_contents for i, c in enumerate(forward.__closure__ or ())}
        path = Path(opts.aot_file)
        if path.exists():
            data = path.read_bytes()
            scope = {**vars(builtins), **forward.__globals__}
            try:
                fn = torch.compiler.load_compiled_function(io.BytesIO(data), f_globals=scope, external_data=closure)
            except RuntimeError as e:
                for name, mod in re.findall(r"'(___module_(\w+?)_\d+_c\d+)'", str(e)):
                    scope[name] = importlib.import_module(mod)
                fn = torch.compiler.load_compiled_function(io.BytesIO(data), f_globals=scope, external_data=closure)
        else:
            if hasattr(torch._dynamo.config, "enable_aot_compile"):
                torch._dynamo.config.enable_aot_compile = True
            added = [k for k in vars(builtins) if k not in forward.__globals__]
            forward.__globals__.update({k: vars(builtins)[k] for k in added})
            with torch.set_grad_enabled(opts.workload == "bert-train"):  # the step's grad mode
                fn = torch.compile(model.forward, fullgraph=True, options={
                    "guard_filter_fn": getattr(torch.compiler, "keep_portable_guards_unsafe",
                                               torch.compiler.skip_all_guards_unsafe)}).aot_compile(((), inputs))
            for k in added:
                del forward.__globals__[k]
            fn.save_compiled_function(str(path), external_data=closure)
        return lambda **kw: fn(model, **kw)
    return torch.compile(model, backend=backend)


def run_child(backend: str, env: dict[str, str], opts: argparse.Namespace, profile: int = 0) -> dict[str, Any]:
    child_backend = BASE.get(backend, backend)
    cmd = [sys.executable, __file__, "--child", child_backend, "--layers", str(opts.layers), "--hidden", str(opts.hidden),
           "--seq", str(opts.seq), "--batch", str(opts.batch), "--device", opts.device, "--workload", opts.workload,
           "--aot-file", opts.aot_file]
    if backend.endswith(("-new", "-replica")):  # another machine of the cluster: an empty local artifact folder
        env = dict(env, KILN_CACHE_DIR=tempfile.mkdtemp(prefix="kiln-new-machine-"))
    if backend.endswith("-replica"):
        # A replica that never served the model: a fresh kilnd (its own empty store) on the same
        # Redis, started before the process and not timed; all it has comes through Redis.
        from kilnd_proc import daemon

        with daemon(args=["--shared-cache", opts.redis_url], own=True) as address:
            return run_child(backend[:-len("-replica")] + "-new", dict(env, KILN_SERVER=address), opts, profile)
    if profile:
        cmd += ["--profile-child", str(profile)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if profile:
        print(p.stderr[-12000:])
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if p.returncode != 0 or line is None:
        raise SystemExit(f"{backend} process failed:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
    return json.loads(line[len("RESULT "):])


# Variants that run as another backend's child, with their caches warmed by its cold run.
BASE = {"kiln-new": "kiln", "kiln-norec": "kiln", "kiln-pre-new": "kiln-pre", "kiln-a": "kiln",
        "kiln-pre-replica": "kiln-pre"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeat", type=int, default=3, help="warm processes per backend")
    ap.add_argument("--workload", default="bert", choices=["bert", "bert-train", "resnet18"])
    ap.add_argument("--backends", default="kiln,kiln-new,kiln-norec,kiln-pre,kiln-pre-new,inductor,torch-aot",
                    help="kiln: warm daemon and local folder; kiln-new: warm daemon, empty local folder; "
                         "kiln-norec: kiln without program records; kiln-pre(-new): kiln.torch.compile with "
                         "precompile; inductor: torch.compile, warm FX graph and AOTAutograd caches; "
                         "torch-aot: PyTorch's AOT precompile (Inductor), loaded from its saved file; "
                         "kiln-pre-replica: kiln-pre from another kilnd replica sharing a Redis (started here) "
                         "that never served the model, with an empty local folder")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile one more warm kiln process")
    ap.add_argument("--profile-backend", help="the backend --profile runs (default kiln-pre, else kiln)")
    ap.add_argument("--site-a", help="a folder holding another build of the kiln package, timed as kiln-a")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--redis-url", default="", help=argparse.SUPPRESS)
    ap.add_argument("--aot-file", default="", help=argparse.SUPPRESS)
    ap.add_argument("--profile-child", type=int, default=0, help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.child:
        child(opts)
        return 0

    sys.path.insert(0, str(HERE))
    from kilnd_proc import daemon, redis_server

    backends = opts.backends.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="kiln-torch-warm-"))
    try:
        with contextlib.ExitStack() as stack:
            shared: list[str] = []
            if any(b.endswith("-replica") for b in backends):
                opts.redis_url = stack.enter_context(redis_server())
                shared = ["--shared-cache", opts.redis_url]
            address = stack.enter_context(daemon(workers=max(2, min(16, os.cpu_count() or 2)), args=shared,
                                                 own=bool(shared)))
            envs = {
                "kiln": dict(os.environ, KILN_SERVER=address, KILN_CACHE_DIR=str(tmp / "kiln")),
                "inductor": dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp / "inductor")),
            }
            envs["kiln-new"] = envs["kiln-pre"] = envs["kiln-pre-new"] = envs["kiln-pre-replica"] = envs["kiln"]
            envs["kiln-norec"] = dict(envs["kiln"], KILN_TORCH_RECORDS="0")
            envs["torch-aot"] = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp / "torch-aot"))
            opts.aot_file = str(tmp / "torch-aot.bin")
            if opts.site_a:
                site = os.path.abspath(opts.site_a)
                envs["kiln-a"] = dict(envs["kiln"], PYTHONPATH=os.pathsep.join(
                    p for p in (site, os.environ.get("PYTHONPATH")) if p))
                backends.append("kiln-a")  # after kiln: its caches are warm by then
            rows: dict[str, list[dict[str, Any]]] = {b: [] for b in backends}
            colds: dict[str, dict[str, Any]] = {}
            for b in backends:
                if b in BASE:
                    continue  # their base's cold run warmed them
                cold = run_child(b, envs[b], opts)
                colds[b] = cold
                print(f"{b} cold: {cold['seconds']:.2f} s {json.dumps(cold)}", flush=True)
            for i in range(opts.repeat):
                for b in backends if i % 2 == 0 else reversed(backends):
                    r = run_child(b, envs[b], opts)
                    rows[b].append(r)
                    print(f"{b} warm {i}: {r['seconds']:.2f} s {json.dumps(r)}", flush=True)
            med = {b: statistics.median(r["seconds"] for r in rows[b]) for b in backends}
            for b in backends:
                base = BASE.get(b, b)
                if base in colds:
                    same = all(r["digest"] == colds[base]["digest"] for r in rows[b])
                    print(f"{b}: outputs equal to {base}'s cold run's: {'yes' if same else 'NO'}")
            for b in backends:
                print(f"{b}: warm first result, median of {opts.repeat}: {med[b]:.2f} s")
            for b in backends:
                if b.startswith("kiln") and "inductor" in med:
                    print(f"{b} / inductor: {med[b] / med['inductor']:.2f}")
                if b.startswith("kiln") and "torch-aot" in med:
                    print(f"{b} / torch-aot: {med[b] / med['torch-aot']:.2f}")
                if b.startswith("kiln"):
                    for key in ("backend_s", "partition_s", "compile_s", "lookup_s", "load_s", "prepare_s", "record_s",
                                "precompile_s"):
                        print(f"{b} {key}: median {statistics.median(r[key] for r in rows[b]):.2f} s")
            profiled = opts.profile_backend or next((b for b in ("kiln-pre", "kiln") if b in backends), None)
            if opts.profile and profiled:
                run_child(profiled, envs[profiled], opts, profile=opts.profile)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
