"""Starts a private kilnd for a benchmark (or uses $KILN_SERVER), and stops it afterwards."""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from typing import Iterator

import kiln


@contextmanager
def daemon(workers: int = 2) -> Iterator[str]:
    if os.environ.get("KILN_SERVER"):
        yield os.environ["KILN_SERVER"]
        return
    binary = kiln.local.find_kilnd()
    if binary is None:
        raise SystemExit("kilnd not found: build it (deploy/build.sh) or set KILND")
    tmp = tempfile.mkdtemp(prefix="kiln-bench-")
    try:
        with kiln.local.LocalDaemon(binary, tmp, args=["--workers", str(workers), "--log-level", "warn"]) as d:
            yield d.address
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
