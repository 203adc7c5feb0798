"""Deadlines and retries on UNAVAILABLE, against a daemon that is down or starts late."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

import kiln
from conftest import find_kilnd, start_kilnd, stop_kilnd


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_daemon_fails_within_the_deadline(tmp_path):
    with kiln.Client(f"127.0.0.1:{free_port()}", timeout=1.5, cache_dir=tmp_path) as c:
        t0 = time.monotonic()
        with pytest.raises(kiln.RpcError) as e:
            c.stats()
        elapsed = time.monotonic() - t0
    assert e.value.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED")
    assert elapsed < 5


def test_compile_retries_until_a_late_daemon_answers(kilnd, tmp_path, rng):
    port = free_port()
    b = kiln.GraphBuilder()
    x = b.input("x", "f64", (8,))
    g = b.build(b.exp(x) - 0.4142)
    xv = rng.standard_normal(8)
    result: dict = {}

    def call() -> None:
        with kiln.Client(f"127.0.0.1:{port}", compile_timeout=60, max_attempts=100, cache_dir=tmp_path / "c") as c:
            try:
                result["out"] = c.compile(g, "cpu")(xv)
            except Exception as e:  # reported by the assertion below
                result["error"] = e

    t = threading.Thread(target=call)
    t.start()
    time.sleep(1.0)  # the client is retrying on UNAVAILABLE meanwhile
    d = start_kilnd(find_kilnd(), tmp_path / "late", listen=f"127.0.0.1:{port}")
    try:
        t.join(60)
    finally:
        stop_kilnd(d)
    assert not t.is_alive()
    assert "out" in result, result.get("error")
    np.testing.assert_allclose(result["out"], np.exp(xv) - 0.4142, rtol=1e-9)
