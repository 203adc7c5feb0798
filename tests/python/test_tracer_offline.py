"""kiln.jit's tracer without a daemon: graphs are checked with a NumPy reference evaluator."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.jit import _rebuild_result
from graph_eval import evaluate
from helpers import assert_same
from sample_fns import CASES, kmeans, kmeans_inputs, numpy_fn, numpy_fn_inputs


def run_traced(fn, *args):
    """Traces ``fn`` on ``args``, evaluates the graph with the reference evaluator, and
    returns the result with the structure the jit would give."""
    traced = kiln.jit(fn).trace(*args)
    arrays = [np.asarray(a) for a in args]
    outs = tuple(evaluate(traced.graph, arrays)) if traced.graph is not None else ()
    return traced, _rebuild_result(traced.result_desc, outs, arrays)


def ops(graph):
    return [n.op for n in graph.nodes]


def test_kmeans_traces_and_matches_numpy(rng):
    X, means = kmeans_inputs(rng)
    traced, got = run_traced(kmeans, X, means)
    assert ops(traced.graph) == ["unsqueeze", "sub", "norm", "argmin"]
    assert [i.name for i in traced.graph.inputs] == ["X", "means"]
    assert_same(got, kmeans(X, means))


def test_numpy_fn_traces_and_matches_numpy(rng):
    X, Y = numpy_fn_inputs(rng)
    traced, got = run_traced(numpy_fn, X.copy(), Y.copy())
    want = numpy_fn(X.copy(), Y.copy())
    assert_same(got, want, rtol=1e-12)


def test_masked_assignment_is_a_where(rng):
    X, Y = numpy_fn_inputs(rng, n=10, d=3)
    traced = kiln.jit(numpy_fn).trace(X, Y)
    g = traced.graph
    wheres = [n for n in g.nodes if n.op == "where"]
    assert len(wheres) == 2
    k = len(g.inputs)
    for w in wheres:
        cond = g.nodes[w.inputs[0] - k]
        assert cond.op == "eq"
        # where(X_std == 0, 1, X_std): the condition tests the very value the where replaces
        assert cond.inputs[0] == w.inputs[2]
        assert g.nodes[w.inputs[2] - k].op == "std"
        one = g.nodes[w.inputs[1] - k]
        assert one.op == "constant" and list(one.attrs["value"].tensor.float_values) == [1.0]


@pytest.mark.parametrize("name,fn,makers", CASES, ids=[c[0] for c in CASES])
def test_catalogue_matches_numpy(name, fn, makers, rng):
    args = [m(rng) for m in makers]
    with np.errstate(all="ignore"):
        want = fn(*[a.copy() for a in args])
        _, got = run_traced(fn, *args)
    assert_same(got, want, rtol=1e-12)


def test_weak_scalars_keep_tensor_dtype():
    t = kiln.jit(lambda x: x * 2 + 0.5).trace(np.ones(3, np.float32))
    assert t.output_types == [("f32", (3,))]
    consts = [n.attrs["value"].tensor.dtype for n in t.graph.nodes if n.op == "constant"]
    assert consts and all(d == kiln.graph_pb2.F32 for d in consts)
    t = kiln.jit(lambda x: x + 1.5).trace(np.ones(3, np.int16))
    assert t.output_types == [("f64", (3,))]
    with pytest.raises(OverflowError):
        kiln.jit(lambda x: x + 1000).trace(np.ones(3, np.int8))


def test_int8_comparison_with_large_int_is_allowed(rng):
    x = rng.integers(-100, 100, 10).astype(np.int8)
    _, got = run_traced(lambda v: v < 1000, x)
    assert_same(got, x < 1000)


def test_non_contiguous_and_scalar_args_are_specialised(rng):
    x = rng.standard_normal((4, 6))
    jf = kiln.jit(lambda a, k, scale=1.0: a[:, :k] * scale)
    t1 = jf.trace(x.T, 2, scale=3.0)
    assert [tuple(i.type.shape) for i in t1.graph.inputs] == [(6, 4)]
    assert t1.output_types == [("f64", (6, 2))]
    _, got = run_traced(lambda a: a[:, :2] * 3.0, np.ascontiguousarray(x.T))
    assert_same(got, x.T[:, :2] * 3.0)


@pytest.mark.parametrize(
    "fn,name",
    [
        (lambda x: np.cumsum(x), "numpy.cumsum"),
        (lambda x: np.dot(x, x), "numpy.dot"),
        (lambda x: x @ x, "numpy.matmul"),
        (lambda x: np.sort(x), "numpy.sort"),
        (lambda x: np.nonzero(x), "numpy.nonzero"),
        (lambda x: x[x > 0], "advanced indexing"),
        (lambda x: x[[0, 1], [1, 0]], "advanced indexing"),  # (one integer array alone is a gather)
        (lambda x: x if x.sum() > 0 else -x, "bool()"),
        (lambda x: float(x[0]), "float()"),
        (lambda x: np.asarray(x) + 1, "conversion of a traced array"),
        (lambda x: x.cumprod(), "ndarray.cumprod"),
        (lambda x: np.add.accumulate(x), "numpy.add.accumulate"),
        (lambda x: np.cbrt(x), "numpy.cbrt"),
        (lambda x: np.sum(x, where=x > 0), "numpy.sum(where=...)"),
    ],
)
def test_unsupported_calls_name_the_function(fn, name):
    with pytest.raises(kiln.UnsupportedError) as e:
        kiln.jit(fn).trace(np.arange(5.0))
    assert name in str(e.value)


def test_writes_that_numpy_would_share_are_refused():
    def into_input(x):
        x[x > 0] = 0
        return x

    def into_view(x):
        y = x * 1
        v = y[1:]
        v[0] = 5
        return y

    def with_live_view(x):
        y = x * 1
        v = y[:2]
        y[0] = 5
        return y + v.sum()

    def dead_view_is_fine(x):
        y = x * 1
        s = y[None, :] * 2
        y[0] = 5
        return y, s

    for fn in (into_input, into_view, with_live_view):
        with pytest.raises(kiln.UnsupportedError):
            kiln.jit(fn).trace(np.arange(4.0))
    x = np.arange(4.0)
    _, got = run_traced(dead_view_is_fine, x)
    assert_same(got, dead_view_is_fine(x.copy()))


def test_inplace_casting_rule():
    def f(x):
        y = x * 1
        y += 1.5
        return y

    with pytest.raises(TypeError):
        kiln.jit(f).trace(np.arange(4))


def test_large_captured_array_must_be_an_argument():
    big = np.arange(200_000.0)
    with pytest.raises(kiln.UnsupportedError, match="captured NumPy array"):
        kiln.jit(lambda x: x + big).trace(np.ones(200_000))
    # a uniform one travels as a `full` node, whatever its size
    t = kiln.jit(lambda x: x + np.ones(200_000)).trace(np.ones(200_000))
    assert "full" in ops(t.graph)


def test_node_names_point_at_user_code():
    t = kiln.jit(kmeans).trace(*kmeans_inputs(np.random.default_rng(0), n=4))
    names = [n.name for n in t.graph.nodes]
    assert any("numpy.linalg.norm at sample_fns.py:" in n for n in names), names


def test_returning_only_inputs_or_constants_needs_no_graph():
    x = np.arange(3.0)
    t = kiln.jit(lambda a: (a, 3)).trace(x)
    assert t.graph is None
    assert _rebuild_result(t.result_desc, (), [x])[1] == 3


def test_views_of_views_trace(rng):
    """A transpose (or any view) of a slice is a view of a view: the tracer recorded its root by
    `base._base or base`, which asked a traced array for its truth value and refused the
    function as data-dependent control flow."""
    a = rng.standard_normal((9, 10))

    def fn(x):
        return x[:, :9] - x[:, :9].T + x[:, ::2].T[::-1].sum(axis=0)

    _, got = run_traced(fn, a)
    assert_same(got, fn(a), rtol=1e-12)
