"""Builder graphs compiled by a real kilnd and run through the client, against NumPy."""

from __future__ import annotations

import os

import numpy as np
import pytest

import kiln
from kiln import loader
from graph_eval import evaluate

F64_RTOL = 1e-9
F32_RTOL = 1e-5


def check(compiled, graph, inputs, rtol=None):
    got = compiled(*inputs)
    got = got if isinstance(got, tuple) else (got,)
    want = evaluate(graph, [np.ascontiguousarray(a) for a in inputs])
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype, f"output {i}: {g.dtype} vs {w.dtype}"
        assert g.shape == w.shape, f"output {i}: {g.shape} vs {w.shape}"
        if w.dtype.kind == "f":
            tol = rtol or (F64_RTOL if w.dtype.itemsize == 8 else F32_RTOL if w.dtype.itemsize == 4 else 2e-3)
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol, equal_nan=True, err_msg=f"output {i}")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"output {i}")


def test_softmax_rows_broadcast_and_reductions(client, rng):
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (64, 33))
    w = b.input("w", "f32", (33,))
    y = x * w + 0.5
    z = b.exp(y - b.max(y, axes=[1], keepdim=True))
    sm = z / b.sum(z, axes=[1], keepdim=True)
    g = b.build([sm, b.argmax(sm, axis=1), b.mean(x, axes=[0])])
    c = client.compile(g, "cpu")
    assert len(c.handle) == 64
    # The count agrees with the fusion report, which lists one "kernel kN" line per kernel.
    assert c.stats.num_kernels == sum(1 for ln in c.fusion_report().splitlines() if ln.startswith("kernel ")) > 0
    check(c, g, [rng.standard_normal((64, 33)).astype(np.float32), rng.standard_normal(33).astype(np.float32)])


UNARY_POS = ["exp", "log", "log2", "log1p", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "erf", "reciprocal", "expm1", "exp2", "atan"]
UNARY_ANY = ["neg", "abs", "sign", "floor", "ceil", "round", "trunc", "sinh", "cosh", "isnan", "isinf", "logical_not"]
BINARY = ["add", "sub", "mul", "div", "floordiv", "remainder", "pow", "maximum", "minimum", "atan2", "eq", "ne", "lt", "le", "gt", "ge"]


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_elementwise_ops(client, rng, dtype):
    b = kiln.GraphBuilder()
    shape = (7, 9)
    pos = b.input("pos", dtype, shape)
    x = b.input("x", dtype, shape)
    y = b.input("y", dtype, (9,))
    outs = [b.unary(op, pos) for op in UNARY_POS] + [b.unary(op, x) for op in UNARY_ANY]
    outs += [b.binary(op, pos, b.abs(y) + 0.5) for op in BINARY]
    outs += [b.where(x > y, x, y), b.clamp(x, -0.5, 0.25), b.cast(x * 4, "i32"), b.cast(x, "bool")]
    g = b.build(outs)
    c = client.compile(g, "cpu")
    npdt = kiln.dtypes.to_numpy(dtype)
    inputs = [(rng.random(shape) + 0.05).astype(npdt), rng.standard_normal(shape).astype(npdt) * 3, rng.standard_normal(9).astype(npdt)]
    check(c, g, inputs, rtol=1e-6 if dtype == "f64" else 2e-5)


def test_integer_and_bool_ops(client, rng):
    b = kiln.GraphBuilder()
    a = b.input("a", "i32", (5, 6))
    s = b.input("s", "i64", (6,))
    m = b.input("m", "bool", (5, 6))
    nz = b.abs(s) + 1
    outs = [a + s, a * 3 - s, b.floordiv(a, nz), b.remainder(a, nz), b.maximum(a, s), a & 7, a | s, a ^ 3,
            b.bitwise_not(a), b.logical_and(m, a > 0), b.logical_xor(m, m), b.sum(a, axes=[1]), b.prod(b.clamp(a, 1, 2), axes=[0]),
            b.max(a), b.min(a, axes=[0], keepdim=True), b.any(m, axes=[0]), b.all(m), b.sum(m, axes=[1]), b.mean(a, axes=[1])]
    g = b.build(outs)
    c = client.compile(g, "cpu")
    check(c, g, [rng.integers(-50, 50, (5, 6)).astype(np.int32), rng.integers(-9, 9, 6), rng.random((5, 6)) < 0.5])


def test_reductions_and_layout(client, rng):
    b = kiln.GraphBuilder()
    x = b.input("x", "f64", (4, 5, 6))
    outs = [
        b.sum(x), b.sum(x, axes=[0, 2]), b.mean(x, axes=[-1], keepdim=True), b.var(x, axes=[1]),
        b.std(x, axes=[0, 1], correction=1), b.max(x, axes=[2]), b.min(x, axes=[0]), b.prod(x, axes=[1]),
        b.argmin(x, axis=2), b.argmax(x), b.argmax(x, axis=0, keepdim=True),
        b.permute(x, [2, 0, 1]) * 2, b.reshape(x, (20, -1)) + 1, b.broadcast_to(b.sum(x, axes=[1], keepdim=True), (4, 5, 6)) - x,
        x[1:, ::-2, 3], b.squeeze(b.unsqueeze(x, [0]), [0]) * 1, b.concat([x, x * 2], axis=1),
        b.iota((3, 4), 1, "i64"), b.full((2, 2), 1.5, "f32"), b.constant(np.arange(6.0).reshape(2, 3)) + 1,
    ]
    g = b.build(outs)
    c = client.compile(g, "cpu")
    check(c, g, [rng.standard_normal((4, 5, 6))])


def test_composites(client, rng):
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (6, 16))
    wgt = b.input("w", "f32", (16,))
    bias = b.input("b", "f32", (16,))
    outs = [b.softmax(x, axis=1), b.log_softmax(x), b.logsumexp(x, axes=[1]), b.layer_norm(x, wgt, bias),
            b.norm(x, axes=[1]), b.norm(x, ord=1, axes=[0]), b.norm(x, ord=float("inf")), b.relu(x)]
    g = b.build(outs)
    c = client.compile(g, "cpu")
    inputs = [rng.standard_normal((6, 16)).astype(np.float32), rng.standard_normal(16).astype(np.float32), rng.standard_normal(16).astype(np.float32)]
    got = c(*inputs)
    xv, wv, bv = inputs
    e = np.exp(xv - xv.max(axis=1, keepdims=True))
    sm = e / e.sum(axis=1, keepdims=True)
    mu, var = xv.mean(axis=-1, keepdims=True), xv.var(axis=-1, keepdims=True)
    want = [sm, np.log(sm), np.log(np.exp(xv).sum(axis=1)), (xv - mu) / np.sqrt(var + 1e-5) * wv + bv,
            np.linalg.norm(xv, axis=1), np.abs(xv).sum(axis=0), np.abs(xv).max(), np.maximum(xv, 0)]
    for i, (gv, wv_) in enumerate(zip(got, want)):
        np.testing.assert_allclose(gv, wv_, rtol=1e-4, atol=1e-5, err_msg=f"output {i}")


def test_scalar_shaped_full_and_empty_list_attributes(client, rng):
    """An empty ``ints`` attribute (the shape of a scalar) is a value, not a missing one."""
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (5,))
    two = b.full((), 2.5, "f32")
    g = b.build([b.binary("mul", x, two), two])
    xv = rng.standard_normal(5).astype(np.float32)
    got = client.compile(g, "cpu")(xv)
    np.testing.assert_allclose(got[0], xv * np.float32(2.5), rtol=1e-6)
    assert got[1].shape == () and float(got[1]) == 2.5


@pytest.mark.parametrize("shape", [(6, 8), (300, 40)])
def test_column_reduction_beside_a_whole_tensor_reduction(client, rng, shape):
    """A column max (lane tiles) minus the mean of row minima (a whole-tensor reduction in the
    same kernel's prologue): the prologue's loops are not lane loops."""
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", shape)
    g = b.build([b.binary("sub", b.reduce("max", x, axes=[0]), b.reduce("mean", b.reduce("min", x, axes=[1])))])
    xv = rng.standard_normal(shape).astype(np.float32)
    got = client.compile(g, "cpu")(xv)
    np.testing.assert_allclose(got, xv.max(0) - xv.min(1).mean(), rtol=1e-5, atol=1e-6)


def test_non_contiguous_inputs_are_copied(client, rng):
    b = kiln.GraphBuilder()
    x = b.input("x", "f64", (6, 4))
    y = b.input("y", "f64", (4,))
    g = b.build(b.sum(x * y, axes=[1]))
    c = client.compile(g, "cpu")
    base = rng.standard_normal((4, 6))
    ybase = rng.standard_normal(8)
    got = c(base.T, ybase[::2])  # a transposed and a strided view
    np.testing.assert_allclose(got, (base.T * ybase[::2]).sum(axis=1), rtol=1e-12)


def test_declared_strides_take_views_without_copying(client, rng):
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (6, 4), strides=(1, 6))  # the transpose of a (4, 6) array
    g = b.build(x * 2 + b.sum(x, axes=[0], keepdim=True))
    c = client.compile(g, "cpu")
    base = rng.standard_normal((4, 6)).astype(np.float32)
    got = c(base.T)
    np.testing.assert_allclose(got, base.T * 2 + base.T.sum(axis=0, keepdims=True), rtol=1e-5)
    with pytest.raises(ValueError, match="strides"):
        c(np.ascontiguousarray(base.T))


def test_bad_inputs_are_rejected_by_the_client(client):
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (3,))
    c = client.compile(b.build(b.exp(x)), "cpu")
    with pytest.raises(TypeError, match="dtype"):
        c(np.ones(3))
    with pytest.raises(ValueError, match="shape"):
        c(np.ones(4, np.float32))
    with pytest.raises(TypeError, match="takes 1 inputs"):
        c()


def test_compile_errors_name_the_node(client):
    g = kiln.graph_pb2.Graph()
    i = g.inputs.add(name="x")
    i.type.dtype = kiln.graph_pb2.F32
    i.type.shape.extend([4])
    g.nodes.add(op="no_such_op", inputs=[0], name="the_bad_node")
    g.outputs.append(1)
    with pytest.raises(kiln.CompileError) as e:
        client.compile(g, "cpu")
    assert e.value.code == "INVALID_ARGUMENT"
    assert "no_such_op" in e.value.details
    # the daemon keeps serving
    assert client.stats().requests > 0


def test_cache_hit_and_lookup(client, rng):
    b = kiln.GraphBuilder()
    x = b.input("x", "f64", (10,))
    g = b.build(b.tanh(x) * 0.123456)
    assert client.lookup(g, "cpu") is None
    first = client.compile(g, "cpu")
    again = client.compile(g, "cpu")
    assert again.handle == first.handle and again.cache_hit
    looked = client.lookup(g, "cpu")
    assert looked is not None and looked.handle == first.handle
    assert client.get(first.handle).handle == first.handle
    # another ISA level is another key
    other = client.compile(g, "cpu:x86-64-v2")
    assert other.handle != first.handle


def test_artifacts_fetched_once_verified_and_loaded_once(server, tmp_path, rng):
    b = kiln.GraphBuilder()
    x = b.input("x", "f64", (5,))
    g = b.build(b.sqrt(b.abs(x)) + 0.987)
    downloads = []
    with kiln.Client(server, cache_dir=tmp_path / "cache") as c1:
        real = c1._download
        c1._download = lambda *a, **k: downloads.append(a[0]) or real(*a, **k)
        comp = c1.compile(g, "cpu")
        xv = rng.standard_normal(5)
        np.testing.assert_allclose(comp(xv), np.sqrt(np.abs(xv)) + 0.987)
        so = comp.artifact("SHARED_OBJECT")
        path = c1.cache.path_for(so.digest)
        assert path.is_file() and kiln.core.sha256_hex(path.read_bytes()) == so.digest
        n_loaded = loader.loaded_kernel_count()
        again = c1.get(comp.handle)
        np.testing.assert_allclose(again(xv), np.sqrt(np.abs(xv)) + 0.987)
        assert downloads == [so.digest]
        assert loader.loaded_kernel_count() == n_loaded
    # a corrupted local copy is detected and fetched again. The file is replaced, not
    # rewritten in place: this process still has the library mapped, and truncating a mapped
    # file under it would crash the process later (SIGBUS).
    bad = path.with_name(path.name + ".bad")
    bad.write_bytes(b"garbage")
    os.replace(bad, path)
    with kiln.Client(server, cache_dir=tmp_path / "cache") as c2:
        p = c2.fetch(so.digest)
        assert kiln.core.sha256_hex(p.read_bytes()) == so.digest


def test_source_and_fusion_report(client):
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (32, 8))
    g = b.build(b.sum(b.exp(x), axes=[1]))
    c = client.compile(g, "cpu")
    src = c.source()
    assert "kiln_run" in src
    # One kernel: exp fused into the row sum, stored to the output.
    report = c.fusion_report()
    kernels = [ln for ln in report.splitlines() if ln.startswith("kernel ")]
    assert len(kernels) == 1 and c.stats.num_kernels == 1, report
    assert "stores out0" in kernels[0] and ":exp" in report and ":sum" in report, report


def test_stats_and_health(client):
    s = client.stats()
    assert s.requests >= 1 and s.workers >= 1
    assert client.health() == "SERVING"
