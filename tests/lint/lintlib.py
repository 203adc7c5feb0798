"""What the C++ and Python lint steps share: the translation units of a build's
compile_commands.json, and counts of findings held to a baseline that may only shrink."""

from __future__ import annotations

import collections
import json
import os
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: kiln's own C++ (tests, tools and generated code are not linted).
CHECKED = ("kernels/", "server/", "wire/", "client/")
# Flags of the g++ build that clang does not take, or that only change code generation.
DROP = ("-fno-semantic-interposition", "-fconcepts-diagnostics-depth")


def compile_units(build: Path) -> list[tuple[str, list[str], str]]:
    """(path relative to the repository, compiler arguments without output or dependency
    flags and without the file, working folder) for each of kiln's own .cc files, once each."""
    units, seen = [], set()
    for entry in json.loads((build / "compile_commands.json").read_text()):
        rel = os.path.relpath(entry["file"], REPO)
        if not rel.startswith(CHECKED) or not rel.endswith(".cc") or rel in seen:
            continue
        seen.add(rel)
        args = shlex.split(entry["command"])[1:]
        keep, skip = [], False
        for a in args:
            if skip:
                skip = False
                continue
            if a in ("-o", "-MF", "-MT", "-MQ"):
                skip = True
                continue
            if a in ("-c", "-MD", "-MMD") or a.startswith(DROP) or a == entry["file"]:
                continue
            keep.append(a)
        units.append((rel, keep, entry["directory"]))
    return units


def hold_to_baseline(name: str, found: collections.Counter, baseline_path: Path, update: bool) -> int:
    """Compares ``found`` (finding key -> count) with the baseline file: a count above its
    baseline, or a key the baseline lacks, fails (1). ``update`` writes the smaller baseline
    (never a larger one). Prints what changed; returns the exit status."""
    baseline = json.loads(baseline_path.read_text()) if baseline_path.exists() else {}
    worse = {k: (baseline.get(k, 0), n) for k, n in found.items() if n > baseline.get(k, 0)}
    better = {k: (n, found.get(k, 0)) for k, n in baseline.items() if found.get(k, 0) < n}
    for k, (was, now) in sorted(worse.items()):
        print(f"NEW  {k}: {now} (baseline {was})")
    for k, (was, now) in sorted(better.items()):
        print(f"less {k}: {now} (baseline {was})")
    if update:
        if worse and baseline:
            print(f"{name}: the baseline only shrinks; fix the new findings first", file=sys.stderr)
            return 1
        shrunk = dict(found) if not baseline else \
            {k: min(n, found.get(k, 0)) for k, n in baseline.items() if found.get(k, 0)}
        baseline_path.write_text(json.dumps(dict(sorted(shrunk.items())), indent=1) + "\n")
        print(f"{name}: baseline written, {sum(shrunk.values())} findings")
        return 0
    print(f"{name}: {sum(found.values())} findings, baseline {sum(baseline.values())}; {len(worse)} rules got worse")
    if worse:
        print(f"{name}: fix the findings marked NEW", file=sys.stderr)
        return 1
    return 0
