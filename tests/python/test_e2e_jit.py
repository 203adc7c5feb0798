"""kiln.jit against a real kilnd: the acceptance functions, the catalogue, caching."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from helpers import assert_labels_match, assert_same
from sample_fns import CASES, kmeans, kmeans_inputs, numpy_fn, numpy_fn_inputs


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_kmeans_matches_numpy(client, rng, dtype):
    X, means = kmeans_inputs(rng, n=20000, k=7, dtype=dtype)
    jf = kiln.jit(kmeans, client=client)
    labels = jf(X, means)
    assert_labels_match(labels, X, means, kmeans(X, means))


def test_numpy_fn_matches_numpy(client, rng):
    X, Y = numpy_fn_inputs(rng, n=3000, d=8)
    jf = kiln.jit(numpy_fn, client=client)
    got = jf(X.copy(), Y.copy())
    assert_same(got, numpy_fn(X.copy(), Y.copy()), rtol=1e-9)
    # the caller's arrays are untouched (the masked assignment only rebinds traced values)
    X2, Y2 = numpy_fn_inputs(rng, n=3000, d=8)
    X2c, Y2c = X2.copy(), Y2.copy()
    jf(X2, Y2)
    np.testing.assert_array_equal(X2, X2c)
    np.testing.assert_array_equal(Y2, Y2c)


def numpy_fn_before_clip(X, Y):
    """numpy_fn's per-row sums r and its last term, without the clip and exp between them."""
    X_mean, X_std = X.mean(axis=0), X.std(axis=0)
    Y_mean, Y_std = Y.mean(axis=0), Y.std(axis=0)
    X_std[X_std == 0] = 1
    Y_std[Y_std == 0] = 1
    Xn = (X - X_mean) / X_std
    Yn = (Y - Y_mean) / Y_std
    r = np.sum(Xn[:, :, None] * Yn[:, None, :], axis=(-2, -1))
    return r, 0.001 * np.sum(Xn ** 2 + Yn ** 2, axis=1)


def test_numpy_fn_sums_before_the_clip_match_numpy(client, rng):
    """numpy_fn clips its per-row sums to [-1, 1] before exp: on its inputs most of them lie
    outside, where a wrong sum of the right sign gives the right result. The clip is the seed
    function's, not a tolerance of this check: the sums themselves must match NumPy."""
    X, Y = numpy_fn_inputs(rng, n=3000, d=8)
    r, rest = numpy_fn_before_clip(X.copy(), Y.copy())
    assert np.mean(np.abs(r) > 1) > 0.5, "the inputs put most sums beyond the clip (the case this test is for)"
    assert_same(kiln.jit(numpy_fn_before_clip, client=client)(X.copy(), Y.copy()), (r, rest), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name,fn,makers", CASES, ids=[c[0] for c in CASES])
def test_catalogue_matches_numpy(client, rng, name, fn, makers):
    args = [m(rng) for m in makers]
    with np.errstate(all="ignore"):
        want = fn(*[a.copy() for a in args])
    got = kiln.jit(fn, client=client)(*args)
    assert_same(got, want, rtol=1e-7, atol=1e-9)


def test_compiled_once_per_signature(client, rng):
    calls = []

    def f(x, scale):
        calls.append(1)
        return np.tanh(x) * scale

    jf = kiln.jit(f, client=client)
    x = rng.standard_normal((10, 3))
    for _ in range(3):
        np.testing.assert_allclose(jf(x, 2.0), np.tanh(x) * 2.0, rtol=1e-9)
    assert (jf.compile_count, jf.signatures, len(calls)) == (1, 1, 1)
    jf(rng.standard_normal((10, 3)), 2.0)  # same signature, new data
    assert jf.compile_count == 1
    jf(x[:5], 2.0)  # new shape
    jf(x.astype(np.float32), 2.0)  # new dtype
    jf(x, 3.0)  # a Python scalar is a constant: a new signature
    assert (jf.compile_count, jf.signatures) == (4, 4)
    jf(np.asfortranarray(x), 2.0)  # layout is not part of the signature
    assert jf.compile_count == 4
    np.testing.assert_allclose(jf(np.asfortranarray(x), 2.0), np.tanh(x) * 2.0, rtol=1e-9)


def test_positional_calls_bind_like_the_signature(client, rng):
    """Positional calls take a binding shortcut: the same signatures as keyword calls, defaults
    filled in, and the same errors for too few or too many arguments."""

    def f(x, y, scale=2.0):
        return (x + y) * scale

    jf = kiln.jit(f, client=client)
    x, y = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    np.testing.assert_allclose(jf(x, y), (x + y) * 2.0, rtol=1e-12)
    np.testing.assert_allclose(jf(x, y=y), (x + y) * 2.0, rtol=1e-12)
    assert jf.compile_count == 1  # positional and keyword calls share the signature
    np.testing.assert_allclose(jf(x, y, 3.0), (x + y) * 3.0, rtol=1e-12)
    with pytest.raises(TypeError):
        jf(x)
    with pytest.raises(TypeError):
        jf(x, y, 1.0, 2.0)


def test_repeated_array_calls_skip_the_binding(client, rng, monkeypatch):
    """A call of arrays only, with dtypes and shapes seen before, goes straight to its entry;
    anything new (a shape, a dtype, a constant argument) takes the full binding, and automatic
    dynamic shapes still compile at most twice."""

    def f(x, y):
        return np.tanh(x) * y, x

    jf = kiln.jit(f, client=client)
    x, y = rng.standard_normal((6, 5)), rng.standard_normal((6, 5))
    jf(x, y)
    binds = []
    bind = jf._bind
    monkeypatch.setattr(jf, "_bind", lambda *a: binds.append(1) or bind(*a))
    for _ in range(3):
        x2, y2 = rng.standard_normal((6, 5)), rng.standard_normal((6, 5))
        got, same = jf(x2, y2)
        np.testing.assert_allclose(got, np.tanh(x2) * y2, rtol=1e-12)
        assert same is x2  # a returned input is the argument itself
    assert binds == []
    for n in (7, 9, 11, 7):
        xn, yn = rng.standard_normal((n, 5)), rng.standard_normal((n, 5))
        np.testing.assert_allclose(jf(xn, yn)[0], np.tanh(xn) * yn, rtol=1e-12)
    assert len(binds) == 3  # 7, 9, 11 once each; 7 again from the fast entry
    np.testing.assert_allclose(jf(x.astype(np.float32), y.astype(np.float32))[0],
                               np.tanh(x.astype(np.float32)) * y.astype(np.float32), rtol=1e-5)
    assert len(binds) == 4 and jf.compile_count == 3  # static, symbolic, float32


def test_unsupported_call_raises_before_compiling(client):
    jf = kiln.jit(lambda x: np.cumsum(x) + 1, client=client)
    with pytest.raises(kiln.UnsupportedError, match="numpy.cumsum"):
        jf(np.arange(4.0))
    assert jf.compile_count == 0


def test_decorator_forms(client, rng):
    @kiln.jit(client=client, target="cpu")
    def g(x, *, k=2):
        return x[:, :k].sum(axis=1)

    x = rng.standard_normal((4, 5))
    np.testing.assert_allclose(g(x), x[:, :2].sum(axis=1), rtol=1e-12)
    np.testing.assert_allclose(g(x, k=3), x[:, :3].sum(axis=1), rtol=1e-12)
    assert g.__name__ == "g"


def test_take_and_integer_array_indexing_match_numpy(client, rng):
    """np.take (every mode, axis None too), np.take_along_axis (the argmax-then-gather idiom)
    and indexing with one integer array among full slices run as kiln gathers; every result
    equals NumPy's, and a second size of the ids reuses the compile (automatic dynamic)."""
    table = rng.standard_normal((40, 6))
    cols = np.array([5, 0, 2, 2, -1])

    def f(x, ids):
        best = np.take_along_axis(x, np.argmax(x, axis=1)[:, None], axis=1)
        return (x[ids], x[:, cols] * 2.0, np.take(x, ids, axis=0, mode="clip"),
                np.take(x, ids - 3, axis=0, mode="wrap"), np.take(x, 7), best, np.take(x, ids, axis=None))

    jf = kiln.jit(f, client=client)
    for n in (9, 13, 17):
        ids = rng.integers(0, 40, size=(3, n))
        got = jf(table, ids)
        want = f(table, ids)
        assert_same(got, want, rtol=1e-12)
    assert jf.compile_count <= 2
    # "clip" and "wrap" are NumPy's exactly, out of range too.
    g = kiln.jit(lambda x, i: (np.take(x, i, axis=0, mode="clip"), np.take(x, i, axis=0, mode="wrap")),
                 client=client)
    wild = np.array([-50, -1, 0, 39, 41, 1000])
    assert_same(g(table, wild), (np.take(table, wild, axis=0, mode="clip"), np.take(table, wild, axis=0, mode="wrap")))
    with pytest.raises(kiln.UnsupportedError, match="advanced indexing"):
        kiln.jit(lambda x, i: x[i, i], client=client)(table, np.array([1, 2]))


def test_out_of_bounds_indices_raise_numpys_index_error(client, rng):
    """An index argument outside [-n, n) raises NumPy's IndexError before anything runs (the
    kernels' gathers would clamp it), through x[ids], x[:, ids], np.take and take_along_axis,
    for exact and symbolic-size compiles alike; a captured index array is checked when traced.
    The function keeps working for in-range calls afterwards."""
    def f(x, ids, cols, along):
        return x[ids] * 2.0, x[:, cols], np.take(x, ids, axis=0), np.take_along_axis(x, along, axis=1)

    jf = kiln.jit(f, client=client)
    for rows in (40, 57, 23):  # the second size compiles with symbolic sizes
        table = rng.standard_normal((rows, 6))
        ids = np.array([0, -rows, rows - 1, 3])
        cols = np.array([5, -6, 0])
        along = rng.integers(-6, 6, size=(rows, 2))
        assert_same(jf(table, ids, cols, along), f(table, ids, cols, along), rtol=1e-12)
        for bad_ids, bad_cols, bad_along, axis, size, index in (  # shapes as above: no new compile
                (np.array([0, rows, 1, 2]), cols, along, 0, rows, rows),
                (np.array([-rows - 1, 2, 1, 0]), cols, along, 0, rows, -rows - 1),
                (ids, np.array([5, 6, 0]), along, 1, 6, 6),
                (ids, cols, np.full((rows, 2), -7), 1, 6, -7)):
            with pytest.raises(IndexError, match=f"index {index} is out of bounds for axis {axis} with size {size}"):
                f(table, bad_ids, bad_cols, bad_along)  # NumPy's own error, for reference
            with pytest.raises(IndexError, match=f"index {index} is out of bounds for axis {axis} with size {size}"):
                jf(table, bad_ids, bad_cols, bad_along)
        assert_same(jf(table, ids, cols, along), f(table, ids, cols, along), rtol=1e-12)
    assert jf.compile_count <= 2

    with pytest.raises(IndexError, match="index 9 is out of bounds for axis 0 with size 4"):
        kiln.jit(lambda x: x[np.array([1, 9])], client=client)(np.zeros(4))
    with pytest.raises(IndexError, match="index 4 is out of bounds for axis 0 with size 4"):
        kiln.jit(lambda x: np.take(x, 4), client=client)(np.zeros(4))
