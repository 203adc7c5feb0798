"""Property test: random valid graphs compile for CPU, sm_80 and sm_90, and the CPU results
match NumPy.

Graphs come from random_graphs.make_graph (all registry ops but the externs, every dtype,
views, broadcasting, concat, zero- and one-sized dimensions). The seeds are fixed, so a run is
reproducible; a failure names its seed and the graph, and
``KILN_PROPERTY_SEEDS=first:count`` reruns any range (e.g. a longer local run).
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

import kiln
from graph_eval import evaluate
from random_graphs import make_graph

SEEDS = os.environ.get("KILN_PROPERTY_SEEDS", "0:40")
_first, _count = (int(x) for x in SEEDS.split(":"))


def _tolerance(dtype: np.dtype) -> float:
    return {2: 3e-2, 4: 2e-4}.get(dtype.itemsize, 1e-9)


def _describe(rg) -> str:
    return f"seed {rg.seed} (rerun: KILN_PROPERTY_SEEDS={rg.seed}:1); ops {rg.ops}\n{rg.graph}"


def _cuda_available(client) -> bool:
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (4,))
    try:
        client.compile(b.build([x + 1]), "cuda:sm_80")
        return True
    except kiln.errors.RpcError as e:
        if e.code == "FAILED_PRECONDITION":  # this daemon has no NVRTC
            return False
        raise


@pytest.fixture(scope="module")
def cuda_ok(client) -> bool:
    return _cuda_available(client)


@pytest.mark.parametrize("seed", range(_first, _first + _count))
def test_random_graph(client, cuda_ok, seed):
    rg = make_graph(seed)
    try:
        compiled = client.compile(rg.graph, "cpu")
        if cuda_ok:
            for sm in ("cuda:sm_80", "cuda:sm_90"):
                client.compile(rg.graph, sm)
    except kiln.errors.KilnError as e:
        pytest.fail(f"valid graph rejected or failed to build: {e}\n{_describe(rg)}")
    if rg.uses_bf16:
        return  # no NumPy bf16 here: compiling is the check
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = evaluate(rg.graph, rg.inputs)
    got = compiled(*rg.inputs)
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        where = f"output {i}: {_describe(rg)}"
        assert g.dtype == w.dtype, f"dtype {g.dtype} vs NumPy {w.dtype}; {where}"
        assert g.shape == w.shape, f"shape {g.shape} vs NumPy {w.shape}; {where}"
        if w.dtype.kind == "f":
            tol = _tolerance(w.dtype)
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol, equal_nan=True, err_msg=where)
        else:
            np.testing.assert_array_equal(g, w, err_msg=where)
