"""The ``kiln`` command line against a real kilnd, run as a subprocess."""

from __future__ import annotations

import json

import numpy as np

import kiln
from helpers import kiln_cli


def make_graph():
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (16, 8))
    y = b.input("y", "f32", (8,))
    z = b.exp(x - y)
    return b.build([z / b.sum(z, axes=[1], keepdim=True), b.argmax(x, axis=0)])


def expected(xv, yv):
    z = np.exp(xv - yv)
    return z / z.sum(axis=1, keepdims=True), xv.argmax(axis=0)


def test_round_trip_compile_fetch_run(subprocess_env, tmp_path, rng):
    g = kiln.save_graph(make_graph(), tmp_path / "graph.json")
    out = kiln_cli(subprocess_env, "compile", g, "--target", "cpu", "--json")
    info = json.loads(out.stdout)
    handle = info["handle"]
    assert len(handle) == 64 and info["kernels"] >= 1 and "ms" in info
    human = kiln_cli(subprocess_env, "compile", g, "--target", "cpu").stdout
    assert handle in human and "cache hit  yes" in human

    fetched = kiln_cli(subprocess_env, "fetch", handle, "--output", tmp_path / "art").stdout
    so = tmp_path / "art" / f"{handle}.so"
    assert so.is_file() and str(so) in fetched
    plan = json.loads((tmp_path / "art" / f"{handle}.plan.json").read_text())
    assert plan["plan"]["abi_version"] == 1

    xv = rng.standard_normal((16, 8)).astype(np.float32)
    yv = rng.standard_normal(8).astype(np.float32)
    np.save(tmp_path / "x.npy", xv)
    np.save(tmp_path / "y.npy", yv)
    kiln_cli(subprocess_env, "run", handle, "--input", f"x={tmp_path / 'x.npy'}", "--input", f"y={tmp_path / 'y.npy'}", "--output", tmp_path / "out")
    want_sm, want_idx = expected(xv, yv)
    np.testing.assert_allclose(np.load(tmp_path / "out" / "output0.npy"), want_sm, rtol=1e-5)
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "output1.npy"), want_idx)

    # on a machine that never compiled the graph, inputs go by position
    env2 = dict(subprocess_env, KILN_CACHE_DIR=str(tmp_path / "other-cache"))
    kiln_cli(env2, "run", handle, "--input", f"0={tmp_path / 'x.npy'}", "--input", f"input1={tmp_path / 'y.npy'}", "--output", tmp_path / "out2")
    np.testing.assert_allclose(np.load(tmp_path / "out2" / "output0.npy"), want_sm, rtol=1e-5)

    src = kiln_cli(subprocess_env, "source", handle).stdout
    assert "kiln_run" in src
    kiln_cli(subprocess_env, "source", handle, "--fusion-report")


def test_graph_formats_and_lookup(subprocess_env, tmp_path):
    g = make_graph()
    handles = set()
    for ext in (".txtpb", ".pbtxt", ".pb", ".json"):
        p = kiln.save_graph(g, tmp_path / f"g{ext}")
        handles.add(json.loads(kiln_cli(subprocess_env, "compile", p, "--target", "cpu:x86-64-v2", "--json").stdout)["handle"])
    assert len(handles) == 1
    hit = kiln_cli(subprocess_env, "lookup", tmp_path / "g.pb", "--target", "cpu:x86-64-v2", "--json")
    assert json.loads(hit.stdout)["handle"] in handles

    b = kiln.GraphBuilder()
    x = b.input("x", "f64", (3,))
    other = kiln.save_graph(b.build(b.cos(x) * 0.314159), tmp_path / "other.json")
    miss = kiln_cli(subprocess_env, "lookup", other, "--target", "cpu:x86-64-v2", check=False)
    assert miss.returncode == 1 and "not cached" in miss.stdout


def test_compile_error_exit_status(subprocess_env, tmp_path):
    (tmp_path / "bad.txtpb").write_text(
        'inputs { name: "x" type { dtype: F32 shape: 4 } }\n'
        'nodes { op: "frobnicate" inputs: 0 name: "culprit" }\n'
        "outputs: 1\n"
    )
    p = kiln_cli(subprocess_env, "compile", tmp_path / "bad.txtpb", "--target", "cpu", check=False)
    assert p.returncode == 1
    assert "INVALID_ARGUMENT" in p.stderr and "frobnicate" in p.stderr


def test_stats(subprocess_env):
    s = json.loads(kiln_cli(subprocess_env, "stats", "--json").stdout)
    assert int(s["requests"]) >= 1
    human = kiln_cli(subprocess_env, "stats").stdout
    assert "compiles" in human


def test_server_flag_overrides_environment(subprocess_env, server):
    env = dict(subprocess_env, KILN_SERVER="127.0.0.1:1")
    s = kiln_cli(env, "stats", "--json", "--server", server)
    assert "requests" in json.loads(s.stdout)
    bad = kiln_cli(env, "stats", "--timeout", "1", check=False)
    assert bad.returncode == 1
    assert "UNAVAILABLE" in bad.stderr or "DEADLINE_EXCEEDED" in bad.stderr
