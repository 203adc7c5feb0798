"""Starts a private kilnd for a benchmark (or uses $KILN_SERVER), and stops it afterwards."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def find_kilnd() -> Path:
    for c in (os.environ.get("KILND"), os.path.join(os.environ.get("KILN_BINARY_DIR", "build"), "server/kilnd"), "build/server/kilnd"):
        if c and Path(c).is_file():
            return Path(c)
    raise SystemExit("kilnd not found: build it (deploy/build.sh) or set KILND")


@contextmanager
def daemon(workers: int = 2, cache_dir: str | None = None) -> Iterator[str]:
    if os.environ.get("KILN_SERVER"):
        yield os.environ["KILN_SERVER"]
        return
    tmp = tempfile.mkdtemp(prefix="kiln-bench-")
    log = open(Path(tmp) / "kilnd.log", "w+")
    proc = subprocess.Popen([str(find_kilnd()), "--listen", "127.0.0.1:0", "--cache-dir", cache_dir or f"{tmp}/cache",
                             "--workers", str(workers), "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        address = None
        while time.time() < deadline and address is None:
            log.seek(0)
            m = re.search(r"kilnd listening on (\S+)", log.read())
            address = m.group(1) if m else None
            if proc.poll() is not None:
                raise SystemExit("kilnd exited early")
            time.sleep(0.05)
        if address is None:
            raise SystemExit("kilnd did not start")
        yield address
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
