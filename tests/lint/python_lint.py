#!/usr/bin/env python3
"""Lint and type check of the Python package (client/python/kiln) against a baseline that may
only shrink.

ruff (the rule set in client/python/pyproject.toml) and mypy each report findings; both are
counted per file and rule (mypy: per file and error code) and compared with
tests/lint/python_baseline.json. A count above its baseline, or a finding in a file or rule the
baseline does not list, fails: new code adds no findings. A count below its baseline is
reported, and ``--update`` writes the smaller baseline (it never raises a count).

    .venv/bin/python tests/lint/python_lint.py            # check
    .venv/bin/python tests/lint/python_lint.py --update   # shrink the baseline after fixing
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
from pathlib import Path

from lintlib import hold_to_baseline

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "client" / "python"
BASELINE = Path(__file__).with_name("python_baseline.json")
BIN = Path(sys.executable).parent


def ruff_findings() -> collections.Counter:
    out = subprocess.run([str(BIN / "ruff"), "check", "--output-format", "json", "--exit-zero", "kiln"],
                         cwd=PACKAGE, capture_output=True, text=True, check=True).stdout
    return collections.Counter(f"ruff {Path(f['filename']).relative_to(PACKAGE)} {f['code']}"
                               for f in json.loads(out))


MYPY_LINE = re.compile(r"^(?P<file>kiln/[^:]+\.py):\d+: error: .*\[(?P<code>[a-z-]+)\]$")


def mypy_findings() -> collections.Counter:
    r = subprocess.run([sys.executable, "-m", "mypy", "kiln"], cwd=PACKAGE, capture_output=True, text=True)
    if r.returncode not in (0, 1):  # 2: mypy itself failed
        raise SystemExit(f"mypy failed:\n{r.stdout}\n{r.stderr}")
    found: collections.Counter = collections.Counter()
    for line in r.stdout.splitlines():
        m = MYPY_LINE.match(line)
        if m:
            found[f"mypy {m['file']} {m['code']}"] += 1
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--update", action="store_true", help="write the baseline where counts went down")
    opts = ap.parse_args()
    # ruff check / mypy in client/python show where a NEW finding is.
    return hold_to_baseline("python_lint", ruff_findings() + mypy_findings(), BASELINE, opts.update)


if __name__ == "__main__":
    sys.exit(main())
