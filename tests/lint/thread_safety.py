#!/usr/bin/env python3
"""The clang thread-safety analysis over kiln's own C++ (the ABSL_GUARDED_BY and
ABSL_EXCLUSIVE_LOCKS_REQUIRED annotations): every translation unit of kernels/, server/, wire/
and client/ in a build folder's compile_commands.json is parsed by clang (-fsyntax-only, no
code generated) with -Wthread-safety as an error. The main build is g++, which ignores the
annotations; this makes them checked. Exits 1 on a finding.

    python3 tests/lint/thread_safety.py [BUILD_DIR]     # default build
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import subprocess
import sys
from pathlib import Path

from lintlib import REPO, compile_units


def main() -> int:
    build = Path(sys.argv[1] if len(sys.argv) > 1 else REPO / "build")
    clang = shutil.which("clang++-14") or shutil.which("clang++")
    if clang is None:
        print("thread_safety: clang++ is not installed", file=sys.stderr)
        return 1
    units = [(rel, [clang, "-fsyntax-only", "-Wno-unknown-warning-option", "-Wno-error", "-Wthread-safety",
                    "-Werror=thread-safety", *args, str(REPO / rel)], cwd)
             for rel, args, cwd in compile_units(build)]

    def check(unit):
        rel, cmd, cwd = unit
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
        return rel, r.returncode, r.stderr

    failed = 0
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        for rel, rc, err in pool.map(check, units):
            if rc != 0:
                failed += 1
                print(f"thread_safety: {rel}:\n{err}")
    print(f"thread_safety: {len(units) - failed} of {len(units)} translation units clean")
    return 1 if failed or not units else 0


if __name__ == "__main__":
    sys.exit(main())
