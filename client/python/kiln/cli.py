"""The ``kiln`` command line: compile, look up, fetch, inspect, run and prewarm kernels.

Every subcommand takes ``--server`` (default ``$KILN_SERVER``, then localhost:50051), the trust
options ``--tls-ca``, ``--tls-cert``, ``--tls-key``, ``--token``, ``--trusted-key`` (repeatable)
and ``--allow-unsigned`` (defaults from ``$KILN_TLS_CA``, ``$KILN_TLS_CERT``, ``$KILN_TLS_KEY``,
``$KILN_TOKEN``, ``$KILN_TRUSTED_KEYS``, ``$KILN_ALLOW_UNSIGNED``), and ``--help``. Exit status: 0 on success, 1 when the operation failed (a compile error, a lookup
miss, a failed prewarm entry), 2 for bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import grpc
import numpy as np

_CODE_NAMES = {sc.value[0]: sc.name for sc in grpc.StatusCode}


def _to_dict(msg: Any) -> dict[str, Any]:
    from google.protobuf import json_format

    try:
        return json_format.MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    except TypeError:  # protobuf before 5.26 names the option differently
        return json_format.MessageToDict(msg, preserving_proto_field_name=True, including_default_value_fields=True)  # type: ignore[call-arg]


def _client(args: argparse.Namespace) -> Any:
    from .client import Client

    return Client(args.server, timeout=args.timeout, compile_timeout=max(args.timeout, 600.0),
                  token=args.token, tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key,
                  trusted_keys=args.trusted_key, allow_unsigned=True if args.allow_unsigned else None)


def _print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


def _compiled_summary(c: Any, wall_ms: Optional[float] = None) -> dict[str, Any]:
    from .v1 import service_pb2

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
    print(f"handle     {d['handle']}")
    print(f"target     {d['target']}")
    print(f"kernels    {d['kernels']}")
    print(f"cache hit  {'yes' if d['cache_hit'] else 'no'}")
    ms = f"{d['ms']:.1f} ms" if "ms" in d else ""
    st = d["stats"]
    detail = ""
    if not d["cache_hit"]:
        detail = f" (frontend {st.get('frontend_ms', 0):.1f} ms, toolchain {st.get('toolchain_ms', 0):.1f} ms)"
    print(f"time       {ms} round trip, {d['server_ms']:.1f} ms in the daemon{detail}")


# ---------------------------------------------------------------------- subcommands

def cmd_compile(args: argparse.Namespace) -> int:
    from .client import make_options
    from .graphio import load_request

    req = load_request(args.graph)
    options = make_options(args.opt_level, not args.no_vector_math) if (args.opt_level is not None or args.no_vector_math) else req.options
    with _client(args) as client:
        t0 = time.perf_counter()
        c = client.compile(req.graph, args.target, options)
        wall = (time.perf_counter() - t0) * 1e3
    d = _compiled_summary(c, wall)
    _print_json(d) if args.json else _print_summary(d)
    return 0


def cmd_lookup(args: argparse.Namespace) -> int:
    from .graphio import load_request

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
    from .v1 import service_pb2

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
        for w in written:
            print(f"{w['kind']:<14} {w['path']}")
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
    """A one-line progress bar on a terminal; silent otherwise."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total = total
        self.enabled = enabled
        self.done = self.hits = self.failed = 0
        self.start = time.monotonic()

    def update(self, event: Any) -> None:
        self.done += 1
        if event.code != 0:
            self.failed += 1
        elif event.cache_hit:
            self.hits += 1
        if self.enabled:
            width = 30
            filled = int(width * self.done / max(self.total, 1))
            sys.stderr.write(
                f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}"
                f"  {self.hits} hit  {self.failed} failed  {time.monotonic() - self.start:.1f} s"
            )
            sys.stderr.flush()

    def finish(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def cmd_prewarm(args: argparse.Namespace) -> int:
    from .graphio import load_request
    from .recorder import iter_graph_files
    from .target import Target
    from .v1 import service_pb2

    targets = [Target.parse(t) for t in args.target]
    files = list(iter_graph_files(args.paths))
    failures: list[str] = []
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
    progress = _Progress(len(requests), enabled=sys.stderr.isatty() and not args.json and not args.quiet)
    t0 = time.monotonic()
    with _client(args) as client:
        events = client.prewarm(requests, on_event=lambda _r, e: progress.update(e)) if requests else []
    progress.finish()
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
            "failures": failures,
            "results": [{"graph": l, "handle": e.handle, "cache_hit": e.cache_hit, "code": _CODE_NAMES.get(e.code, e.code), "ms": round(e.ms, 3)} for l, e in zip(labels, events)],
        })
    else:
        for failure in failures:
            print(f"FAILED {failure}", file=sys.stderr)
        print(f"prewarm: {len(files)} graphs x {len(targets)} targets: {compiled} compiled, {hits} cache hits, "
              f"{len(failures)} failed in {elapsed:.1f} s")
    return 1 if failures else 0


def cmd_stats(args: argparse.Namespace) -> int:
    with _client(args) as client:
        s = client.stats()
    d = _to_dict(s)
    if args.json:
        _print_json(d)
        return 0
    store = d.pop("store", {})
    for k, v in d.items():
        print(f"{k:<18} {v}")
    for k, v in store.items():
        print(f"store.{k:<12} {v}")
    return 0


# ---------------------------------------------------------------------- parser

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
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    graph_help = "graph file: protobuf JSON (.json), text (.txtpb, .pbtxt) or binary (.pb); or a recorded .kreq"

    s = sub.add_parser("compile", parents=[common], help="get or compile a graph", description="Get or compile a graph; prints handle, kernels, cache hit and milliseconds.")
    s.add_argument("graph", metavar="GRAPH", help=graph_help)
    s.add_argument("--target", "-t", default="cpu", help="cpu (this machine), cpu:x86-64-v3, cpu:+avx2+fma, cuda:sm_90 (default: cpu)")
    s.add_argument("--opt-level", type=int, choices=range(4), default=None, help="0 (fastest build) to 3 (fastest code, the default)")
    s.add_argument("--no-vector-math", action="store_true", help="compute transcendentals with the scalar libm")
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

    s = sub.add_parser("prewarm", parents=[common], help="compile recorded graphs for targets", description="Compile every graph file in PATHs (folders are searched recursively) for every --target at prewarm priority. Exit status 1 if any failed.")
    s.add_argument("paths", nargs="+", metavar="PATH", help="graph files or folders of them (.kreq recordings, .json, .txtpb, .pb)")
    s.add_argument("--target", "-t", action="append", required=True, help="a target; repeat for several")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_prewarm)

    s = sub.add_parser("stats", parents=[common], help="print the daemon's counters", description="Print the daemon's cache and compile counters.")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_stats)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``kiln`` console script."""
    from .errors import KilnError

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KilnError as e:
        print(f"kiln {args.command}: {e}", file=sys.stderr)
        return 1
    except (ValueError, FileNotFoundError) as e:
        print(f"kiln {args.command}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
