"""The client retry policy (client/RETRY.md) against real daemons: one that is not running, one
that starts late, and one whose compile queue overflows. Timings are asserted as loose bounds."""

from __future__ import annotations

import socket
import threading
import time
import warnings

import numpy as np
import pytest

import kiln
from conftest import find_kilnd, start_kilnd, stop_kilnd


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("timeout, policy, low, high", [
    (1.5, None, 0.0, 5.0),                                   # the deadline comes first
    (60, None, 2.0, 20.0),                                   # the policy's 5 s window, not 60 s
    (60, kiln.RetryPolicy(unavailable_timeout=0.5), 0.0, 5.0),
], ids=["deadline", "default-window", "short-window"])
def test_stopped_daemon_fails_within_bounds(tmp_path, timeout, policy, low, high):
    with kiln.Client(f"127.0.0.1:{free_port()}", timeout=timeout, retry=policy, cache_dir=tmp_path) as c:
        t0 = time.monotonic()
        with pytest.raises(kiln.RpcError) as e:
            c.stats()
        elapsed = time.monotonic() - t0
    assert e.value.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED")
    assert low <= elapsed < high, elapsed


def test_compile_retries_until_a_late_daemon_answers(kilnd, tmp_path, rng):
    port = free_port()
    b = kiln.GraphBuilder()
    x = b.input("x", "f64", (8,))
    g = b.build(b.exp(x) - 0.4142)
    xv = rng.standard_normal(8)
    result: dict = {}

    def call() -> None:
        # A daemon that takes a while to start is still reached when the UNAVAILABLE window
        # is widened.
        policy = kiln.RetryPolicy(unavailable_timeout=60)
        with kiln.Client(f"127.0.0.1:{port}", compile_timeout=60, retry=policy, cache_dir=tmp_path / "c") as c:
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


def _distinct_graph(i: int):
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (64 + i,))
    return b.build(b.tanh(b.exp(x) * float(i + 2)) - float(i))


def _flood(address: str, graphs, policy, cache_dir) -> list:
    """Compiles every graph at once, one client thread each; returns each outcome (a Compiled
    or the exception)."""
    out: list = [None] * len(graphs)
    barrier = threading.Barrier(len(graphs))

    def one(i: int) -> None:
        with kiln.Client(address, compile_timeout=120, retry=policy, cache_dir=cache_dir / str(i)) as c:
            barrier.wait()
            try:
                out[i] = c.compile(graphs[i], "cpu")
            except Exception as e:  # collected and asserted on below
                out[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(graphs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not any(t.is_alive() for t in threads)
    return out


@pytest.fixture(scope="module")
def overloaded(tmp_path_factory):
    """A kilnd with one compile worker and room for one queued job: a burst of distinct
    compiles overflows its queue."""
    d = kiln.local.LocalDaemon(find_kilnd(), tmp_path_factory.mktemp("overloaded"),
                               args=["--workers", "1", "--queue-size", "1"])
    yield d
    d.stop()


def test_overloaded_daemon_is_retried_until_every_compile_lands(overloaded, tmp_path):
    n = 6
    graphs = [_distinct_graph(i) for i in range(n)]
    outcomes = _flood(overloaded.address, graphs, kiln.RetryPolicy(), tmp_path)
    failures = [o for o in outcomes if isinstance(o, Exception)]
    assert not failures, failures
    stats = kiln.Client(overloaded.address, cache_dir=tmp_path / "s").stats()
    # The burst did overflow the queue (so the successes above include retried rejections).
    assert stats.rejected >= 1, stats
    assert stats.compiles >= n


def test_overload_without_retries_reaches_the_caller(overloaded, tmp_path):
    n = 6
    graphs = [_distinct_graph(100 + i) for i in range(n)]
    outcomes = _flood(overloaded.address, graphs, kiln.RetryPolicy(retry_overloaded=False), tmp_path)
    exhausted = [o for o in outcomes if isinstance(o, kiln.RpcError) and o.code == "RESOURCE_EXHAUSTED"]
    assert exhausted, outcomes
    assert all(isinstance(o, kiln.Compiled) or o in exhausted for o in outcomes), outcomes
    assert "queue is full" in str(exhausted[0])


def test_jit_fallback_runs_numpy_with_one_warning(tmp_path):
    client = kiln.Client(f"127.0.0.1:{free_port()}", timeout=10, cache_dir=tmp_path,
                         retry=kiln.RetryPolicy(unavailable_timeout=0.5))

    @kiln.jit(client=client, fallback=True)
    def f(x):
        return np.tanh(x) * 2 + 1

    x = np.linspace(-2, 2, 50)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = f(x)
        second = f(x[:10])
    np.testing.assert_allclose(first, np.tanh(x) * 2 + 1)
    np.testing.assert_allclose(second, np.tanh(x[:10]) * 2 + 1)
    fallback = [w for w in caught if issubclass(w.category, kiln.KilnFallbackWarning)]
    assert len(fallback) == 1, [str(w.message) for w in caught]
    assert "cannot be reached" in str(fallback[0].message)


def test_jit_without_fallback_raises_when_unreachable(tmp_path):
    client = kiln.Client(f"127.0.0.1:{free_port()}", timeout=10, cache_dir=tmp_path,
                         retry=kiln.RetryPolicy(unavailable_timeout=0.5))
    f = kiln.jit(lambda x: x + 1, client=client)
    with pytest.raises(kiln.RpcError) as e:
        f(np.ones(3))
    assert e.value.code == "UNAVAILABLE"


def test_jit_fallback_needs_a_cpu_target():
    with pytest.raises(ValueError, match="CPU target"):
        kiln.jit(lambda x: x, target="cuda:sm_90", fallback=True)
