"""GraphBuilder: writes kiln.v1.Graph messages with a method per op of the kiln op set.

Example::

    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (1024, 64))
    y = b.input("y", "f32", (64,))
    z = b.exp(x - y)                      # operators work on the returned values
    s = b.sum(z, axes=[1], keepdim=True)
    graph = b.build([z / s])              # a kiln.v1.Graph

Every method checks its operands and infers the output's dtype and shape the way the daemon
does (the rules of the op reference), so mistakes surface at the call that made them, and every
:class:`Value` knows its ``dtype`` and ``shape``. Python scalars mixed with values become
``constant`` nodes typed by NumPy 2's weak-scalar rule (:func:`kiln.dtypes.weak_scalar_dtype`):
``x_f32 * 2`` stays f32, ``x_i32 + 0.5`` is f64.

Graph inputs may be added at any time; value ids are assigned by :meth:`GraphBuilder.build`,
which also drops nodes that no output depends on.
"""

from __future__ import annotations

import contextlib
import math
import operator
from typing import Any, Iterable, Iterator, Optional, Sequence, Union

import numpy as np

from . import dtypes as dt
from .dtypes import DTypeLike
from .op_table import BINARY_RULES, REDUCTION_RULES, UNARY_RULES
from .v1 import graph_pb2

Shape = tuple[int, ...]
Operand = Union["Value", bool, int, float, np.ndarray, np.generic]



def unary_result(op: str, rule: str, x: str) -> str:
    """The result type of unary ``op`` under its typing-table ``rule`` (op_table.py) on type ``x``;
    TypeError where the rule refuses it. The daemon's registry applies the same rules."""
    if rule == "Float":
        return dt.float_result(x)
    if rule == "BoolOut":
        return "bool"
    if rule == "Signed" and x == "bool":
        raise TypeError(f"{op} is not defined for bool")
    if rule == "IntOrBool" and dt.is_float(x):
        raise TypeError(f"{op} takes integers or bool, not {x}")
    return x  # Same, and Signed or IntOrBool on a type they accept


def binary_result(op: str, rule: str, a: str, b: str) -> str:
    """The result type of binary ``op`` under its ``rule`` on types ``a`` and ``b``: NumPy's
    promotion, then the rule; TypeError where the rule refuses them."""
    t = dt.promote(a, b)
    if rule == "Float":
        return dt.float_result(t)
    if rule == "TrueDiv":  # NumPy's true division: integers and bools divide in float64
        return t if dt.is_float(t) else "f64"
    if rule == "BoolOut":
        return "bool"
    if rule == "Numeric" and t == "bool":
        raise TypeError(f"{op} is not defined for bool inputs")
    if rule == "IntOrBool" and dt.is_float(t):
        raise TypeError(f"{op} takes integers or bool, not {t}")
    return t  # Promote, and Numeric or IntOrBool on types they accept


def reduction_result(rule: str, x: str) -> str:
    """The result type of a reduction under its ``rule`` on type ``x``."""
    if rule == "Sum":
        return dt.sum_result(x)
    if rule == "Float":
        return dt.float_result(x)
    if rule == "Bool":
        return "bool"
    return x  # Extremum


# Attribute kinds as the wire has them (AttrValue's oneof).
_ATTR_KINDS = ("i", "f", "s", "b", "dtype", "ints", "floats", "tensor")


def broadcast_shapes(*shapes: Sequence[int]) -> Shape:
    """NumPy broadcasting of shapes; ValueError naming the shapes when they do not broadcast."""
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        for i, d in enumerate(s):
            j = rank - len(s) + i
            if d == out[j] or d == 1:
                continue
            if out[j] == 1:
                out[j] = d
            else:
                raise ValueError(
                    "shapes do not broadcast: " + " vs ".join(str(tuple(x)) for x in shapes)
                )
    return tuple(out)


def normalize_axes(axes: Optional[Iterable[int]], rank: int, empty_means_all: bool = True) -> list[int]:
    """Sorted, deduplicated non-negative axes; None (or empty, if ``empty_means_all``) means all."""
    if axes is None:
        return list(range(rank))
    if isinstance(axes, (int, np.integer)):
        axes = [int(axes)]
    out = set()
    for a in axes:
        a = operator.index(a)
        if not -rank <= a < rank:
            raise ValueError(f"axis {a} is out of range for rank {rank}")
        out.add(a % rank)
    if not out and empty_means_all:
        return list(range(rank))
    return sorted(out)


class Value:
    """One value of a graph under construction: a graph input or a node's output.

    Knows its ``dtype`` (a kiln dtype name) and ``shape``. Arithmetic, comparison and bitwise
    operators, ``-x``, ``abs(x)``, ``~x`` and basic indexing (``x[1:, None, ..., 0]``) emit nodes
    in the owning builder. A value has no truth value: ``if value:`` raises TypeError.
    """

    __slots__ = ("builder", "ref", "dtype", "shape")

    def __init__(self, builder: "GraphBuilder", ref: tuple[str, int], dtype: str, shape: Shape) -> None:
        self.builder = builder
        self.ref = ref  # ("input", i) or ("node", j); ids are assigned at build()
        self.dtype = dtype
        self.shape = shape

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def is_input(self) -> bool:
        return self.ref[0] == "input"

    def __repr__(self) -> str:
        return f"<kiln.Value {self.ref[0]} {self.ref[1]}: {self.dtype}{list(self.shape)}>"

    __hash__ = object.__hash__

    def __bool__(self) -> bool:
        raise TypeError("a kiln graph value has no truth value (it is not computed yet)")

    # Arithmetic.
    def __add__(self, o: Operand) -> "Value": return self.builder.add(self, o)
    def __radd__(self, o: Operand) -> "Value": return self.builder.add(o, self)
    def __sub__(self, o: Operand) -> "Value": return self.builder.sub(self, o)
    def __rsub__(self, o: Operand) -> "Value": return self.builder.sub(o, self)
    def __mul__(self, o: Operand) -> "Value": return self.builder.mul(self, o)
    def __rmul__(self, o: Operand) -> "Value": return self.builder.mul(o, self)
    def __truediv__(self, o: Operand) -> "Value": return self.builder.div(self, o)
    def __rtruediv__(self, o: Operand) -> "Value": return self.builder.div(o, self)
    def __floordiv__(self, o: Operand) -> "Value": return self.builder.floordiv(self, o)
    def __rfloordiv__(self, o: Operand) -> "Value": return self.builder.floordiv(o, self)
    def __mod__(self, o: Operand) -> "Value": return self.builder.remainder(self, o)
    def __rmod__(self, o: Operand) -> "Value": return self.builder.remainder(o, self)
    def __pow__(self, o: Operand) -> "Value": return self.builder.pow(self, o)
    def __rpow__(self, o: Operand) -> "Value": return self.builder.pow(o, self)
    def __matmul__(self, o: Operand) -> "Value": return self.builder.matmul(self, o)
    def __rmatmul__(self, o: Operand) -> "Value": return self.builder.matmul(o, self)
    def __neg__(self) -> "Value": return self.builder.neg(self)
    def __pos__(self) -> "Value": return self
    def __abs__(self) -> "Value": return self.builder.abs(self)
    def __invert__(self) -> "Value": return self.builder.bitwise_not(self)
    def __and__(self, o: Operand) -> "Value": return self.builder.bitwise_and(self, o)
    def __rand__(self, o: Operand) -> "Value": return self.builder.bitwise_and(o, self)
    def __or__(self, o: Operand) -> "Value": return self.builder.bitwise_or(self, o)
    def __ror__(self, o: Operand) -> "Value": return self.builder.bitwise_or(o, self)
    def __xor__(self, o: Operand) -> "Value": return self.builder.bitwise_xor(self, o)
    def __rxor__(self, o: Operand) -> "Value": return self.builder.bitwise_xor(o, self)

    # Comparisons give bool values.
    def __eq__(self, o: Operand) -> "Value": return self.builder.eq(self, o)  # type: ignore[override]
    def __ne__(self, o: Operand) -> "Value": return self.builder.ne(self, o)  # type: ignore[override]
    def __lt__(self, o: Operand) -> "Value": return self.builder.lt(self, o)
    def __le__(self, o: Operand) -> "Value": return self.builder.le(self, o)
    def __gt__(self, o: Operand) -> "Value": return self.builder.gt(self, o)
    def __ge__(self, o: Operand) -> "Value": return self.builder.ge(self, o)

    def __getitem__(self, key: Any) -> "Value":
        return self.builder.index(self, key)

    # Conveniences mirroring the builder.
    def astype(self, dtype: DTypeLike) -> "Value":
        return self.builder.cast(self, dtype)

    def reshape(self, *shape: Any) -> "Value":
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = tuple(shape[0])
        return self.builder.reshape(self, shape)

    @property
    def T(self) -> "Value":
        return self.builder.permute(self, list(range(self.ndim))[::-1])


class _Node:
    __slots__ = ("op", "inputs", "attrs", "name")

    def __init__(self, op: str, inputs: list[tuple[str, int]], attrs: dict[str, tuple[str, Any]], name: str) -> None:
        self.op = op
        self.inputs = inputs
        self.attrs = attrs
        self.name = name


class GraphBuilder:
    """Builds a kiln.v1.Graph. See the module docstring for an example.

    Methods named after ops take :class:`Value` operands (Python and NumPy scalars are accepted
    where an elementwise op takes a tensor) and return the output :class:`Value`. Attribute
    arguments follow the op reference: ``axes`` lists of ints, ``keepdim`` bools, ``dtype``
    anything :func:`kiln.dtypes.dtype_name` accepts. Not thread-safe.
    """

    def __init__(self) -> None:
        self._inputs: list[tuple[str, str, Shape, Optional[tuple[int, ...]]]] = []
        self._input_dims: list[Optional[tuple[str, ...]]] = []
        self._input_values: list[Value] = []
        self._nodes: list[_Node] = []
        self._node_values: list[Value] = []
        self._consts: dict[tuple[Any, ...], Value] = {}
        self._scope: list[str] = []

    # ------------------------------------------------------------------ structure

    def input(self, name: str, dtype: DTypeLike, shape: Sequence[int], strides: Optional[Sequence[int]] = None,
              dims: Optional[Sequence[Optional[str]]] = None) -> Value:
        """Adds a graph input. ``strides`` (in elements, optional) declares a non-contiguous
        layout the caller will pass (e.g. a transposed array); omitted means C-contiguous.

        ``dims`` (optional, one entry per dimension) makes dimensions symbolic: a name (``"N"``)
        stands for a size known only at run time, the same name for the same size across
        inputs; None or ``""`` keeps a dimension static. The compiled kernel then serves every
        value of the symbols (kernels/codegen/ABI.md, version 2). ``shape`` still gives an
        example size for each symbolic dimension, which this builder's own shape inference
        uses; keep it generic (not 0 or 1) so that broadcasting is inferred as for any size.
        """
        shp = tuple(operator.index(d) for d in shape)
        if any(d < 0 for d in shp):
            raise ValueError(f"input {name!r}: negative dimension in {shp}")
        st = None
        if strides is not None:
            st = tuple(operator.index(s) for s in strides)
            if len(st) != len(shp):
                raise ValueError(f"input {name!r}: {len(st)} strides for rank {len(shp)}")
        sym: Optional[tuple[str, ...]] = None
        if dims is not None:
            sym = tuple(d or "" for d in dims)
            if len(sym) != len(shp):
                raise ValueError(f"input {name!r}: {len(sym)} dims for rank {len(shp)}")
            if not any(sym):
                sym = None
            elif st is not None:
                raise ValueError(f"input {name!r}: symbolic dimensions need a contiguous input (no strides)")
        v = Value(self, ("input", len(self._inputs)), dt.dtype_name(dtype), shp)
        self._inputs.append((name, v.dtype, shp, st))
        self._input_dims.append(sym)
        self._input_values.append(v)
        return v

    @property
    def inputs(self) -> list[Value]:
        """The input values, in order."""
        return list(self._input_values)

    @contextlib.contextmanager
    def name_scope(self, name: str) -> Iterator[None]:
        """Nodes created inside get ``name`` (shown in the daemon's error messages)."""
        self._scope.append(name)
        try:
            yield
        finally:
            self._scope.pop()

    def node(self, op: str, inputs: Sequence[Value], attrs: dict[str, tuple[str, Any]], dtype: DTypeLike, shape: Sequence[int]) -> Value:
        """Low-level: appends a node whose output type the caller states.

        ``attrs`` maps names to ``(kind, value)`` with kind one of ``i f s b dtype ints floats
        tensor`` (a ``tensor`` value is a NumPy array). Prefer the op methods, which check and
        infer; this is the escape hatch for ops newer than this client.
        """
        for k, (kind, _) in attrs.items():
            if kind not in _ATTR_KINDS:
                raise ValueError(f"attribute {k!r}: unknown kind {kind!r}")
        for v in inputs:
            self._check_owned(v)
        n = _Node(op, [v.ref for v in inputs], dict(attrs), self._scope[-1] if self._scope else "")
        v = Value(self, ("node", len(self._nodes)), dt.dtype_name(dtype), tuple(int(d) for d in shape))
        self._nodes.append(n)
        self._node_values.append(v)
        return v

    def _check_owned(self, v: Value) -> None:
        if not isinstance(v, Value):
            raise TypeError(f"expected a kiln Value, got {type(v).__name__}")
        if v.builder is not self:
            raise ValueError("a Value from another GraphBuilder was used")

    def build(self, outputs: Union[Value, Sequence[Value]], prune: bool = True) -> Any:
        """Returns the kiln.v1.Graph computing ``outputs`` (one value or a sequence).

        With ``prune`` (default), nodes no output depends on are left out. Every input stays,
        used or not: the kernel's argument list is the graph's input list.
        """
        outs = [outputs] if isinstance(outputs, Value) else list(outputs)
        if not outs:
            raise ValueError("a graph needs at least one output")
        for v in outs:
            self._check_owned(v)

        keep = [not prune] * len(self._nodes)
        if prune:
            stack = [v.ref[1] for v in outs if v.ref[0] == "node"]
            while stack:
                j = stack.pop()
                if keep[j]:
                    continue
                keep[j] = True
                stack.extend(i for kind, i in self._nodes[j].inputs if kind == "node" and not keep[i])

        k = len(self._inputs)
        ids: dict[int, int] = {}
        for j, kept in enumerate(keep):
            if kept:
                ids[j] = k + len(ids)

        def vid(ref: tuple[str, int]) -> int:
            return ref[1] if ref[0] == "input" else ids[ref[1]]

        g = graph_pb2.Graph()
        for (name, dtype, shape, strides), sym in zip(self._inputs, self._input_dims):
            inp = g.inputs.add()
            inp.name = name
            inp.type.dtype = dt.to_wire(dtype)
            inp.type.shape.extend(shape)
            if strides is not None:
                inp.type.strides.extend(strides)
            if sym is not None:
                inp.type.dim_symbols.extend(sym)
        for j, n in enumerate(self._nodes):
            if not keep[j]:
                continue
            node = g.nodes.add()
            node.op = n.op
            node.inputs.extend(vid(r) for r in n.inputs)
            if n.name:
                node.name = n.name
            for key in sorted(n.attrs):
                _set_attr(node.attrs[key], *n.attrs[key])
        g.outputs.extend(vid(v.ref) for v in outs)
        return g

    # ------------------------------------------------------------------ operands

    def _tensor_operands(self, args: Sequence[Operand]) -> list[Value]:
        """Turns scalars and arrays among ``args`` into constants, NumPy 2 style.

        Python scalars are weak: they take the dtype the values (and NumPy scalars/arrays, which
        are strong) promote to, when their kind allows. With no tensor at all they take their
        default dtypes (bool, i64, f64).
        """
        strong: list[str] = []
        for a in args:
            if isinstance(a, Value):
                self._check_owned(a)
                strong.append(a.dtype)
            elif isinstance(a, (np.ndarray, np.generic)):
                strong.append(dt.dtype_name(a.dtype))
            elif dt.scalar_kind(a) is None:
                raise TypeError(f"expected a kiln Value or a scalar, got {type(a).__name__}")
        if strong:
            ref: Optional[str] = dt.promote_all(strong)
        else:
            # All Python scalars: NumPy takes the highest kind among them at its default dtype.
            kinds = [dt.scalar_kind(a) for a in args]
            ref = "f64" if "float" in kinds else ("i64" if "int" in kinds else "bool")
        out = []
        for a in args:
            if isinstance(a, Value):
                out.append(a)
            elif isinstance(a, (np.ndarray, np.generic)):
                out.append(self.constant(np.asarray(a)))
            else:
                out.append(self.constant(a, dt.weak_scalar_dtype(a, ref)))
        return out

    def constant(self, value: Any, dtype: Optional[DTypeLike] = None) -> Value:
        """A ``constant`` node: a Python/NumPy scalar (shape ``()``) or a small NumPy array.

        ``dtype`` defaults to the array's dtype, or NumPy's default for a Python scalar.
        Identical scalar constants are emitted once.
        """
        if dt.scalar_kind(value) is not None and dtype is None:
            dtype = dt.default_scalar_dtype(value)
        arr = np.asarray(value, dtype=dt.to_numpy(dtype) if dtype is not None and dt.dtype_name(dtype) != "bf16" else None)
        name = dt.dtype_name(dtype) if dtype is not None else dt.dtype_name(arr.dtype)
        key = None
        if arr.ndim == 0:
            item = arr.item()
            key = (name, float(item).hex() if isinstance(item, float) else int(item))
            if key in self._consts:
                return self._consts[key]
        v = self.node("constant", [], {"value": ("tensor", (name, arr))}, name, arr.shape)
        if key is not None:
            self._consts[key] = v
        return v

    def full(self, shape: Sequence[int], value: float, dtype: DTypeLike) -> Value:
        """A ``full`` node: ``shape`` filled with ``value`` converted to ``dtype``."""
        shp = tuple(operator.index(d) for d in shape)
        return self.node("full", [], {"shape": ("ints", shp), "value": ("f", float(value)), "dtype": ("dtype", dt.dtype_name(dtype))}, dtype, shp)

    def iota(self, shape: Sequence[int], axis: int, dtype: DTypeLike = "i64", like: Optional[Value] = None) -> Value:
        """An ``iota`` node: each element is its index along ``axis``. With ``like``, the shape is
        ``like``'s (a symbolic size follows it; its values are not read) and ``shape`` must
        equal it."""
        shp = tuple(operator.index(d) for d in shape)
        ax = normalize_axes([axis], len(shp))[0]
        attrs = {"axis": ("i", ax), "dtype": ("dtype", dt.dtype_name(dtype))}
        if like is not None:
            if tuple(like.shape) != shp:
                raise ValueError(f"iota: shape {shp} is not like's {tuple(like.shape)}")
            return self.node("iota", [like], attrs, dtype, shp)
        return self.node("iota", [], {"shape": ("ints", shp), **attrs}, dtype, shp)

    def uniform(self, seed: Operand, like: Value, stream: int = 0, dtype: DTypeLike = "f32") -> Value:
        """A ``uniform`` node: random numbers in [0, 1) of ``like``'s shape (its values are not
        read). The element at row-major position ``p`` is Philox4x32-10 of key ``seed`` (an
        integer tensor of one element) and counter ``(p, stream)``: the same seed, stream and
        shape give the same numbers on every backend, and different streams are independent."""
        sd = self._tensor_operands([seed])[0]
        if not dt.is_integer(sd.dtype) or math.prod(sd.shape) != 1:
            raise TypeError(f"uniform: the seed must be an integer tensor of one element, not {sd.dtype}{tuple(sd.shape)}")
        if not dt.is_float(dtype):
            raise TypeError(f"uniform: dtype must be a float type, not {dt.dtype_name(dtype)}")
        if not 0 <= operator.index(stream) < 2**32:
            raise ValueError(f"uniform: stream {stream} is outside [0, 2**32)")
        return self.node("uniform", [sd, like], {"dtype": ("dtype", dt.dtype_name(dtype)), "stream": ("i", int(stream))},
                         dtype, tuple(like.shape))

    # ------------------------------------------------------------------ elementwise

    def unary(self, op: str, x: Operand) -> Value:
        """Any unary elementwise op of the op set, by name."""
        rule = UNARY_RULES.get(op)
        if rule is None:
            raise ValueError(f"not a unary op: {op!r}")
        (x,) = self._tensor_operands([x])
        return self.node(op, [x], {}, unary_result(op, rule, x.dtype), x.shape)

    def binary(self, op: str, a: Operand, b: Operand) -> Value:
        """Any binary elementwise op of the op set, by name (NumPy broadcasting)."""
        rule = BINARY_RULES.get(op)
        if rule is None:
            raise ValueError(f"not a binary op: {op!r}")
        a, b = self._tensor_operands([a, b])
        shape = broadcast_shapes(a.shape, b.shape)
        return self.node(op, [a, b], {}, binary_result(op, rule, a.dtype, b.dtype), shape)

    def where(self, cond: Operand, a: Operand, b: Operand) -> Value:
        """``cond ? a : b`` elementwise; ``cond`` must be bool; result ``promote(a, b)``."""
        (c,) = self._tensor_operands([cond])
        if c.dtype != "bool":
            raise TypeError(f"where: the condition must be bool, not {c.dtype}")
        a, b = self._tensor_operands([a, b])
        shape = broadcast_shapes(c.shape, a.shape, b.shape)
        return self.node("where", [c, a, b], {}, dt.promote(a.dtype, b.dtype), shape)

    def clamp(self, x: Operand, min: Optional[float] = None, max: Optional[float] = None) -> Value:
        """Clamps to ``[min, max]`` (either may be omitted); NaN passes through."""
        return self._clamp("clamp", x, min, max)

    def clip(self, x: Operand, min: Optional[float] = None, max: Optional[float] = None) -> Value:
        """The ``clip`` composite: the same as :meth:`clamp`."""
        return self._clamp("clip", x, min, max)

    def _clamp(self, op: str, x: Operand, lo: Optional[float], hi: Optional[float]) -> Value:
        (x,) = self._tensor_operands([x])
        attrs: dict[str, tuple[str, Any]] = {}
        if lo is not None:
            attrs["min"] = ("f", float(lo))
        if hi is not None:
            attrs["max"] = ("f", float(hi))
        return self.node(op, [x], attrs, x.dtype, x.shape)

    def cast(self, x: Operand, dtype: DTypeLike) -> Value:
        """Converts to ``dtype``: float to int truncates toward zero, to bool is ``x != 0``."""
        (x,) = self._tensor_operands([x])
        return self.node("cast", [x], {"dtype": ("dtype", dt.dtype_name(dtype))}, dtype, x.shape)

    # ------------------------------------------------------------------ layout

    def broadcast_to(self, x: Value, shape: Sequence[int]) -> Value:
        shp = tuple(operator.index(d) for d in shape)
        if broadcast_shapes(x.shape, shp) != shp:
            raise ValueError(f"broadcast_to: {x.shape} does not broadcast to {shp}")
        return self.node("broadcast_to", [x], {"shape": ("ints", shp)}, x.dtype, shp)

    def reshape(self, x: Value, shape: Sequence[int]) -> Value:
        """Reshapes (row-major); at most one dimension may be -1."""
        shp = [operator.index(d) for d in shape]
        if shp.count(-1) > 1:
            raise ValueError("reshape: at most one -1")
        known = math.prod(d for d in shp if d != -1)
        if -1 in shp:
            if known == 0 or x.size % known:
                raise ValueError(f"reshape: cannot reshape {x.shape} to {tuple(shape)}")
            shp[shp.index(-1)] = x.size // known
        if math.prod(shp) != x.size or any(d < 0 for d in shp):
            raise ValueError(f"reshape: cannot reshape {x.shape} to {tuple(shape)}")
        return self.node("reshape", [x], {"shape": ("ints", tuple(operator.index(d) for d in shape))}, x.dtype, tuple(shp))

    def permute(self, x: Value, dims: Sequence[int]) -> Value:
        """Permutes axes: output axis i is input axis ``dims[i]``."""
        d = [operator.index(a) for a in dims]
        d = [a + x.ndim if -x.ndim <= a < 0 else a for a in d]
        if sorted(d) != list(range(x.ndim)):
            raise ValueError(f"permute: {list(dims)} is not a permutation of {x.ndim} axes")
        return self.node("permute", [x], {"dims": ("ints", tuple(d))}, x.dtype, tuple(x.shape[a] for a in d))

    def squeeze(self, x: Value, axes: Optional[Sequence[int]] = None) -> Value:
        """Removes size-1 axes (``axes``, or all of them)."""
        if axes is None:
            ax = [i for i, d in enumerate(x.shape) if d == 1]
            attrs: dict[str, tuple[str, Any]] = {}
        else:
            ax = normalize_axes(axes, x.ndim, empty_means_all=False)
            for a in ax:
                if x.shape[a] != 1:
                    raise ValueError(f"squeeze: axis {a} of {x.shape} is not 1")
            attrs = {"axes": ("ints", tuple(ax))}
        shape = tuple(d for i, d in enumerate(x.shape) if i not in ax)
        return self.node("squeeze", [x], attrs, x.dtype, shape)

    def unsqueeze(self, x: Value, axes: Sequence[int]) -> Value:
        """Inserts size-1 axes at ``axes`` (positions in the output)."""
        out_rank = x.ndim + len(axes)
        ax = normalize_axes(axes, out_rank, empty_means_all=False)
        if len(ax) != len(axes):
            raise ValueError(f"unsqueeze: repeated axes {list(axes)}")
        it = iter(x.shape)
        shape = tuple(1 if i in ax else next(it) for i in range(out_rank))
        return self.node("unsqueeze", [x], {"axes": ("ints", tuple(ax))}, x.dtype, shape)

    def slice(self, x: Value, axes: Sequence[int], starts: Sequence[int], stops: Sequence[int], steps: Optional[Sequence[int]] = None) -> Value:
        """Python slicing ``x[start:stop:step]`` along each of ``axes`` (negatives and clamping
        as Python does them)."""
        steps = [1] * len(axes) if steps is None else list(steps)
        if not len(axes) == len(starts) == len(stops) == len(steps):
            raise ValueError("slice: axes, starts, stops and steps differ in length")
        shape = list(x.shape)
        ax = [operator.index(a) for a in axes]
        for a, s0, s1, st in zip(ax, starts, stops, steps):
            if not -x.ndim <= a < x.ndim:
                raise ValueError(f"slice: axis {a} out of range for rank {x.ndim}")
            if st == 0:
                raise ValueError("slice: step 0")
            shape[a % x.ndim] = len(range(*slice(s0, s1, st).indices(x.shape[a % x.ndim])))
        attrs = {
            "axes": ("ints", tuple(a % x.ndim for a in ax)),
            "starts": ("ints", tuple(operator.index(s) for s in starts)),
            "stops": ("ints", tuple(operator.index(s) for s in stops)),
            "steps": ("ints", tuple(operator.index(s) for s in steps)),
        }
        return self.node("slice", [x], attrs, x.dtype, tuple(shape))

    def concat(self, xs: Sequence[Operand], axis: int = 0) -> Value:
        """Joins along ``axis``; the others must agree; the result dtype promotes all inputs."""
        vals = self._tensor_operands(list(xs))
        if not vals:
            raise ValueError("concat: no inputs")
        rank = vals[0].ndim
        if rank == 0:
            raise ValueError("concat: zero-dimensional inputs cannot be concatenated")
        a = normalize_axes([axis], rank)[0]
        for v in vals:
            if v.ndim != rank or any(v.shape[i] != vals[0].shape[i] for i in range(rank) if i != a):
                raise ValueError("concat: shapes disagree: " + ", ".join(str(v.shape) for v in vals))
        shape = list(vals[0].shape)
        shape[a] = sum(v.shape[a] for v in vals)
        return self.node("concat", vals, {"axis": ("i", a)}, dt.promote_all([v.dtype for v in vals]), tuple(shape))

    def gather(self, x: Value, index: Operand, axis: int) -> Value:
        """NumPy's ``take_along_axis(x, index, axis)``: ``out[i] = x[i with axis -> index[i]]``.
        ``index`` is an integer tensor of ``x``'s rank; off ``axis`` the two broadcast, and the
        result has ``x``'s dtype. Negative positions count from the end; positions outside the
        axis read its nearest end (kernels never read outside ``x``; NumPy would raise)."""
        idx = self._tensor_operands([index])[0]
        if not dt.is_integer(idx.dtype):
            raise TypeError(f"gather: the index must be an integer tensor, not {idx.dtype}")
        if idx.ndim != x.ndim:
            raise ValueError(f"gather: index has rank {idx.ndim}, x rank {x.ndim}")
        a = normalize_axes([axis], x.ndim)[0]
        shape = list(idx.shape)
        for d in range(x.ndim):
            if d == a or x.shape[d] in (1, idx.shape[d]):
                continue
            if idx.shape[d] != 1:
                raise ValueError(f"gather: x {tuple(x.shape)} and index {tuple(idx.shape)} do not broadcast off axis {a}")
            shape[d] = x.shape[d]
        return self.node("gather", [x, idx], {"axis": ("i", a)}, x.dtype, tuple(shape))

    def take(self, x: Value, indices: Operand, axis: int = 0) -> Value:
        """NumPy's ``take(x, indices, axis)``: the result's shape is ``x.shape[:axis] +
        indices.shape + x.shape[axis+1:]`` (an embedding lookup: ``take(table, ids)``). A gather
        of ``x`` with size-1 axes inserted after ``axis`` by ``indices`` with size-1 axes around
        it (views only, so symbolic sizes stay symbolic); positions as :meth:`gather` treats them."""
        idx = self._tensor_operands([indices])[0]
        a = normalize_axes([axis], x.ndim)[0]
        if idx.ndim == 0:
            return self.squeeze(self.take(x, self.reshape(idx, (1,)), a), [a])
        k = idx.ndim
        xs = self.unsqueeze(x, list(range(a + 1, a + k))) if k > 1 else x
        around = list(range(a)) + list(range(a + k, x.ndim + k - 1))
        ix = self.unsqueeze(idx, around) if around else idx
        return self.gather(xs, ix, a)

    def index(self, x: Value, key: Any) -> Value:
        """Basic NumPy indexing: ints, slices, None and Ellipsis, as ``x[key]`` does.

        Emits at most a ``slice``, a ``squeeze`` and an ``unsqueeze``. Boolean and integer array
        indices (advanced indexing) are data-dependent and raise TypeError.
        """
        if not isinstance(key, tuple):
            key = (key,)
        for k in key:
            if not (k is None or k is Ellipsis or isinstance(k, slice) or _is_int_index(k)):
                raise TypeError(f"only ints, slices, None and Ellipsis index a kiln value, not {type(k).__name__}")
        if sum(k is Ellipsis for k in key) > 1:
            raise IndexError("an index can only have a single ellipsis ('...')")
        consumed = sum(1 for k in key if k is not None and k is not Ellipsis)
        if consumed > x.ndim:
            raise IndexError(f"too many indices: array is {x.ndim}-dimensional, but {consumed} were indexed")
        fill = (slice(None),) * (x.ndim - consumed)
        if any(k is Ellipsis for k in key):
            i = next(i for i, k in enumerate(key) if k is Ellipsis)
            key = key[:i] + fill + key[i + 1:]
        else:
            key = key + fill

        axes: list[int] = []
        starts: list[int] = []
        stops: list[int] = []
        steps: list[int] = []
        squeeze_axes: list[int] = []
        none_pos: list[int] = []
        axis = 0
        out_pos = 0
        for k in key:
            if k is None:
                none_pos.append(out_pos)
                out_pos += 1
                continue
            dim = x.shape[axis]
            if isinstance(k, slice):
                start, stop, step = k.indices(dim)
                if (start, stop, step) != (0, dim, 1):
                    if step < 0:
                        # .indices() says "before index 0" with -1, which the op would read
                        # as the last element; -dim-1 clamps to the same place.
                        start = start if start >= 0 else -dim - 1
                        stop = stop if stop >= 0 else -dim - 1
                    axes.append(axis)
                    starts.append(start)
                    stops.append(stop)
                    steps.append(step)
                out_pos += 1
            else:
                i = operator.index(k)
                if not -dim <= i < dim:
                    raise IndexError(f"index {i} is out of bounds for axis {axis} with size {dim}")
                i %= dim
                if dim != 1:
                    axes.append(axis)
                    starts.append(i)
                    stops.append(i + 1)
                    steps.append(1)
                squeeze_axes.append(axis)
            axis += 1
        v = x
        if axes:
            v = self.slice(v, axes, starts, stops, steps)
        if squeeze_axes:
            v = self.squeeze(v, squeeze_axes)
        if none_pos:
            v = self.unsqueeze(v, none_pos)
        if v is x:
            # x[...] or x[:] is a new view in NumPy; here it is the same value.
            return x
        return v

    # ------------------------------------------------------------------ reductions

    def reduce(self, op: str, x: Operand, axes: Optional[Sequence[int]] = None, keepdim: bool = False, correction: Optional[float] = None) -> Value:
        """Any reduction of the op set by name; ``axes`` None or empty reduces all axes."""
        # logsumexp and norm are composites outside the table: float results, like mean.
        rule = REDUCTION_RULES.get(op) or ("Float" if op in ("logsumexp", "norm") else None)
        if rule is None:
            raise ValueError(f"not a reduction: {op!r}")
        (x,) = self._tensor_operands([x])
        ax = normalize_axes(axes, x.ndim)
        if rule == "Extremum":
            for a in ax:
                if x.shape[a] == 0:
                    raise ValueError(f"{op}: reducing an empty axis {a}")
        out = reduction_result(rule, x.dtype)
        shape = _reduced_shape(x.shape, ax, keepdim)
        attrs: dict[str, tuple[str, Any]] = {}
        if axes is not None:
            attrs["axes"] = ("ints", tuple(ax))
        if keepdim:
            attrs["keepdim"] = ("b", True)
        if correction is not None:
            if op not in ("var", "std"):
                raise ValueError(f"{op}: correction applies to var and std only")
            attrs["correction"] = ("f", float(correction))
        return self.node(op, [x], attrs, out, shape)

    def sum(self, x: Operand, axes: Optional[Sequence[int]] = None, keepdim: bool = False) -> Value:
        return self.reduce("sum", x, axes, keepdim)

    def prod(self, x: Operand, axes: Optional[Sequence[int]] = None, keepdim: bool = False) -> Value:
        return self.reduce("prod", x, axes, keepdim)

    def max(self, x: Operand, axes: Optional[Sequence[int]] = None, keepdim: bool = False) -> Value:
        return self.reduce("max", x, axes, keepdim)

    def min(self, x: Operand, axes: Optional[Sequence[int]] = None, keepdim: bool = False) -> Value:
        return self.reduce("min", x, axes, keepdim)

    def mean(self, x: Operand, axes: Optional[Sequence[int]] = None, keepdim: bool = False) -> Value:
        return self.reduce("mean", x, axes, keepdim)

    def any(self, x: Operand, axes: Optional[Sequence[int]] = None, keepdim: bool = False) -> Value:
        return self.reduce("any", x, axes, keepdim)

    def all(self, x: Operand, axes: Optional[Sequence[int]] = None, keepdim: bool = False) -> Value:
        return self.reduce("all", x, axes, keepdim)

    def var(self, x: Operand, axes: Optional[Sequence[int]] = None, keepdim: bool = False, correction: float = 0.0) -> Value:
        """Variance; ``correction`` is NumPy's ``ddof``."""
        return self.reduce("var", x, axes, keepdim, correction if correction else None)

    def std(self, x: Operand, axes: Optional[Sequence[int]] = None, keepdim: bool = False, correction: float = 0.0) -> Value:
        """Standard deviation; ``correction`` is NumPy's ``ddof``."""
        return self.reduce("std", x, axes, keepdim, correction if correction else None)

    def argmax(self, x: Operand, axis: Optional[int] = None, keepdim: bool = False) -> Value:
        """Index of the first maximum along ``axis`` (None: of the flattened tensor); i64."""
        return self._arg("argmax", x, axis, keepdim)

    def argmin(self, x: Operand, axis: Optional[int] = None, keepdim: bool = False) -> Value:
        """Index of the first minimum along ``axis`` (None: of the flattened tensor); i64."""
        return self._arg("argmin", x, axis, keepdim)

    def _arg(self, op: str, x: Operand, axis: Optional[int], keepdim: bool) -> Value:
        (x,) = self._tensor_operands([x])
        attrs: dict[str, tuple[str, Any]] = {}
        if axis is None:
            if x.size == 0:
                raise ValueError(f"{op} of an empty tensor")
            shape: Shape = (1,) * x.ndim if keepdim else ()
        else:
            a = normalize_axes([axis], x.ndim)[0]
            if x.shape[a] == 0:
                raise ValueError(f"{op}: reducing an empty axis {a}")
            shape = _reduced_shape(x.shape, [a], keepdim)
            attrs["axis"] = ("i", a)
        if keepdim:
            attrs["keepdim"] = ("b", True)
        return self.node(op, [x], attrs, "i64", shape)

    # ------------------------------------------------------------------ composites

    def softmax(self, x: Operand, axis: int = -1) -> Value:
        (x,) = self._tensor_operands([x])
        a = normalize_axes([axis], x.ndim)[0]
        return self.node("softmax", [x], {"axis": ("i", a)}, dt.float_result(x.dtype), x.shape)

    def log_softmax(self, x: Operand, axis: int = -1) -> Value:
        (x,) = self._tensor_operands([x])
        a = normalize_axes([axis], x.ndim)[0]
        return self.node("log_softmax", [x], {"axis": ("i", a)}, dt.float_result(x.dtype), x.shape)

    def logsumexp(self, x: Operand, axes: Optional[Sequence[int]] = None, keepdim: bool = False) -> Value:
        return self.reduce("logsumexp", x, axes, keepdim)

    def norm(self, x: Operand, ord: float = 2.0, axes: Optional[Sequence[int]] = None, keepdim: bool = False) -> Value:
        """The vector ``ord``-norm (1, 2 or inf) over ``axes`` (default all)."""
        if ord not in (1, 2, math.inf):
            raise ValueError(f"norm: ord must be 1, 2 or inf, not {ord}")
        v = self.reduce("norm", x, axes, keepdim)
        if ord != 2:
            n = self._nodes[v.ref[1]]
            n.attrs["ord"] = ("f", float(ord))
        return v

    def layer_norm(self, x: Operand, weight: Optional[Value] = None, bias: Optional[Value] = None, axes: Sequence[int] = (-1,), eps: float = 1e-5) -> Value:
        """Normalizes over ``axes`` then applies ``weight``/``bias`` (shaped like those axes)."""
        (x,) = self._tensor_operands([x])
        if bias is not None and weight is None:
            raise ValueError("layer_norm: a bias needs a weight")
        ins = [x] + [v for v in (weight, bias) if v is not None]
        ax = normalize_axes(axes, x.ndim)
        attrs: dict[str, tuple[str, Any]] = {"axes": ("ints", tuple(ax)), "eps": ("f", float(eps))}
        out = dt.float_result(dt.promote_all([v.dtype for v in ins]))
        return self.node("layer_norm", ins, attrs, out, x.shape)

    def gelu(self, x: Operand, approximate: str = "none") -> Value:
        if approximate not in ("none", "tanh"):
            raise ValueError("gelu: approximate is 'none' or 'tanh'")
        (x,) = self._tensor_operands([x])
        attrs = {} if approximate == "none" else {"approximate": ("s", approximate)}
        return self.node("gelu", [x], attrs, dt.float_result(x.dtype), x.shape)

    def elu(self, x: Operand, alpha: float = 1.0) -> Value:
        (x,) = self._tensor_operands([x])
        return self.node("elu", [x], {"alpha": ("f", float(alpha))}, dt.float_result(x.dtype), x.shape)

    def silu(self, x: Operand) -> Value:
        (x,) = self._tensor_operands([x])
        return self.node("silu", [x], {}, dt.float_result(x.dtype), x.shape)

    def relu(self, x: Operand) -> Value:
        (x,) = self._tensor_operands([x])
        return self.node("relu", [x], {}, x.dtype, x.shape)

    def leaky_relu(self, x: Operand, negative_slope: float = 0.01) -> Value:
        (x,) = self._tensor_operands([x])
        return self.node("leaky_relu", [x], {"negative_slope": ("f", float(negative_slope))}, dt.float_result(x.dtype), x.shape)

    def hardtanh(self, x: Operand, min_val: float = -1.0, max_val: float = 1.0) -> Value:
        (x,) = self._tensor_operands([x])
        attrs = {"min_val": ("f", float(min_val)), "max_val": ("f", float(max_val))}
        return self.node("hardtanh", [x], attrs, x.dtype, x.shape)

    def softplus(self, x: Operand, beta: float = 1.0, threshold: float = 20.0) -> Value:
        (x,) = self._tensor_operands([x])
        attrs = {"beta": ("f", float(beta)), "threshold": ("f", float(threshold))}
        return self.node("softplus", [x], attrs, dt.float_result(x.dtype), x.shape)

    # ------------------------------------------------------------------ externs

    def matmul(self, a: Operand, b: Operand) -> Value:
        """An extern: the daemon rejects it (front ends keep matmul in their framework)."""
        a, b = self._tensor_operands([a, b])
        if a.ndim == 0 or b.ndim == 0:
            raise ValueError("matmul: operands must be at least 1-D")
        sa = a.shape if a.ndim > 1 else (1,) + a.shape
        sb = b.shape if b.ndim > 1 else b.shape + (1,)
        if sa[-1] != sb[-2]:
            raise ValueError(f"matmul: {a.shape} @ {b.shape}: inner dimensions differ")
        batch = broadcast_shapes(sa[:-2], sb[:-2])
        shape = batch + ((sa[-2],) if a.ndim > 1 else ()) + ((sb[-1],) if b.ndim > 1 else ())
        return self.node("matmul", [a, b], {}, dt.promote(a.dtype, b.dtype), shape)

    def conv2d(self, x: Value, w: Value) -> Value:
        """An extern (NCHW input, OIHW weight, stride 1, no padding); the daemon rejects it."""
        if x.ndim != 4 or w.ndim != 4:
            raise ValueError("conv2d: NCHW input and OIHW weight")
        shape = (x.shape[0], w.shape[0], x.shape[2] - w.shape[2] + 1, x.shape[3] - w.shape[3] + 1)
        return self.node("conv2d", [x, w], {}, dt.promote(x.dtype, w.dtype), shape)

    # ------------------------------------------------------------------ one method per elementwise op
    # Unary, computing integers and bool in float_result(dtype):
    def exp(self, x: Operand) -> Value:
        return self.unary("exp", x)

    def exp2(self, x: Operand) -> Value:
        return self.unary("exp2", x)

    def expm1(self, x: Operand) -> Value:
        return self.unary("expm1", x)

    def log(self, x: Operand) -> Value:
        return self.unary("log", x)

    def log2(self, x: Operand) -> Value:
        return self.unary("log2", x)

    def log1p(self, x: Operand) -> Value:
        return self.unary("log1p", x)

    def sqrt(self, x: Operand) -> Value:
        return self.unary("sqrt", x)

    def rsqrt(self, x: Operand) -> Value:
        return self.unary("rsqrt", x)

    def sin(self, x: Operand) -> Value:
        return self.unary("sin", x)

    def cos(self, x: Operand) -> Value:
        return self.unary("cos", x)

    def tan(self, x: Operand) -> Value:
        return self.unary("tan", x)

    def tanh(self, x: Operand) -> Value:
        return self.unary("tanh", x)

    def asin(self, x: Operand) -> Value:
        return self.unary("asin", x)

    def acos(self, x: Operand) -> Value:
        return self.unary("acos", x)

    def atan(self, x: Operand) -> Value:
        return self.unary("atan", x)

    def sinh(self, x: Operand) -> Value:
        return self.unary("sinh", x)

    def cosh(self, x: Operand) -> Value:
        return self.unary("cosh", x)

    def sigmoid(self, x: Operand) -> Value:
        return self.unary("sigmoid", x)

    def erf(self, x: Operand) -> Value:
        return self.unary("erf", x)

    def reciprocal(self, x: Operand) -> Value:
        return self.unary("reciprocal", x)

    # Unary, keeping the dtype (floor/ceil/round/trunc leave integers unchanged; round is half-to-even):
    def neg(self, x: Operand) -> Value:
        return self.unary("neg", x)

    def abs(self, x: Operand) -> Value:
        return self.unary("abs", x)

    def sign(self, x: Operand) -> Value:
        return self.unary("sign", x)

    def floor(self, x: Operand) -> Value:
        return self.unary("floor", x)

    def ceil(self, x: Operand) -> Value:
        return self.unary("ceil", x)

    def round(self, x: Operand) -> Value:
        return self.unary("round", x)

    def trunc(self, x: Operand) -> Value:
        return self.unary("trunc", x)

    def bitwise_not(self, x: Operand) -> Value:
        return self.unary("bitwise_not", x)

    # Unary, giving bool:
    def logical_not(self, x: Operand) -> Value:
        return self.unary("logical_not", x)

    def isnan(self, x: Operand) -> Value:
        return self.unary("isnan", x)

    def isinf(self, x: Operand) -> Value:
        return self.unary("isinf", x)

    # Binary, giving promote(a, b) (div: NumPy's true division; atan2: float_result):
    def add(self, a: Operand, b: Operand) -> Value:
        return self.binary("add", a, b)

    def sub(self, a: Operand, b: Operand) -> Value:
        return self.binary("sub", a, b)

    def mul(self, a: Operand, b: Operand) -> Value:
        return self.binary("mul", a, b)

    def floordiv(self, a: Operand, b: Operand) -> Value:
        return self.binary("floordiv", a, b)

    def remainder(self, a: Operand, b: Operand) -> Value:
        return self.binary("remainder", a, b)

    def pow(self, a: Operand, b: Operand) -> Value:
        return self.binary("pow", a, b)

    def maximum(self, a: Operand, b: Operand) -> Value:
        return self.binary("maximum", a, b)

    def minimum(self, a: Operand, b: Operand) -> Value:
        return self.binary("minimum", a, b)

    def bitwise_and(self, a: Operand, b: Operand) -> Value:
        return self.binary("bitwise_and", a, b)

    def bitwise_or(self, a: Operand, b: Operand) -> Value:
        return self.binary("bitwise_or", a, b)

    def bitwise_xor(self, a: Operand, b: Operand) -> Value:
        return self.binary("bitwise_xor", a, b)

    def div(self, a: Operand, b: Operand) -> Value:
        return self.binary("div", a, b)

    def atan2(self, a: Operand, b: Operand) -> Value:
        return self.binary("atan2", a, b)

    # Binary, giving bool:
    def eq(self, a: Operand, b: Operand) -> Value:
        return self.binary("eq", a, b)

    def ne(self, a: Operand, b: Operand) -> Value:
        return self.binary("ne", a, b)

    def lt(self, a: Operand, b: Operand) -> Value:
        return self.binary("lt", a, b)

    def le(self, a: Operand, b: Operand) -> Value:
        return self.binary("le", a, b)

    def gt(self, a: Operand, b: Operand) -> Value:
        return self.binary("gt", a, b)

    def ge(self, a: Operand, b: Operand) -> Value:
        return self.binary("ge", a, b)

    def logical_and(self, a: Operand, b: Operand) -> Value:
        return self.binary("logical_and", a, b)

    def logical_or(self, a: Operand, b: Operand) -> Value:
        return self.binary("logical_or", a, b)

    def logical_xor(self, a: Operand, b: Operand) -> Value:
        return self.binary("logical_xor", a, b)


def _reduced_shape(shape: Shape, axes: Sequence[int], keepdim: bool) -> Shape:
    if keepdim:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _is_int_index(k: Any) -> bool:
    if isinstance(k, (bool, np.bool_)):
        return False
    try:
        operator.index(k)
        return True
    except TypeError:
        return False


def _set_attr(attr: Any, kind: str, value: Any) -> None:
    """Fills a kiln.v1.AttrValue."""
    if kind == "i":
        attr.i = int(value)
    elif kind == "f":
        attr.f = float(value)
    elif kind == "s":
        attr.s = str(value)
    elif kind == "b":
        attr.b = bool(value)
    elif kind == "dtype":
        attr.dtype = dt.to_wire(value)
    elif kind == "ints":
        attr.ints.SetInParent()  # an empty list is a value too (the shape of a scalar)
        attr.ints.values.extend(int(v) for v in value)
    elif kind == "floats":
        attr.floats.SetInParent()
        attr.floats.values.extend(float(v) for v in value)
    elif kind == "tensor":
        name, arr = value if isinstance(value, tuple) else (dt.dtype_name(value.dtype), value)
        t = attr.tensor
        t.dtype = dt.to_wire(name)
        t.shape.extend(arr.shape)
        flat = np.asarray(arr).reshape(-1)
        if dt.is_float(name):
            t.float_values.extend(flat.astype(np.float64).tolist())
        else:
            t.int_values.extend(flat.astype(np.int64).tolist())
    else:  # pragma: no cover - checked by node()
        raise ValueError(kind)
