#!/usr/bin/env python3
"""A broad model sweep of kiln's torch.compile backend: many models a user brings (torchvision,
timm and Hugging Face ``transformers`` families at small configurations, random weights, nothing
downloaded) under ``torch.compile(backend="kiln")``, each checked against float64 eager in
several modes (tests/models/checks.py), with every crash, result outside tolerance and fallback
(a part kiln refused and left to torch) reported with its reason.

    python3 tests/models/sweep.py [--device cpu|cuda] [--list sample|full|selftest]
        [--models PATTERNS] [--modes infer,train,...] [--out results.json] [--timing]
        [--time-limit SECONDS] [--server HOST:PORT]

``--models`` takes comma-separated names or globs (``hf/*``, ``timm/conv*``) or parts of names
(``bert`` selects hf/bert, hf/roberta...). Without ``--server`` the sweep starts its own kilnd
($KILND, else $KILN_BINARY_DIR/server/kilnd, else build/server/kilnd; ``$KILND_ARGS`` adds flags).

Each model runs in a worker process, one mode after another; a mode that raises is recorded and
the sweep goes on, and a worker that dies (a segfault, an abort) or outlives the model's time
limit is replaced, the mode recorded as ``crash`` or ``timeout`` with the end of its stderr. The
table lists model, mode, status (ok, crash, mismatch, timeout, skipped: with the reason), kiln's
error, eager's and the bound, kiln parts compiled / cut, and fallbacks; ``--timing`` adds eager,
Inductor and kiln inference times (median of interleaved rounds). ``--out`` writes every row with
its details (nodes left to torch by reason, graph breaks, the kiln graphs a second length added)
as JSON, rewritten after each model. The exit status is 1 when any mode crashed, timed out or
mismatched.
"""

from __future__ import annotations

import argparse
import collections
import fnmatch
import json
import multiprocessing
import os
import re
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
try:
    import kiln  # noqa: F401
except ImportError:  # a source checkout
    sys.path.insert(0, str(REPO / "client" / "python"))

FAILING = ("crash", "mismatch", "timeout")


# --------------------------------------------------------------------------------- worker

def worker_main(conn: Any, address: str, device: str, timing: bool, threads: int, stderr_path: str) -> None:
    """The worker process: runs (model, mode) requests from ``conn`` until it gets None."""
    os.setsid()  # its own process group: the sweep ends it and whatever it started at once
    fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 2)
    os.dup2(fd, 1)
    import faulthandler

    faulthandler.enable()  # a crash leaves its Python stack in the log the sweep reads
    import kiln
    import kiln.torch  # noqa: F401  (registers the backend)
    import torch
    from checks import Context, run_mode
    from zoo import all_specs

    if threads:
        torch.set_num_threads(threads)
    if device == "cuda":  # the checks compare float32 results: no TF32
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    every = all_specs()
    ctx = Context(device=device, client=kiln.Client(address), timing=timing)
    while True:
        msg = conn.recv()
        if msg is None:
            return
        name, mode = msg
        print(f"=== {name} {mode}", file=sys.stderr, flush=True)
        conn.send(run_mode(every[name], mode, ctx).as_dict())


class Worker:
    """A worker process and its pipe; ``run`` sends one request and waits for its answer."""

    def __init__(self, address: str, opts: argparse.Namespace, workdir: Path, serial: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.log = workdir / f"worker-{serial}.log"
        self.proc = ctx.Process(target=worker_main, daemon=True,
                                args=(child, address, opts.device, opts.timing, opts.threads, str(self.log)))
        self.proc.start()
        child.close()

    def run(self, name: str, mode: str, timeout: float) -> tuple[Optional[dict[str, Any]], str]:
        """The mode's row, or None and why there is none (the worker died or timed out)."""
        self.conn.send((name, mode))
        try:
            if self.conn.poll(max(timeout, 0.0)):
                return self.conn.recv(), ""
        except (EOFError, OSError):
            pass
        self.proc.join(1)
        if self.proc.exitcode is None:
            self.kill()
            return None, "timeout"
        code = self.proc.exitcode
        what = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        return None, f"the worker died ({what}): {self.log_tail()}"

    def log_tail(self) -> str:
        """What the worker's log says since its last request: a fatal error and its innermost
        frames (faulthandler's), else the last lines."""
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        start = max((i for i, line in enumerate(text) if line.startswith("=== ")), default=-1) + 1
        text = [line.strip() for line in text[start:] if line.strip()]
        fatal = next((i for i, line in enumerate(text) if line.startswith("Fatal Python error")), None)
        if fatal is None:
            return " | ".join(text[-6:])
        current = next((i for i, line in enumerate(text) if line.startswith("Current thread")), fatal)
        frames = [line for line in text[current:] if line.startswith("File ")][:3]
        return " | ".join([text[fatal], *frames])

    def kill(self) -> None:
        if self.proc.exitcode is None and self.proc.pid is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
        self.proc.join(10)

    def close(self) -> None:
        try:
            self.conn.send(None)
            self.proc.join(30)
        except (OSError, BrokenPipeError):
            pass
        self.kill()


# ---------------------------------------------------------------------------------- sweep

def select(specs: list[Any], patterns: str) -> list[Any]:
    if not patterns:
        return specs
    pats = [p.strip() for p in patterns.split(",") if p.strip()]

    def matches(name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, p) if any(c in p for c in "*?[") else (p == name or p in name)
                   for p in pats)

    return [s for s in specs if matches(s.name)]


def blank_row(name: str, mode: str, status: str, reason: str) -> dict[str, Any]:
    from checks import Outcome

    row = Outcome(name, mode, status=status, reason=reason).as_dict()
    return row


class Sweep:
    """Runs the selected models mode by mode in workers; keeps kilnd alive."""

    def __init__(self, opts: argparse.Namespace, workdir: Path) -> None:
        self.opts, self.workdir = opts, workdir
        self.daemon: Any = None
        self.worker: Optional[Worker] = None
        self.serial = 0
        self.models_in_worker = 0
        self.address = opts.server or self._start_kilnd()

    def _start_kilnd(self) -> str:
        import kiln.local

        binary = kiln.local.find_kilnd()
        if binary is None:
            raise SystemExit("sweep: no kilnd (set KILND or KILN_BINARY_DIR, or pass --server)")
        self.serial += 1
        self.daemon = kiln.local.LocalDaemon(binary, self.workdir / f"kilnd-{self.serial}",
                                             args=shlex.split(os.environ.get("KILND_ARGS", "")))
        return self.daemon.address

    def _worker(self) -> Worker:
        if self.worker is None or self.worker.proc.exitcode is not None:
            self.serial += 1
            self.worker = Worker(self.address, self.opts, self.workdir, self.serial)
            self.models_in_worker = 0
        return self.worker

    def _drop_worker(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None

    def _check_kilnd(self) -> str:
        """'' while kilnd runs; else restarts it (and the worker) and says what happened."""
        if self.daemon is None or self.daemon.proc.poll() is None:
            return ""
        code = self.daemon.proc.returncode
        tail = " | ".join(self.daemon.log().splitlines()[-3:])
        self._drop_worker()
        self.address = self._start_kilnd()
        return f"kilnd exited ({code}) and was restarted: {tail}"

    def run_model(self, spec: Any, modes: list[str]) -> list[dict[str, Any]]:
        from zoo import library_missing

        missing = library_missing(spec.library)
        if missing:
            return [blank_row(spec.name, m, "skipped", missing) for m in modes]
        limit = min(self.opts.time_limit, spec.time_limit or self.opts.time_limit)
        deadline = time.monotonic() + limit
        rows = []
        for mode in modes:
            left = deadline - time.monotonic()
            if left <= 0:
                rows.append(blank_row(spec.name, mode, "timeout", f"not run: the model's {limit:.0f} s were spent"))
                continue
            t0 = time.monotonic()
            row, why = self._worker().run(spec.name, mode, left)
            if row is None:
                self.worker = None  # dead or killed
                status = "timeout" if why == "timeout" else "crash"
                reason = f"the model's time limit of {limit:.0f} s ran out in this mode" if why == "timeout" else why
                row = blank_row(spec.name, mode, status, reason)
                row["seconds"] = round(time.monotonic() - t0, 1)
            note = self._check_kilnd()
            if note:
                row["reason"] = (row["reason"] + "; " if row["reason"] else "") + note
                if row["status"] == "ok":
                    row["status"] = "crash"
            rows.append(row)
            print(progress_line(row), flush=True)
        self.models_in_worker += 1
        # A selftest plants bugs in its worker; a long run's worker gathers memory: a fresh one.
        if spec.library == "selftest" or self.models_in_worker >= self.opts.recycle:
            self._drop_worker()
        return rows

    def close(self) -> None:
        self._drop_worker()
        if self.daemon is not None:
            self.daemon.stop()


# --------------------------------------------------------------------------------- report

def _e(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.1e}"


def progress_line(row: dict[str, Any]) -> str:
    extra = "".join(f"  {x}" for x in (row["reason"], row.get("note", "")) if x)
    return (f"{row['model']:<40} {row['mode']:<15} {row['status']:<8} err {_e(row['error'])} "
            f"(eager {_e(row['eager_error'])}) {row['seconds']:>6.1f}s{extra}")


def table(rows: list[dict[str, Any]], timing: bool) -> str:
    head = ["model", "mode", "status", "kiln err", "eager err", "bound", "parts", "fallbacks"]
    if timing:
        head += ["eager ms", "inductor ms", "kiln ms"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        status = r["status"] + (f": {r['reason']}" if r["reason"] else "")
        status += f" ({r['note']})" if r.get("note") else ""
        fb = "; ".join(r["fallbacks"]) if r["fallbacks"] else "0"
        if r["fallbacks"]:
            fb = f"{len(r['fallbacks'])}: {fb}"
        if r.get("warnings"):
            fb += "; warned: " + "; ".join(r["warnings"])
        cells = [r["model"], r["mode"], status.replace("|", "/"), _e(r["error"]), _e(r["eager_error"]), _e(r["bound"]),
                 f"{r['compiled']}/{r['parts']}", fb.replace("|", "/")]
        if timing:
            t = r.get("timing") or {}
            cells += [str(t.get("eager_ms", "-")), str(t.get("inductor_ms", t.get("inductor_error", "-"))),
                      str(t.get("kiln_ms", "-"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def reason_key(reason: str) -> str:
    """A reason with its numbers and names of values made generic, to count alike ones together."""
    return re.sub(r"\b\d+\b", "N", re.sub(r"\b(arg|kiln_part_|view_|getitem_)\w*", "_", reason))


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    models = sorted({r["model"] for r in rows})
    status = collections.Counter(r["status"] for r in rows)
    bad_models = sorted({r["model"] for r in rows if r["status"] in FAILING})
    fallbacks: collections.Counter = collections.Counter()
    examples: dict[str, str] = {}
    for r in rows:
        for f in r["fallbacks"]:
            key = reason_key(f)
            fallbacks[key] += 1
            examples.setdefault(key, f"{r['model']} {r['mode']}")
    warned: collections.Counter = collections.Counter()
    for r in rows:
        for w in r.get("warnings") or ():
            key = reason_key(w)
            warned[key] += 1
            examples.setdefault(key, f"{r['model']} {r['mode']}")
    torch_ops: collections.Counter = collections.Counter()
    for r in rows:
        for why, n in (r.get("torch_ops") or {}).items():
            torch_ops[why] += n
    return {
        "models": len(models),
        "models_ok": len([m for m in models if all(r["status"] in ("ok", "skipped") for r in rows if r["model"] == m)]),
        "models_failing": bad_models,
        "modes": dict(status),
        "fallbacks": sum(len(r["fallbacks"]) for r in rows),
        "models_with_fallbacks": len({r["model"] for r in rows if r["fallbacks"]}),
        "top_fallback_reasons": [{"reason": k, "count": n, "first": examples[k]} for k, n in fallbacks.most_common(15)],
        "warnings": [{"warning": k, "count": n, "first": examples[k]} for k, n in warned.most_common(15)],
        "top_left_to_torch": [{"reason": k, "nodes": n} for k, n in torch_ops.most_common(20)],
    }


def print_summary(s: dict[str, Any]) -> None:
    print(f"\n{s['models']} models; modes: " + ", ".join(f"{k} {v}" for k, v in sorted(s["modes"].items())))
    print(f"models failing: {', '.join(s['models_failing']) or 'none'}")
    print(f"fallbacks: {s['fallbacks']} in {s['models_with_fallbacks']} models")
    for f in s["top_fallback_reasons"]:
        print(f"  {f['count']:>4}  {f['reason']}  (first: {f['first']})")
    if s["warnings"]:
        print("kiln.torch warnings:")
        for f in s["warnings"]:
            print(f"  {f['count']:>4}  {f['warning']}  (first: {f['first']})")
    if s["top_left_to_torch"]:
        print("nodes left to torch, by reason:")
        for f in s["top_left_to_torch"][:10]:
            print(f"  {f['nodes']:>6}  {f['reason']}")


def write_json(path: Optional[str], opts: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    if not path:
        return
    import torch

    doc = {"device": opts.device, "list": opts.list, "torch": torch.__version__, "versions": versions(),
           "summary": summary(rows), "results": rows}
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    tmp.replace(path)


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for p in ("torch", "torchvision", "timm", "transformers"):
        try:
            out[p] = version(p)
        except PackageNotFoundError:
            out[p] = "absent"
    return out


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--list", default="sample", choices=("sample", "full", "selftest"))
    ap.add_argument("--models", default="", help="comma-separated names, globs or parts of names")
    ap.add_argument("--modes", default="", help="comma-separated modes (default: every mode that applies)")
    ap.add_argument("--out", default="", help="write the rows and a summary as JSON here")
    ap.add_argument("--timing", action="store_true", help="time eager, Inductor and kiln inference")
    ap.add_argument("--time-limit", type=float, default=900.0, help="seconds per model, all its modes")
    ap.add_argument("--server", default="", help="a running kilnd (default: start one)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads in the worker (default: torch's)")
    ap.add_argument("--recycle", type=int, default=10, help="models per worker process before a fresh one")
    opts = ap.parse_args(argv)

    from checks import MODES, modes_for
    from zoo import specs

    chosen = select(specs(opts.list), opts.models)
    if not chosen:
        print(f"sweep: no model of the {opts.list} list matches {opts.models!r}", file=sys.stderr)
        return 2
    wanted = [m for m in opts.modes.split(",") if m]
    unknown = set(wanted) - set(MODES)
    if unknown:
        print(f"sweep: unknown modes {sorted(unknown)}; known: {', '.join(MODES)}", file=sys.stderr)
        return 2
    os.environ.setdefault("KILN_TORCH_RECORDS", "0")  # partition every graph: the sweep reports on it
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kiln-sweep-") as tmp:
        os.environ.setdefault("KILN_CACHE_DIR", str(Path(tmp) / "client-cache"))
        sweep = Sweep(opts, Path(tmp))
        try:
            print(f"sweep: {len(chosen)} models on {opts.device}, kilnd at {sweep.address}", flush=True)
            for spec in chosen:
                modes = [m for m in modes_for(spec, opts.device) if not wanted or m in wanted]
                if wanted and "reduce-overhead" in wanted and opts.device != "cuda":
                    modes.append("reduce-overhead")  # asked for: reported as skipped
                rows += sweep.run_model(spec, modes)
                write_json(opts.out, opts, rows)
        finally:
            sweep.close()
    print()
    print(table(rows, opts.timing))
    s = summary(rows)
    print_summary(s)
    write_json(opts.out, opts, rows)
    return 1 if s["models_failing"] else 0


if __name__ == "__main__":
    sys.exit(main())
