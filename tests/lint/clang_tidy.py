#!/usr/bin/env python3
"""clang-tidy over kiln's own C++ with the repository's check set (.clang-tidy: checks that find
bugs, not style), held to a baseline that may only shrink (tests/lint/clang_tidy_baseline.json,
findings counted per file and check). Every translation unit of kernels/, server/, wire/ and
client/ in a build folder's compile_commands.json is checked, its headers under those folders
with it; a header's finding counts once however many units include it.

    python3 tests/lint/clang_tidy.py [--update] [BUILD_DIR]     # default build
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from lintlib import REPO, compile_units, hold_to_baseline

BASELINE = Path(__file__).with_name("clang_tidy_baseline.json")
FINDING = re.compile(r"^(?P<file>/[^:]+):(?P<line>\d+):\d+: (?:warning|error): .* \[(?P<check>[\w.,-]+)\]$")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--update", action="store_true", help="write the baseline where counts went down")
    ap.add_argument("build", nargs="?", default=str(REPO / "build"))
    opts = ap.parse_args()
    tidy = shutil.which("clang-tidy-14") or shutil.which("clang-tidy")
    if tidy is None:
        print("clang_tidy: clang-tidy is not installed (deploy/setup.sh installs it)", file=sys.stderr)
        return 1
    build = Path(opts.build)
    units = compile_units(build)

    def check(unit: tuple[str, list[str], str]) -> str:
        rel, _args, _cwd = unit
        r = subprocess.run([tidy, "--quiet", "-p", str(build), str(REPO / rel)], cwd=REPO, capture_output=True,
                           text=True)
        return r.stdout

    findings: set[tuple[str, str, str]] = set()  # (file, line, check): a header's once
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        for out in pool.map(check, units):
            for line in out.splitlines():
                m = FINDING.match(line)
                if m and m["file"].startswith(str(REPO) + "/"):
                    findings.add((os.path.relpath(m["file"], REPO), m["line"], m["check"]))
    found = collections.Counter(f"{file} {check}" for file, _line, check in findings)
    print(f"clang_tidy: {len(units)} translation units")
    return hold_to_baseline("clang_tidy", found, BASELINE, opts.update)


if __name__ == "__main__":
    sys.exit(main())
