"""The ``kiln`` command line: compile, look up, fetch, inspect, run and prewarm kernels.

Every subcommand takes ``--server`` (default ``$KILN_SERVER``, then localhost:50051), the trust
options ``--tls-ca``, ``--tls-cert``, ``--tls-key``, ``--token``, ``--trusted-key`` (repeatable)
and ``--allow-unsigned`` (defaults from ``$KILN_TLS_CA``, ``$KILN_TLS_CERT``, ``$KILN_TLS_KEY``,
``$KILN_TOKEN``, ``$KILN_TRUSTED_KEYS``, ``$KILN_ALLOW_UNSIGNED``), and ``--help``. Exit status: 0 on success, 1 when the operation failed (a compile error, a lookup
miss, a failed prewarm entry), 2 for bad usage.

Output conventions: ``--json`` prints one JSON document whose counters and sizes are numbers;
the human form prints sizes in binary units (``1.5 MiB``) and aligns its columns. ``kiln
explain`` highlights differing key fields in colour on a terminal (``NO_COLOR`` turns that off)
and marks them with ``!`` everywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import google.protobuf
import grpc
import numpy as np
from google.protobuf import json_format

from . import dtypes as dt
from . import ext
from ._version import __version__
from .autotune import autotune, device_name
from .client import Client
from .connection import make_options
from .errors import KilnError
from .graphio import load_request
from .recorder import iter_graph_files
from .target import Target, host_runs
from .v1 import service_pb2

from .bundle import export_bundle, import_bundle

_CODE_NAMES = {sc.value[0]: sc.name for sc in grpc.StatusCode}


# Field types protobuf's JSON mapping prints as strings (64-bit integers); kiln prints numbers.
_INT64_TYPES = frozenset({3, 4, 6, 16, 18})  # INT64, UINT64, FIXED64, SFIXED64, SINT64


def _to_dict(msg: Any) -> dict[str, Any]:
    """The message as JSON-ready data, with every field (defaults too) and numbers as numbers."""
    try:
        d = json_format.MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    except TypeError:  # protobuf before 5.26 names the option differently
        d = json_format.MessageToDict(msg, preserving_proto_field_name=True, including_default_value_fields=True)  # type: ignore[call-arg]
    return _numbers(msg.DESCRIPTOR, d)


def _numbers(descriptor: Any, d: dict[str, Any]) -> dict[str, Any]:
    for field in descriptor.fields:
        if field.name not in d:
            continue
        v = d[field.name]
        if field.message_type is not None:
            if isinstance(v, list):
                d[field.name] = [_numbers(field.message_type, x) if isinstance(x, dict) else x for x in v]
            elif isinstance(v, dict) and not field.message_type.GetOptions().map_entry:
                d[field.name] = _numbers(field.message_type, v)
        elif field.type in _INT64_TYPES:
            d[field.name] = [int(x) for x in v] if isinstance(v, list) else int(v)
    return d


def human_size(n: float) -> str:
    """``n`` bytes in binary units: ``512 B``, ``1.5 KiB``, ``20.0 GiB``."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _print_table(rows: Sequence[Sequence[Any]], indent: str = "") -> None:
    """Prints rows as columns padded to the widest cell (the last column is not padded);
    columns whose cells are all numbers or sizes are right-aligned."""
    if not rows:
        return
    cells = [[str(c) for c in r] for r in rows]
    ncols = max(len(r) for r in cells)
    widths = [max((len(r[i]) for r in cells if i < len(r)), default=0) for i in range(ncols)]

    def numeric(i: int) -> bool:
        col = [r[i] for r in cells if i < len(r)]
        return i > 0 and all(_looks_numeric(c) for c in col)

    right = [numeric(i) for i in range(ncols)]
    for r in cells:
        parts = []
        for i, c in enumerate(r):
            last = i == len(r) - 1
            if right[i]:
                parts.append(c.rjust(widths[i]))
            else:
                parts.append(c if last else c.ljust(widths[i]))
        print(indent + "  ".join(parts).rstrip())


def _looks_numeric(c: str) -> bool:
    """Numbers, sizes, durations, and the yes/no of flags: cells of a right-aligned column."""
    if c in ("yes", "no"):
        return True
    head = c.split(" ", 1)[0]
    try:
        float(head)
    except ValueError:
        return False
    return True


def _client(args: argparse.Namespace) -> Any:
    return Client(args.server, timeout=args.timeout, compile_timeout=max(args.timeout, 600.0),
                  token=args.token, tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key,
                  trusted_keys=args.trusted_key, allow_unsigned=True if args.allow_unsigned else None)


def _print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


def _compiled_summary(c: Any, wall_ms: Optional[float] = None) -> dict[str, Any]:
    d = {
        "handle": c.handle,
        "target": str(c.target) if c.target else "",
        "cache_hit": c.cache_hit,
        "kernels": c.stats.num_kernels,
        "server_ms": round(c.server_ms, 3),
        "stats": _to_dict(c.stats),
        "artifacts": [
            {"kind": service_pb2.ArtifactKind.Name(a.kind), "digest": a.digest, "size": a.size}
            for a in c.result.artifacts
        ],
        "inputs": [{"name": s.name, "dtype": s.dtype, "shape": list(s.shape)} for s in c.inputs],
        "outputs": [{"dtype": s.dtype, "shape": list(s.shape)} for s in c.outputs],
    }
    if wall_ms is not None:
        d["ms"] = round(wall_ms, 3)
    return d


def _print_summary(d: dict[str, Any]) -> None:
    ms = f"{d['ms']:.1f} ms" if "ms" in d else ""
    st = d["stats"]
    detail = ""
    if not d["cache_hit"]:
        detail = f" (frontend {st.get('frontend_ms', 0):.1f} ms, toolchain {st.get('toolchain_ms', 0):.1f} ms)"
    rows = [
        ("handle", d["handle"]),
        ("target", d["target"]),
        ("kernels", d["kernels"]),
        ("cache hit", "yes" if d["cache_hit"] else "no"),
        ("time", f"{ms} round trip, {d['server_ms']:.1f} ms in the daemon{detail}"),
    ]
    rows += [("artifact", f"{a['kind']:<13} {human_size(a['size']):>10}  {a['digest'][:16]}") for a in d["artifacts"]]
    _print_table(rows)


# ---------------------------------------------------------------------- subcommands

def cmd_compile(args: argparse.Namespace) -> int:
    req = load_request(args.graph)
    asked = args.opt_level is not None or args.no_vector_math or args.no_algebraic_rewrites
    options = make_options(args.opt_level, not args.no_vector_math, not args.no_algebraic_rewrites) if asked else req.options
    with _client(args) as client:
        t0 = time.perf_counter()
        c = client.compile(req.graph, args.target, options)
        wall = (time.perf_counter() - t0) * 1e3
    d = _compiled_summary(c, wall)
    _print_json(d) if args.json else _print_summary(d)
    return 0


def cmd_lookup(args: argparse.Namespace) -> int:
    req = load_request(args.graph)
    with _client(args) as client:
        t0 = time.perf_counter()
        c = client.lookup(req.graph, args.target, req.options)
        wall = (time.perf_counter() - t0) * 1e3
    if c is None:
        if args.json:
            _print_json({"found": False})
        else:
            print(f"not cached for {args.target}")
        return 1
    d = _compiled_summary(c, wall)
    d["found"] = True
    _print_json(d) if args.json else _print_summary(d)
    return 0


_EXTENSIONS = {"SHARED_OBJECT": ".so", "CUBIN": ".cubin", "PTX": ".ptx", "FUSION_REPORT": ".fusion.txt"}


def cmd_fetch(args: argparse.Namespace) -> int:
    with _client(args) as client:
        c = client.get(args.handle)
        out_dir = Path(args.output) if args.output else None
        if out_dir:
            out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for a in c.result.artifacts:
            kind = service_pb2.ArtifactKind.Name(a.kind)
            path = client.fetch(a.digest, size=a.size or None)
            if out_dir:
                ext = _EXTENSIONS.get(kind) or (".cu" if c.target is not None and c.target.is_cuda else ".cpp")
                dest = out_dir / f"{c.handle}{ext}"
                # The bytes hashed against the signed digest, not whatever the file holds later.
                dest.write_bytes(client.read_verified(a.digest, size=a.size or None))
                path = dest
            written.append({"kind": kind, "digest": a.digest, "size": a.size, "path": str(path)})
        if out_dir:
            plan = out_dir / f"{c.handle}.plan.json"
            plan.write_text(json.dumps(_to_dict(c.result), indent=2, sort_keys=True) + "\n")
            written.append({"kind": "PLAN", "path": str(plan)})
    if args.json:
        _print_json({"handle": c.handle, "artifacts": written})
    else:
        _print_table([(w["kind"], human_size(w["size"]) if "size" in w else "-", w["path"]) for w in written])
    return 0


def cmd_source(args: argparse.Namespace) -> int:
    with _client(args) as client:
        src = client.source(args.handle)
    text = src.fusion_report if args.fusion_report else src.source
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    with _client(args) as client:
        c = client.get(args.handle)
        given: dict[str, np.ndarray] = {}
        for item in args.input:
            name, sep, file = item.partition("=")
            if not sep or not name or not file:
                raise SystemExit(f"kiln run: --input takes NAME=FILE.npy, got {item!r}")
            given[name] = np.load(file, allow_pickle=False)
        arrays = []
        for i, spec in enumerate(c.inputs):
            for key in (spec.name, f"input{i}", str(i)):
                if key in given:
                    arrays.append(given.pop(key))
                    break
            else:
                names = ", ".join(f"{s.name} ({s.dtype}{list(s.shape)})" for s in c.inputs)
                raise SystemExit(f"kiln run: no --input for {spec.name!r}; the kernel takes: {names}")
        if given:
            raise SystemExit(f"kiln run: unknown inputs {sorted(given)}; the kernel takes {[s.name for s in c.inputs]}")
        t0 = time.perf_counter()
        outs = c(*arrays, num_threads=args.threads)
        ms = (time.perf_counter() - t0) * 1e3
    outs = outs if isinstance(outs, tuple) else (outs,)
    out_dir = Path(args.output)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, o in enumerate(outs):
        p = out_dir / f"output{i}.npy"
        np.save(p, o)
        paths.append(str(p))
    if args.json:
        _print_json({"handle": c.handle, "outputs": paths, "ms": round(ms, 3)})
    else:
        for path, o in zip(paths, outs):
            print(f"{path}  {o.dtype}{list(o.shape)}")
        print(f"ran in {ms:.1f} ms")
    return 0


class _Progress:
    """Progress of a prewarm: a bar redrawn in place on a terminal ("bar"), one plain line per
    finished request otherwise ("lines", for logs and CI), or nothing ("off")."""

    def __init__(self, total: int, mode: str, labels: Sequence[str]) -> None:
        self.total = total
        self.mode = mode
        self.labels = labels
        self.done = self.hits = self.failed = 0
        self.start = time.monotonic()

    def update(self, event: Any) -> None:
        self.done += 1
        if event.code != 0:
            self.failed += 1
            outcome = f"failed ({_CODE_NAMES.get(event.code, event.code)})"
        elif event.cache_hit:
            self.hits += 1
            outcome = "cache hit"
        else:
            outcome = "compiled"
        if self.mode == "bar":
            width = 30
            filled = int(width * self.done / max(self.total, 1))
            sys.stderr.write(
                f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}"
                f"  {self.hits} hit  {self.failed} failed  {time.monotonic() - self.start:.1f} s"
            )
            sys.stderr.flush()
        elif self.mode == "lines":
            label = self.labels[event.index] if 0 <= event.index < len(self.labels) else f"#{event.index}"
            n = len(str(self.total))
            print(f"[{self.done:>{n}}/{self.total}] {outcome:<10} {event.ms:8.1f} ms  {label}", flush=True)

    def finish(self) -> None:
        if self.mode == "bar":
            sys.stderr.write("\n")


def cmd_prewarm(args: argparse.Namespace) -> int:
    targets = [Target.parse(t) for t in args.target]
    files = list(iter_graph_files(args.paths))
    builds = ext.iter_build_records(args.paths)
    failures: list[str] = []
    if files and not targets:
        print("prewarm: graphs need at least one --target", file=sys.stderr)
        return 2
    if not args.paths and not args.model:
        print("prewarm: give graph files or folders, --model MODULE:FUNCTION, or both", file=sys.stderr)
        return 2
    requests: list[Any] = []
    labels: list[str] = []
    for f in files:
        try:
            base = load_request(f)
        except (ValueError, OSError) as err:
            failures.append(f"{f}: {err}")
            continue
        for t in targets:
            r = service_pb2.CompileRequest()
            r.CopyFrom(base)
            r.target.CopyFrom(t.to_proto())
            requests.append(r)
            labels.append(f"{f} [{t}]")
    mode = "off" if (args.json or args.quiet) else ("bar" if sys.stderr.isatty() else "lines")
    progress = _Progress(len(requests), mode, labels)
    t0 = time.monotonic()
    built = build_hits = 0
    with _client(args) as client:
        events = client.prewarm(requests, on_event=lambda _r, e: progress.update(e)) if requests else []
        progress.finish()
        # Recorded custom builds (extensions, raw kernels), one at a time: each is a whole
        # compiler run on kilnd.
        for f in builds:
            try:
                outcome = ext.replay_file(client, f)
            except (KilnError, OSError, ValueError) as err:
                failures.append(f"{f}: {err}")
                continue
            build_hits += outcome.cache_hit
            built += not outcome.cache_hit
            if mode == "lines":
                print(f"{'cache hit' if outcome.cache_hit else 'built':<10} {outcome.seconds * 1000:8.1f} ms  {f}", flush=True)
        tuned = _prewarm_autotune(client, requests, labels, events, failures, mode) if args.autotune else []
    models = _prewarm_models(args, failures, mode) if args.model else []
    elapsed = time.monotonic() - t0
    compiled = sum(1 for e in events if e.code == 0 and not e.cache_hit)
    hits = sum(1 for e in events if e.code == 0 and e.cache_hit)
    for label, ev in zip(labels, events):
        if ev.code != 0:
            failures.append(f"{label}: {_CODE_NAMES.get(ev.code, ev.code)}: {ev.message}")
    if args.json:
        _print_json({
            "graphs": len(files), "targets": [str(t) for t in targets], "requests": len(requests),
            "compiled": compiled, "cache_hits": hits, "failed": len(failures), "seconds": round(elapsed, 3),
            "builds": len(builds), "built": built, "build_cache_hits": build_hits,
            "tuned": tuned, "models": models,
            "failures": failures,
            "results": [{"graph": l, "handle": e.handle, "cache_hit": e.cache_hit, "code": _CODE_NAMES.get(e.code, e.code), "ms": round(e.ms, 3)} for l, e in zip(labels, events)],
        })
    else:
        for failure in failures:
            print(f"FAILED {failure}", file=sys.stderr)
        print(f"prewarm: {len(files)} graphs x {len(targets)} targets: {compiled} compiled, {hits} cache hits; "
              f"{len(builds)} custom builds: {built} built, {build_hits} cache hits; "
              + (f"{len(models)} models: {sum(m.get('outcome') == 'stored' for m in models)} stored, "
                 f"{sum(m.get('outcome') == 'hit' for m in models)} already held; " if args.model else "")
              + f"{len(failures)} failed in {elapsed:.1f} s")
    return 1 if failures else 0


def _prewarm_models(args: argparse.Namespace, failures: list[str], mode: str) -> list[dict[str, Any]]:
    """``kiln prewarm --model``: each MODULE:FUNCTION replayed by :mod:`kiln.torch.prewarm` in a
    process of its own (the model's code and PyTorch stay out of this one, and a model that
    crashes costs its own line only), with this command's connection settings. Its JSON lines."""
    env = dict(os.environ)
    for name, value in (("KILN_SERVER", args.server), ("KILN_TOKEN", args.token), ("KILN_TLS_CA", args.tls_ca),
                        ("KILN_TLS_CERT", args.tls_cert), ("KILN_TLS_KEY", args.tls_key),
                        ("KILN_TRUSTED_KEYS", ",".join(args.trusted_key or []) or None),
                        ("KILN_ALLOW_UNSIGNED", "1" if args.allow_unsigned else None)):
        if value:
            env[name] = value
    rows: list[dict[str, Any]] = []
    for spec in args.model:
        proc = subprocess.run([sys.executable, "-m", "kiln.torch.prewarm", spec], env=env, stdout=subprocess.PIPE,
                              stderr=None if mode == "lines" else subprocess.PIPE, text=True)
        got = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        if not got:
            tail = (proc.stderr or "").strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
            got = [{"spec": spec, "outcome": "error", "reason": tail[0]}]
        for row in got:
            rows.append(row)
            if row.get("outcome") not in ("hit", "stored") or row.get("failed"):
                failures.append(f"{spec} [{row.get('example', '-')}]: {row.get('outcome')}: {row.get('reason')}")
            if mode == "lines":
                where = f"{spec} [{row.get('example', '-')}] {row.get('model', '')}"
                print(f"{row.get('outcome', '?'):<10} {1000 * row.get('seconds', 0):8.1f} ms  {where}: "
                      f"{row.get('parts', 0)} parts, {row.get('compiled', 0)} compiled", flush=True)
    return rows


def _random_inputs(graph: Any, device: Optional[str]) -> list[Any]:
    """Random arrays of a graph's input types (symbolic dimensions at their example sizes): NumPy
    for a CPU target, torch tensors on ``device`` for a CUDA one."""
    rng = np.random.default_rng(0)
    arrays = []
    for inp in graph.inputs:
        dtype = dt.from_wire(inp.type.dtype)
        shape = tuple(inp.type.shape)
        npt = dt.to_numpy(dtype)
        if dtype == "bool":
            a = rng.random(shape) < 0.5
        elif np.issubdtype(npt, np.integer):
            a = rng.integers(0, 8, size=shape).astype(npt)
        else:
            a = rng.standard_normal(shape).astype(npt)
        if inp.type.strides:
            raise ValueError("inputs with declared strides are not tuned")
        arrays.append(a)
    if device is None:
        return arrays
    import torch

    return [torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in arrays]


def _prewarm_autotune(client: Any, requests: list[Any], labels: list[str], events: list[Any], failures: list[str],
                      mode: str) -> list[dict[str, Any]]:
    """``kiln prewarm --autotune``: each compiled graph whose target runs here (this CPU, or a
    CUDA device of that compute capability) is tuned on random inputs, unless the daemon
    already holds a tuning for this device model; the winners are recorded for every client."""
    out: list[dict[str, Any]] = []
    for req, label, ev in zip(requests, labels, events):
        if ev.code != 0:
            continue
        target = Target.from_proto(req.target)
        device = None
        if target.is_cuda:
            try:
                import torch

                if not torch.cuda.is_available() or torch.cuda.get_device_capability(0) != divmod(target.sm, 10):
                    continue
                device = "cuda:0"
            except ImportError:
                continue
        elif not host_runs(target):
            continue
        try:
            inputs = _random_inputs(req.graph, device)
            name = device_name(target, inputs)
            known = client.lookup_tuning(req.graph, target, name, req.options)
            _, timings = autotune(client, req.graph, inputs, target, options=req.options, device=name)
        except Exception as err:  # a graph that cannot be tuned here is reported, the rest go on
            failures.append(f"{label}: autotune: {type(err).__name__}: {err}")
            continue
        chosen = client.lookup_tuning(req.graph, target, name, req.options).variant  # recorded before or just now
        out.append({"graph": label, "device": name, "variant": chosen, "already_tuned": bool(known.found),
                    "timings_ms": {str(t.variant): round(t.median_ms, 4) for t in timings}})
        if mode == "lines":
            print(f"{'tuned' if not known.found else 'known':<10} variant {chosen}  {label}  on {name}", flush=True)
    return out


def cmd_stats(args: argparse.Namespace) -> int:
    with _client(args) as client:
        s = client.stats()
    d = _to_dict(s)
    if args.json:
        _print_json(d)
        return 0
    store = d.pop("store", {})
    shared = d.pop("shared", {})
    tokens = d.pop("tokens", [])
    # One table of counters and sizes (a numeric column, right-aligned), then the shared tier
    # and the per-token counters, each a table of its own when kilnd has them.
    rows = [(k, _stat_text(k, v)) for k, v in d.items()]
    rows += [(f"store.{k}", _stat_text(k, v)) for k, v in store.items()]
    _print_table(rows)
    if shared.get("enabled"):
        _print_table(_shared_tier_rows(shared))
    if tokens:
        _print_table([("token", "role", "requests", "denied", "in flight", "limited")] +
                     [(t.get("name", ""), t.get("role", ""), t.get("requests", 0), t.get("denied", 0),
                       t.get("compiles_in_flight", 0), t.get("limited", 0)) for t in tokens])
    return 0


def _stat_text(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if name.endswith("bytes"):
        return human_size(value)
    if name.endswith("_s") and isinstance(value, float):
        return f"{value:.1f} s"
    return str(value)


def cmd_export(args: argparse.Namespace) -> int:
    def progress(st: Any) -> None:
        if not args.quiet:
            print(f"\rexported {st.entries} entries ({st.blobs} blobs)", end="", file=sys.stderr, flush=True)

    with _client(args) as client:
        st = export_bundle(client, args.bundle, progress=progress)
    if not args.quiet:
        print(file=sys.stderr)
    print(f"{args.bundle}: {st.entries} entries, {st.blobs} blobs, {human_size(st.bytes)}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    def progress(st: Any) -> None:
        if not args.quiet:
            print(f"\rimported {st.entries} entries", end="", file=sys.stderr, flush=True)

    with _client(args) as client:
        st = import_bundle(client, args.bundle, resign=args.resign, progress=progress)
    if not args.quiet:
        print(file=sys.stderr)
    print(f"{args.bundle}: {st.entries} entries, {st.stored} stored, {st.present} already present")
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    req = load_request(args.graph)
    with _client(args) as client:
        r = client.explain(req.graph, args.target, req.options, max_entries=args.max_entries)
    mine = [(f.label, f.value) for f in r.fields]
    entries = []
    for e in r.nearest:
        theirs = dict((f.label, f.value) for f in e.fields)
        differing = [label for label, value in mine if theirs.get(label) != value]
        entries.append({"handle": e.handle, "fields": theirs, "differing": differing})
    if args.json:
        _print_json({"handle": r.handle, "target": args.target, "cached": r.cached, "graph_digest": r.graph_digest,
                     "fields": dict(mine), "nearest": entries})
        return 0
    color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")

    def mark(text: str) -> str:
        return f"\033[1;31m{text}\033[0m" if color else text

    verdict = "HIT: the daemon holds this key" if r.cached else "MISS: no stored entry has this key"
    print(f"{verdict} ({r.handle})")
    print("request key:")
    _print_table([(f"  {label}", value) for label, value in mine])
    if not entries:
        print(f"no other stored entry for this graph ({r.graph_digest[:16]}): the graph itself is new to the daemon"
              if not r.cached else "no other stored entry for this graph")
        return 0
    print(f"{len(entries)} other stored entr{'y' if len(entries) == 1 else 'ies'} for the same graph, nearest first:")
    for e in entries:
        n = len(e["differing"])
        print(f"entry {e['handle']}: {n} field{'' if n == 1 else 's'} differ{'s' if n == 1 else ''}")
        rows = []
        for label, value in mine:
            if label in e["differing"]:
                rows.append((mark(f"! {label}"), mark(e["fields"].get(label, "(absent)")), f"(request: {value})"))
        same = [label for label, _ in mine if label not in e["differing"]]
        _print_table(rows, indent="  ")
        if same:
            print(f"    same: {', '.join(same)}")
    return 0


def _shared_tier_rows(shared: dict[str, Any]) -> list[tuple[str, str]]:
    """The shared (Redis) tier, when kilnd has one, as table rows: state, counters and the
    latency median from its histogram."""
    down = int(shared.get("nodes_down", 0))
    state = "DOWN" if not shared.get("available") else f"up, {down} node(s) down" if down else "up"
    rows = [("shared", f"{shared.get('address', '')} ({state})")]
    bounds = shared.pop("latency_bounds_s", [])
    counts = [int(c) for c in shared.pop("latency_counts", [])]
    for k in ("enabled", "available", "address", "latency_sum_s"):
        shared.pop(k, None)
    rows += [(f"shared.{k}", _stat_text(k, v)) for k, v in shared.items()]
    total = sum(counts)
    if total:
        seen, p50 = 0, "> 250 ms"
        for bound, c in zip(bounds, counts):
            seen += c
            if seen * 2 >= total:
                p50 = f"<= {bound * 1e3:g} ms"
                break
        rows.append(("shared.latency_p50", f"{p50} ({total} calls)"))
    return rows


# ---------------------------------------------------------------------- parser

def _version_text() -> str:
    return f"kiln {__version__} (grpcio {grpc.__version__}, protobuf {google.protobuf.__version__}, numpy {np.__version__})"


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--server", default=None, help="daemon address host:port (default: $KILN_SERVER, else localhost:50051)")
    common.add_argument("--timeout", type=float, default=60.0, help="deadline of each call in seconds, retries included (default 60; compiles at least 600)")
    common.add_argument("--tls-ca", metavar="PEM", default=None, help="CA of the daemon's certificate: speak TLS (default: $KILN_TLS_CA)")
    common.add_argument("--tls-cert", metavar="PEM", default=None, help="client certificate for mTLS (default: $KILN_TLS_CERT)")
    common.add_argument("--tls-key", metavar="PEM", default=None, help="key of --tls-cert (default: $KILN_TLS_KEY)")
    common.add_argument("--token", default=None, help="bearer token sent with every call (default: $KILN_TOKEN)")
    common.add_argument("--trusted-key", action="append", default=None, metavar="PEM",
                        help="Ed25519 public key whose signed results are accepted; repeat for several (default: $KILN_TRUSTED_KEYS)")
    common.add_argument("--allow-unsigned", action="store_true", help="also accept unsigned results when trusted keys are given")

    p = argparse.ArgumentParser(prog="kiln", description="Client of the kiln compile server for fused tensor kernels.")
    p.add_argument("--version", action="version", version=_version_text())
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    graph_help = "graph file: protobuf JSON (.json), text (.txtpb, .pbtxt) or binary (.pb); or a recorded .kreq"

    s = sub.add_parser("compile", parents=[common], help="get or compile a graph", description="Get or compile a graph; prints handle, kernels, cache hit and milliseconds.")
    s.add_argument("graph", metavar="GRAPH", help=graph_help)
    s.add_argument("--target", "-t", default="cpu", help="cpu (this machine), cpu:x86-64-v3, cpu:+avx2+fma, cuda:sm_90 (default: cpu)")
    s.add_argument("--opt-level", type=int, choices=range(4), default=None, help="0 (fastest build) to 3 (fastest code, the default)")
    s.add_argument("--no-vector-math", action="store_true", help="compute transcendentals with the scalar libm")
    s.add_argument("--no-algebraic-rewrites", action="store_true",
                   help="no reassociating rewrites (a sum of a product over disjoint axes stays one sum)")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_compile)

    s = sub.add_parser("lookup", parents=[common], help="look a graph up in the cache without compiling", description="Look a graph up in the daemon's cache; exit status 1 when it is not cached.")
    s.add_argument("graph", metavar="GRAPH", help=graph_help)
    s.add_argument("--target", "-t", default="cpu", help="target (default: cpu)")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_lookup)

    s = sub.add_parser("fetch", parents=[common], help="download a handle's artifacts", description="Download a handle's artifacts into the local cache (verified), and copy them to --output.")
    s.add_argument("handle", metavar="HANDLE")
    s.add_argument("--output", "-o", metavar="DIR", help="also copy the artifacts and the plan (JSON) to DIR as HANDLE.so, HANDLE.cpp, ...")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_fetch)

    s = sub.add_parser("source", parents=[common], help="print a handle's generated source", description="Print the generated source (or the fusion report) of a handle.")
    s.add_argument("handle", metavar="HANDLE")
    s.add_argument("--fusion-report", action="store_true", help="print the fusion report instead")
    s.add_argument("--output", "-o", metavar="FILE", help="write to FILE instead of standard output")
    s.set_defaults(func=cmd_source)

    s = sub.add_parser("run", parents=[common], help="run a CPU kernel on .npy files", description="Run a handle's CPU kernel on .npy inputs and write output0.npy, output1.npy... to DIR.")
    s.add_argument("handle", metavar="HANDLE")
    s.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE.npy",
                   help="an input by graph input name (known when this machine compiled the graph), inputN or N")
    s.add_argument("--output", "-o", required=True, metavar="DIR", help="folder for the outputs")
    s.add_argument("--threads", type=int, default=None, help="threads the kernel may use (default: all)")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_run)

    s = sub.add_parser("prewarm", parents=[common], help="compile recorded graphs for targets, replay models", description="Compile every graph file in PATHs (folders are searched recursively) for every --target at prewarm priority, and replay every --model so that kilnd holds its precompiled record. Exit status 1 if any failed.")
    s.add_argument("paths", nargs="*", metavar="PATH",
                   help="graph files or folders of them (.kreq recordings, .json, .txtpb, .pb); .kbuild recordings "
                        "of extension builds and raw kernels are built as recorded")
    s.add_argument("--target", "-t", action="append", default=[], help="a target for the graphs; repeat for several")
    s.add_argument("--model", "-m", action="append", default=[], metavar="MODULE:FUNCTION",
                   help="replay a model: FUNCTION returns (model, args[, kwargs]) examples, each run once through "
                        "kiln.torch.compile with precompile on, so kilnd holds the whole compiled model "
                        "(python3 -m kiln.torch.prewarm --help says more); repeat for several")
    s.add_argument("--autotune", action="store_true",
                   help="also tune each graph whose target runs here (this CPU, or a CUDA device of that sm) on random "
                        "inputs and record the fastest variant for every client of the daemon (kiln.autotune)")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_prewarm)

    s = sub.add_parser("explain", parents=[common], help="say why a graph misses the cache", description="Print the key fields of the request beside those of the stored entries for the same graph, differing fields highlighted: why a graph missed (or that it would hit).")
    s.add_argument("graph", metavar="GRAPH", help=graph_help)
    s.add_argument("--target", "-t", default="cpu", help="target (default: cpu)")
    s.add_argument("--max-entries", type=int, default=0, help="at most this many stored entries (default: the daemon's, 16)")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_explain)

    s = sub.add_parser("export", parents=[common], help="write the daemon's cache to a bundle file",
                       description="Write every entry the daemon stores (results with their artifacts, model records, "
                                   "tunings) to BUNDLE, for `kiln import` into another daemon. Needs role admin.")
    s.add_argument("bundle", metavar="BUNDLE", help="the file to write")
    s.add_argument("--quiet", "-q", action="store_true", help="no progress")
    s.set_defaults(func=cmd_export)

    s = sub.add_parser("import", parents=[common], help="store a bundle file's entries in the daemon",
                       description="Check BUNDLE whole, then store its entries in the daemon, which checks each one "
                                   "(digests; signatures when it signs). Needs role admin.")
    s.add_argument("bundle", metavar="BUNDLE", help="a file written by `kiln export`")
    s.add_argument("--resign", action="store_true",
                   help="a daemon that signs signs the entries with its own key instead of requiring a key it trusts")
    s.add_argument("--quiet", "-q", action="store_true", help="no progress")
    s.set_defaults(func=cmd_import)

    s = sub.add_parser("stats", parents=[common], help="print the daemon's counters", description="Print the daemon's cache and compile counters.")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_stats)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``kiln`` console script."""
    args = build_parser().parse_args(argv)
    try:
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # here, where a closed pipe is caught below, not at the interpreter's exit
        return status
    except KilnError as e:
        print(f"kiln {args.command}: {e}", file=sys.stderr)
        return 1
    except (ValueError, FileNotFoundError) as e:
        print(f"kiln {args.command}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (``kiln stats | head``): no traceback, and nothing more to write.
        # stdout is pointed at /dev/null so that the interpreter's own flush at exit is quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a command killed by it


if __name__ == "__main__":
    sys.exit(main())
