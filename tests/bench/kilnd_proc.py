"""Starts a private kilnd for a benchmark (or uses $KILN_SERVER), and stops it afterwards."""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from typing import Iterator, Sequence

import kiln


@contextmanager
def redis_server() -> Iterator[str]:
    """A private ``redis-server`` on a free loopback port, no persistence: its URL."""
    import socket
    import subprocess
    import time

    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server not found (Debian: apt-get install redis-server)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@contextmanager
def daemon(workers: int = 2, args: Sequence[str] = (), own: bool = False) -> Iterator[str]:
    """A kilnd's address: ``$KILN_SERVER``'s, or a private one started with ``args`` added
    (``own``: always a private one)."""
    if os.environ.get("KILN_SERVER") and not own:
        yield os.environ["KILN_SERVER"]
        return
    binary = kiln.local.find_kilnd()
    if binary is None:
        raise SystemExit("kilnd not found: build it (deploy/build.sh) or set KILND")
    tmp = tempfile.mkdtemp(prefix="kiln-bench-")
    try:
        with kiln.local.LocalDaemon(binary, tmp, args=["--workers", str(workers), "--log-level", "warn", *args]) as d:
            yield d.address
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
