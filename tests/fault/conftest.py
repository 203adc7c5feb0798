"""Shared pieces of the fault tests: the kilnd binary, daemons started with chosen flags, small
distinct graphs, and a look at the process tree through /proc.

Every test here starts its own kilnd (kiln.local.LocalDaemon) and bounds its own time; none
leaves a process behind (the fixtures kill what a failed test left).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Iterator, Optional

import pytest

REPO = Path(__file__).resolve().parents[2]
try:
    import kiln  # noqa: F401
except ImportError:  # not installed: use the source tree
    sys.path.insert(0, str(REPO / "client" / "python"))
    import kiln  # noqa: F401

from kiln.local import LocalDaemon, find_kilnd  # noqa: E402

sys.path.insert(0, str(REPO / "tests"))
from ci_skips import pytest_runtest_makereport  # noqa: E402,F401  (a hook: fails skips CI must not see)


@pytest.fixture(scope="session")
def kilnd_binary() -> Path:
    binary = find_kilnd()
    if binary is None:
        if os.environ.get("CI") or os.environ.get("KILN_BINARY_DIR"):
            pytest.fail("no kilnd binary in $KILND or $KILN_BINARY_DIR/server (an error under CI or with "
                        "KILN_BINARY_DIR set, not a skip)")
        pytest.skip("no kilnd binary (build it, or set KILN_BINARY_DIR / KILND)")
    return binary


@pytest.fixture(autouse=True)
def _private_client_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "client-cache"))


class Daemons:
    """Starts daemons for one test and makes sure none outlives it."""

    def __init__(self, binary: Path, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        self.started: list[LocalDaemon] = []

    def start(self, *args: str, name: str = "kilnd", cache_dir: Optional[Path] = None) -> LocalDaemon:
        d = LocalDaemon(self.binary, self.workdir / name, cache_dir=cache_dir, args=list(args), timeout=60)
        self.started.append(d)
        return d

    def cleanup(self) -> None:
        for d in self.started:
            if d.proc.poll() is None:
                kill_tree(d.proc.pid)
                d.proc.wait(timeout=20)


@pytest.fixture
def daemons(kilnd_binary: Path, tmp_path: Path) -> Iterator[Daemons]:
    ds = Daemons(kilnd_binary, tmp_path)
    try:
        yield ds
    finally:
        ds.cleanup()


# ---------------------------------------------------------------------------- graphs

def small_graph(seed: float, fault: str = ""):
    """A one-kernel graph, distinct for each ``seed`` (a different constant, so a different
    key). ``fault`` names a worker fault to inject (needs kilnd --fault-injection)."""
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (32,))
    y = b.exp(x) * float(seed) + 0.5
    g = b.build([y])
    if fault:
        g.nodes[-1].name = f"kiln-fault:{fault}"
    return g


# ---------------------------------------------------------------------------- processes

def _stat_fields(pid: int) -> Optional[list[str]]:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def descendants(root: int) -> dict[int, str]:
    """Live descendants of ``root``: pid -> state letter (Z for a zombie)."""
    parents: dict[int, int] = {}
    states: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        if fields:
            states[int(entry)] = fields[0]
            parents[int(entry)] = int(fields[1])
    found: dict[int, str] = {}
    frontier = [root]
    while frontier:
        p = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == p and pid not in found:
                found[pid] = states[pid]
                frontier.append(pid)
    return found


def alive(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def kill_tree(root: int) -> None:
    for pid in list(descendants(root)) + [root]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_until(predicate, timeout: float, step: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class Outcomes:
    """Counts the outcomes of calls made from many threads: "OK" or the gRPC code name."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def run(self, call) -> None:
        from kiln.errors import RpcError

        try:
            call()
            code = "OK"
        except RpcError as e:
            code = e.code
        with self._lock:
            self.counts[code] = self.counts.get(code, 0) + 1
