"""A reference evaluator of kiln.v1.Graph messages in NumPy, for tests that run without a daemon.

It follows the op reference (names, attributes, result dtypes) literally and slowly; it is a
test oracle for graphs the Python client writes, not a second compiler.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from kiln import dtypes as dt


def _attr(node: Any, name: str, default: Any = None) -> Any:
    if name not in node.attrs:
        return default
    a = node.attrs[name]
    which = a.WhichOneof("value")
    if which == "ints":
        return list(a.ints.values)
    if which == "floats":
        return list(a.floats.values)
    if which == "dtype":
        return dt.from_wire(a.dtype)
    if which == "tensor":
        t = a.tensor
        d = dt.from_wire(t.dtype)
        vals = list(t.float_values) if t.float_values else list(t.int_values)
        return np.array(vals, dtype=dt.to_numpy(d)).reshape(tuple(t.shape))
    return getattr(a, which)


def _axes(node: Any, rank: int) -> tuple[int, ...]:
    ax = _attr(node, "axes", None)
    if not ax:
        return tuple(range(rank))
    return tuple(sorted({a % rank for a in ax}))


_UNARY = {
    "neg": np.negative, "abs": np.abs, "sign": np.sign, "exp": np.exp, "exp2": np.exp2, "expm1": np.expm1,
    "log": np.log, "log2": np.log2, "log1p": np.log1p, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x),
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "tanh": np.tanh, "asin": np.arcsin, "acos": np.arccos,
    "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh, "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "erf": np.vectorize(math.erf, otypes=[np.float64]), "floor": np.floor, "ceil": np.ceil, "round": np.rint, "trunc": np.trunc,
    "reciprocal": np.reciprocal, "logical_not": np.logical_not, "isnan": np.isnan, "isinf": np.isinf,
    "bitwise_not": np.invert,
}
_BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide, "floordiv": np.floor_divide,
    "remainder": np.remainder, "pow": np.power, "maximum": np.maximum, "minimum": np.minimum,
    "atan2": np.arctan2, "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal, "logical_and": np.logical_and, "logical_or": np.logical_or,
    "logical_xor": np.logical_xor, "bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or,
    "bitwise_xor": np.bitwise_xor,
}


def _np(name: str) -> np.dtype:
    return dt.to_numpy(name)


def _name(a: np.ndarray) -> str:
    return dt.dtype_name(a.dtype)


def _activation(node: Any, x: np.ndarray) -> np.ndarray:
    op = node.op
    if op == "hardtanh":
        lo, hi = _attr(node, "min_val", -1.0), _attr(node, "max_val", 1.0)
        return np.where(x < lo, np.asarray(lo).astype(x.dtype), np.where(x > hi, np.asarray(hi).astype(x.dtype), x))
    if op == "leaky_relu" and not dt.is_float(_name(x)):
        x = x.astype(_np(dt.float_result(_name(x))))
    fx = x.astype(_np(dt.float_result(_name(x))))
    if op == "gelu":
        if _attr(node, "approximate", "none") == "tanh":
            r = 0.5 * fx * (1 + np.tanh(math.sqrt(2 / math.pi) * (fx + 0.044715 * fx ** 3)))
        else:
            r = 0.5 * fx * (1 + np.vectorize(math.erf, otypes=[np.float64])(fx / math.sqrt(2)))
    elif op == "elu":
        r = np.where(fx > 0, fx, _attr(node, "alpha", 1.0) * np.expm1(fx))
    elif op == "silu":
        r = fx / (1 + np.exp(-fx))
    elif op == "softplus":
        beta, th = _attr(node, "beta", 1.0), _attr(node, "threshold", 20.0)
        r = np.where(fx * beta > th, fx, np.log1p(np.exp(fx * beta)) / beta)
    else:  # leaky_relu
        r = np.where(fx > 0, fx, fx * _attr(node, "negative_slope", 0.01))
    return np.asarray(r).astype(fx.dtype)


def evaluate(graph: Any, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Runs ``graph`` on ``inputs``; returns the outputs as arrays with kiln's result dtypes."""
    vals: list[np.ndarray] = []
    for spec, x in zip(graph.inputs, inputs):
        x = np.asarray(x)
        assert _name(x) == dt.from_wire(spec.type.dtype), (spec.name, x.dtype)
        assert list(x.shape) == list(spec.type.shape), (spec.name, x.shape)
        vals.append(x)
    with np.errstate(all="ignore"):
        for node in graph.nodes:
            ins = [vals[i] for i in node.inputs]
            vals.append(np.asarray(_eval(node, ins)))
    return [vals[i] for i in graph.outputs]


def _eval(node: Any, ins: list[np.ndarray]) -> np.ndarray:
    op = node.op
    if op in _UNARY:
        (x,) = ins
        if op in ("exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh",
                  "asin", "acos", "atan", "sinh", "cosh", "sigmoid", "erf", "reciprocal"):
            x = x.astype(_np(dt.float_result(_name(x))))
        r = _UNARY[op](x)
        if op in ("floor", "ceil", "round", "trunc", "neg", "abs", "sign", "bitwise_not") or op in ("erf",):
            r = np.asarray(r).astype(x.dtype)
        return r
    if op in _BINARY:
        a, b = ins
        out = dt.promote(_name(a), _name(b))
        if op in ("div", "atan2"):
            # div is NumPy's true division (integers and bools in f64); atan2 uses FloatResult
            out = (out if dt.is_float(out) else "f64") if op == "div" else dt.float_result(out)
            a, b = a.astype(_np(out)), b.astype(_np(out))
        elif op not in ("eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor"):
            a, b = a.astype(_np(out)), b.astype(_np(out))
        return _BINARY[op](a, b)
    if op == "where":
        c, a, b = ins
        out = dt.promote(_name(a), _name(b))
        return np.where(c, a.astype(_np(out)), b.astype(_np(out)))
    if op in ("clamp", "clip"):
        (x,) = ins
        lo, hi = _attr(node, "min"), _attr(node, "max")
        r = x
        if lo is not None:
            r = np.where(r < lo, np.asarray(lo).astype(x.dtype), r)
        if hi is not None:
            r = np.where(r > hi, np.asarray(hi).astype(x.dtype), r)
        return r.astype(x.dtype)
    if op == "cast":
        (x,) = ins
        d = _attr(node, "dtype")
        if d == "bool":
            return x != 0
        return x.astype(_np(d))
    if op == "broadcast_to":
        return np.broadcast_to(ins[0], tuple(_attr(node, "shape")))
    if op == "reshape":
        return ins[0].reshape(tuple(_attr(node, "shape")))
    if op == "permute":
        return np.transpose(ins[0], _attr(node, "dims"))
    if op == "squeeze":
        ax = _attr(node, "axes")
        return np.squeeze(ins[0], axis=None if ax is None else tuple(ax))
    if op == "unsqueeze":
        return np.expand_dims(ins[0], tuple(_attr(node, "axes")))
    if op == "slice":
        x = ins[0]
        idx: list[Any] = [slice(None)] * x.ndim
        steps = _attr(node, "steps") or [1] * len(_attr(node, "axes"))
        for a, s0, s1, st in zip(_attr(node, "axes"), _attr(node, "starts"), _attr(node, "stops"), steps):
            idx[a] = slice(s0, s1, st)
        return x[tuple(idx)]
    if op == "concat":
        out = dt.promote_all([_name(x) for x in ins])
        return np.concatenate([x.astype(_np(out)) for x in ins], axis=_attr(node, "axis"))
    if op == "constant":
        return _attr(node, "value")
    if op == "full":
        return np.full(tuple(_attr(node, "shape")), _attr(node, "value"), dtype=_np(_attr(node, "dtype")))
    if op == "iota":
        shape = tuple(_attr(node, "shape"))
        axis = _attr(node, "axis")
        idx = np.arange(shape[axis]).reshape([-1 if i == axis else 1 for i in range(len(shape))])
        return np.broadcast_to(idx, shape).astype(_np(_attr(node, "dtype")))
    if op in ("sum", "prod", "max", "min", "mean", "any", "all", "var", "std", "logsumexp", "norm"):
        (x,) = ins
        ax = _axes(node, x.ndim)
        kd = bool(_attr(node, "keepdim", False))
        name = _name(x)
        if op in ("sum", "prod"):
            return getattr(np, op)(x.astype(_np(dt.sum_result(name))), axis=ax, keepdims=kd)
        if op in ("max", "min", "any", "all"):
            return getattr(np, op)(x, axis=ax, keepdims=kd)
        fx = x.astype(_np(dt.float_result(name)))
        if op == "mean":
            return np.mean(fx, axis=ax, keepdims=kd).astype(fx.dtype)
        if op in ("var", "std"):
            return getattr(np, op)(fx, axis=ax, keepdims=kd, ddof=_attr(node, "correction", 0.0)).astype(fx.dtype)
        if op == "logsumexp":
            if any(x.shape[a] == 0 for a in ax):  # log(sum(exp(nothing))) = log(0), as scipy gives
                return np.full(np.sum(fx, axis=ax, keepdims=kd).shape, -np.inf, dtype=fx.dtype)
            m = np.max(fx, axis=ax, keepdims=True)
            r = np.log(np.sum(np.exp(fx - m), axis=ax, keepdims=True)) + m
            return r if kd else np.squeeze(r, axis=ax)
        order = _attr(node, "ord", 2.0)
        if order == 2.0:
            r = np.sqrt(np.sum(fx * fx, axis=ax, keepdims=kd))
        elif order == 1.0:
            r = np.sum(np.abs(fx), axis=ax, keepdims=kd)
        else:
            r = np.max(np.abs(fx), axis=ax, keepdims=kd)
        return r.astype(fx.dtype)
    if op in ("argmax", "argmin"):
        (x,) = ins
        axis = _attr(node, "axis")
        kd = bool(_attr(node, "keepdim", False))
        return getattr(np, op)(x, axis=axis, keepdims=kd).astype(np.int64)
    if op in ("softmax", "log_softmax"):
        (x,) = ins
        fx = x.astype(_np(dt.float_result(_name(x))))
        axis = _attr(node, "axis", -1)
        if fx.size == 0:  # nothing to compute (kiln, like torch, accepts an empty axis here)
            return fx
        e = np.exp(fx - fx.max(axis=axis, keepdims=True))
        s = e / e.sum(axis=axis, keepdims=True)
        return s if op == "softmax" else np.log(s)
    if op == "relu":
        return np.maximum(ins[0], 0).astype(ins[0].dtype)
    if op in ("gelu", "elu", "silu", "softplus", "leaky_relu", "hardtanh"):
        return _activation(node, ins[0])
    if op == "layer_norm":
        x = ins[0]
        out = dt.promote_all([_name(a) for a in ins])
        fx = x.astype(_np(dt.float_result(out)))
        ax = tuple(sorted({a % x.ndim for a in (_attr(node, "axes") or [-1])}))
        mu = fx.mean(axis=ax, keepdims=True)
        var = ((fx - mu) ** 2).mean(axis=ax, keepdims=True)
        y = (fx - mu) / np.sqrt(var + _attr(node, "eps", 1e-5))
        full = [x.shape[i] if i in ax else 1 for i in range(x.ndim)]
        for k, p in enumerate(ins[1:]):
            p = p.reshape(full)
            y = y * p if k == 0 else y + p
        return y.astype(_np(dt.float_result(out)))
    raise NotImplementedError(f"graph_eval: op {op!r}")
