"""Random *valid* kiln graphs for property tests and fuzz seeds.

``make_graph(seed)`` builds a small graph with the Python GraphBuilder: every op of the
registry except the externs, every dtype, views (permute, slice with negative steps, reshape,
squeeze/unsqueeze, broadcast), concat, and zero- and one-sized dimensions. The same seed
always gives the same graph and inputs.

Values carry an ``exact`` flag: graph inputs (and views of them) and integer values are exact;
float values computed by math ops are not, because kiln computes f16/bf16 chains in float and
its math library may differ from NumPy's in the last bit. Ops that would magnify a last-bit
difference into a different answer (floor, comparisons, argmax, float -> int casts...) are
only applied to exact values, so a mismatch against NumPy is a real bug.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import numpy as np

import kiln
from kiln import dtypes as dt

FLOATS = ("f16", "f32", "f64")
INTS = ("i8", "i16", "i32", "i64", "u8")
# bf16 has no NumPy dtype here (ml_dtypes is optional): graphs using it compile only.
ALL_DTYPES = FLOATS + INTS + ("bool", "bf16")

UNARY_FLOAT = ["exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh",
               "asin", "acos", "atan", "sinh", "cosh", "sigmoid", "erf", "reciprocal"]
UNARY_SMOOTH_SAME = ["abs", "neg"]
UNARY_STEP = ["floor", "ceil", "round", "trunc", "sign"]
UNARY_BOOL = ["logical_not", "isnan", "isinf"]
BINARY_SMOOTH = ["add", "mul", "maximum", "minimum", "sub", "div", "atan2"]
BINARY_COMPARE = ["eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor"]
BINARY_BITWISE = ["bitwise_and", "bitwise_or", "bitwise_xor"]
COMPOSITES_FLOAT = ["softmax", "log_softmax", "gelu", "elu", "silu", "softplus", "leaky_relu", "hardtanh"]


@dataclasses.dataclass
class Val:
    v: Any  # kiln.builder.Value
    exact: bool

    @property
    def dtype(self) -> str:
        return self.v.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.v.shape)


@dataclasses.dataclass
class RandomGraph:
    seed: int
    graph: Any  # kiln.v1.Graph
    inputs: list[np.ndarray]
    uses_bf16: bool
    ops: list[str]


def _random_shape(r: np.random.Generator) -> tuple[int, ...]:
    rank = int(r.integers(0, 4))
    return tuple(int(r.choice([0, 1, 1, 2, 3, 4, 5])) if r.random() < 0.9 else 1 for _ in range(rank))


def _random_array(r: np.random.Generator, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    if dtype == "bool":
        return r.random(shape) < 0.5
    if dtype in INTS:
        lo = 0 if dtype == "u8" else -4
        return r.integers(lo, 5, shape).astype(dt.to_numpy(dtype))
    return (r.standard_normal(shape) * 1.5).astype(dt.to_numpy(dtype if dtype != "bf16" else "f32"))


class _Gen:
    def __init__(self, seed: int) -> None:
        self.r = np.random.default_rng(seed)
        self.b = kiln.GraphBuilder()
        self.vals: list[Val] = []
        self.inputs: list[np.ndarray] = []
        self.ops: list[str] = []
        self.bf16 = False

    def pick(self, pred: Callable[[Val], bool] = lambda v: True) -> Optional[Val]:
        c = [v for v in self.vals if pred(v)]
        return c[int(self.r.integers(len(c)))] if c else None

    def choice(self, seq: Any) -> Any:
        return seq[int(self.r.integers(len(seq)))]

    def add_input(self) -> None:
        dtype = self.choice(ALL_DTYPES) if self.r.random() < 0.9 else "f32"
        if dtype == "bf16" and self.r.random() < 0.7:
            dtype = "f32"
        shape = _random_shape(self.r)
        name = f"x{len(self.inputs)}"
        arr = _random_array(self.r, dtype, shape)
        self.bf16 |= dtype == "bf16"
        self.inputs.append(arr)
        self.vals.append(Val(self.b.input(name, dtype, shape), True))

    def push(self, v: Any, exact: bool, op: str) -> None:
        self.ops.append(op)
        self.bf16 |= v.dtype == "bf16"
        self.vals.append(Val(v, exact or not dt.is_float(v.dtype)))

    # ---- one random op; returns False when the drawn op did not apply
    def step(self) -> bool:
        b, r = self.b, self.r
        kind = self.choice(["unary", "unary", "binary", "binary", "layout", "layout", "reduce", "source",
                            "composite", "cast", "where", "concat", "clamp"])
        if kind == "unary":
            x = self.pick()
            if x is None:
                return False
            op = self.choice(UNARY_FLOAT + UNARY_SMOOTH_SAME + UNARY_STEP + UNARY_BOOL + ["bitwise_not"])
            if op == "bitwise_not" and dt.is_float(x.dtype):
                return False
            if op in ("neg", "sign") and x.dtype == "bool":
                return False
            if op in UNARY_STEP and not x.exact:
                return False
            self.push(b.unary(op, x.v), x.exact and op not in UNARY_FLOAT, op)
            return True
        if kind == "binary":
            x = self.pick()
            if x is None:
                return False
            y = self.pick(lambda v: _broadcastable(v.shape, x.shape))
            if y is None:
                return False
            op = self.choice(BINARY_SMOOTH + BINARY_COMPARE + BINARY_BITWISE + ["floordiv", "remainder", "pow"])
            out = dt.promote(x.dtype, y.dtype)
            if op in BINARY_BITWISE and dt.is_float(out):
                return False
            if op in ("sub", "floordiv", "remainder", "pow") and out == "bool":
                return False
            if op in BINARY_COMPARE and not (x.exact and y.exact):
                return False
            if op in ("floordiv", "remainder"):
                if not (x.exact and y.exact):
                    return False
                # A divisor of at least 1: no division by zero, no INT_MIN // -1.
                d = b.maximum(b.abs(y.v), b.constant(1, "i8" if not dt.is_float(y.dtype) else y.dtype))
                self.push(b.binary(op, x.v, d), True, op)
                return True
            if op == "pow":
                if not dt.is_float(out) or not x.exact:
                    return False
                # Positive base, small exponent: no NaN/inf edge differences between libms.
                base = b.add(b.abs(x.v), b.constant(0.5, x.dtype if dt.is_float(x.dtype) else "f32"))
                e = b.clamp(y.v, -2, 2) if dt.is_float(y.dtype) else y.v
                self.push(b.binary("pow", base, e), False, op)
                return True
            exact = x.exact and y.exact and (not dt.is_float(out) or op in ("maximum", "minimum"))
            self.push(b.binary(op, x.v, y.v), exact, op)
            return True
        if kind == "clamp":
            x = self.pick(lambda v: v.dtype != "bool")
            if x is None:
                return False
            lo, hi = sorted(int(t) for t in r.integers(-3, 4, 2))
            which = self.choice(["both", "lo", "hi"])
            op = self.choice(["clamp", "clip"])
            v = b.clamp if op == "clamp" else b.clip
            self.push(v(x.v, lo if which != "hi" else None, hi if which != "lo" else None), x.exact, op)
            return True
        if kind == "cast":
            x = self.pick()
            if x is None:
                return False
            to = self.choice(ALL_DTYPES)
            if dt.is_float(x.dtype) and not dt.is_float(to) and not x.exact:
                return False
            # Narrowing a float to f16/bf16 rounds: the result is exact only if the input was.
            self.push(b.cast(x.v, to), x.exact, "cast")
            return True
        if kind == "where":
            c = self.pick(lambda v: v.dtype == "bool")
            if c is None:
                return False
            x = self.pick(lambda v: _broadcastable(v.shape, c.shape))
            if x is None:
                return False
            y = self.pick(lambda v: _broadcastable(v.shape, _bshape(c.shape, x.shape)))
            if y is None:
                return False
            self.push(b.where(c.v, x.v, y.v), x.exact and y.exact, "where")
            return True
        if kind == "concat":
            x = self.pick(lambda v: len(v.shape) > 0)
            if x is None:
                return False
            axis = int(r.integers(len(x.shape)))
            same = [v for v in self.vals if len(v.shape) == len(x.shape)
                    and all(a == c for i, (a, c) in enumerate(zip(v.shape, x.shape)) if i != axis)]
            parts = [x] + [same[int(r.integers(len(same)))] for _ in range(int(r.integers(1, 3)))]
            self.push(b.concat([p.v for p in parts], axis=axis - len(x.shape) if r.random() < 0.3 else axis),
                      all(p.exact for p in parts), "concat")
            return True
        if kind == "layout":
            x = self.pick()
            if x is None:
                return False
            return self.layout(x)
        if kind == "reduce":
            x = self.pick()
            if x is None:
                return False
            rank = len(x.shape)
            axes = sorted(set(int(a) for a in r.integers(0, max(rank, 1), int(r.integers(0, rank + 1))))) if rank else []
            keep = bool(r.random() < 0.4)
            reduced = axes if axes else list(range(rank))
            empty = any(x.shape[a] == 0 for a in reduced)
            op = self.choice(["sum", "prod", "max", "min", "any", "all", "mean", "var", "std", "argmax", "argmin",
                              "logsumexp", "norm"])
            if op in ("max", "min", "argmax", "argmin") and empty:
                return False
            if op in ("argmax", "argmin"):
                if not x.exact or x.dtype == "bool" or rank == 0:
                    return False
                axis = int(r.integers(rank)) if r.random() < 0.7 else None
                if axis is None and x.v.size == 0:
                    return False
                if axis is not None and x.shape[axis] == 0:
                    return False
                self.push(getattr(b, op)(x.v, axis=axis, keepdim=keep), True, op)
                return True
            if op in ("prod",) and dt.is_float(x.dtype) and x.dtype != "f64":
                return False  # products of many f16/f32 values amplify rounding
            if op == "norm":
                order = self.choice([1.0, 2.0, float("inf")])
                if empty and order == float("inf"):
                    return False
                self.push(b.norm(x.v, ord=order, axes=axes or None, keepdim=keep), False, op)
                return True
            if op == "logsumexp":
                self.push(b.logsumexp(x.v, axes=axes or None, keepdim=keep), False, op)
                return True
            if op in ("var", "std"):
                corr = self.choice([0.0, 1.0])
                self.push(getattr(b, op)(x.v, axes=axes or None, keepdim=keep, correction=corr), False, op)
                return True
            exact = (op in ("max", "min", "any", "all")) and x.exact or not dt.is_float(dt.sum_result(x.dtype)) and op != "mean"
            self.push(b.reduce(op, x.v, axes or None, keep), exact, op)
            return True
        if kind == "source":
            op = self.choice(["constant", "full", "iota"])
            dtype = self.choice(ALL_DTYPES)
            shape = _random_shape(r)
            if op == "constant":
                if dtype == "bf16":
                    return False
                self.push(b.constant(_random_array(r, dtype, shape), dtype), True, op)
            elif op == "full":
                value = float(r.integers(-3, 4)) if dtype in INTS + ("bool",) else float(np.round(r.standard_normal(), 2))
                if dtype == "u8":
                    value = abs(value)
                self.push(b.full(shape, value, dtype), True, op)
            else:
                if not shape or dtype == "bool":
                    return False
                self.push(b.iota(shape, int(r.integers(len(shape))), dtype), True, op)
            return True
        if kind == "composite":
            x = self.pick()
            if x is None:
                return False
            op = self.choice(COMPOSITES_FLOAT + ["relu", "layer_norm"])
            if op in ("softmax", "log_softmax"):
                if not x.shape:
                    return False
                self.push(getattr(b, op)(x.v, axis=int(r.integers(-len(x.shape), len(x.shape)))), False, op)
                return True
            if op == "layer_norm":
                if not x.shape:
                    return False
                axes = [-1] if r.random() < 0.7 else list(range(len(x.shape)))
                norm_shape = tuple(x.shape[a] for a in axes)
                w = self.pick(lambda v: v.shape == norm_shape)
                bias = self.pick(lambda v: v.shape == norm_shape) if w is not None else None
                self.push(b.layer_norm(x.v, w.v if w else None, bias.v if bias else None, axes=axes), False, op)
                return True
            if op == "relu":
                if x.dtype == "bool":
                    return False
                self.push(b.relu(x.v), x.exact, op)
                return True
            if op == "hardtanh":
                self.push(b.hardtanh(x.v, -1.0, 1.0), x.exact and not dt.is_float(x.dtype), op)
                return True
            if op == "gelu":
                self.push(b.gelu(x.v, approximate=self.choice(["none", "tanh"])), False, op)
                return True
            self.push(getattr(b, op)(x.v), False, op)
            return True
        return False

    def layout(self, x: Val) -> bool:
        b, r = self.b, self.r
        shape = x.shape
        op = self.choice(["permute", "slice", "reshape", "squeeze", "unsqueeze", "broadcast_to", "index"])
        if op == "permute":
            if not shape:
                return False
            dims = [int(d) for d in r.permutation(len(shape))]
            self.push(b.permute(x.v, dims), x.exact, op)
        elif op == "slice":
            if not shape:
                return False
            axis = int(r.integers(len(shape)))
            n = shape[axis]
            step = int(self.choice([1, 1, 2, -1, -2, 3]))
            start = int(r.integers(-n - 1, n + 2))
            stop = int(r.integers(-n - 1, n + 2))
            self.push(b.slice(x.v, [axis], [start], [stop], [step]), x.exact, op)
        elif op == "reshape":
            size = int(np.prod(shape)) if shape else 1
            if size == 0:
                new = (0,) if r.random() < 0.5 else (2, 0, 1)
            else:
                new = _factor(r, size)
                if len(new) > 1 and r.random() < 0.3:
                    k = int(r.integers(len(new)))
                    new = tuple(-1 if i == k else d for i, d in enumerate(new))
            self.push(b.reshape(x.v, new), x.exact, op)
        elif op == "squeeze":
            if 1 not in shape:
                return False
            self.push(b.squeeze(x.v), x.exact, op)
        elif op == "unsqueeze":
            if len(shape) >= 4:
                return False
            self.push(b.unsqueeze(x.v, [int(r.integers(len(shape) + 1))]), x.exact, op)
        elif op == "broadcast_to":
            if len(shape) >= 4:
                return False
            target = tuple(int(r.choice([2, 3])) if d == 1 and r.random() < 0.7 else d for d in shape)
            if r.random() < 0.5:
                target = (int(r.choice([1, 2])),) + target
            self.push(b.broadcast_to(x.v, target), x.exact, op)
        else:  # NumPy-style indexing through the builder
            if not shape or shape[0] == 0:
                return False
            self.push(x.v[int(r.integers(-shape[0], shape[0]))], x.exact, "slice")
        return True


def _broadcastable(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    for x, y in zip(reversed(a), reversed(b)):
        if x != y and x != 1 and y != 1:
            return False
    return True


def _bshape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(d) for d in np.broadcast_shapes(a, b))


def _factor(r: np.random.Generator, size: int) -> tuple[int, ...]:
    dims = []
    rest = size
    for p in (2, 3, 5, 2, 3):
        if rest % p == 0 and r.random() < 0.5:
            dims.append(p)
            rest //= p
    dims.append(rest)
    r.shuffle(dims)
    return tuple(int(d) for d in dims)


def make_graph(seed: int, steps: Optional[int] = None) -> RandomGraph:
    """A random valid graph and matching random inputs, fixed by ``seed``."""
    g = _Gen(seed)
    for _ in range(int(g.r.integers(1, 4))):
        g.add_input()
    want = steps if steps is not None else int(g.r.integers(3, 14))
    tries = 0
    while len(g.ops) < want and tries < 400:
        tries += 1
        g.step()
    computed = g.vals[len(g.inputs):] or g.vals
    k = min(len(computed), int(g.r.integers(1, 4)))
    idx = sorted(set(int(i) for i in g.r.choice(len(computed), size=k, replace=False)))
    outs = [computed[i].v for i in idx]
    if not any(o is computed[-1].v for o in outs):
        outs.append(computed[-1].v)
    graph = g.b.build(outs)
    return RandomGraph(seed, graph, g.inputs, g.bf16, g.ops)
