"""Op-by-op suite: every op of kernels/ir/OPS.md, compiled by the real daemon and run on random
data, against NumPy. Inputs reach each op through views (permute + strided slice of a
contiguous buffer), through broadcasting, and at odd and size-1 shapes, so the index
arithmetic of the lowering is exercised along with the op itself.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

import kiln

NP = {"f16": np.float16, "f32": np.float32, "f64": np.float64, "i8": np.int8, "i16": np.int16,
      "i32": np.int32, "i64": np.int64, "u8": np.uint8, "bool": np.bool_}
FLOATS = ["f16", "f32", "f64"]
INTS = ["i8", "i16", "i32", "i64", "u8"]
TOL = {"f16": (2e-3, 2e-3), "f32": (2e-6, 1e-6), "f64": (1e-12, 1e-13)}


def random_array(rng: np.random.Generator, dtype: str, shape: tuple[int, ...], domain: str = "any") -> np.ndarray:
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype in INTS:
        info = np.iinfo(NP[dtype])
        lo, hi = max(info.min, -100), min(info.max, 100)
        if domain == "positive":
            lo = 1
        return rng.integers(lo, hi + 1, size=shape).astype(NP[dtype])
    if domain == "positive":
        a = rng.uniform(0.05, 4.0, size=shape)
    elif domain == "unit":
        a = rng.uniform(-0.99, 0.99, size=shape)
    elif domain == "small":
        a = rng.uniform(-3.0, 3.0, size=shape)
    else:
        a = rng.standard_normal(shape) * 3
    return a.astype(NP[dtype])


def check(got: np.ndarray, want: np.ndarray, dtype: str, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    if got.dtype.kind == "f":
        rtol, atol = TOL.get(str(dtype), TOL["f32"]) if dtype in TOL else TOL[{np.float16: "f16", np.float32: "f32", np.float64: "f64"}[got.dtype.type]]
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol,
                                   equal_nan=True, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def strided_view(b: kiln.GraphBuilder, name: str, dtype: str, shape: tuple[int, int], host: np.ndarray):
    """A graph input of shape (2*c, r) read as x[::2].T -> (r, c): a permuted, strided view."""
    r, c = shape
    x = b.input(name, dtype, (2 * c, r))
    v = b.slice(x, axes=[0], starts=[0], stops=[2 * c], steps=[2])
    return b.permute(v, [1, 0]), host[::2].T


UNARY = {
    "neg": (np.negative, "any"), "abs": (np.abs, "any"), "sign": (np.sign, "any"),
    "exp": (np.exp, "small"), "exp2": (np.exp2, "small"), "expm1": (np.expm1, "small"),
    "log": (np.log, "positive"), "log2": (np.log2, "positive"), "log1p": (np.log1p, "positive"),
    "sqrt": (np.sqrt, "positive"), "rsqrt": (lambda a: 1 / np.sqrt(a), "positive"),
    "sin": (np.sin, "any"), "cos": (np.cos, "any"), "tan": (np.tan, "unit"), "tanh": (np.tanh, "any"),
    "asin": (np.arcsin, "unit"), "acos": (np.arccos, "unit"), "atan": (np.arctan, "any"),
    "sinh": (np.sinh, "small"), "cosh": (np.cosh, "small"),
    "sigmoid": (lambda a: 1 / (1 + np.exp(-a)), "any"),
    "erf": (None, "any"), "floor": (np.floor, "any"), "ceil": (np.ceil, "any"), "round": (np.round, "any"),
    "trunc": (np.trunc, "any"), "reciprocal": (np.reciprocal, "positive"),
    "logical_not": (np.logical_not, "any"), "isnan": (np.isnan, "any"), "isinf": (np.isinf, "any"),
}
FLOAT_MATH = {"exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh",
              "asin", "acos", "atan", "sinh", "cosh", "sigmoid", "erf", "reciprocal"}


def np_erf(a: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(a.astype(np.float64)).astype(a.dtype)


def float_result(dtype: str) -> str:
    return dtype if dtype in FLOATS else {"bool": "f16", "i8": "f16", "u8": "f16", "i16": "f32"}.get(dtype, "f64")


# neg/sign of unsigned are rejected by the type rules (tested in the type-rule tests).
UNARY_CASES = [(op, dtype) for op in sorted(UNARY) for dtype in FLOATS + ["i32", "u8"]
               if not (dtype == "u8" and op in ("neg", "sign"))]


@pytest.mark.parametrize("op, dtype", UNARY_CASES)
def test_unary(client, rng, op: str, dtype: str) -> None:
    fn, domain = UNARY[op]
    b = kiln.GraphBuilder()
    host = random_array(rng, dtype, (2 * 13, 7), domain)
    if dtype in FLOATS and op in ("isnan", "isinf", "abs", "sign", "floor", "round"):
        host.flat[::5] = np.nan
        host.flat[1::7] = np.inf
        host.flat[2::11] = -np.inf
        host.flat[3::13] = -0.0
        if op == "round":
            host.flat[4::9] = 2.5
    xv, xnp = strided_view(b, "x", dtype, (7, 13), host)
    g = b.build([b.unary(op, xv)])
    got = client.compile(g)(host)
    ref_in = xnp
    if op in FLOAT_MATH:
        ref_in = xnp.astype(NP[float_result(dtype)])
    if op == "erf":
        want = np_erf(ref_in)
    else:
        with np.errstate(all="ignore"):
            want = fn(ref_in)
    if op in ("floor", "ceil", "round", "trunc") and dtype not in FLOATS:
        want = xnp.copy()
    if op == "rsqrt" or op == "sigmoid":
        want = want.astype(ref_in.dtype)
    check(got, np.asarray(want), float_result(dtype) if op in FLOAT_MATH else dtype, f"{op}({dtype})")


BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
    "floordiv": np.floor_divide, "remainder": np.remainder, "pow": np.power,
    "maximum": np.maximum, "minimum": np.minimum, "atan2": np.arctan2,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
    "logical_and": np.logical_and, "logical_or": np.logical_or, "logical_xor": np.logical_xor,
    "bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor,
}


def _binary_applies(op: str, dtypes: tuple[str, str]) -> bool:
    """Bitwise ops take integers; sub, floordiv, remainder and pow are not defined for bool;
    atan2 is covered for floats."""
    floaty = dtypes[0] in FLOATS or dtypes[1] in FLOATS
    if op.startswith("bitwise") and floaty:
        return False
    if "bool" in dtypes and op in ("sub", "floordiv", "remainder", "pow"):
        return False
    return not (op == "atan2" and not floaty)


BINARY_CASES = [(op, dtypes) for op in sorted(BINARY)
                for dtypes in [("f32", "f32"), ("f64", "f64"), ("f16", "f16"), ("i32", "i32"),
                               ("i8", "u8"), ("i64", "i64"), ("i32", "f32"), ("bool", "bool")]
                if _binary_applies(op, dtypes)]


# Ops whose results hinge on equal operands and NaN (IEEE: every comparison with NaN is false,
# except ne; maximum and minimum propagate NaN).
COMPARE_LIKE = {"eq", "ne", "lt", "le", "gt", "ge", "maximum", "minimum"}


@pytest.mark.parametrize("op, dtypes", BINARY_CASES)
def test_binary_broadcast(client, rng, op: str, dtypes: tuple[str, str]) -> None:
    da, db = dtypes
    floaty = da in FLOATS or db in FLOATS
    b = kiln.GraphBuilder()
    a_host = random_array(rng, da, (7, 1, 5), "positive" if op == "pow" else "any")
    b_host = random_array(rng, db, (4, 5), "positive" if op in ("floordiv", "remainder", "pow") and not floaty else
                          ("small" if op == "pow" else "any"))
    if op == "pow" and not floaty:
        b_host = rng.integers(0, 4, size=(4, 5)).astype(NP[db])
    if op in COMPARE_LIKE:
        # Equal operands somewhere: out[i, j, k] compares a[i, 0, k] with b[j, k].
        if db in FLOATS or da == db:
            b_host[0, :] = a_host[0, 0, :]
            b_host[2, ::2] = a_host[3, 0, ::2]
        else:
            a_host[0, 0, :] = b_host[0, :]
            a_host[3, 0, ::2] = b_host[2, ::2]
        # NaN on either side, and on both.
        if da in FLOATS:
            a_host.flat[::3] = np.nan
        if db in FLOATS:
            b_host[1, 1::2] = np.nan
            b_host[3, 0] = np.nan
    if op.startswith("logical") and "bool" not in dtypes:
        a_host.flat[::4] = 0  # false operands too (random numbers are all true)
        b_host[1, ::2] = 0
    x = b.input("a", da, a_host.shape)
    y = b.input("b", db, b_host.shape)
    g = b.build([b.binary(op, x, y)])
    got = client.compile(g)(a_host, b_host)
    with np.errstate(all="ignore"):
        want = BINARY[op](a_host, b_host)
    if want.dtype == np.bool_:
        assert want.any() and not want.all(), f"{op}({da},{db}): a constant expected result tests nothing"
    check(got, want, str(want.dtype), f"{op}({da},{db})")


@pytest.mark.parametrize("dtype", ["f16", "f32", "f64"])
def test_float_division_by_zero_follows_ieee(client, dtype: str) -> None:
    """x / ±0 is ±inf or NaN; floordiv follows true division there and remainder gives NaN,
    as NumPy does."""
    b = kiln.GraphBuilder()
    x = b.input("a", dtype, (8,))
    y = b.input("b", dtype, (8,))
    g = b.build([b.binary(op, x, y) for op in ("div", "floordiv", "remainder")])
    a = np.array([7, -7, 0, 2.5, -0.0, np.nan, np.inf, -np.inf], NP[dtype])
    z = np.array([0, 0, 0, -0.0, 0, 0, -0.0, 0], NP[dtype])
    got = client.compile(g)(a, z)
    with np.errstate(all="ignore"):
        wants = [np.true_divide(a, z), np.floor_divide(a, z), np.remainder(a, z)]
    for op, g_, w in zip(("div", "floordiv", "remainder"), got, wants):
        check(g_, w, dtype, f"{op}({dtype}) by zero")
        np.testing.assert_array_equal(np.signbit(g_), np.signbit(w), err_msg=f"{op}({dtype}) by zero: signs")


@pytest.mark.parametrize("dtype", ["i32", "i16"])
def test_integer_division_by_zero_gives_zero(client, dtype: str) -> None:
    b = kiln.GraphBuilder()
    x = b.input("a", dtype, (6,))
    y = b.input("b", dtype, (6,))
    g = b.build([b.binary("floordiv", x, y), b.binary("remainder", x, y)])
    a = np.array([7, -7, 0, 5, -128 if dtype == "i8" else -5, 9], NP[dtype])
    z = np.zeros(6, NP[dtype])
    fd, rm = client.compile(g)(a, z)
    assert (fd == 0).all() and (rm == 0).all()


def test_where_clamp_cast(client, rng) -> None:
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (9, 11))
    y = b.input("y", "f64", (11,))
    c = b.gt(x, 0.5)
    w = b.where(c, x, y)
    cl = b.clamp(x, min=-0.25, max=0.75)
    ci = b.cast(x, "i32")
    cb = b.cast(x, "bool")
    ch = b.cast(b.cast(x, "bf16"), "f32")
    g = b.build([w, cl, ci, cb, ch])
    xh = random_array(rng, "f32", (9, 11))
    xh[0, 0] = np.nan
    yh = random_array(rng, "f64", (11,))
    got = client.compile(g)(xh, yh)
    check(got[0], np.where(xh > 0.5, xh, yh), "f64", "where")
    check(got[1], np.clip(xh, -0.25, 0.75), "f32", "clamp")
    with np.errstate(invalid="ignore"):
        want_i = xh.astype(np.int32)
    np.testing.assert_array_equal(got[2].ravel()[1:], want_i.ravel()[1:])  # NaN->int is undefined
    check(got[3], xh.astype(bool), "bool", "cast bool")
    np.testing.assert_allclose(got[4], xh, rtol=8e-3, equal_nan=True)  # bf16 keeps 8 bits


REDUCTIONS = ["sum", "prod", "max", "min", "mean", "any", "all", "var", "std"]


def truthiness_inputs(rng: np.random.Generator, dtype: str, shape: tuple[int, ...], axes) -> list[np.ndarray]:
    """Inputs for any/all: five arrays in which each reduced slice is, in turn, all true, all
    false, true in one place, false in one place, and mixed. Random data would make nearly
    every slice all true (numbers) or mixed (bool), so a kernel returning a constant would pass.
    True numbers include NaN; false ones include -0.0."""
    nd = len(shape)
    red = list(range(nd)) if axes is None else sorted(a % nd for a in axes)
    keep = [a for a in range(nd) if a not in red]
    m = int(np.prod([shape[a] for a in keep], dtype=np.int64))
    k = int(np.prod([shape[a] for a in red], dtype=np.int64))
    perm = keep + red
    out = []
    for shift in range(5):
        truth = np.empty((m, k), bool)
        for row in range(m):
            kind = (row + shift) % 5
            if kind == 4:
                truth[row] = rng.random(k) < 0.5
            else:
                truth[row] = kind in (0, 3)
                if kind in (2, 3):
                    truth[row, rng.integers(k)] = kind == 2
        if dtype == "bool":
            vals = truth
        elif dtype in INTS:
            vals = rng.integers(1, 20, size=(m, k)) * rng.choice([-1, 1], size=(m, k))
            vals = np.where(truth, vals, 0).astype(NP[dtype])
        else:
            vals = rng.standard_normal((m, k)) + np.where(rng.random((m, k)) < 0.5, 1.0, -1.0)
            vals[rng.random((m, k)) < 0.05] = np.nan
            vals = np.where(truth, vals, np.where(rng.random((m, k)) < 0.5, 0.0, -0.0)).astype(NP[dtype])
        arr = vals.reshape([shape[a] for a in perm]).transpose(np.argsort(perm))
        out.append(np.ascontiguousarray(arr))
    return out



# bool is covered for the counting reductions only; keepdim over the last axis for f32 only.
REDUCTION_CASES = [(op, dtype, axes, keepdim) for op in REDUCTIONS for dtype in ["f32", "f64", "i32", "bool"]
                   for axes in [(1,), (0, 2), (2,), None] for keepdim in [False, True]
                   if not (dtype == "bool" and op in ("max", "min", "var", "std", "mean", "prod"))
                   and not (dtype != "f32" and keepdim and axes == (2,))]


@pytest.mark.parametrize("op, dtype, axes, keepdim", REDUCTION_CASES)
def test_reductions(client, rng, op: str, dtype: str, axes, keepdim: bool) -> None:
    shape = (5, 7, 9)
    if op in ("any", "all"):
        hosts = truthiness_inputs(rng, dtype, shape, axes)
    else:
        hosts = [random_array(rng, dtype, shape, "small")]
    if op == "prod" and dtype in FLOATS:
        hosts = [rng.uniform(0.8, 1.25, size=shape).astype(NP[dtype])]
    b = kiln.GraphBuilder()
    x = b.input("x", dtype, shape)
    r = b.reduce(op, x, axes=list(axes) if axes else None, keepdim=keepdim,
                 correction=1.0 if op in ("var", "std") else None)
    compiled = client.compile(b.build([r]))
    ax = axes if axes else None
    kw = {"axis": ax, "keepdims": keepdim}
    seen = set()
    for host in hosts:
        got = compiled(host)
        if op in ("var", "std"):
            want = getattr(np, op)(host, ddof=1, **kw)
        else:
            want = getattr(np, op)(host, **kw)
        want = np.asarray(want)
        if op in ("sum", "prod") and dtype in ("i32", "bool"):
            want = want.astype(np.int64)
        seen.update(np.unique(want).tolist() if want.dtype == np.bool_ else ())
        check(got, want, str(want.dtype), f"{op}{axes} keepdim={keepdim} {dtype}")
    if op in ("any", "all"):
        assert seen == {False, True}, f"{op}: the inputs never made the result both true and false"


@pytest.mark.parametrize("dtype", ["f32", "f64", "i32", "u8"])
@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_arg_reductions(client, rng, op: str, dtype: str) -> None:
    shape = (6, 17, 4)
    host = random_array(rng, dtype, shape)
    if dtype in INTS:
        host = rng.integers(0, 5, size=shape).astype(NP[dtype])  # many ties: first index wins
    else:
        host[2, 5, 1] = np.nan  # NaN wins
    for axis, keepdim in [(1, False), (0, True), (-1, False), (None, False)]:
        b = kiln.GraphBuilder()
        x = b.input("x", dtype, shape)
        got = client.compile(b.build([getattr(b, op)(x, axis=axis, keepdim=keepdim)]))(host)
        want = np.asarray(getattr(np, op)(host, axis=axis, keepdims=keepdim if axis is not None else False))
        check(got, want.astype(np.int64), "i64", f"{op} axis={axis} {dtype}")


def test_layout_ops(client, rng) -> None:
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (4, 6, 5))
    y = b.input("y", "f32", (6, 1))
    outs = [
        b.reshape(x, (24, 5)),
        b.reshape(b.permute(x, [2, 0, 1]), (5, -1)),
        b.squeeze(b.unsqueeze(x, [0, 3]), [0]),
        b.slice(x, axes=[1, 2], starts=[5, 1], stops=[-7, 100], steps=[-2, 3]),
        b.concat([x, b.broadcast_to(y, (4, 6, 5)), x], axis=2),
        b.broadcast_to(y, (3, 6, 7)),
        b.iota((3, 4), axis=1, dtype="i32"),
        b.full((2, 3), 2.5, "f64"),
        b.add(x, b.constant(np.arange(5, dtype=np.float32))),
    ]
    xh = random_array(rng, "f32", (4, 6, 5))
    yh = random_array(rng, "f32", (6, 1))
    got = client.compile(b.build(outs))(xh, yh)
    wants = [
        xh.reshape(24, 5), xh.transpose(2, 0, 1).reshape(5, -1), xh[:, :, None],
        xh[:, 5:-7:-2, 1:100:3], np.concatenate([xh, np.broadcast_to(yh, (4, 6, 5)), xh], axis=2),
        np.broadcast_to(yh, (3, 6, 7)), np.broadcast_to(np.arange(4, dtype=np.int32), (3, 4)),
        np.full((2, 3), 2.5), xh + np.arange(5, dtype=np.float32),
    ]
    for i, (g_, w) in enumerate(zip(got, wants)):
        check(g_, np.ascontiguousarray(w), str(w.dtype), f"layout output {i}")


def test_composites(client, rng) -> None:
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (8, 33))
    w = b.input("w", "f32", (33,))
    bias = b.input("bias", "f32", (33,))
    outs = [
        b.softmax(x, axis=-1), b.softmax(x, axis=0), b.log_softmax(x, axis=1),
        b.logsumexp(x, axes=[1]), b.layer_norm(x, w, bias, eps=1e-5),
        b.norm(x, ord=2.0, axes=[1]), b.norm(x, ord=1.0, axes=[0], keepdim=True), b.norm(x, ord=math.inf, axes=[1]),
        b.gelu(x), b.gelu(x, approximate="tanh"), b.elu(x, alpha=0.7), b.silu(x), b.relu(x),
        b.leaky_relu(x, negative_slope=0.1), b.hardtanh(x, -0.5, 0.5), b.softplus(x, beta=2.0, threshold=5.0),
        b.clip(x, -1.0, 1.0),
    ]
    xh = random_array(rng, "f32", (8, 33))
    wh = random_array(rng, "f32", (33,))
    bh = random_array(rng, "f32", (33,))
    got = client.compile(b.build(outs))(xh, wh, bh)
    x64 = xh.astype(np.float64)
    e = np.exp(x64 - x64.max(1, keepdims=True))
    mu = x64.mean(1, keepdims=True)
    var = x64.var(1, keepdims=True)
    erf = np.vectorize(math.erf)
    wants = [
        e / e.sum(1, keepdims=True),
        np.exp(x64 - x64.max(0, keepdims=True)) / np.exp(x64 - x64.max(0, keepdims=True)).sum(0, keepdims=True),
        (x64 - x64.max(1, keepdims=True)) - np.log(e.sum(1, keepdims=True)),
        np.log(np.exp(x64).sum(1)),
        (x64 - mu) / np.sqrt(var + 1e-5) * wh + bh,
        np.linalg.norm(x64, 2, axis=1), np.abs(x64).sum(0, keepdims=True), np.abs(x64).max(1),
        0.5 * x64 * (1 + erf(x64 / math.sqrt(2))),
        0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64 ** 3))),
        np.where(x64 > 0, x64, 0.7 * np.expm1(x64)), x64 / (1 + np.exp(-x64)), np.maximum(x64, 0),
        np.where(x64 > 0, x64, 0.1 * x64), np.clip(x64, -0.5, 0.5),
        np.where(2 * x64 > 5, x64, np.log1p(np.exp(2 * x64)) / 2), np.clip(x64, -1, 1),
    ]
    for i, (g_, w_) in enumerate(zip(got, wants)):
        assert g_.dtype == np.float32, i
        np.testing.assert_allclose(g_, w_, rtol=2e-5, atol=2e-5, err_msg=f"composite output {i}")


@pytest.mark.parametrize("shape", [(1,), (1, 1), (3, 1, 5), (0, 4), (257,), ()])
def test_odd_shapes(client, rng, shape) -> None:
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", shape)
    y = b.exp(b.mul(x, 2.0))
    outs = [y]
    if len(shape) and all(d > 0 for d in shape):
        outs.append(b.sum(y, axes=[len(shape) - 1], keepdim=True))
    host = random_array(rng, "f32", shape, "small")
    got = client.compile(b.build(outs))(host)
    got = got if isinstance(got, tuple) else (got,)
    check(got[0], np.exp(host * np.float32(2)), "f32", f"exp(2x) {shape}")
    if len(outs) > 1:
        np.testing.assert_allclose(got[1], np.exp(host * np.float32(2)).sum(-1, keepdims=True), rtol=1e-5)


def thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.parametrize("op", ["sum", "max", "var", "std", "mean", "all"])
def test_whole_tensor_reductions_run_in_parallel(client, rng, op: str) -> None:
    # Large enough that the outermost reduction loop is split across threads, including
    # reductions nested in reductions (var: a mean inside a sum).
    shape = (64, 512)
    host = random_array(rng, "f64", shape, "small")
    host[50, 300] = 0.0  # so that `all` is false
    b = kiln.GraphBuilder()
    x = b.input("x", "f64", shape)
    compiled = client.compile(b.build([b.reduce(op, x)]))
    want = np.asarray(getattr(np, op)(host))
    # OpenMP keeps the threads of its largest team so far, all counted in `before`. A team
    # larger than that must start new threads: the kernel ran in parallel only if it did.
    before = thread_count()
    got = compiled(host, num_threads=before + 4)
    assert thread_count() >= before + 2, f"{op}: no new threads: the reduction did not run in parallel"
    check(got, want, str(want.dtype), f"{op} over all axes")
    for threads in (1, 3):
        check(compiled(host, num_threads=threads), want, str(want.dtype), f"{op} over all axes, {threads} threads")


@pytest.mark.parametrize("rewrites", [True, False])
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_factored_sums(client, rng, dtype: str, rewrites: bool) -> None:
    """Sums the algebraic rewrite factors (outer-product sums, their means, scaled terms, a
    sum of terms), read through strided views, with the rewrite on and off: both within the
    suite's tolerance of NumPy."""
    n, d = 13, 9
    b = kiln.GraphBuilder()
    raw = random_array(rng, dtype, (2 * d, n))
    x, xh = strided_view(b, "x", dtype, (n, d), raw)
    y = b.input("y", dtype, (n, d))
    w = b.input("w", dtype, (n,))
    yh, wh = random_array(rng, dtype, (n, d)), random_array(rng, dtype, (n,), "positive")
    xe, ye = b.unsqueeze(x, [2]), b.unsqueeze(y, [1])
    we = b.unsqueeze(w, [1, 2])
    outs = [
        b.sum(xe * ye, axes=[-2, -1]),
        b.mean(xe * ye, axes=[1, 2], keepdim=True),
        b.sum(xe * 0.5 * ye / we, axes=[1, 2]),
        b.sum(xe * ye - xe + ye * 2.0, axes=[1, 2]),
        b.sum(xe * ye, axes=[0, 2]),
        b.sum(xe * ye),
    ]
    got = client.compile(b.build(outs), options=kiln.make_options(algebraic_rewrites=rewrites))(raw, yh, wh)
    X, Y, W = xh[:, :, None], yh[:, None, :], wh[:, None, None]
    wants = [np.sum(X * Y, axis=(-2, -1)), np.mean(X * Y, axis=(1, 2), keepdims=True),
             np.sum(X * NP[dtype](0.5) * Y / W, axis=(1, 2)), np.sum(X * Y - X + Y * NP[dtype](2), axis=(1, 2)),
             np.sum(X * Y, axis=(0, 2)), np.sum(X * Y)]
    for i, (g_, w_) in enumerate(zip(got, wants)):
        # Sums of n*d products: the tolerance scales with the sum of magnitudes, as any two
        # summation orders differ by that much (NumPy's is pairwise).
        scale = np.sum(np.abs(X * Y) + np.abs(X) + np.abs(Y) * 2) / max(g_.size, 1)
        rtol, atol = TOL[dtype]
        np.testing.assert_allclose(g_, w_, rtol=rtol, atol=atol + rtol * scale, err_msg=f"factored sum {i}")


# Outer-axis reductions large enough for the CPU's lane tiles to split rows across threads
# (few kept columns) and to give whole tiles to threads (many columns, a partial last tile).
@pytest.mark.parametrize("shape", [(3001, 37), (17, 9000 * 4 + 5)])
def test_outer_axis_reductions_split_over_threads(client, rng, shape) -> None:
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", shape)
    t = b.input("t", "f32", (shape[1], shape[0]))
    outs = [b.sum(x, axes=[0]), b.max(x, axes=[0]), b.var(x, axes=[0]), b.argmax(x, axis=0),
            b.softmax(x, axis=0), b.sum(b.gt(x, 0.5), axes=[0]), b.sum(b.permute(t, [1, 0]), axes=[0]),
            b.any(b.isnan(x), axes=[0])]
    xh = random_array(rng, "f32", shape)
    xh[5, 3] = np.nan  # a NaN propagates through max, wins argmax, poisons var and softmax
    th = np.ascontiguousarray(random_array(rng, "f32", shape).T)
    compiled = client.compile(b.build(outs))
    x64 = xh.astype(np.float64)
    e = np.exp(x64 - x64.max(0, keepdims=True))
    wants = [x64.sum(0), x64.max(0), x64.var(0), np.argmax(xh, axis=0), e / e.sum(0, keepdims=True),
             (xh > 0.5).sum(0), th.T.astype(np.float64).sum(0), np.isnan(xh).any(0)]
    for threads in (1, 2, 3):
        got = compiled(xh, th, num_threads=threads)
        for i, (g_, w_) in enumerate(zip(got, wants)):
            what = f"output {i}, {threads} thread(s), shape {shape}"
            if g_.dtype.kind == "f":
                np.testing.assert_allclose(g_, w_, rtol=2e-5, atol=2e-3, equal_nan=True, err_msg=what)
            else:
                np.testing.assert_array_equal(g_, w_, err_msg=what)


def test_algebraic_rewrites_option_enters_the_key(client) -> None:
    b = kiln.GraphBuilder()
    x, y = b.input("x", "f32", (8, 5)), b.input("y", "f32", (8, 5))
    g = b.build([b.sum(b.unsqueeze(x, [2]) * b.unsqueeze(y, [1]), axes=[1, 2])])
    on = client.compile(g, options=kiln.make_options(algebraic_rewrites=True))
    off = client.compile(g, options=kiln.make_options(algebraic_rewrites=False))
    assert on.handle != off.handle
    src_on, src_off = (client.source(c.handle).source for c in (on, off))
    # Factored: two sums over one axis each (one reduction loop apiece); unfactored: one
    # reduction over both axes, two nested loops.
    assert src_on != src_off
    assert client.compile(g, options=kiln.make_options(algebraic_rewrites=False)).cache_hit


def test_autotune_times_distinct_variants_that_agree(client, rng) -> None:
    """Kernel variants (CompileOptions.variant) compile, agree with the default, enter the key,
    and kiln.autotune keeps the fastest of the distinct ones."""
    shape = (1000, 2000)  # rows a multiple of 4, columns past two tile widths: every CPU knob applies
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", shape)
    g = b.build([b.var(x, axes=[0]), b.sum(x, axes=[0])])
    xh = random_array(rng, "f32", shape)
    best, timings = kiln.autotune(client, g, [xh], iters=3, rtol=1e-4, atol=1e-3, share=False)
    handles = [t.handle for t in timings]
    assert len(timings) == 4 and len(set(handles)) == len(handles)  # the CPU table's 4 entries
    assert best.handle in handles
    # The fastest, unless it beats the default by less than the noise margin: the rule
    # written out (at most 97% of the default's time), not read from kiln.autotune.
    fastest = min(timings, key=lambda t: t.median_ms)
    default = next(t for t in timings if t.variant == 0)
    want = fastest if fastest.median_ms <= default.median_ms * 0.97 else default
    assert best.handle == want.handle
    # A graph the knobs do not touch (pointwise) has one distinct variant.
    b = kiln.GraphBuilder()
    y = b.input("y", "f32", (64,))
    _, only = kiln.autotune(client, b.build([b.exp(y)]), [random_array(rng, "f32", (64,))], iters=1, share=False)
    assert len(only) == 1
    np.testing.assert_allclose(best(xh)[0], xh.astype(np.float64).var(0), rtol=1e-4, atol=1e-3)


def test_jit_max_autotune_keeps_a_variant_and_matches_numpy(client, rng) -> None:
    def col_stats(x):
        return (x - x.mean(axis=0)) / np.sqrt(x.var(axis=0) + 1e-5)

    f = kiln.jit(col_stats, client=client, mode="max-autotune")
    x = random_array(rng, "f32", (1000, 2000))
    got = f(x)
    assert f.compile_count == 1
    np.testing.assert_allclose(got, col_stats(x.astype(np.float64)), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(f(x), got)  # later calls: the kept variant, no tuning again
    assert f.compile_count == 1
    with pytest.raises(ValueError):
        kiln.jit(col_stats, client=client, mode="fastest")


@pytest.mark.parametrize("shape", [(2, 7, 3), (3, 5, 3), (4, 4, 2)])
def test_reversed_flat_view_reads_in_floor_division(client, rng, shape) -> None:
    """x.reshape(-1)[::-1].reshape(-1, c).T: the index of x is a floor division of an argument
    whose split-off remainder goes negative (C's / and % truncate; a regression of the index
    simplification)."""
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", shape)
    flat = b.slice(b.reshape(x, [-1]), axes=[0], starts=[2**62], stops=[-2**62], steps=[-1])
    out = b.permute(b.reshape(flat, [-1, shape[-1]]), [1, 0])
    host = random_array(rng, "f32", shape)
    check(client.compile(b.build([out]))(host), host.reshape(-1)[::-1].reshape(-1, shape[-1]).T, "f32", f"{shape}")


# A sum over outer axes whose rows are unrolled (lane tiles, the innermost reduced axis of 16
# stepped by 4) reading a value that depends on that axis alone (a mask from its index, as a
# backward graph builds for the first token): the value is tabulated once, before the loops,
# over the axis's own name (it used to be generated over the unrolled row's "(i2 + 1)").
def test_unrolled_outer_sums_read_index_tables(client, rng) -> None:
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (2, 16, 64))
    y = b.input("y", "f32", (2, 16, 64))
    first = b.reshape(b.eq(b.iota((16,), axis=0), 0), (1, 16, 1))
    masked = b.where(first, x, 0.0)
    outs = [b.sum(b.add(masked, y), axes=[0, 1]), b.sum(b.mul(masked, y), axes=[0, 1])]
    xh, yh = random_array(rng, "f32", (2, 16, 64)), random_array(rng, "f32", (2, 16, 64))
    got = client.compile(b.build(outs))(xh, yh)
    m = np.where((np.arange(16) == 0)[None, :, None], xh, 0).astype(np.float64)
    np.testing.assert_allclose(got[0], (m + yh).sum((0, 1)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1], (m * yh).sum((0, 1)), rtol=1e-5, atol=1e-5)


# Outputs with the same elements in another shape (a reshape, a permute of it) are stored by
# one kernel, each at the flat position of the kernel's element.
def test_outputs_of_another_shape_share_a_kernel(client, rng) -> None:
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (2, 3, 40))
    y = b.input("y", "f32", (2, 3, 40))
    s = b.add(x, y)
    r = b.reshape(s, (6, 40))
    outs = [s, b.mul(r, r), b.permute(b.exp(r), [1, 0]), b.sub(b.reshape(x, (40, 6)), 1.0)]
    compiled = client.compile(b.build(outs))
    assert "kernel k1" not in compiled.fusion_report(), compiled.fusion_report()
    xh, yh = random_array(rng, "f32", (2, 3, 40)), random_array(rng, "f32", (2, 3, 40))
    got = compiled(xh, yh)
    sh = xh + yh
    wants = [sh, sh.reshape(6, 40) ** 2, np.exp(sh.reshape(6, 40)).T, xh.reshape(40, 6) - 1]
    for i, (g_, w_) in enumerate(zip(got, wants)):
        assert g_.shape == w_.shape, (i, g_.shape, w_.shape)
        np.testing.assert_allclose(g_, w_, rtol=1e-5, atol=1e-5, err_msg=f"output {i}")


# f16 and bf16 means divide by the count (exact in the type up to 2048 / 256) instead of
# multiplying by 1/N rounded to the type: a constant row's layer_norm is exactly zero, as in
# NumPy and PyTorch (it was 0.077 for rows of 3 in f16: 1/3 rounds to 0.33325).
# (bf16 takes the same path; NumPy has no bf16 here to feed it.)
def test_half_precision_means_are_not_biased(client, rng) -> None:
    dtype = "f16"
    b = kiln.GraphBuilder()
    x = b.input("x", dtype, (4, 3))
    w = b.input("w", dtype, (6, 768))
    outs = [b.layer_norm(x, axes=[1]), b.mean(w, axes=[1])]
    compiled = client.compile(b.build(outs))
    xh = np.array([[1, 1, 1], [0, 1, 0], [2, -1, 0.5], [3, 3, 3]], dtype=np.float16)
    wh = np.full((6, 768), 1.5, dtype=np.float16)
    got = [np.asarray(g, dtype=np.float32) for g in compiled(xh, wh)]
    x64 = xh.astype(np.float64)
    want = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5)
    np.testing.assert_array_equal(got[0][[0, 3]], 0)  # constant rows
    np.testing.assert_allclose(got[0], want, rtol=2e-2, atol=2e-2)
    np.testing.assert_array_equal(got[1], 1.5)


# f16 means, variances and deviations of more elements than f16 counts (65504) are computed in
# f32 and rounded once, as NumPy does: the count as an f16 constant was inf (the mean came out
# 0), and a sum in f16 of positive values overflows.
def test_half_precision_reductions_of_large_tensors(client, rng) -> None:
    b = kiln.GraphBuilder()
    x = b.input("x", "f16", (300, 1000))
    outs = [b.mean(x), b.var(x), b.std(x), b.mean(x, axes=[0]), b.layer_norm(x, axes=[0, 1])]
    xh = (rng.random((300, 1000)) * 4 + 1).astype(np.float16)  # positive: the sum is ~900000
    got = [np.asarray(g, dtype=np.float64) for g in client.compile(b.build(outs))(xh)]
    x64 = xh.astype(np.float64)
    np.testing.assert_allclose(got[0], x64.mean(), rtol=1e-3)
    np.testing.assert_allclose(got[1], x64.var(), rtol=2e-3)
    np.testing.assert_allclose(got[2], x64.std(), rtol=2e-3)
    np.testing.assert_allclose(got[3], x64.mean(0), rtol=1e-3)
    want_ln = (x64 - x64.mean()) / np.sqrt(x64.var() + 1e-5)
    np.testing.assert_allclose(got[4], want_ln, rtol=1e-2, atol=1e-2)


# Long float sums are summed in blocks whose partial sums are added in double (CPU): rows of
# 200003 f32 values were 1.3e-5 off their exact sum in one running accumulator per lane, where
# NumPy's pairwise sum is 1e-7 off; the same for a whole-tensor sum split over threads, a mean
# and a variance of rows, a row sum whose length is a symbol (one compile, sizes on both sides
# of the block length), a sum over two axes whose inner one is blocked, and sums over the
# outer axis of long columns (lane tiles: 5.6e-6 off on 2e5 rows before their blocks).
@pytest.mark.parametrize("symbolic", [False, True])
def test_long_float_sums_match_pairwise_accuracy(client, rng, symbolic: bool) -> None:
    b = kiln.GraphBuilder()
    n = 200003
    x = b.input("x", "f32", (6, n), dims=(None, "N") if symbolic else None)
    c = b.input("c", "f32", (n, 70), dims=("N", None) if symbolic else None)
    outs = [b.sum(x, axes=[1]), b.mean(x, axes=[1]), b.var(x, axes=[1]), b.sum(x), b.sum(x * x, axes=[0, 1]),
            b.sum(c, axes=[0]), b.mean(c * c, axes=[0])]
    compiled = client.compile(b.build(outs))
    for length in ([n, 1, 1023, 1024, 1025, 70001] if symbolic else [n]):
        # Positive-biased values: the running sum grows, which is what rounds away the low bits.
        xh = (rng.standard_normal((6, length)) + 0.5).astype(np.float32)
        ch = (rng.standard_normal((length, 70)) + 0.5).astype(np.float32)
        x64, c64 = xh.astype(np.float64), ch.astype(np.float64)
        wants = [x64.sum(1), x64.mean(1), x64.var(1), x64.sum(), (x64 * x64).sum(), c64.sum(0), (c64 * c64).mean(0)]
        for threads in (1, 2):
            got = compiled(xh, ch, num_threads=threads)
            for i, (g_, w_) in enumerate(zip(got, wants)):
                err = np.max(np.abs(np.asarray(g_, np.float64) - w_) / np.maximum(np.abs(w_), 1e-30))
                assert err < 1e-6, f"output {i}, length {length}, {threads} thread(s): relative error {err:.2e}"


# argmax/argmin along rows run in blocks of 1024, two vector loops per block (CPU): the answer
# must be NumPy's where it lies in a later block, where the extreme value repeats across blocks
# (the first wins), where a NaN comes after the extreme (it wins), for rows of -inf or +inf
# only, integer rows of the type's lowest value, over the whole tensor (a flat index across
# rows), and at symbolic lengths.
@pytest.mark.parametrize("dtype", ["f32", "i32"])
@pytest.mark.parametrize("symbolic", [False, True])
def test_arg_reductions_over_rows_of_several_blocks(client, rng, dtype: str, symbolic: bool) -> None:
    n = 3001
    b = kiln.GraphBuilder()
    x = b.input("x", dtype, (8, n), dims=(None, "N") if symbolic else None)
    compiled = client.compile(b.build([b.argmax(x, axis=1), b.argmin(x, axis=1), b.argmax(x), b.argmin(x)]))
    for length in ([n, 1, 1024, 1025, 2049] if symbolic else [n]):
        h = random_array(rng, dtype, (8, length))
        if length > 1:
            last = length - 1
            h[0, last] = h[0].max() + 1  # the extreme in the last block
            h[0, 0] = h[0].min() - 1
            h[1, :] = 0
            h[1, [length // 2, last]] = 5  # a tie: the first wins
            h[1, [length // 3, last - 1]] = -5
            if dtype == "f32":
                h[2, length // 4] = h[2].max() + 1
                h[2, last] = np.nan  # a later NaN wins over the extreme
                h[3, :] = -np.inf
                h[4, :] = np.inf
                h[5, last] = np.inf
                h[5, 0] = -np.inf
            else:
                h[3, :] = np.iinfo(np.int32).min
                h[4, :] = np.iinfo(np.int32).max
        for threads in (1, 2):
            got = compiled(h, num_threads=threads)
            np.testing.assert_array_equal(got[0], np.argmax(h, axis=1), err_msg=f"argmax, length {length}")
            np.testing.assert_array_equal(got[1], np.argmin(h, axis=1), err_msg=f"argmin, length {length}")
            # Over the whole tensor: the flat index, across rows and blocks.
            np.testing.assert_array_equal(got[2], np.argmax(h), err_msg=f"whole argmax, length {length}")
            np.testing.assert_array_equal(got[3], np.argmin(h), err_msg=f"whole argmin, length {length}")
            np.testing.assert_array_equal(compiled(np.where(np.isnan(h), 0, h).astype(h.dtype))[2],
                                          np.argmax(np.where(np.isnan(h), 0, h)), err_msg=f"no NaN, length {length}")


# Kernels that write along one axis while reading along another (a transpose, `a + a.T`, a
# permute moving the last axis) run in 16 x 16 tiles (CPU): partial tiles at both edges, a
# loop between the two tiled ones, 1, 2 and 3 threads, and a symbolic extent on each side of
# the tile size.
@pytest.mark.parametrize("dtype", ["f32", "f64", "i32"])
def test_transposing_kernels_run_in_tiles(client, rng, dtype: str) -> None:
    b = kiln.GraphBuilder()
    x = b.input("x", dtype, (37, 100))
    y = b.input("y", dtype, (3, 40, 70))
    s = b.input("s", dtype, (50, 50))
    outs = [b.permute(x, [1, 0]) * 2, b.permute(y, [2, 0, 1]) + 1, s + b.permute(s, [1, 0])]
    compiled = client.compile(b.build(outs))
    xh, yh, sh = (random_array(rng, dtype, shape) for shape in [(37, 100), (3, 40, 70), (50, 50)])
    wants = [xh.T * NP[dtype](2), yh.transpose(2, 0, 1) + NP[dtype](1), sh + sh.T]
    for threads in (1, 2, 3):
        for i, (g_, w_) in enumerate(zip(compiled(xh, yh, sh, num_threads=threads), wants)):
            np.testing.assert_array_equal(g_, w_, err_msg=f"output {i}, {threads} thread(s)")
    # Bytes run in 64 x 64 tiles: partial ones at both edges, a full one in the middle.
    b = kiln.GraphBuilder()
    u = b.input("u", "u8", (150, 130))
    uh = random_array(rng, "u8", (150, 130))
    np.testing.assert_array_equal(client.compile(b.build([b.permute(u, [1, 0]) + 1]))(uh), uh.T + np.uint8(1))
    b = kiln.GraphBuilder()
    z = b.input("z", dtype, (40, 33), dims=("N", None))
    dyn = client.compile(b.build([b.permute(z, [1, 0]) - 1]))
    for n in [0, 1, 15, 16, 17, 100]:
        zh = random_array(rng, dtype, (n, 33))
        np.testing.assert_array_equal(dyn(zh), zh.T - NP[dtype](1), err_msg=f"N={n}")


# A kernel whose outputs concatenate pieces along the innermost axis runs one loop per piece
# (CPU): three pieces of odd widths (one a broadcast, one a computed value), two outputs with
# the same bounds, a concatenation cast to another type, a piece-wise reduction feeding it,
# and pieces whose widths are symbols (0 and 1 included).
def test_concatenated_pieces_run_a_loop_each(client, rng) -> None:
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (6, 37))
    y = b.input("y", "f32", (6, 1))
    z = b.input("z", "f64", (6, 19))
    row = b.sum(x, axes=[1], keepdim=True)
    cat = b.concat([x, b.broadcast_to(y, (6, 5)), b.exp(b.cast(z, "f32")) + row], axis=1)
    outs = [cat, b.concat([x * 2.0, b.broadcast_to(y, (6, 5)), b.cast(z, "f32")], axis=1),
            b.cast(b.concat([x, x], axis=1), "f64")]
    compiled = client.compile(b.build(outs))
    xh, yh, zh = random_array(rng, "f32", (6, 37)), random_array(rng, "f32", (6, 1)), random_array(rng, "f64", (6, 19))
    r = xh.sum(1, keepdims=True)
    wants = [np.concatenate([xh, np.broadcast_to(yh, (6, 5)), np.exp(zh.astype(np.float32)) + r], axis=1),
             np.concatenate([xh * 2, np.broadcast_to(yh, (6, 5)), zh.astype(np.float32)], axis=1),
             np.concatenate([xh, xh], axis=1).astype(np.float64)]
    for threads in (1, 2):
        for i, (g_, w_) in enumerate(zip(compiled(xh, yh, zh, num_threads=threads), wants)):
            np.testing.assert_allclose(g_, w_, rtol=1e-5, atol=1e-5, err_msg=f"output {i}")
    b = kiln.GraphBuilder()
    p_ = b.input("p", "f32", (3, 10), dims=(None, "A"))
    q = b.input("q", "f32", (3, 12), dims=(None, "B"))
    dyn = client.compile(b.build([b.concat([p_, q * 3.0, p_], axis=1)]))
    for a_, b_ in [(0, 5), (1, 0), (7, 13), (40, 1)]:
        ph, qh = random_array(rng, "f32", (3, a_)), random_array(rng, "f32", (3, b_))
        np.testing.assert_allclose(dyn(ph, qh), np.concatenate([ph, qh * 3, ph], axis=1), rtol=1e-6,
                                   err_msg=f"A={a_}, B={b_}")


# A reduction stored by a kernel was recomputed, not read back, by that kernel's later outputs
# of the same domain: a row sum of `where(x > x.mean(axis=0), x, 0)` recomputed the column
# means for every row (cubic work: minutes at 4096 x 4096). That consumer now starts a kernel
# of its own reading the stored means; the report says why.
@pytest.mark.parametrize("n", [64, 301])
def test_same_domain_consumer_reads_a_stored_reduction(client, rng, n: int) -> None:
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (n, n))
    col_mean = b.mean(x, axes=[0])
    outs = [b.sum(b.where(b.gt(x, col_mean), x, 0.0), axes=[1]), col_mean]
    compiled = client.compile(b.build(outs))
    assert "would recompute" in compiled.fusion_report(), compiled.fusion_report()
    xh = random_array(rng, "f32", (n, n))
    got = compiled(xh)
    x64 = xh.astype(np.float64)
    want = np.where(xh > xh.mean(axis=0), x64, 0).sum(axis=1)
    np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(got[1], x64.mean(axis=0), rtol=1e-5, atol=1e-6)


# A short innermost output loop (an HWC image's channels) is unrolled inside a vector loop over
# the loop outside it (CPU): per-channel constants along the short axis, a u8 image normalised
# to f32, several short widths, and a symbolic outer extent.
def test_short_innermost_loops_unroll_inside_the_vector_loop(client, rng) -> None:
    b = kiln.GraphBuilder()
    img = b.input("img", "u8", (45, 37, 3))
    y = b.input("y", "f64", (5, 19, 7))
    w = b.input("w", "f64", (7,))
    mean = b.constant(np.array([0.485, 0.456, 0.406], np.float32))
    std = b.constant(np.array([0.229, 0.224, 0.225], np.float32))
    outs = [(b.cast(img, "f32") / 255.0 - mean) / std, y * w + 1.0]
    compiled = client.compile(b.build(outs))
    assert "#pragma GCC unroll 3" in compiled.source() and "#pragma GCC unroll 7" in compiled.source()
    ih, yh, wh = random_array(rng, "u8", (45, 37, 3)), random_array(rng, "f64", (5, 19, 7)), random_array(rng, "f64", (7,))
    m32, s32 = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)
    for threads in (1, 2):
        got = compiled(ih, yh, wh, num_threads=threads)
        np.testing.assert_allclose(got[0], (ih.astype(np.float32) / np.float32(255) - m32) / s32, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got[1], yh * wh + 1, rtol=1e-12)
    b = kiln.GraphBuilder()
    pts = b.input("pts", "f32", (40, 3), dims=("N", None))
    dyn = client.compile(b.build([pts * b.constant(np.array([1.0, -2.0, 0.5], np.float32)) + 3.0]))
    for n in [0, 1, 17, 100]:
        ph = random_array(rng, "f32", (n, 3))
        np.testing.assert_allclose(dyn(ph), ph * np.array([1, -2, 0.5], np.float32) + np.float32(3), rtol=1e-6,
                                   err_msg=f"N={n}")


# Float to a narrow integer truncates toward zero and wraps to the type, also where the cast
# feeds more arithmetic in the same kernel (a negative float cast to u8 was kept as -1 there:
# the direct C conversion is undefined for values out of the type's range; seed 1346 of the
# property test).
def test_float_to_narrow_integer_casts_wrap(client) -> None:
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (6,))
    u = b.cast(x, "u8")
    i = b.cast(x, "i8")
    outs = [u, b.sigmoid(u), i, b.add(b.cast(i, "f32"), 0.5)]
    xh = np.array([-0.7, -1.6, 2.9, -1.9, 300.5, -200.2], dtype=np.float32)
    got = client.compile(b.build(outs))(xh)
    wrapped_u = xh.astype(np.int64).astype(np.uint8)  # [0, 255, 2, 255, 44, 56]
    wrapped_i = xh.astype(np.int64).astype(np.int8)
    np.testing.assert_array_equal(got[0], wrapped_u)
    np.testing.assert_allclose(got[1].astype(np.float64), 1 / (1 + np.exp(-wrapped_u.astype(np.float64))), rtol=2e-3)
    np.testing.assert_array_equal(got[2], wrapped_i)
    np.testing.assert_array_equal(got[3], wrapped_i.astype(np.float32) + 0.5)


def _np_gather(x: np.ndarray, idx: np.ndarray, axis: int) -> np.ndarray:
    """gather's rule in NumPy: negative positions from the end, the rest clamped into the axis;
    off the axis a dimension of 1 broadcasts and a longer one is read from its start."""
    n = x.shape[axis]
    pos = np.where(idx < 0, idx.astype(np.int64) + n, idx.astype(np.int64)).clip(0, n - 1)
    grids = list(np.indices(idx.shape, sparse=True))
    for d in range(x.ndim):
        if d != axis and x.shape[d] == 1:
            grids[d] = np.zeros_like(grids[d])
    grids[axis] = pos
    return x[tuple(np.broadcast_arrays(*grids))]


# gather and take: values read at positions held in a tensor (an embedding lookup, NumPy's
# take_along_axis), from an input, a strided view, a computed value (stored first) and a
# broadcast table; negative and out-of-range positions; several index dtypes; both thread counts.
@pytest.mark.parametrize("dtype", ["f32", "f16", "i32", "bool"])
def test_gather_and_take(client, rng, dtype: str) -> None:
    b = kiln.GraphBuilder()
    w = b.input("w", dtype, (11, 7))
    ids = b.input("ids", "i64", (3, 5))
    pos = b.input("pos", "i32", (4, 7))
    tab = b.input("tab", dtype, (1, 13))
    sel = b.input("sel", "u8", (6, 3))
    wt = b.permute(w, [1, 0])  # a view: [7, 11]
    outs = [
        b.take(w, ids, axis=0),                                   # [3, 5, 7]: rows
        b.gather(w, pos, axis=0),                                 # take_along_axis
        b.gather(b.broadcast_to(tab, (6, 13)), sel, axis=1),      # a broadcast table
        b.take(wt, ids, axis=1),                                  # columns of a view: [7, 3, 5]
        b.gather(b.cast(b.add(w, w), "f32") if dtype != "bool" else b.cast(w, "f32"), pos, axis=0),  # computed
    ]
    outs.append(b.add(b.cast(outs[0], "f32"), 1.0))  # a consumer of a gather in the same kernel
    compiled = client.compile(b.build(outs))
    wh = random_array(rng, dtype, (11, 7))
    idh = rng.integers(-14, 14, size=(3, 5)).astype(np.int64)  # negative and out-of-range positions
    ph = rng.integers(-11, 11, size=(4, 7)).astype(np.int32)
    th = random_array(rng, dtype, (1, 13))
    sh = rng.integers(0, 20, size=(6, 3)).astype(np.uint8)
    flat = _np_gather(wh, np.broadcast_to(idh.reshape(15, 1), (15, 7)), 0).reshape(3, 5, 7)
    computed = (wh + wh).astype(np.float32) if dtype != "bool" else wh.astype(np.float32)
    wants = [flat, _np_gather(wh, ph, 0), _np_gather(np.broadcast_to(th, (6, 13)), sh, 1),
             _np_gather(wh.T, np.broadcast_to(idh.reshape(1, 15), (7, 15)), 1).reshape(7, 3, 5),
             _np_gather(computed, ph, 0), flat.astype(np.float32) + 1]
    # In range, the rule is NumPy's own.
    ok = rng.integers(-11, 11, size=(3, 5))
    np.testing.assert_array_equal(_np_gather(wh, np.broadcast_to(ok.reshape(15, 1), (15, 7)), 0).reshape(3, 5, 7),
                                  np.take(wh, ok, axis=0))
    for threads in (1, 2):
        got = compiled(wh, idh, ph, th, sh, num_threads=threads)
        for i, (g_, w_) in enumerate(zip(got, wants)):
            check(g_, np.ascontiguousarray(w_), str(w_.dtype), f"gather output {i} ({threads} threads)")


def test_gather_rejects_what_it_cannot_read(client) -> None:
    """A float index, ranks that differ, shapes that do not broadcast off the axis, an empty axis:
    InvalidArgument naming the rule, and the daemon keeps serving."""
    def graph(xshape, ishape, idtype="i64", axis=0):
        b = kiln.GraphBuilder()
        x = b.input("x", "f32", xshape)
        i = b.input("i", idtype, ishape)
        return b.build([b.node("gather", [x, i], {"axis": ("i", axis)}, "f32", ishape)])

    for args, rule in [(((4, 3), (2, 3), "f32"), "integer tensor"), (((4, 3), (2,)), "same rank"),
                       (((4, 3), (2, 5)), "broadcast"), (((0, 3), (2, 3)), "element to read"),
                       (((4, 3), (2, 3), "i64", 2), "out of range")]:
        with pytest.raises(kiln.KilnError) as e:
            client.compile(graph(*args))
        assert "gather" in str(e.value) and rule in str(e.value), (args, str(e.value))
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (4, 3))
    i = b.input("i", "i32", (2, 3))
    got = client.compile(b.build([b.gather(x, i, 0)]))(np.ones((4, 3), np.float32), np.zeros((2, 3), np.int32))
    np.testing.assert_array_equal(got, np.ones((2, 3), np.float32))


def test_gather_at_symbolic_sizes(client, rng) -> None:
    """An embedding lookup whose ids have symbolic batch and length: one compile serves every
    size, the table's row count stays static."""
    b = kiln.GraphBuilder()
    w = b.input("w", "f32", (50, 24))
    ids = b.input("ids", "i64", (2, 3), dims=("B", "T"))
    g = b.take(w, ids, axis=0)
    out = b.layer_norm(g, axes=[-1]) if hasattr(b, "layer_norm") else g
    compiled = client.compile(b.build([g, out]))
    for bs, t in [(1, 1), (2, 7), (5, 13), (3, 0)]:
        wh = random_array(rng, "f32", (50, 24))
        idh = rng.integers(-50, 60, size=(bs, t)).astype(np.int64)
        want = _np_gather(wh, np.broadcast_to(idh.reshape(-1, 1), (bs * t, 24)), 0).reshape(bs, t, 24)
        got = compiled(wh, idh)
        check(got[0], want, "f32", f"B={bs}, T={t}")
        mu = want.mean(-1, keepdims=True)
        ln = (want - mu) / np.sqrt(((want - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
        np.testing.assert_allclose(got[1], ln, rtol=1e-4, atol=1e-4, err_msg=f"B={bs}, T={t}")
    # A table of symbolic rows and width: the stride and the clamp's bound vary with the sizes.
    b = kiln.GraphBuilder()
    w = b.input("w", "f32", (7, 5), dims=("V", "D"))
    ids = b.input("ids", "i32", (4,), dims=("N",))
    compiled = client.compile(b.build([b.take(w, ids, axis=0) * 2.0]))
    for v, d, n in [(1, 1, 3), (9, 13, 5), (31, 4, 0), (2, 33, 17)]:
        wh = random_array(rng, "f32", (v, d))
        idh = rng.integers(-v - 3, v + 3, size=(n,)).astype(np.int32)
        want = _np_gather(wh, np.broadcast_to(idh.reshape(n, 1), (n, d)), 0) * 2
        check(compiled(wh, idh), want, "f32", f"V={v}, D={d}, N={n}")


def _np_philox(seed: int, position: np.ndarray, stream: int) -> tuple[np.ndarray, np.ndarray]:
    """Philox4x32-10 (Salmon et al., SC'11) in NumPy: the first two output words of key
    ``seed`` and counters ``(position, stream, 0)``: the reference for ``uniform``."""
    m = np.uint64(0xFFFFFFFF)
    pos = position.astype(np.uint64)
    c0, c1 = pos & m, pos >> np.uint64(32)
    c2, c3 = np.full_like(pos, stream), np.zeros_like(pos)
    seed %= 2**64
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32)
    for _ in range(10):
        p0, p1 = c0 * np.uint64(0xD2511F53), c2 * np.uint64(0xCD9E8D57)
        n0, n2 = (p1 >> np.uint64(32)) ^ c1 ^ k0, (p0 >> np.uint64(32)) ^ c3 ^ k1
        c1, c3, c0, c2 = p1 & m, p0 & m, n0, n2
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & m, (k1 + np.uint64(0xBB67AE85)) & m
    return c0, c1


def _np_uniform(seed: int, shape: tuple[int, ...], stream: int, dtype: str) -> np.ndarray:
    x, y = _np_philox(seed, np.arange(math.prod(shape), dtype=np.uint64).reshape(shape), stream)
    if dtype == "f64":
        return ((x << np.uint64(21)) | (y >> np.uint64(11))).astype(np.float64) * 2.0**-53
    bits = {"f32": 24, "f16": 11}[dtype]
    return ((x >> np.uint64(32 - bits)).astype(np.float64) * 2.0**-bits).astype(NP[dtype])


# uniform: counter-based random numbers, the same bits as a NumPy Philox at every element, through
# views (a permuted draw), broadcasts (one number per row), reductions (row sums of a draw), a
# dropout mask and the scaled kept values, any seed (negative ones too), both thread counts.
@pytest.mark.parametrize("dtype", ["f32", "f16", "f64"])
def test_uniform_matches_philox(client, rng, dtype: str) -> None:
    b = kiln.GraphBuilder()
    seed = b.input("seed", "i64", ())
    x = b.input("x", dtype, (37, 129))
    col = b.input("col", "f32", (37, 1))
    xt = b.permute(x, [1, 0])
    u = b.uniform(seed, x, stream=3, dtype=dtype)
    keep = b.ge(b.uniform(seed, x, stream=1, dtype=dtype), 0.25)
    outs = [
        u,
        b.permute(b.uniform(seed, xt, stream=3, dtype=dtype), [1, 0]),   # a draw of the transposed shape
        b.add(b.uniform(seed, col, stream=2), b.cast(x, "f32")),         # one number per row, broadcast
        b.sum(b.uniform(seed, x, stream=4, dtype=dtype), axes=[1]),       # row sums of a draw
        keep,
        b.where(keep, b.div(x, 0.75), 0.0),                               # dropout
    ]
    compiled = client.compile(b.build(outs))
    for s in (12345, -7, 2**62 + 3):
        xh = random_array(rng, dtype, (37, 129))
        ch = random_array(rng, "f32", (37, 1))
        keep_h = _np_uniform(s, (37, 129), 1, dtype) >= 0.25
        wants = [_np_uniform(s, (37, 129), 3, dtype), _np_uniform(s, (129, 37), 3, dtype).T,
                 _np_uniform(s, (37, 1), 2, "f32") + xh.astype(np.float32),
                 _np_uniform(s, (37, 129), 4, dtype).astype(np.float64).sum(1),
                 keep_h, np.where(keep_h, xh / NP[dtype](0.75), 0).astype(NP[dtype])]
        for threads in (1, 2):
            got = compiled(np.array(s, np.int64), xh, ch, num_threads=threads)
            for i in (0, 1, 2, 4):
                np.testing.assert_array_equal(got[i], np.ascontiguousarray(wants[i]), err_msg=f"output {i}, seed {s}")
            np.testing.assert_allclose(got[3], wants[3], rtol=1e-3 if dtype == "f16" else 1e-5, err_msg=f"seed {s}")
            check(got[5], wants[5], dtype, f"dropout, seed {s}")
        # A draw is uniform: mean near 1/2, about a quarter dropped, streams and seeds apart.
        assert abs(float(got[0].astype(np.float64).mean()) - 0.5) < 0.02
        assert 0.2 < 1 - got[4].mean() < 0.3
        assert (got[0] != got[1]).any() or dtype == "f16"
        assert 0.0 <= float(got[0].min()) and float(got[0].max()) < 1.0
    other = compiled(np.array(1, np.int64), xh, ch)[0]
    assert (other != got[0]).mean() > 0.9


def test_uniform_rejects_and_runs_at_symbolic_sizes(client) -> None:
    """A float or many-element seed, an integer dtype, a stream outside 32 bits: InvalidArgument
    naming the rule. At symbolic sizes the positions follow the sizes of the call, as an iota
    shaped like a symbolic tensor does."""
    def graph(seed_dtype="i64", seed_shape=(), attrs=None):
        b = kiln.GraphBuilder()
        s = b.input("s", seed_dtype, seed_shape)
        x = b.input("x", "f32", (4, 3))
        return b.build([b.node("uniform", [s, x], attrs or {}, "f32", (4, 3))])

    for args, rule in [(("f32",), "integer tensor of one element"), (("i32", (2,)), "integer tensor of one element"),
                       (("i64", (), {"dtype": ("dtype", "i32")}), "floats"),
                       (("i64", (), {"stream": ("i", 2**32)}), "[0, 2^32)")]:
        with pytest.raises(kiln.KilnError) as e:
            client.compile(graph(*args))
        assert "uniform" in str(e.value) and rule in str(e.value), (args, str(e.value))
    b = kiln.GraphBuilder()
    s = b.input("s", "u8", (1,))
    x = b.input("x", "f32", (2, 3), dims=("B", "T"))
    # iota shaped like a tensor: positions along a symbolic axis (torch.arange of a run-time size)
    compiled = client.compile(b.build([b.uniform(s, x, stream=9), b.iota((2, 3), 1, "i32", like=x)]))
    for bs, t in [(1, 1), (3, 17), (0, 5), (7, 31)]:
        got = compiled(np.array([200], np.uint8), np.zeros((bs, t), np.float32))
        np.testing.assert_array_equal(got[0], _np_uniform(200, (bs, t), 9, "f32"), err_msg=f"B={bs}, T={t}")
        np.testing.assert_array_equal(got[1], np.broadcast_to(np.arange(t, dtype=np.int32), (bs, t)))
    with pytest.raises(kiln.KilnError) as e:  # a shape from an input and an attribute
        b = kiln.GraphBuilder()
        x = b.input("x", "f32", (2, 3))
        client.compile(b.build([b.node("iota", [x], {"shape": ("ints", (2, 3)), "axis": ("i", 0)}, "i64", (2, 3))]))
    assert "iota" in str(e.value) and "one of them" in str(e.value)


# Gathers inside the CPU code generator's special loops: a short innermost output loop unrolled
# in a vector loop over rows (HWC-like [rows, 3]), a transposing kernel in tiles, row sums and
# argmax of gathered rows (the reduction as the vector loop), column sums over gathered rows.
def test_gather_in_special_loops(client, rng) -> None:
    b = kiln.GraphBuilder()
    w = b.input("w", "f32", (40, 3))
    big = b.input("big", "f32", (30, 200))
    ids = b.input("ids", "i64", (50,))
    rows = b.input("rows", "i32", (64,))
    g = b.take(w, ids, axis=0)                      # [50, 3]
    r = b.take(big, rows, axis=0)                   # [64, 200]
    outs = [b.mul(g, 2.0), b.permute(b.add(r, 1.0), [1, 0]), b.sum(r, axes=[1]), b.argmax(r, axis=1),
            b.sum(r, axes=[0])]
    compiled = client.compile(b.build(outs))
    wh, bh = random_array(rng, "f32", (40, 3)), random_array(rng, "f32", (30, 200))
    idh = rng.integers(-40, 40, size=(50,)).astype(np.int64)
    rh = rng.integers(0, 30, size=(64,)).astype(np.int32)
    gw, rw = np.take(wh, idh, axis=0), np.take(bh, rh, axis=0)
    wants = [gw * 2, (rw + 1).T, rw.sum(1), rw.argmax(1), rw.sum(0)]
    for threads in (1, 2):
        got = compiled(wh, bh, idh, rh, num_threads=threads)
        for i, (g_, w_) in enumerate(zip(got, wants)):
            if w_.dtype.kind == "f":
                np.testing.assert_allclose(g_, w_, rtol=1e-5, atol=1e-4, err_msg=f"output {i}")
            else:
                np.testing.assert_array_equal(g_, w_, err_msg=f"output {i}")
