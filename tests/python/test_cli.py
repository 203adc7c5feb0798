"""The ``kiln`` command line against a real kilnd, run as a subprocess."""

from __future__ import annotations

import json
import re

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


def test_stats_json_has_numbers_and_human_output_has_sizes(subprocess_env, tmp_path):
    kiln_cli(subprocess_env, "compile", kiln.save_graph(make_graph(), tmp_path / "g.json"), "--json")
    s = json.loads(kiln_cli(subprocess_env, "stats", "--json").stdout)
    # Every counter is a JSON number (protobuf's JSON mapping would print int64 as strings).
    for key in ("requests", "compiles", "cache_hits", "rejected", "queue_depth", "workers"):
        assert type(s[key]) is int, (key, s[key])
    for key in ("hits", "misses", "bytes", "entries", "capacity_bytes"):
        assert type(s["store"][key]) is int, (key, s["store"][key])
    assert isinstance(s["uptime_s"], float)
    assert s["requests"] >= 1 and s["store"]["bytes"] > 0

    human = kiln_cli(subprocess_env, "stats").stdout.splitlines()
    rows = {line.split()[0]: line for line in human}
    assert "compiles" in rows
    # Sizes in binary units, never raw byte counts.
    assert re.search(r"\d+(\.\d)? (B|KiB|MiB|GiB|TiB)$", rows["store.bytes"]), rows["store.bytes"]
    assert str(s["store"]["bytes"]) not in rows["store.bytes"] or s["store"]["bytes"] < 1024
    # Aligned columns: the values, all numbers or sizes, are right-aligned in one column.
    assert len({len(line) for line in human}) == 1, human


def test_output_cut_short_by_its_reader_is_quiet(subprocess_env):
    """``kiln stats | head -1``: the command stops when its reader closes the pipe, with
    status 141 (a shell's SIGPIPE) and no traceback."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "kiln", "stats"], env=subprocess_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline()  # one line read, then the pipe closed
    proc.stdout.close()
    stderr = proc.communicate(timeout=60)[1].decode()
    assert proc.returncode in (0, 141), (proc.returncode, stderr)
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr


def test_compile_json_types(subprocess_env, tmp_path):
    info = json.loads(kiln_cli(subprocess_env, "compile", kiln.save_graph(make_graph(), tmp_path / "g.json"), "--json").stdout)
    assert type(info["kernels"]) is int and type(info["cache_hit"]) is bool
    assert all(type(a["size"]) is int and a["size"] > 0 for a in info["artifacts"])
    assert type(info["stats"]["num_kernels"]) is int
    for step in json.loads(kiln_cli(subprocess_env, "fetch", info["handle"], "--json").stdout)["artifacts"]:
        assert type(step["size"]) is int


def test_version(subprocess_env):
    out = kiln_cli(subprocess_env, "--version").stdout
    assert re.match(r"kiln \d+\.\d+\.\d+ \(grpcio [\d.]+, protobuf [\d.]+, numpy [\d.]+\)$", out.strip()), out
    assert kiln.__version__ in out


def test_prewarm_prints_plain_lines_off_a_terminal(subprocess_env, tmp_path):
    folder = tmp_path / "graphs"
    folder.mkdir()
    for i in range(3):
        b = kiln.GraphBuilder()
        x = b.input("x", "f32", (5 + i,))
        kiln.save_graph(b.build(b.sin(x) + float(i)), folder / f"g{i}.json")
    out = kiln_cli(subprocess_env, "prewarm", folder, "--target", "cpu:x86-64-v2").stdout.splitlines()
    progress = [line for line in out if line.startswith("[")]
    assert len(progress) == 3, out
    assert [line.split("]")[0] for line in progress] == ["[1/3", "[2/3", "[3/3"]
    assert all(("compiled" in line or "cache hit" in line) and ".json" in line for line in progress)
    assert "\r" not in "".join(out)


def test_explain_names_the_differing_field_of_a_real_miss(subprocess_env, tmp_path):
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (32,))
    g = kiln.save_graph(b.build(b.exp(x) * 1.25 - 0.75), tmp_path / "explain.json")
    kiln_cli(subprocess_env, "compile", g, "--target", "cpu:x86-64-v2")
    kiln_cli(subprocess_env, "compile", g, "--target", "cpu:x86-64-v2", "--opt-level", "1")

    # The same graph for another target: a miss, whose nearest entries differ in the target.
    miss = kiln_cli(subprocess_env, "lookup", g, "--target", "cpu:x86-64-v3", check=False)
    assert miss.returncode == 1
    d = json.loads(kiln_cli(subprocess_env, "explain", g, "--target", "cpu:x86-64-v3", "--json").stdout)
    assert d["cached"] is False
    assert len(d["handle"]) == 64 and d["fields"]["graph"] == d["graph_digest"]
    assert set(d["fields"]) >= {"graph", "target", "options", "toolchain"}
    assert len(d["nearest"]) == 2
    # Nearest first: the entry that differs in the target (and the toolchain fingerprint, which
    # depends on the target), then the one that also differs in the options.
    nearest, farther = d["nearest"]
    assert "target" in nearest["differing"] and "options" not in nearest["differing"], d["nearest"]
    assert set(nearest["differing"]) <= {"target", "toolchain"}
    assert nearest["fields"]["target"] == "cpu:x86-64-v2" != d["fields"]["target"]
    assert nearest["fields"]["graph"] == d["fields"]["graph"]
    assert set(farther["differing"]) == set(nearest["differing"]) | {"options"}

    human = kiln_cli(subprocess_env, "explain", g, "--target", "cpu:x86-64-v3").stdout
    assert human.startswith("MISS")
    assert "! target" in human and "(request: " in human
    assert "2 other stored entries for the same graph" in human

    hit = json.loads(kiln_cli(subprocess_env, "explain", g, "--target", "cpu:x86-64-v2", "--json").stdout)
    assert hit["cached"] is True
    assert [e["differing"] for e in hit["nearest"]] == [["options"]]


def test_explain_of_a_new_graph_says_so(subprocess_env, tmp_path):
    b = kiln.GraphBuilder()
    x = b.input("x", "f64", (7,))
    g = kiln.save_graph(b.build(b.log1p(b.abs(x)) * 3.5), tmp_path / "new.json")
    d = json.loads(kiln_cli(subprocess_env, "explain", g, "--json").stdout)
    assert d["cached"] is False and d["nearest"] == []
    assert "the graph itself is new" in kiln_cli(subprocess_env, "explain", g).stdout


def test_explain_rejects_a_bad_graph_naming_the_node(subprocess_env, tmp_path):
    (tmp_path / "bad.txtpb").write_text(
        'inputs { name: "x" type { dtype: F32 shape: 4 } }\n'
        'nodes { op: "frobnicate" inputs: 0 name: "culprit" }\n'
        "outputs: 1\n"
    )
    p = kiln_cli(subprocess_env, "explain", tmp_path / "bad.txtpb", check=False)
    assert p.returncode == 1
    assert "INVALID_ARGUMENT" in p.stderr and "frobnicate" in p.stderr


def test_server_flag_overrides_environment(subprocess_env, server):
    env = dict(subprocess_env, KILN_SERVER="127.0.0.1:1")
    s = kiln_cli(env, "stats", "--json", "--server", server)
    assert "requests" in json.loads(s.stdout)
    bad = kiln_cli(env, "stats", "--timeout", "1", check=False)
    assert bad.returncode == 1
    assert "UNAVAILABLE" in bad.stderr or "DEADLINE_EXCEEDED" in bad.stderr
