"""Fixtures for the Python client tests.

The ``kilnd`` fixture starts the real daemon once per session on a free port with a temporary
cache folder, waits for its gRPC health check to say SERVING, and stops it with SIGTERM at the
end. The binary is ``$KILND``, else ``$KILN_BINARY_DIR/server/kilnd``, else ``build/server/kilnd``
in the repository. Tests that need the daemon are skipped when there is none (an error instead
under CI, ``$CI`` set, or when ``$KILN_BINARY_DIR`` names a build: the daemon should be there);
the tracer and builder tests run without it. Under CI, a skip for a reason CI should never meet
fails the test (tests/ci_skips.py).

Every test process (and the subprocesses tests start) uses a temporary local artifact cache,
never the user's, and the native client core of the build under test
(``$KILN_BINARY_DIR/client/core/libkiln_core.so``, else ``build/``'s) when there is one, so that
a rebuilt core is what the tests load; tests/python/test_wheel.py tests the wheel's own copy.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
CLIENT_DIR = REPO / "client" / "python"


def _use_built_core() -> None:
    built = Path(os.environ.get("KILN_BINARY_DIR") or REPO / "build") / "client" / "core" / "libkiln_core.so"
    if "KILN_CORE_LIBRARY" not in os.environ and built.is_file():
        os.environ["KILN_CORE_LIBRARY"] = str(built)


_use_built_core()

try:
    import kiln  # noqa: F401
except ImportError:  # not installed: use the source tree
    sys.path.insert(0, str(CLIENT_DIR))
    import kiln  # noqa: F401

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO / "tests"))
from ci_skips import pytest_runtest_makereport  # noqa: E402,F401  (a hook: fails skips CI must not see)


def find_kilnd() -> Optional[Path]:
    """The kilnd binary to test, or None (kiln.local.find_kilnd's search order)."""
    return kiln.local.find_kilnd()


def no_kilnd() -> None:
    """Skips the test for want of a kilnd binary; fails it instead under CI or when
    $KILN_BINARY_DIR is set (the daemon should have been built there)."""
    where = os.environ.get("KILN_BINARY_DIR")
    if os.environ.get("CI") or where:
        pytest.fail(f"kilnd is not built (looked in $KILND, then {where or '$KILN_BINARY_DIR'}/server, build/server; "
                    "under CI or with KILN_BINARY_DIR set a missing daemon is an error, not a skip)")
    pytest.skip("kilnd is not built (set KILND or KILN_BINARY_DIR, or build into build/)")


# A running kilnd: kiln.local.LocalDaemon (address, cache_dir, log_path, log(), stop()).
Daemon = kiln.local.LocalDaemon


def start_kilnd(binary: Path, workdir: Path, timeout: float = 60.0, listen: str = "127.0.0.1:0") -> Daemon:
    """Starts kilnd listening on ``listen`` and waits until it is SERVING. ``$KILND_ARGS``
    adds flags (e.g. ``--log-level debug``)."""
    return Daemon(binary, workdir, listen=listen, args=shlex.split(os.environ.get("KILND_ARGS", "")),
                  timeout=timeout)


def stop_kilnd(d: Daemon) -> None:
    """SIGTERM, then SIGKILL if it has not exited after 20 s."""
    d.stop()


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private local artifact cache for the whole session (and its subprocesses).

    kiln.torch's program records are off here: the backend tests inspect what partitioning
    makes of each graph, and a graph another test compiled before would be rebuilt from its
    record instead. test_torch_records.py turns them on where it tests them."""
    d = tmp_path_factory.mktemp("kiln-client-cache")
    old = {k: os.environ.get(k) for k in ("KILN_CACHE_DIR", "KILN_RECORD_DIR", "KILN_TORCH_RECORDS")}
    os.environ["KILN_CACHE_DIR"] = str(d)
    os.environ["KILN_TORCH_RECORDS"] = "0"
    os.environ.pop("KILN_RECORD_DIR", None)
    yield d
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def private_kilnd(tmp_path_factory: pytest.TempPathFactory, name: str, args: list[str]) -> Iterator[Daemon]:
    """A kilnd of a test module's own with extra flags (``yield from`` it in a fixture); skips
    the test when none is built."""
    binary = find_kilnd()
    if binary is None:
        no_kilnd()
    d = Daemon(binary, tmp_path_factory.mktemp(name), args=args)
    yield d
    d.stop()


@pytest.fixture(scope="session")
def kilnd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A kilnd serving on a free port for the session; skips the test when none is built."""
    binary = find_kilnd()
    if binary is None:
        no_kilnd()
    d = start_kilnd(binary, tmp_path_factory.mktemp("kilnd"))
    yield d
    stop_kilnd(d)


@pytest.fixture(scope="session")
def server(kilnd: Daemon) -> str:
    """The running daemon's address."""
    return kilnd.address


@pytest.fixture(scope="session")
def client(server: str) -> Iterator["kiln.Client"]:
    """A client of the session's daemon. ``KILN_TEST_ALGEBRAIC_REWRITES=0`` compiles every graph
    that asks for no options of its own without the reassociating rewrites, so the whole
    suite can be run both ways."""
    c = kiln.Client(server)
    if os.environ.get("KILN_TEST_ALGEBRAIC_REWRITES", "1") == "0":
        compile_ = c.compile

        def compile_without_rewrites(graph, target="cpu", options=None, **kw):
            if options is None:
                options = kiln.make_options(algebraic_rewrites=False)
            return compile_(graph, target, options, **kw)

        c.compile = compile_without_rewrites  # type: ignore[method-assign]
    yield c
    c.close()


@pytest.fixture
def subprocess_env(server: str) -> dict[str, str]:
    """An environment for child processes: the daemon's address and an importable kiln."""
    env = dict(os.environ)
    env["KILN_SERVER"] = server
    env["PYTHONPATH"] = os.pathsep.join([str(CLIENT_DIR), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)
