#!/usr/bin/env python3
"""Mutation check: proves the test suite fails when kiln is wrong.

Copies the working tree (tracked and untracked, not ignored files) into a scratch folder,
builds the targets the chosen mutants need there (build/ inside the copy, so the compiler
cache shares entries with an ordinary build), runs each mutant's tests on the unmutated copy
(they must pass), then for each mutant in turn plants its bug (tests/mutation/mutants.py),
rebuilds, runs its tests and puts the file back. A mutant is killed when one of its tests
fails; it survives when they all pass. Exit status 0 only when every mutant was killed.

    python3 tests/mutation/run_mutants.py                  # every mutant (rebuilds a lot)
    python3 tests/mutation/run_mutants.py --sample         # the small CI sample
    python3 tests/mutation/run_mutants.py NAME ...         # chosen mutants
    python3 tests/mutation/run_mutants.py --list
    ... --work DIR     keep the scratch copy in DIR (reused, so a second run builds little)
    ... --jobs N       build parallelism (default 2)

The real tree is never written to. Builds and tests run at low priority (nice 10).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import CI_SAMPLE, MUTANTS, Mutant  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TEST_TIMEOUT_S = 900


def log(msg: str) -> None:
    print(f"[mutation] {msg}", flush=True)


def copy_tree(dst: Path) -> None:
    """Copies the files git would commit (tracked, and untracked but not ignored) into dst,
    replacing what an earlier run left there."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=REPO, check=True, capture_output=True).stdout
    for rel in sorted(set(p for p in out.decode().split("\0") if p)):
        src = REPO / rel
        if not src.is_file():  # deleted in the working tree
            continue
        copy_file(src, dst / rel)
    # The Python client's generated protocol modules are build outputs (ignored by git); the
    # copy's Python tests need them, and no mutant touches the protos.
    proto = REPO / "client" / "python" / "kiln" / "_proto"
    if proto.is_dir():
        for src in proto.rglob("*"):
            if src.is_file() and "__pycache__" not in src.parts:
                copy_file(src, dst / src.relative_to(REPO))


def copy_file(src: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_file() and target.read_bytes() == src.read_bytes():
        return  # unchanged: keep its time stamp so the build does not redo it
    shutil.copyfile(src, target)
    shutil.copymode(src, target)


def targets_of(m: Mutant) -> list[str]:
    t = list(m.build)
    for spec in m.tests:
        kind, _, rest = spec.partition(":")
        if kind == "gtest":
            t.append(rest.split(":", 1)[0])
        elif kind == "pytest":
            # The Python tests run against the copy's own daemon and client core.
            t.extend(("kilnd", "kiln_core"))
    return t


def build(root: Path, targets: list[str], jobs: int) -> tuple[bool, str]:
    if not targets:
        return True, ""  # a mutant of Python code: nothing to rebuild
    bdir = root / "build"
    if not (bdir / "build.ninja").is_file():
        r = subprocess.run(["cmake", "-S", str(root), "-B", str(bdir), "-G", "Ninja",
                            "-DCMAKE_BUILD_TYPE=RelWithDebInfo"], capture_output=True, text=True)
        if r.returncode != 0:
            return False, r.stdout + r.stderr
    r = subprocess.run(["cmake", "--build", str(bdir), f"-j{jobs}", "--target", *sorted(set(targets))],
                       capture_output=True, text=True)
    return r.returncode == 0, r.stdout[-6000:] + r.stderr[-6000:]


def run_test(root: Path, spec: str) -> tuple[bool, str]:
    """Runs one test spec in the scratch copy; returns (passed, tail of its output)."""
    kind, _, rest = spec.partition(":")
    env = dict(os.environ)
    env["KILN_BINARY_DIR"] = str(root / "build")
    env["KILN_SOURCE_DIR"] = str(root)
    env["PYTHONPATH"] = str(root / "client" / "python")
    # The copy's client core (a package built in place keeps it in kiln/_native, which the copy
    # lacks: the client needs it from its first request, for this machine's answers).
    env["KILN_CORE_LIBRARY"] = str(root / "build" / "client" / "core" / "libkiln_core.so")
    env.pop("KILND", None)
    if kind == "gtest":
        target, _, flt = rest.partition(":")
        if flt:
            env["GTEST_FILTER"] = flt
        cmd = ["ctest", "--test-dir", str(root / "build"), "-R", f"^{target}$", "--output-on-failure",
               "--timeout", str(TEST_TIMEOUT_S)]
    elif kind == "pytest":
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-rs", "-p", "no:cacheprovider", *shlex.split(rest)]
    else:
        raise ValueError(f"unknown test spec {spec!r}")
    try:
        r = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=TEST_TIMEOUT_S + 60)
    except subprocess.TimeoutExpired:
        return False, "timed out"
    out = r.stdout + r.stderr
    if kind == "gtest" and r.returncode == 0 and "No tests were found" in out:
        return False, out[-3000:]  # a misspelt target must not read as a pass
    if kind == "pytest" and r.returncode == 5:
        return False, "pytest collected no tests:\n" + out[-3000:]
    if kind == "pytest" and "SKIPPED" in out:
        return False, "a test was skipped (a skip is not a pass):\n" + out[-3000:]
    return r.returncode == 0, out[-3000:]


def apply(root: Path, m: Mutant) -> str:
    """Plants m; returns the file's original text."""
    path = root / m.file
    text = path.read_text()
    n = text.count(m.find)
    if n != 1:
        raise LookupError(f"{m.name}: the text to replace occurs {n} times in {m.file}, not once")
    path.write_text(text.replace(m.find, m.replace))
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="mutants to run (default: all)")
    ap.add_argument("--sample", action="store_true", help="only the CI sample")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--work", help="scratch folder to use and keep (default: a temporary one)")
    ap.add_argument("--jobs", type=int, default=2)
    opts = ap.parse_args()

    by_name = {m.name: m for m in MUTANTS}
    if opts.list:
        for m in MUTANTS:
            print(f"{m.name:32} {m.file}: {m.what}")
        return 0
    names = opts.names or (CI_SAMPLE if opts.sample else [m.name for m in MUTANTS])
    unknown = [n for n in names if n not in by_name]
    if unknown:
        log(f"unknown mutant(s): {', '.join(unknown)} (--list shows them)")
        return 2
    chosen = [by_name[n] for n in names]
    os.nice(10)

    temp = None
    if opts.work:
        root = Path(opts.work).resolve()
        root.mkdir(parents=True, exist_ok=True)
    else:
        temp = tempfile.mkdtemp(prefix="kiln-mutation-")
        root = Path(temp)
    if REPO == root or REPO in root.parents:
        log("the scratch folder must lie outside the repository")
        return 2
    started = time.monotonic()
    try:
        log(f"copying the tree into {root}")
        copy_tree(root)
        for m in chosen:  # every mutant must still match the code it follows
            count = (root / m.file).read_text().count(m.find)
            if count != 1:
                log(f"{m.name}: its text occurs {count} times in {m.file}, not once: update mutants.py")
                return 2
        targets = sorted({t for m in chosen for t in targets_of(m)})
        log(f"building {' '.join(targets)}")
        ok, out = build(root, targets, opts.jobs)
        if not ok:
            print(out)
            log("the unmutated tree does not build")
            return 2
        specs = sorted({s for m in chosen for s in m.tests})
        for spec in specs:
            t0 = time.monotonic()
            passed, out = run_test(root, spec)
            log(f"baseline {spec}: {'pass' if passed else 'FAIL'} ({time.monotonic() - t0:.0f} s)")
            if not passed:
                print(out)
                log("a test fails without any mutant: fix it before trusting this check")
                return 2

        results: list[tuple[str, str, str, float]] = []
        for m in chosen:
            t0 = time.monotonic()
            original = apply(root, m)
            try:
                ok, out = build(root, targets_of(m), opts.jobs)
                if not ok:
                    status, by = "BUILD ERROR", out.strip().splitlines()[-1][:120] if out.strip() else ""
                    print(out)
                else:
                    status, by = "SURVIVED", ""
                    for spec in m.tests:
                        passed, out = run_test(root, spec)
                        if not passed:
                            status, by = "killed", spec
                            break
            finally:
                (root / m.file).write_text(original)
            results.append((m.name, status, by, time.monotonic() - t0))
            log(f"{m.name}: {status}{' by ' + by if by else ''} ({results[-1][3]:.0f} s)")

        # The last mutant's file is restored; rebuild so a kept scratch folder is clean.
        build(root, targets, opts.jobs)
        width = max(len(r[0]) for r in results)
        print()
        print(f"{'mutant':{width}}  {'result':11}  {'seconds':>7}  killed by")
        for name, status, by, secs in results:
            print(f"{name:{width}}  {status:11}  {secs:7.0f}  {by}")
        killed = sum(1 for r in results if r[1] == "killed")
        print(f"\n{killed}/{len(results)} mutants killed in {time.monotonic() - started:.0f} s")
        return 0 if killed == len(results) else 1
    finally:
        if temp:
            shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
