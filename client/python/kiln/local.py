"""A kilnd started by this process: for tests, benchmarks, notebooks and scripts that want a
private daemon rather than a shared one.

    with kiln.local.LocalDaemon(kiln.local.find_kilnd(), workdir) as d:
        client = kiln.Client(d.address)

The daemon listens on a free loopback port (``127.0.0.1:0``; the address it prints is read
back), keeps its cache in ``workdir/kilnd-cache`` unless told otherwise, logs to
``workdir/kilnd.log``, and is ready (its gRPC health check says SERVING) when the constructor
returns. ``stop()`` sends SIGTERM, so in-flight compiles finish and RocksDB closes cleanly;
``reload()`` sends SIGHUP (kilnd re-reads its certificates, tokens and signing keys). The daemon
does not outlive this process: it runs with ``--exit-on-stdin-eof`` and a pipe on its stdin whose
write end only this process holds, so when the process ends, however it ends (even SIGKILL),
kilnd sees the pipe close and stops as on SIGTERM. A daemon
started with ``--tls-cert`` is probed with ``probe_options`` (Client keyword arguments such as
``tls_ca``, ``tls_cert``, ``tls_key``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Optional, Sequence, Union

from .client import Client
from .errors import RpcError

PathLike = Union[str, Path]

_LISTENING = re.compile(r"kilnd listening on (\S+:\d+)")


def find_kilnd(explicit: Optional[PathLike] = None) -> Optional[Path]:
    """The kilnd binary: ``explicit``, else ``$KILND``, else ``$KILN_BINARY_DIR/server/kilnd``,
    else ``build/server/kilnd`` under the current folder or the repository holding this
    package; None when there is none."""
    candidates: list[Optional[PathLike]] = [explicit, os.environ.get("KILND")]
    if os.environ.get("KILN_BINARY_DIR"):
        candidates.append(Path(os.environ["KILN_BINARY_DIR"]) / "server" / "kilnd")
    candidates.append(Path("build") / "server" / "kilnd")
    candidates.append(Path(__file__).resolve().parents[3] / "build" / "server" / "kilnd")
    for c in candidates:
        if c and Path(c).is_file():
            return Path(c)
    return None


class LocalDaemon:
    """A running kilnd child process: ``address``, ``proc``, ``cache_dir``, ``log_path``.

    Raises RuntimeError (with the daemon's log) when it exits early or is not SERVING within
    ``timeout`` seconds.
    """

    def __init__(self, binary: PathLike, workdir: PathLike, *, listen: str = "127.0.0.1:0",
                 cache_dir: Optional[PathLike] = None, args: Sequence[str] = (), timeout: float = 60.0,
                 probe_options: Optional[dict] = None) -> None:
        self._probe_options = dict(probe_options or {})
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        self.cache_dir = Path(cache_dir) if cache_dir else workdir / "kilnd-cache"
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / "kilnd.log"
        cmd = [str(binary), "--listen", listen, "--cache-dir", str(self.cache_dir), "--exit-on-stdin-eof", *args]
        with open(self.log_path, "wb") as log:
            # proc.stdin stays open for the daemon's life: its closing is what stops kilnd when
            # this process dies without calling stop().
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.PIPE)
        self.address = ""
        try:
            self._wait_ready(time.monotonic() + timeout, timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, deadline: float, timeout: float) -> None:
        while not self.address:
            m = _LISTENING.search(self.log())
            if m:
                self.address = m.group(1)
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"kilnd exited with {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"kilnd did not print its address in {timeout} s:\n{self.log()}")
            time.sleep(0.05)
        with Client(self.address, **self._probe_options) as probe:
            while True:
                try:
                    if probe.health() == "SERVING":
                        return
                except RpcError:
                    pass
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"kilnd at {self.address} never became SERVING:\n{self.log()}")
                time.sleep(0.1)

    def log(self, tail: Optional[int] = None) -> str:
        """The daemon's log so far (its last ``tail`` characters when given)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return text[-tail:] if tail else text

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout`` seconds; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        return self.proc.returncode

    def reload(self) -> None:
        """SIGHUP: kilnd reloads its TLS certificates, token file and signing keys."""
        self.proc.send_signal(signal.SIGHUP)

    def __enter__(self) -> "LocalDaemon":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["LocalDaemon", "find_kilnd"]
