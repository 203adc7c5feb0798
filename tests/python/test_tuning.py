"""Shared tuning: the fastest variant of a graph on a device model, recorded on kilnd by one
client and served to every other without timing (RecordTuning / LookupTuning, kiln.autotune,
``kiln prewarm --autotune``)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kiln
from helpers import kiln_cli
from kiln.autotune import device_name
from kiln.errors import RpcError


def column_stats_graph(rows: int, cols: int):
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (rows, cols))
    return b.build([b.mean(x, axes=[0]), b.var(x, axes=[0])])


SECOND_PROCESS = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import kiln

    client = kiln.Client()
    compiles = []
    real = client.compile
    client.compile = lambda *a, **k: compiles.append(1) or real(*a, **k)
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (ROWS, COLS))
    graph = b.build([b.mean(x, axes=[0]), b.var(x, axes=[0])])
    X = np.random.default_rng(1).standard_normal((ROWS, COLS)).astype(np.float32)
    best, timings = kiln.autotune(client, graph, [X])
    mean, var = best(X)
    ok = bool(np.allclose(mean, X.mean(0), rtol=1e-4, atol=1e-5) and np.allclose(var, X.var(0), rtol=1e-4, atol=1e-5))
    print(json.dumps({"handle": best.handle, "compiles": len(compiles), "ok": ok,
                      "timings": [[t.variant, t.median_ms] for t in timings]}))
    """
)


def test_tuned_variant_is_served_to_a_second_process_without_timing(client, subprocess_env, tmp_path) -> None:
    rows, cols = 1500, 2501
    graph = column_stats_graph(rows, cols)
    X = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    device = device_name("cpu")
    assert not client.lookup_tuning(graph, "cpu", device).found
    best, timings = kiln.autotune(client, graph, [X])
    assert len(timings) >= 2, "the graph has several distinct variants to time"
    fastest = min(timings, key=lambda t: t.median_ms)
    default = next(t for t in timings if t.variant == 0)
    # The rule as documented, written out (not read from kiln.autotune): another variant is
    # chosen when it takes at most 97% of the default's time per call (a 3% margin: repeated
    # timings of one kernel vary by that much); else the default stays. CPU timings have no
    # latencies, so the loop medians decide alone.
    winner = fastest if fastest.median_ms <= default.median_ms * 0.97 else default
    print(f"default {default.median_ms:.4f} ms, fastest variant {fastest.variant} {fastest.median_ms:.4f} ms")
    assert best.handle == winner.handle
    known = client.lookup_tuning(graph, "cpu", device)
    assert known.found and known.variant == winner.variant
    assert sorted(t.variant for t in known.timings) == sorted(t.variant for t in timings)

    env = dict(subprocess_env, KILN_CACHE_DIR=str(tmp_path / "empty-cache"))
    script = SECOND_PROCESS.replace("ROWS", str(rows)).replace("COLS", str(cols))
    p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    other = json.loads(p.stdout.strip().splitlines()[-1])
    assert other["ok"]
    assert other["handle"] == best.handle
    assert other["compiles"] == 1, "the second process compiles the recorded variant only, and times nothing"
    assert sorted(v for v, _ in other["timings"]) == sorted(t.variant for t in timings)


def test_tunings_are_per_device_model_and_checked(client) -> None:
    graph = column_stats_graph(300, 257)
    client.record_tuning(graph, "cpu", "test device A", 1, [(0, 2.0), (1, 1.0)])
    assert client.lookup_tuning(graph, "cpu", "test device A").variant == 1
    assert not client.lookup_tuning(graph, "cpu", "test device B").found
    # Options other than the variant keep their own tunings; the variant itself is ignored.
    assert client.lookup_tuning(graph, "cpu", "test device A", {"variant": 3}).found
    assert not client.lookup_tuning(graph, "cpu", "test device A", {"opt_level": 1}).found
    with pytest.raises(RpcError, match="variant 99"):
        client.record_tuning(graph, "cpu", "test device A", 99)
    with pytest.raises(RpcError, match="device name"):
        client.record_tuning(graph, "cpu", "", 0)
    with pytest.raises(RpcError, match="device name"):
        client.lookup_tuning(graph, "cpu", "x" * 300)


def test_prewarm_autotune_tunes_recorded_graphs_once(client, subprocess_env, tmp_path) -> None:
    rec = tmp_path / "recorded"
    rec.mkdir()
    (rec / "stats.pb").write_bytes(column_stats_graph(700, 1031).SerializeToString())
    first = json.loads(kiln_cli(subprocess_env, "prewarm", rec, "--target", "cpu", "--autotune", "--json").stdout)
    assert first["failed"] == 0, first
    assert len(first["tuned"]) == 1 and not first["tuned"][0]["already_tuned"]
    again = json.loads(kiln_cli(subprocess_env, "prewarm", rec, "--target", "cpu", "--autotune", "--json").stdout)
    assert again["tuned"][0]["already_tuned"] and again["tuned"][0]["variant"] == first["tuned"][0]["variant"]


def test_device_timing_measures_each_call_after_evicting_the_cache(client, monkeypatch) -> None:
    """On a device the tuner also times single calls between events, the cache evicted before
    each; stand-in events on the host exercise that path: every variant gets a latency, one
    eviction per timed call."""
    import importlib
    import time

    A = importlib.import_module("kiln.autotune")  # the package exports a function of that name

    class Event:
        def record(self) -> None:
            self.t = time.perf_counter()

        def elapsed_time(self, end: "Event") -> float:
            return (end.t - self.t) * 1e3

    evictions: list[int] = []
    monkeypatch.setattr(A, "_device_tools", lambda inputs: ((lambda: None), (Event, lambda: evictions.append(1))))
    g = column_stats_graph(1000, 2000)
    x = np.random.default_rng(3).standard_normal((1000, 2000)).astype(np.float32)
    best, timings = kiln.autotune(client, g, [x], iters=3, rtol=1e-4, atol=1e-3, share=False)
    assert len(timings) > 1 and all(t.latency_ms is not None and t.latency_ms > 0 for t in timings), timings
    assert best.handle == A._pick(timings).handle
    assert len(evictions) >= 3 * len(timings)
