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
    print(json.dumps({"cache_hit": c.cache_hit, "handle": c.handle, "ms": ms, "ok": ok}))
    """
)


def test_second_process_compiles_nothing(client, subprocess_env, rng):
    X, means = kmeans_inputs(np.random.default_rng(7), n=100000, k=6)
    first = kiln.jit(kmeans, client=client)
    first(X, means)
    handle = first.compiled_for(X, means).handle
    before = client.stats()
    env = dict(subprocess_env, PYTHONPATH=f"{TESTS_DIR}:{subprocess_env['PYTHONPATH']}")
    p = subprocess.run([sys.executable, "-c", SECOND_PROCESS], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["cache_hit"] and r["handle"] == handle and r["ok"]
    after = client.stats()
    assert after.compiles == before.compiles
    assert after.cache_hits > before.cache_hits
