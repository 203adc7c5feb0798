"""The recorder and ``kiln prewarm``; a second process finds everything compiled."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

import kiln
from helpers import kiln_cli
from sample_fns import kmeans, kmeans_inputs

TESTS_DIR = Path(__file__).resolve().parent

RECORDING_SCRIPT = textwrap.dedent(
    """
    import numpy as np
    import kiln

    @kiln.jit
    def f(x, y):
        return np.sqrt(np.abs(x - y)).sum(axis=1) * 0.271828

    @kiln.jit
    def g(x):
        return np.exp(-x ** 2).max(axis=0)

    rng = np.random.default_rng(0)
    f(rng.standard_normal((50, 3)), rng.standard_normal(3))
    f(rng.standard_normal((20, 3)), rng.standard_normal(3))  # a second signature
    g(rng.standard_normal((7, 4)))
    g(rng.standard_normal((7, 4)))  # cached in the process: not compiled or recorded again
    print(f.compile_count + g.compile_count)
    """
)


def test_record_then_prewarm_for_other_targets(client, subprocess_env, tmp_path):
    rec = tmp_path / "recorded"
    env = dict(subprocess_env, KILN_RECORD_DIR=str(rec))
    p = subprocess.run([sys.executable, "-c", RECORDING_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "3"
    files = sorted(rec.glob("*.kreq"))
    assert len(files) == 3

    targets = ["cpu:x86-64-v2", "cpu:x86-64-v3"]
    out = kiln_cli(subprocess_env, "prewarm", rec, *sum((["--target", t] for t in targets), []))
    assert "0 failed" in out.stdout, out.stdout
    again = json.loads(kiln_cli(subprocess_env, "prewarm", rec, "--target", targets[0], "--target", targets[1], "--json").stdout)
    assert again["requests"] == 6 and again["cache_hits"] == 6 and again["failed"] == 0

    before = client.stats().compiles
    for f in files:
        req = kiln.load_request(f)
        for t in targets:
            c = client.compile(req.graph, t, req.options)
            assert c.cache_hit, (f.name, t)
            assert client.lookup(req.graph, t, req.options) is not None
    assert client.stats().compiles == before


def test_prewarm_reports_failures(subprocess_env, tmp_path):
    d = tmp_path / "graphs"
    d.mkdir()
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (4,))
    kiln.save_graph(b.build(b.exp(x) * 0.5772), d / "good.json")
    (d / "bad.txtpb").write_text('inputs { name: "x" type { dtype: F32 shape: 4 } }\nnodes { op: "nope" inputs: 0 }\noutputs: 1\n')
    (d / "broken.json").write_text("{")
    p = kiln_cli(subprocess_env, "prewarm", d, "--target", "cpu:x86-64-v2", check=False)
    assert p.returncode == 1
    assert "2 failed" in p.stdout
    assert "bad.txtpb" in p.stderr and "broken.json" in p.stderr


SECOND_PROCESS = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    import kiln
    from helpers import assert_labels_match
    from sample_fns import kmeans, kmeans_inputs

    X, means = kmeans_inputs(np.random.default_rng(7), n=100000, k=6)
    jf = kiln.jit(kmeans)
    t0 = time.perf_counter()
    labels = jf(X, means)
    ms = (time.perf_counter() - t0) * 1e3
    c = jf.compiled_for(X, means)
    try:  # every label NumPy's, except between two equally near centres
        assert_labels_match(labels, X, means, kmeans(X, means))
        ok = True
    except AssertionError:
        ok = False
    print(json.dumps({"cache_hit": c.cache_hit, "handle": c.handle, "ms": ms, "ok": ok,
                      "machine_hits": c.client.machine_hits}))
    """
)


def test_second_process_compiles_nothing(client, subprocess_env, rng):
    X, means = kmeans_inputs(np.random.default_rng(7), n=100000, k=6)
    first = kiln.jit(kmeans, client=client)
    first(X, means)
    handle = first.compiled_for(X, means).handle
    env = dict(subprocess_env, PYTHONPATH=f"{TESTS_DIR}:{subprocess_env['PYTHONPATH']}")

    def second(**extra: str) -> dict:
        p = subprocess.run([sys.executable, "-c", SECOND_PROCESS], env=dict(env, **extra), capture_output=True,
                           text=True, timeout=600)
        assert p.returncode == 0, p.stderr
        r = json.loads(p.stdout.strip().splitlines()[-1])
        assert r["cache_hit"] and r["handle"] == handle and r["ok"], r
        return r

    # Answered by kilnd's cache (this machine's answers off), then by this machine's answers.
    before = client.stats()
    assert second(KILN_ANSWER_TTL="0")["machine_hits"] == 0
    after = client.stats()
    assert after.compiles == before.compiles
    assert after.cache_hits > before.cache_hits
    assert second()["machine_hits"] == 1
    assert client.stats().requests == after.requests, "kilnd was asked"


def _serve(env: dict[str, str], cache: Path, kind: str) -> dict:
    """A production process on a machine that never ran kiln (its own empty local folder)."""
    p = subprocess.run([sys.executable, "-c", f"import prewarm_models; prewarm_models.serve({kind!r})"],
                       env=dict(env, KILN_CACHE_DIR=str(cache)), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_prewarm_replays_models(subprocess_env, tmp_path):
    """``kiln prewarm --model``: the CI job stores each example's precompiled model (inference
    and a training step); a second prewarm finds them held; a production process on another
    machine then loads each without tracing or compiling anything, with eager's results."""
    torch = __import__("pytest").importorskip("torch")  # noqa: F841
    env = dict(subprocess_env, PYTHONPATH=f"{TESTS_DIR}:{subprocess_env['PYTHONPATH']}",
               KILN_CACHE_DIR=str(tmp_path / "ci"), KILN_TORCH_RECORDS="1")
    env.pop("KILN_SEALED", None)
    first = json.loads(kiln_cli(env, "prewarm", "--model", "prewarm_models:examples", "--json").stdout)
    assert [m["outcome"] for m in first["models"]] == ["stored", "stored"], first
    assert all(m["parts"] > 0 and m["compiled"] > 0 and m["failed"] == 0 for m in first["models"]), first
    assert first["failed"] == 0 and first["requests"] == 0, first

    again = json.loads(kiln_cli(env, "prewarm", "--model", "prewarm_models:examples", "--json").stdout)
    assert [m["outcome"] for m in again["models"]] == ["hit", "hit"], again
    assert all(m["compiled"] == 0 for m in again["models"]), again

    for i, kind in enumerate(("infer", "train")):
        got = _serve(env, tmp_path / f"serve-{kind}", kind)
        s = got["stats"]
        assert s["precompile_hits"] == 1 and s["precompile_misses"] == 0, s
        assert s["graphs"] == 0 and s["cache_hits"] == 0 and s["lookup_s"] == 0, s
        assert s["parts"] == first["models"][i]["parts"] and s["failed"] == 0, s
        assert got["max_err"] < 1e-5, got


def test_prewarm_reports_model_failures(subprocess_env, tmp_path):
    """A factory that raises, one that is not there and a malformed spec each fail the prewarm
    with their reason; a good one beside them is still replayed."""
    env = dict(subprocess_env, PYTHONPATH=f"{TESTS_DIR}:{subprocess_env['PYTHONPATH']}",
               KILN_CACHE_DIR=str(tmp_path / "ci"), KILN_TORCH_RECORDS="1")
    p = kiln_cli(env, "prewarm", "--json", "--model", "prewarm_models:broken", "--model", "prewarm_models:absent",
                 "--model", "no_colon", "--model", "prewarm_models:examples", check=False)
    assert p.returncode == 1, p.stderr
    r = json.loads(p.stdout)
    reasons = {m["spec"]: m.get("reason") or "" for m in r["models"]}
    assert "fails on purpose" in reasons["prewarm_models:broken"], reasons
    assert "absent" in reasons["prewarm_models:absent"], reasons
    assert "MODULE:FUNCTION" in reasons["no_colon"], reasons
    assert [m["outcome"] for m in r["models"] if m["spec"] == "prewarm_models:examples"] in (["stored"] * 2, ["hit"] * 2)
    assert r["failed"] == 3, r
    assert kiln_cli(env, "prewarm", check=False).returncode == 2
