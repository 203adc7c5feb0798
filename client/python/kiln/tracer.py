"""Tracing NumPy code into kiln graphs.

A :class:`Tracer` stands in for a NumPy array while a function runs under :func:`kiln.jit`. It
implements ``__array_ufunc__`` and ``__array_function__``, so NumPy hands every ufunc and every
dispatched function (``np.sum``, ``np.linalg.norm``, ``np.where``...) to kiln, which records a
node instead of computing. Array methods (``.mean()``, ``.astype()``, ``.T``...), operators and
basic indexing are implemented on the tracer directly.

The semantics are NumPy 2's: result dtypes come from NumPy's own ufunc type resolution
(``ufunc.resolve_dtypes``), with Python scalars weak (NEP 50); ``mean``/``var``/``std`` of
integers compute in float64; ``np.linalg.norm`` converts integers to float64. One difference:
kiln has no uint64, so a sum or product of uint8 gives int64 where NumPy gives uint64.
Float16 math is computed in float32 and rounded once, so it can differ from NumPy's
op-by-op float16 rounding in the last bit.

In-place writes (``a[mask] = v``, ``a[1:] = v``, ``a += v``) rebind the tracer to a new value,
which is what NumPy does to the array as long as no other array shares its memory. Since the
tracer cannot follow NumPy's memory sharing, a write into a function input, into a view of
another array, or into an array with live views raises :class:`kiln.UnsupportedError`.

Anything kiln does not express (data-dependent shapes or control flow, matmul, sorting, an
unknown function) raises :class:`kiln.UnsupportedError` naming the NumPy function.
"""

from __future__ import annotations

import math
import operator
import os
import sys
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from . import dtypes as dt
from .builder import GraphBuilder, Value, broadcast_shapes, normalize_axes
from .errors import UnsupportedError

#: Captured NumPy arrays larger than this (and not uniform) must be passed as arguments.
MAX_CONSTANT_ELEMENTS = 1 << 16

_NOVALUE: Any = getattr(np, "_NoValue", object())
_KILN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_NUMPY_DIR = os.path.dirname(os.path.abspath(np.__file__)) + os.sep


def _fname(func: Any) -> str:
    mod = getattr(func, "__module__", None) or "numpy"
    if mod.startswith("numpy._core") or mod.startswith("numpy.core"):
        mod = "numpy"
    return f"{mod}.{getattr(func, '__name__', repr(func))}"


def _call_site() -> str:
    """``file.py:LINE`` of the innermost frame outside kiln and NumPy (the user's code)."""
    f: Optional[Any] = sys._getframe(1)
    while f is not None:
        path = f.f_code.co_filename
        if not (path.startswith(_KILN_DIR) or path.startswith(_NUMPY_DIR) or path.startswith("<__array_function__")):
            return f"{os.path.basename(path)}:{f.f_lineno}"
        f = f.f_back
    return "?"


@dataclass(frozen=True)
class IndexCheck:
    """Argument ``index`` holds indices into an axis of ``size`` elements (``axis``, for the
    message); ``source`` (argument, axis): where that size is read at run time when the indexed
    array is an argument itself (a function compiled for symbolic sizes serves many)."""

    index: int
    size: int
    axis: int
    source: Optional[tuple[int, int]] = None

    def check(self, arrays: Sequence[Any]) -> None:
        idx = arrays[self.index]
        if not isinstance(idx, np.ndarray):
            return  # a device array: not read back to the host for this
        n = self.size if self.source is None else arrays[self.source[0]].shape[self.source[1]]
        raise_if_out_of_bounds(idx, n, self.axis)


def raise_if_out_of_bounds(idx: np.ndarray, n: int, axis: int) -> None:
    """NumPy's IndexError for an integer index array with an element outside [-n, n)."""
    if idx.size == 0 or idx.dtype.kind not in "iu":
        return
    lo, hi = idx.min(), idx.max()
    bad = int(lo) if lo < -n else int(hi) if hi >= n else None
    if bad is not None:
        raise IndexError(f"index {bad} is out of bounds for axis {axis} with size {n}")


class Trace:
    """One tracing session: the graph builder plus NumPy-semantics helpers. Not thread-safe."""

    def __init__(self, builder: Optional[GraphBuilder] = None) -> None:
        self.b = builder or GraphBuilder()
        self._inputs: dict[int, int] = {}  # id of an input's Value -> its position
        #: Bounds the caller's index arrays must keep, checked before each run (kiln's gather
        #: clamps; NumPy raises): see :meth:`check_index`.
        self.index_checks: list[IndexCheck] = []

    # ------------------------------------------------------------------ wrapping

    def input(self, name: str, dtype: Any, shape: Sequence[int]) -> "Tracer":
        v = self.b.input(name, dt.dtype_name(dtype), shape)
        self._inputs[id(v)] = len(self._inputs)
        t = Tracer(self, v)
        t._is_input = True
        return t

    def check_index(self, key: Any, idx: Value, a: Value, axis: int) -> None:
        """``idx`` indexes axis ``axis`` of ``a`` where NumPy raises IndexError for an index
        out of bounds. A captured array (``key``) is checked now; an argument of the traced
        function is checked before every run (:attr:`index_checks`). An index computed inside
        the function cannot be checked on the host: kiln's gather clamps it."""
        n = a.shape[axis]
        if isinstance(key, (np.ndarray, list, int, np.integer)):
            raise_if_out_of_bounds(np.asarray(key), n, axis)
            return
        pos = self._inputs.get(id(idx))
        if pos is not None:
            src = self._inputs.get(id(a))
            self.index_checks.append(IndexCheck(pos, n, axis, None if src is None else (src, axis)))

    def wrap(self, v: Value, base: Optional["Tracer"] = None) -> "Tracer":
        """A tracer for ``v``; ``base`` makes it a view of that tracer (for write checks)."""
        t = Tracer(self, v)
        if base is not None:
            # `is None`: a tracer has no truth value (bool() of one is data-dependent control flow).
            root = base._base if base._base is not None else base
            t._base = root
            root._views.add(t)
        return t

    def scope(self, what: str) -> Any:
        return self.b.name_scope(f"{what} at {_call_site()}")

    # ------------------------------------------------------------------ operands

    def const_array(self, arr: np.ndarray) -> Value:
        """A captured NumPy array or scalar as a graph value."""
        dtype = dt.dtype_name(arr.dtype)
        if arr.ndim == 0:
            return self.b.constant(arr)
        flat = arr.reshape(-1)
        if arr.size > 0:
            # A uniform array (np.zeros, np.full...) travels as a `full` node, whatever its size.
            first = flat[0]
            if dt.is_float(dtype) and np.isnan(first):
                uniform = bool(np.isnan(flat).all())
            else:
                uniform = bool((flat == first).all())
            if uniform and (dt.is_float(dtype) or float(first) == first):
                return self.b.full(arr.shape, float(first), dtype)
        if arr.size > MAX_CONSTANT_ELEMENTS:
            raise UnsupportedError(
                f"a captured NumPy array of {arr.size} elements",
                "pass it to the jitted function as an argument",
            )
        return self.b.constant(arr)

    def value(self, x: Any, dtype: Optional[Any] = None) -> Value:
        """Any operand as a Value, optionally converted to ``dtype``.

        Tracers are cast; Python scalars become constants of ``dtype`` (or their default);
        NumPy arrays and scalars become constants of their own dtype, then cast.
        """
        if isinstance(x, Tracer):
            self._check_own(x)
            v = x._v
        elif dt.scalar_kind(x) is not None:
            if dtype is None:
                return self.b.constant(x)
            npdt = np.dtype(dtype)
            return self.b.constant(np.asarray(x, dtype=npdt), dt.dtype_name(npdt))
        elif isinstance(x, (np.ndarray, np.generic)):
            v = self.const_array(np.asarray(x))
        elif isinstance(x, (list, tuple)):
            v = self.const_array(np.asarray(x))
        elif isinstance(x, complex):
            raise UnsupportedError("complex numbers")
        else:
            raise TypeError(f"kiln.jit: cannot use a {type(x).__name__} as an array")
        return self.cast(v, dtype) if dtype is not None else v

    def cast(self, v: Value, dtype: Any) -> Value:
        name = dt.dtype_name(dtype)
        return v if v.dtype == name else self.b.cast(v, name)

    def _check_own(self, t: "Tracer") -> None:
        if t._trace is not self:
            raise UnsupportedError("a traced array from another trace", "a jitted function cannot capture another's tracers")

    @staticmethod
    def resolve_dtype_of(x: Any) -> Any:
        """What ``ufunc.resolve_dtypes`` takes for an operand: a dtype, or a Python scalar
        type for weak scalars."""
        if isinstance(x, Tracer):
            return x.dtype
        if isinstance(x, (np.ndarray, np.generic)):
            return x.dtype
        if isinstance(x, bool):
            return np.dtype(bool)
        if isinstance(x, (int, float)):
            return type(x)
        if isinstance(x, complex):
            raise UnsupportedError("complex numbers")
        if isinstance(x, (np.ndarray, np.generic)):
            return x.dtype
        if isinstance(x, (list, tuple)):
            return np.asarray(x).dtype
        raise TypeError(f"kiln.jit: cannot use a {type(x).__name__} as an array")

    # ------------------------------------------------------------------ ufuncs

    def ufunc(self, ufunc: np.ufunc, method: str, inputs: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        name = f"numpy.{ufunc.__name__}"
        if method != "__call__":
            return self.ufunc_method(ufunc, method, inputs, kwargs)
        with self.scope(name):
            out_dtype = self._ufunc_kwargs(name, ufunc, kwargs)
            emit = _UFUNCS.get(ufunc)
            if emit is None:
                reason = "matmul is an extern: keep it outside the jitted function" if ufunc is np.matmul else ""
                raise UnsupportedError(name, reason)
            if out_dtype is not None:
                resolved = ufunc.resolve_dtypes(tuple(out_dtype for _ in inputs) + (None,) * ufunc.nout)
            else:
                resolved = ufunc.resolve_dtypes(tuple(self.resolve_dtype_of(a) for a in inputs) + (None,) * ufunc.nout)
            in_dt = resolved[: ufunc.nin]
            try:
                vals = [self.value(a, in_dt[i]) for i, a in enumerate(inputs)]
            except OverflowError:
                if ufunc not in _COMPARISONS:
                    raise
                # NumPy compares an out-of-range Python int exactly; so does a wider type.
                wide = np.result_type(*[d for d in in_dt], np.int64)
                vals = [self.value(a, wide) for a in inputs]
            v = emit(self, *vals)
            return self.wrap(self.cast(v, resolved[ufunc.nin]))

    def _ufunc_kwargs(self, name: str, ufunc: np.ufunc, kwargs: dict[str, Any]) -> Optional[np.dtype]:
        kwargs = dict(kwargs)
        out = kwargs.pop("out", None)
        if out is not None and any(o is not None for o in (out if isinstance(out, tuple) else (out,))):
            raise UnsupportedError(f"{name}(out=...)", "assign the result instead")
        where = kwargs.pop("where", True)
        if where is not True:
            raise UnsupportedError(f"{name}(where=...)", "use np.where on the result")
        dtype = kwargs.pop("dtype", None)
        for k in ("casting", "order", "subok"):
            kwargs.pop(k, None)
        if kwargs:
            raise UnsupportedError(f"{name}({', '.join(kwargs)}=...)")
        return np.dtype(dtype) if dtype is not None else None

    def ufunc_method(self, ufunc: np.ufunc, method: str, inputs: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        name = f"numpy.{ufunc.__name__}.{method}"
        with self.scope(name):
            if method == "reduce" and ufunc in _UFUNC_REDUCTIONS:
                kw = dict(kwargs)
                axis = kw.pop("axis", 0)
                return _reduction(self, _UFUNC_REDUCTIONS[ufunc], inputs[0], axis=axis, **kw)
            if method == "outer" and ufunc.nin == 2 and ufunc in _UFUNCS:
                a, b = inputs
                av = a if isinstance(a, Tracer) else self.wrap(self.value(a))
                bv = b if isinstance(b, Tracer) else self.wrap(self.value(b))
                expanded = self.wrap(self.b.reshape(av._v, av.shape + (1,) * bv.ndim))
                return self.ufunc(ufunc, "__call__", (expanded, bv), kwargs)
            raise UnsupportedError(name)

    # ------------------------------------------------------------------ functions

    def function(self, func: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        name = _fname(func)
        handler = _FUNCTIONS.get(func)
        if handler is None:
            raise UnsupportedError(name, _UNSUPPORTED_REASONS.get(func.__name__, ""))
        with self.scope(name):
            return handler(self, *args, **kwargs)

    def tracer_of(self, x: Any) -> "Tracer":
        """``x`` as a tracer (wrapping constants)."""
        if isinstance(x, Tracer):
            self._check_own(x)
            return x
        return self.wrap(self.value(x))


class Tracer:
    """A traced NumPy array: static shape and dtype, contents unknown until run.

    Supports NumPy ufuncs and the dispatched functions kiln knows, the array methods listed in
    this class, operators (arithmetic, comparison, bitwise, ``**``, unary minus), basic
    indexing, boolean-mask and basic-index assignment. ``bool(t)``, ``float(t)``, ``np.asarray(t)``
    and other data-dependent uses raise :class:`kiln.UnsupportedError`.
    """

    __slots__ = ("_trace", "_v", "_base", "_views", "_is_input", "__weakref__")
    __array_priority__ = 1000.0

    def __init__(self, trace: Trace, value: Value) -> None:
        self._trace = trace
        self._v = value
        self._base: Optional[Tracer] = None
        self._views: "weakref.WeakSet[Tracer]" = weakref.WeakSet()
        self._is_input = False

    # NumPy protocols.
    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        return self._trace.ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        return self._trace.function(func, args, kwargs)

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        raise UnsupportedError(
            "conversion of a traced array to a NumPy array (np.asarray, np.array, ...)",
            "its values are not known while tracing",
        )

    # Static properties.
    @property
    def shape(self) -> tuple[int, ...]:
        return self._v.shape

    @property
    def dtype(self) -> np.dtype:
        return dt.to_numpy(self._v.dtype)

    @property
    def ndim(self) -> int:
        return len(self._v.shape)

    @property
    def size(self) -> int:
        return math.prod(self._v.shape)

    @property
    def itemsize(self) -> int:
        return dt.itemsize(self._v.dtype)

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    @property
    def value(self) -> Value:
        """The graph value this tracer currently stands for."""
        return self._v

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"<kiln traced array {self.dtype}{list(self.shape)}>"

    __hash__ = object.__hash__

    # Data-dependent uses.
    def __bool__(self) -> bool:
        raise UnsupportedError("bool() of a traced array", "data-dependent control flow; use np.where")

    def __float__(self) -> float:
        raise UnsupportedError("float() of a traced array", "its value is not known while tracing")

    def __int__(self) -> int:
        raise UnsupportedError("int() of a traced array", "its value is not known while tracing")

    def __index__(self) -> int:
        raise UnsupportedError("a traced array used as an index", "data-dependent indexing")

    def __complex__(self) -> complex:
        raise UnsupportedError("complex() of a traced array")

    def __iter__(self) -> Iterator["Tracer"]:
        if not self.shape:
            raise TypeError("iteration over a 0-d array")
        if self.shape[0] > 64:
            raise UnsupportedError("iterating over a traced array with more than 64 rows", "use vectorised operations")
        return (self[i] for i in range(self.shape[0]))

    def item(self, *args: Any) -> Any:
        raise UnsupportedError("ndarray.item", "its value is not known while tracing")

    def tolist(self) -> Any:
        raise UnsupportedError("ndarray.tolist", "its value is not known while tracing")

    def __getattr__(self, name: str) -> Any:
        if hasattr(np.ndarray, name) and not name.startswith("__"):
            raise UnsupportedError(f"ndarray.{name}")
        raise AttributeError(f"'kiln traced array' object has no attribute {name!r}")

    # Operators, as NumPy's ndarray defines them.
    def _u(self, ufunc: np.ufunc, *args: Any) -> Any:
        return self._trace.ufunc(ufunc, "__call__", args, {})

    def __add__(self, o: Any) -> Any: return self._u(np.add, self, o)
    def __radd__(self, o: Any) -> Any: return self._u(np.add, o, self)
    def __sub__(self, o: Any) -> Any: return self._u(np.subtract, self, o)
    def __rsub__(self, o: Any) -> Any: return self._u(np.subtract, o, self)
    def __mul__(self, o: Any) -> Any: return self._u(np.multiply, self, o)
    def __rmul__(self, o: Any) -> Any: return self._u(np.multiply, o, self)
    def __truediv__(self, o: Any) -> Any: return self._u(np.true_divide, self, o)
    def __rtruediv__(self, o: Any) -> Any: return self._u(np.true_divide, o, self)
    def __floordiv__(self, o: Any) -> Any: return self._u(np.floor_divide, self, o)
    def __rfloordiv__(self, o: Any) -> Any: return self._u(np.floor_divide, o, self)
    def __mod__(self, o: Any) -> Any: return self._u(np.remainder, self, o)
    def __rmod__(self, o: Any) -> Any: return self._u(np.remainder, o, self)
    def __rpow__(self, o: Any) -> Any: return self._u(np.power, o, self)
    def __and__(self, o: Any) -> Any: return self._u(np.bitwise_and, self, o)
    def __rand__(self, o: Any) -> Any: return self._u(np.bitwise_and, o, self)
    def __or__(self, o: Any) -> Any: return self._u(np.bitwise_or, self, o)
    def __ror__(self, o: Any) -> Any: return self._u(np.bitwise_or, o, self)
    def __xor__(self, o: Any) -> Any: return self._u(np.bitwise_xor, self, o)
    def __rxor__(self, o: Any) -> Any: return self._u(np.bitwise_xor, o, self)
    def __eq__(self, o: Any) -> Any: return self._u(np.equal, self, o)  # type: ignore[override]
    def __ne__(self, o: Any) -> Any: return self._u(np.not_equal, self, o)  # type: ignore[override]
    def __lt__(self, o: Any) -> Any: return self._u(np.less, self, o)
    def __le__(self, o: Any) -> Any: return self._u(np.less_equal, self, o)
    def __gt__(self, o: Any) -> Any: return self._u(np.greater, self, o)
    def __ge__(self, o: Any) -> Any: return self._u(np.greater_equal, self, o)
    def __neg__(self) -> Any: return self._u(np.negative, self)
    def __pos__(self) -> Any: return self._u(np.positive, self)
    def __abs__(self) -> Any: return self._u(np.absolute, self)
    def __invert__(self) -> Any: return self._u(np.invert, self)

    def __pow__(self, o: Any) -> Any:
        # ndarray's fast paths for scalar exponents: a**2 is a square, a**0.5 a square root.
        if dt.scalar_kind(o) in ("int", "float") and o in (2, 0.5, 1):
            if o == 2:
                return self._u(np.square, self)
            if self.dtype.kind == "f":
                return self._u(np.sqrt, self) if o == 0.5 else self._u(np.positive, self)
        return self._u(np.power, self, o)

    def __matmul__(self, o: Any) -> Any:
        raise UnsupportedError("numpy.matmul (the @ operator)", "matmul is an extern: keep it outside the jitted function")

    __rmatmul__ = __matmul__

    def __divmod__(self, o: Any) -> Any:
        raise UnsupportedError("divmod", "use // and % separately")

    def __lshift__(self, o: Any) -> Any:
        raise UnsupportedError("numpy.left_shift")

    def __rshift__(self, o: Any) -> Any:
        raise UnsupportedError("numpy.right_shift")

    # In-place operators rebind the value, with NumPy's same_kind casting rule.
    def _inplace(self, ufunc: np.ufunc, o: Any) -> "Tracer":
        result = self._u(ufunc, self, o)
        if not np.can_cast(result.dtype, self.dtype, casting="same_kind"):
            raise TypeError(
                f"Cannot cast ufunc '{ufunc.__name__}' output from {result.dtype!r} to {self.dtype!r} "
                "with casting rule 'same_kind'"
            )
        v = self._trace.cast(result._v, self._v.dtype)
        if v.shape != self.shape:
            raise ValueError(f"non-broadcastable output operand with shape {self.shape} doesn't match the broadcast shape {v.shape}")
        self._rebind(v, f"in-place numpy.{ufunc.__name__}")
        return self

    def __iadd__(self, o: Any) -> "Tracer": return self._inplace(np.add, o)
    def __isub__(self, o: Any) -> "Tracer": return self._inplace(np.subtract, o)
    def __imul__(self, o: Any) -> "Tracer": return self._inplace(np.multiply, o)
    def __itruediv__(self, o: Any) -> "Tracer": return self._inplace(np.true_divide, o)
    def __ifloordiv__(self, o: Any) -> "Tracer": return self._inplace(np.floor_divide, o)
    def __imod__(self, o: Any) -> "Tracer": return self._inplace(np.remainder, o)
    def __ipow__(self, o: Any) -> "Tracer": return self._inplace(np.power, o)
    def __iand__(self, o: Any) -> "Tracer": return self._inplace(np.bitwise_and, o)
    def __ior__(self, o: Any) -> "Tracer": return self._inplace(np.bitwise_or, o)
    def __ixor__(self, o: Any) -> "Tracer": return self._inplace(np.bitwise_xor, o)

    def _rebind(self, v: Value, what: str) -> None:
        """Makes this tracer stand for ``v`` (an in-place write), when that is NumPy-exact."""
        if self._is_input:
            raise UnsupportedError(f"{what} into an argument of the jitted function", "it would change the caller's array; copy it first")
        if self._base is not None:
            raise UnsupportedError(f"{what} into a view of another array", "NumPy would write through to the base array; copy it first")
        if len(self._views):
            raise UnsupportedError(f"{what} into an array with live views", "NumPy would change the views too")
        self._v = v

    # Indexing.
    def __getitem__(self, key: Any) -> "Tracer":
        tr = self._trace
        with tr.scope("ndarray.__getitem__"):
            keys = key if isinstance(key, tuple) else (key,)
            arrays = [i for i, k in enumerate(keys) if isinstance(k, (Tracer, np.ndarray, list))]
            if len(arrays) == 1 and arrays[0] < self.ndim and all(
                    isinstance(k, slice) and k == slice(None) for j, k in enumerate(keys) if j != arrays[0]):
                # One integer array among full slices: np.take along that axis (a copy).
                idx = _integer_index(tr, keys[arrays[0]])
                if idx is not None:
                    tr.check_index(keys[arrays[0]], idx, self._v, arrays[0])
                    return tr.wrap(_take_value(tr, self._v, idx, arrays[0], "raise"))
            for k in keys:
                if isinstance(k, (Tracer, np.ndarray, list)):
                    raise UnsupportedError("indexing with an array (advanced indexing)",
                                           "one integer array among full slices (x[idx], x[:, idx]) is supported; "
                                           "for a mask the result's shape would depend on the data: use np.where")
                if isinstance(k, (bool, np.bool_)):
                    raise UnsupportedError("indexing with a bool scalar")
            try:
                v = tr.b.index(self._v, key)
            except TypeError as e:
                raise UnsupportedError(f"indexing with {key!r}", str(e)) from None
            return tr.wrap(v, base=self)

    def __setitem__(self, key: Any, value: Any) -> None:
        tr = self._trace
        with tr.scope("ndarray.__setitem__"):
            if isinstance(key, Tracer) or (isinstance(key, np.ndarray) and key.dtype == np.bool_):
                new = _masked_assign(tr, self, key, value)
            else:
                new = _basic_assign(tr, self, key, value)
            self._rebind(new, "assignment")

    # Methods.
    @property
    def T(self) -> "Tracer":
        return self.transpose()

    @property
    def mT(self) -> "Tracer":
        if self.ndim < 2:
            raise ValueError("matrix transpose with ndim < 2 is undefined")
        return _swapaxes(self._trace, self, -1, -2)

    def transpose(self, *axes: Any) -> "Tracer":
        if len(axes) == 1 and (axes[0] is None or not isinstance(axes[0], (int, np.integer))):
            axes = () if axes[0] is None else tuple(axes[0])
        return _transpose(self._trace, self, axes or None)

    def reshape(self, *shape: Any, order: str = "C", copy: Optional[bool] = None) -> "Tracer":
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = tuple(shape[0])
        return _reshape(self._trace, self, shape, order=order)

    def astype(self, dtype: Any, order: str = "K", casting: str = "unsafe", subok: bool = True, copy: bool = True) -> "Tracer":
        return _astype(self._trace, self, dtype, copy=copy)

    def copy(self, order: str = "C") -> "Tracer":
        return self._trace.wrap(self._v)

    def flatten(self, order: str = "C") -> "Tracer":
        return self._trace.wrap(_reshape(self._trace, self, (-1,), order=order)._v)

    def ravel(self, order: str = "C") -> "Tracer":
        return _reshape(self._trace, self, (-1,), order=order)

    def squeeze(self, axis: Any = None) -> "Tracer":
        return _squeeze(self._trace, self, axis)

    def swapaxes(self, axis1: int, axis2: int) -> "Tracer":
        return _swapaxes(self._trace, self, axis1, axis2)

    def conj(self) -> "Tracer":
        return self._u(np.conjugate, self)

    conjugate = conj

    def sum(self, axis: Any = None, dtype: Any = None, out: Any = None, keepdims: bool = False, initial: Any = _NOVALUE, where: Any = _NOVALUE) -> Any:
        return _m(self, "sum", _reduction, "sum", self, axis=axis, dtype=dtype, out=out, keepdims=keepdims, initial=initial, where=where)

    def prod(self, axis: Any = None, dtype: Any = None, out: Any = None, keepdims: bool = False, initial: Any = _NOVALUE, where: Any = _NOVALUE) -> Any:
        return _m(self, "prod", _reduction, "prod", self, axis=axis, dtype=dtype, out=out, keepdims=keepdims, initial=initial, where=where)

    def mean(self, axis: Any = None, dtype: Any = None, out: Any = None, keepdims: bool = False, *, where: Any = _NOVALUE) -> Any:
        return _m(self, "mean", _reduction, "mean", self, axis=axis, dtype=dtype, out=out, keepdims=keepdims, where=where)

    def var(self, axis: Any = None, dtype: Any = None, out: Any = None, ddof: float = 0, keepdims: bool = False, *, where: Any = _NOVALUE, mean: Any = _NOVALUE, correction: Any = _NOVALUE) -> Any:
        return _m(self, "var", _reduction, "var", self, axis=axis, dtype=dtype, out=out, keepdims=keepdims, where=where, ddof=_ddof(ddof, correction), mean=mean)

    def std(self, axis: Any = None, dtype: Any = None, out: Any = None, ddof: float = 0, keepdims: bool = False, *, where: Any = _NOVALUE, mean: Any = _NOVALUE, correction: Any = _NOVALUE) -> Any:
        return _m(self, "std", _reduction, "std", self, axis=axis, dtype=dtype, out=out, keepdims=keepdims, where=where, ddof=_ddof(ddof, correction), mean=mean)

    def max(self, axis: Any = None, out: Any = None, keepdims: bool = False, initial: Any = _NOVALUE, where: Any = _NOVALUE) -> Any:
        return _m(self, "max", _reduction, "max", self, axis=axis, out=out, keepdims=keepdims, initial=initial, where=where)

    def min(self, axis: Any = None, out: Any = None, keepdims: bool = False, initial: Any = _NOVALUE, where: Any = _NOVALUE) -> Any:
        return _m(self, "min", _reduction, "min", self, axis=axis, out=out, keepdims=keepdims, initial=initial, where=where)

    def any(self, axis: Any = None, out: Any = None, keepdims: bool = False, *, where: Any = _NOVALUE) -> Any:
        return _m(self, "any", _reduction, "any", self, axis=axis, out=out, keepdims=keepdims, where=where)

    def all(self, axis: Any = None, out: Any = None, keepdims: bool = False, *, where: Any = _NOVALUE) -> Any:
        return _m(self, "all", _reduction, "all", self, axis=axis, out=out, keepdims=keepdims, where=where)

    def argmax(self, axis: Any = None, out: Any = None, *, keepdims: bool = False) -> Any:
        return _m(self, "argmax", _arg_reduction, "argmax", self, axis=axis, out=out, keepdims=keepdims)

    def argmin(self, axis: Any = None, out: Any = None, *, keepdims: bool = False) -> Any:
        return _m(self, "argmin", _arg_reduction, "argmin", self, axis=axis, out=out, keepdims=keepdims)

    def clip(self, min: Any = None, max: Any = None, out: Any = None, **kwargs: Any) -> Any:
        with self._trace.scope("ndarray.clip"):
            return _clip(self._trace, self, min, max, out=out, **kwargs)

    def round(self, decimals: int = 0, out: Any = None) -> Any:
        with self._trace.scope("ndarray.round"):
            return _round(self._trace, self, decimals, out)


def _m(t: Tracer, method: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    with t._trace.scope(f"ndarray.{method}"):
        return fn(t._trace, *args, **kwargs)


def _ddof(ddof: Any, correction: Any) -> float:
    if correction is not _NOVALUE:
        return float(correction)
    return float(ddof)


# ---------------------------------------------------------------------- ufunc table

def _u(op: str) -> Callable[..., Value]:
    """Emits a unary op of the op set."""
    bool_op = {"bitwise_not": "logical_not"}.get(op)

    def emit(tr: Trace, x: Value) -> Value:
        return tr.b.unary(bool_op if bool_op and x.dtype == "bool" else op, x)

    return emit


_BOOL_BINARY = {
    "add": "logical_or", "mul": "logical_and", "maximum": "logical_or", "minimum": "logical_and",
    "bitwise_and": "logical_and", "bitwise_or": "logical_or", "bitwise_xor": "logical_xor",
}


def _bin(op: str) -> Callable[..., Value]:
    """Emits a binary op of the op set; bool loops become logical ops as NumPy's are."""

    def emit(tr: Trace, a: Value, b: Value) -> Value:
        if a.dtype == "bool" and b.dtype == "bool" and op in _BOOL_BINARY:
            return tr.b.binary(_BOOL_BINARY[op], a, b)
        return tr.b.binary(op, a, b)

    return emit


def _const_like(tr: Trace, x: Value, value: float) -> Value:
    return tr.b.constant(np.asarray(value, dtype=dt.to_numpy(x.dtype)), x.dtype)


def _e_positive(tr: Trace, x: Value) -> Value:
    return x


def _e_square(tr: Trace, x: Value) -> Value:
    return tr.b.binary("logical_and" if x.dtype == "bool" else "mul", x, x)


def _e_power(tr: Trace, a: Value, b: Value) -> Value:
    return tr.b.binary("pow", a, b)


def _e_log10(tr: Trace, x: Value) -> Value:
    return tr.b.binary("mul", tr.b.unary("log", x), _const_like(tr, x, 1.0 / math.log(10.0)))


def _e_isnan(tr: Trace, x: Value) -> Value:
    return tr.b.unary("isnan", x) if dt.is_float(x.dtype) else tr.b.full(x.shape, 0, "bool")


def _e_isinf(tr: Trace, x: Value) -> Value:
    return tr.b.unary("isinf", x) if dt.is_float(x.dtype) else tr.b.full(x.shape, 0, "bool")


def _e_isfinite(tr: Trace, x: Value) -> Value:
    if not dt.is_float(x.dtype):
        return tr.b.full(x.shape, 1, "bool")
    return tr.b.unary("logical_not", tr.b.binary("logical_or", tr.b.unary("isnan", x), tr.b.unary("isinf", x)))


def _e_reciprocal(tr: Trace, x: Value) -> Value:
    if not dt.is_float(x.dtype):
        raise UnsupportedError("numpy.reciprocal of integers")
    return tr.b.unary("reciprocal", x)


def _e_hypot(tr: Trace, a: Value, b: Value) -> Value:
    return tr.b.unary("sqrt", tr.b.binary("add", tr.b.binary("mul", a, a), tr.b.binary("mul", b, b)))


def _e_fmax(op: str) -> Callable[..., Value]:
    def emit(tr: Trace, a: Value, b: Value) -> Value:
        m = _bin(op)(tr, a, b)
        if not dt.is_float(m.dtype):
            return m
        # fmax/fmin ignore a NaN when the other operand is a number.
        return tr.b.where(tr.b.unary("isnan", a), b, tr.b.where(tr.b.unary("isnan", b), a, m))

    return emit


def _e_scale(factor: float) -> Callable[..., Value]:
    def emit(tr: Trace, x: Value) -> Value:
        return tr.b.binary("mul", x, _const_like(tr, x, factor))

    return emit


def _e_logaddexp(tr: Trace, a: Value, b: Value) -> Value:
    # log(e^a + e^b) = max + log1p(exp(-|a - b|)); equal operands (infinities included)
    # give a + log(2), as NumPy computes it.
    m = tr.b.binary("maximum", a, b)
    d = tr.b.unary("abs", tr.b.binary("sub", a, b))
    general = tr.b.binary("add", m, tr.b.unary("log1p", tr.b.unary("exp", tr.b.unary("neg", d))))
    same = tr.b.binary("add", a, _const_like(tr, a, math.log(2.0)))
    return tr.b.where(tr.b.binary("eq", a, b), same, general)


_UFUNCS: dict[Any, Callable[..., Value]] = {
    np.add: _bin("add"), np.subtract: _bin("sub"), np.multiply: _bin("mul"),
    np.true_divide: _bin("div"), np.floor_divide: _bin("floordiv"), np.remainder: _bin("remainder"),
    np.power: _e_power, np.maximum: _bin("maximum"), np.minimum: _bin("minimum"),
    np.fmax: _e_fmax("maximum"), np.fmin: _e_fmax("minimum"), np.arctan2: _bin("atan2"),
    np.hypot: _e_hypot, np.logaddexp: _e_logaddexp,
    np.equal: _bin("eq"), np.not_equal: _bin("ne"), np.less: _bin("lt"), np.less_equal: _bin("le"),
    np.greater: _bin("gt"), np.greater_equal: _bin("ge"),
    np.logical_and: _bin("logical_and"), np.logical_or: _bin("logical_or"), np.logical_xor: _bin("logical_xor"),
    np.bitwise_and: _bin("bitwise_and"), np.bitwise_or: _bin("bitwise_or"), np.bitwise_xor: _bin("bitwise_xor"),
    np.negative: _u("neg"), np.positive: _e_positive, np.absolute: _u("abs"), np.fabs: _u("abs"),
    np.sign: _u("sign"), np.exp: _u("exp"), np.exp2: _u("exp2"), np.expm1: _u("expm1"),
    np.log: _u("log"), np.log2: _u("log2"), np.log10: _e_log10, np.log1p: _u("log1p"),
    np.sqrt: _u("sqrt"), np.square: _e_square, np.reciprocal: _e_reciprocal,
    np.sin: _u("sin"), np.cos: _u("cos"), np.tan: _u("tan"), np.arcsin: _u("asin"),
    np.arccos: _u("acos"), np.arctan: _u("atan"), np.sinh: _u("sinh"), np.cosh: _u("cosh"),
    np.tanh: _u("tanh"), np.floor: _u("floor"), np.ceil: _u("ceil"), np.rint: _u("round"),
    np.trunc: _u("trunc"), np.logical_not: _u("logical_not"), np.invert: _u("bitwise_not"),
    np.isnan: _e_isnan, np.isinf: _e_isinf, np.isfinite: _e_isfinite,
    np.deg2rad: _e_scale(math.pi / 180.0), np.rad2deg: _e_scale(180.0 / math.pi),
    np.conjugate: _e_positive,
}
_COMPARISONS = frozenset({np.equal, np.not_equal, np.less, np.less_equal, np.greater, np.greater_equal})
_UFUNC_REDUCTIONS: dict[Any, str] = {
    np.add: "sum", np.multiply: "prod", np.maximum: "max", np.minimum: "min",
    np.logical_and: "all", np.logical_or: "any",
}


# ---------------------------------------------------------------------- function handlers

_FUNCTIONS: dict[Any, Callable[..., Any]] = {}
_UNSUPPORTED_REASONS: dict[str, str] = {
    "dot": "matrix products are externs: keep them outside the jitted function",
    "matmul": "matrix products are externs: keep them outside the jitted function",
    "einsum": "matrix products are externs: keep them outside the jitted function",
    "tensordot": "matrix products are externs: keep them outside the jitted function",
    "inner": "matrix products are externs: keep them outside the jitted function",
    "nonzero": "the result's shape depends on the data",
    "unique": "the result's shape depends on the data",
    "argwhere": "the result's shape depends on the data",
    "sort": "sorting is not in kiln's op set",
    "argsort": "sorting is not in kiln's op set",
    "cumsum": "scans are not in kiln's op set",
    "cumprod": "scans are not in kiln's op set",
}


def _implements(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Registers a handler for NumPy functions given as dotted names under ``numpy``."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        for name in names:
            obj: Any = np
            for part in name.split("."):
                obj = getattr(obj, part, None)
                if obj is None:
                    break
            if obj is not None:
                _FUNCTIONS[obj] = fn
        return fn

    return deco


def _no_out(name: str, out: Any) -> None:
    if out is not None:
        raise UnsupportedError(f"{name}(out=...)", "assign the result instead")


def _no_where(name: str, where: Any) -> None:
    if where is not _NOVALUE and where is not True:
        raise UnsupportedError(f"{name}(where=...)", "apply np.where to the input instead")


def _axes_arg(axis: Any, ndim: int) -> Optional[list[int]]:
    """NumPy's axis argument (None, an int, or a tuple) as a normalized list (None: all)."""
    if axis is None:
        return None
    if isinstance(axis, (tuple, list)):
        ax = normalize_axes(axis, ndim, empty_means_all=False)
        if len(ax) != len(axis):
            raise ValueError("duplicate value in 'axis'")
        return ax
    return normalize_axes([operator.index(axis)], ndim)


_INITIAL_COMBINE = {"sum": "add", "prod": "mul", "max": "maximum", "min": "minimum"}


def _reduction(tr: Trace, op: str, a: Any, axis: Any = None, dtype: Any = None, out: Any = None,
               keepdims: Any = False, initial: Any = _NOVALUE, where: Any = _NOVALUE,
               ddof: float = 0.0, mean: Any = _NOVALUE) -> Tracer:
    """np.sum / mean / var / std / max / min / prod / any / all with NumPy's dtype rules."""
    name = f"numpy.{op}"
    _no_out(name, out)
    _no_where(name, where)
    if mean is not _NOVALUE:
        raise UnsupportedError(f"{name}(mean=...)")
    if keepdims is _NOVALUE:
        keepdims = False
    x = tr.value(a)
    if dtype is not None:
        x = tr.cast(x, dtype)
    elif op in ("mean", "var", "std") and not dt.is_float(x.dtype):
        x = tr.cast(x, "f64")  # NumPy averages integers and bools in float64
    axes = _axes_arg(axis, x.ndim)
    if initial is not _NOVALUE and op not in _INITIAL_COMBINE:
        raise UnsupportedError(f"{name}(initial=...)")
    if axes == []:
        # An empty axis tuple reduces nothing: the input with the result's dtype.
        result_dtype = {"sum": dt.sum_result(x.dtype), "prod": dt.sum_result(x.dtype), "any": "bool", "all": "bool"}.get(op, x.dtype)
        v = tr.cast(x, result_dtype)
        if op in ("var", "std"):
            v = tr.b.full(x.shape, 0.0, v.dtype)
    else:
        v = tr.b.reduce(op, x, axes, bool(keepdims), correction=float(ddof) if op in ("var", "std") and ddof else None)
    if initial is not _NOVALUE:
        v = tr.b.binary(_INITIAL_COMBINE[op], v, tr.value(initial, dt.to_numpy(v.dtype)))
    return tr.wrap(v)


def _arg_reduction(tr: Trace, op: str, a: Any, axis: Any = None, out: Any = None, *, keepdims: Any = False) -> Tracer:
    _no_out(f"numpy.{op}", out)
    x = tr.value(a)
    if axis is not None:
        axis = operator.index(axis)
    return tr.wrap(getattr(tr.b, op)(x, axis, bool(keepdims) if keepdims is not _NOVALUE else False))


# The positional parameters after `axis` of each NumPy reduction, in its own order.
_REDUCTION_POSITIONAL: dict[str, tuple[str, ...]] = {
    "sum": ("dtype", "out", "keepdims", "initial", "where"),
    "prod": ("dtype", "out", "keepdims", "initial", "where"),
    "mean": ("dtype", "out", "keepdims"),
    "max": ("out", "keepdims", "initial", "where"),
    "min": ("out", "keepdims", "initial", "where"),
    "any": ("out", "keepdims"),
    "all": ("out", "keepdims"),
}


def _make_reduction(op: str) -> Callable[..., Any]:
    def handler(tr: Trace, a: Any, axis: Any = None, *args: Any, **kwargs: Any) -> Any:
        if len(args) > len(_REDUCTION_POSITIONAL[op]):
            raise TypeError(f"numpy.{op}: too many positional arguments")
        kwargs.update(zip(_REDUCTION_POSITIONAL[op], args))
        return _reduction(tr, op, a, axis, **kwargs)

    return handler


for _op in _REDUCTION_POSITIONAL:
    _implements(_op)(_make_reduction(_op))
_implements("amax")(_FUNCTIONS[np.max])
_implements("amin")(_FUNCTIONS[np.min])


def _make_var(op: str) -> Callable[..., Any]:
    def handler(tr: Trace, a: Any, axis: Any = None, dtype: Any = None, out: Any = None, ddof: float = 0,
                keepdims: Any = False, *, where: Any = _NOVALUE, mean: Any = _NOVALUE, correction: Any = _NOVALUE) -> Any:
        return _reduction(tr, op, a, axis, dtype, out, keepdims, where=where, ddof=_ddof(ddof, correction), mean=mean)
    return handler


_FUNCTIONS[np.var] = _make_var("var")
_FUNCTIONS[np.std] = _make_var("std")


@_implements("argmin")
def _np_argmin(tr: Trace, a: Any, axis: Any = None, out: Any = None, *, keepdims: Any = False) -> Any:
    return _arg_reduction(tr, "argmin", a, axis, out, keepdims=keepdims)


@_implements("argmax")
def _np_argmax(tr: Trace, a: Any, axis: Any = None, out: Any = None, *, keepdims: Any = False) -> Any:
    return _arg_reduction(tr, "argmax", a, axis, out, keepdims=keepdims)


def _clamp_scalar(bound: Any, dtype: str, upper: bool) -> Any:
    """Clips a Python int bound to an integer dtype's range (NumPy 2's clip accepts it)."""
    if dt.scalar_kind(bound) == "int" and dt.is_integer(dtype):
        info = np.iinfo(dt.to_numpy(dtype))
        return min(max(bound, info.min), info.max)
    return bound


@_implements("clip")
def _clip(tr: Trace, a: Any, a_min: Any = _NOVALUE, a_max: Any = _NOVALUE, out: Any = None, *,
          min: Any = _NOVALUE, max: Any = _NOVALUE, **kwargs: Any) -> Tracer:
    _no_out("numpy.clip", out)
    for k in kwargs:
        if k not in ("casting", "order", "subok", "dtype") or (k == "dtype" and kwargs[k] is not None):
            raise UnsupportedError(f"numpy.clip({k}=...)")
    lo = min if min is not _NOVALUE else (None if a_min is _NOVALUE else a_min)
    hi = max if max is not _NOVALUE else (None if a_max is _NOVALUE else a_max)
    if lo is None and hi is None:
        raise ValueError("One of max or min must be given")
    t = tr.tracer_of(a)
    x_dt = t._v.dtype
    lo = _clamp_scalar(lo, x_dt, False) if lo is not None else None
    hi = _clamp_scalar(hi, x_dt, True) if hi is not None else None
    # The result dtype NumPy gives: maximum(x, lo) then minimum(., hi), scalars weak.
    res = t.dtype
    if lo is not None:
        res = np.maximum.resolve_dtypes((res, Trace.resolve_dtype_of(lo), None))[2]
    if hi is not None:
        res = np.minimum.resolve_dtypes((res, Trace.resolve_dtype_of(hi), None))[2]
    x = tr.cast(t._v, res)
    scalar = lambda b: b is None or dt.scalar_kind(b) in ("int", "float") or (isinstance(b, np.generic) and b.dtype.kind in "iuf")
    if scalar(lo) and scalar(hi) and x.dtype != "bool":
        v = tr.b.clamp(x, None if lo is None else float(lo), None if hi is None else float(hi))
    else:
        v = x
        if lo is not None:
            v = tr.b.binary("maximum", v, tr.value(lo, res))
        if hi is not None:
            v = tr.b.binary("minimum", v, tr.value(hi, res))
    return tr.wrap(v)


def _integer_index(tr: Trace, k: Any) -> Optional[Value]:
    """``k`` as an integer Value when it is an integer array (traced or captured), else None."""
    if isinstance(k, Tracer):
        v = tr.value(k)
    elif isinstance(k, (np.ndarray, list)):
        arr = np.asarray(k)
        if arr.dtype.kind not in "iu":
            return None
        v = tr.value(arr)
    else:
        return None
    return v if dt.is_integer(v.dtype) else None


def _take_value(tr: Trace, a: Value, idx: Value, axis: int, mode: str) -> Value:
    """np.take's modes on kiln's gather (which wraps negatives and clamps the rest; for
    ``raise``, :meth:`Trace.check_index` raises where NumPy does): ``clip`` clamps first (a
    negative index reads position 0, as NumPy's clip does), ``wrap`` takes the remainder."""
    n = a.shape[axis]
    if mode == "clip":
        idx = tr.b.clamp(idx, 0, max(n - 1, 0))
    elif mode == "wrap":
        idx = tr.b.binary("remainder", idx, tr.b.constant(max(n, 1), idx.dtype))
    elif mode != "raise":
        raise ValueError(f"clipmode must be one of 'clip', 'raise', or 'wrap' (got {mode!r})")
    return tr.b.take(a, idx, axis)


@_implements("take")
def _take(tr: Trace, a: Any, indices: Any, axis: Any = None, out: Any = None, mode: str = "raise") -> Tracer:
    _no_out("numpy.take", out)
    v = tr.value(a)
    idx = _integer_index(tr, indices) if not dt.scalar_kind(indices) else tr.value(int(indices))
    if idx is None:
        raise TypeError("numpy.take: indices must be integers")
    if axis is None:
        v, axis = tr.b.reshape(v, (-1,)), 0
    axis = normalize_axes([axis], v.ndim)[0]
    if mode == "raise":
        tr.check_index(indices, idx, v, axis)
    return tr.wrap(_take_value(tr, v, idx, axis, mode))


@_implements("take_along_axis")
def _take_along_axis(tr: Trace, arr: Any, indices: Any, axis: Any = -1) -> Tracer:
    v = tr.value(arr)
    idx = _integer_index(tr, indices)
    if idx is None:
        raise IndexError("`indices` must be an integer array")
    if axis is None:
        v, axis = tr.b.reshape(v, (-1,)), 0
    if idx.ndim != v.ndim:
        raise ValueError("`indices` and `arr` must have the same number of dimensions")
    axis = normalize_axes([axis], v.ndim)[0]
    tr.check_index(indices, idx, v, axis)
    return tr.wrap(tr.b.gather(v, idx, axis))


@_implements("where")
def _where(tr: Trace, condition: Any, x: Any = _NOVALUE, y: Any = _NOVALUE) -> Tracer:
    if x is _NOVALUE or y is _NOVALUE:
        if x is _NOVALUE and y is _NOVALUE:
            raise UnsupportedError("numpy.where with one argument (nonzero)", "the result's shape depends on the data")
        raise ValueError("either both or neither of x and y should be given")
    c = tr.value(condition)
    if c.dtype != "bool":
        c = tr.b.cast(c, "bool")
    a, b = (o if dt.scalar_kind(o) is not None else tr.value(o) for o in (x, y))
    return tr.wrap(tr.b.where(c, a, b))


def _as_values(tr: Trace, arrays: Any, name: str) -> list[Value]:
    if isinstance(arrays, Tracer):
        raise UnsupportedError(f"{name} of a single traced array", "pass a list of arrays")
    return [tr.value(a) for a in arrays]


@_implements("concatenate", "concat")
def _concatenate(tr: Trace, arrays: Any, axis: Any = 0, out: Any = None, *, dtype: Any = None, casting: Any = "same_kind") -> Tracer:
    _no_out("numpy.concatenate", out)
    vals = _as_values(tr, arrays, "numpy.concatenate")
    if axis is None:
        vals = [tr.b.reshape(v, (-1,)) for v in vals]
        axis = 0
    if dtype is not None:
        vals = [tr.cast(v, dtype) for v in vals]
    return tr.wrap(tr.b.concat(vals, axis))


@_implements("stack")
def _stack(tr: Trace, arrays: Any, axis: int = 0, out: Any = None, *, dtype: Any = None, casting: Any = "same_kind") -> Tracer:
    _no_out("numpy.stack", out)
    vals = _as_values(tr, arrays, "numpy.stack")
    if not vals:
        raise ValueError("need at least one array to stack")
    shapes = {v.shape for v in vals}
    if len(shapes) != 1:
        raise ValueError("all input arrays must have the same shape")
    ax = normalize_axes([axis], vals[0].ndim + 1)[0]
    vals = [tr.b.unsqueeze(v, [ax]) for v in vals]
    if dtype is not None:
        vals = [tr.cast(v, dtype) for v in vals]
    return tr.wrap(tr.b.concat(vals, ax))


@_implements("vstack", "row_stack")
def _vstack(tr: Trace, tup: Any, *, dtype: Any = None, casting: Any = "same_kind") -> Tracer:
    vals = [v if v.ndim >= 2 else tr.b.reshape(v, (1, -1) if v.ndim == 1 else (1, 1)) for v in _as_values(tr, tup, "numpy.vstack")]
    if dtype is not None:
        vals = [tr.cast(v, dtype) for v in vals]
    return tr.wrap(tr.b.concat(vals, 0))


@_implements("hstack")
def _hstack(tr: Trace, tup: Any, *, dtype: Any = None, casting: Any = "same_kind") -> Tracer:
    vals = [v if v.ndim >= 1 else tr.b.reshape(v, (1,)) for v in _as_values(tr, tup, "numpy.hstack")]
    if dtype is not None:
        vals = [tr.cast(v, dtype) for v in vals]
    return tr.wrap(tr.b.concat(vals, 0 if vals[0].ndim == 1 else 1))


def _reshape(tr: Trace, a: Any, shape: Any, order: str = "C") -> Tracer:
    if order not in ("C", "A", "K"):
        raise UnsupportedError(f"numpy.reshape(order={order!r})", "only row-major order is supported")
    t = tr.tracer_of(a)
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    shape = tuple(operator.index(d) for d in shape)
    if shape == t.shape:
        return tr.wrap(t._v, base=t)
    return tr.wrap(tr.b.reshape(t._v, shape), base=t)


@_implements("reshape")
def _np_reshape(tr: Trace, a: Any, shape: Any = None, order: str = "C", *, newshape: Any = None, copy: Any = None) -> Tracer:
    return _reshape(tr, a, shape if shape is not None else newshape, order)


@_implements("ravel")
def _np_ravel(tr: Trace, a: Any, order: str = "C") -> Tracer:
    return _reshape(tr, a, (-1,), order)


def _transpose(tr: Trace, a: Any, axes: Optional[Sequence[int]]) -> Tracer:
    t = tr.tracer_of(a)
    perm = list(range(t.ndim))[::-1] if axes is None else [operator.index(x) for x in axes]
    if len(perm) != t.ndim:
        raise ValueError("axes don't match array")
    perm = [p + t.ndim if -t.ndim <= p < 0 else p for p in perm]
    if sorted(perm) != list(range(t.ndim)):
        raise ValueError(f"axes {list(axes or [])} are not a permutation of {t.ndim} axes")
    if perm == list(range(t.ndim)):
        return tr.wrap(t._v, base=t)
    return tr.wrap(tr.b.permute(t._v, perm), base=t)


@_implements("transpose", "permute_dims")
def _np_transpose(tr: Trace, a: Any, axes: Any = None) -> Tracer:
    return _transpose(tr, a, axes)


def _swapaxes(tr: Trace, a: Any, axis1: int, axis2: int) -> Tracer:
    t = tr.tracer_of(a)
    i, j = normalize_axes([axis1], t.ndim)[0], normalize_axes([axis2], t.ndim)[0]
    perm = list(range(t.ndim))
    perm[i], perm[j] = perm[j], perm[i]
    return _transpose(tr, t, perm)


_implements("swapaxes")(_swapaxes)


@_implements("moveaxis")
def _moveaxis(tr: Trace, a: Any, source: Any, destination: Any) -> Tracer:
    t = tr.tracer_of(a)
    src_in = [source] if isinstance(source, (int, np.integer)) else list(source)
    dst_in = [destination] if isinstance(destination, (int, np.integer)) else list(destination)
    src: list[int] = [normalize_axes([int(s)], t.ndim)[0] for s in src_in]
    dst: list[int] = [normalize_axes([int(d)], t.ndim)[0] for d in dst_in]
    if len(src) != len(dst):
        raise ValueError("`source` and `destination` arguments must have the same number of elements")
    order = [n for n in range(t.ndim) if n not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return _transpose(tr, t, order)


def _squeeze(tr: Trace, a: Any, axis: Any = None) -> Tracer:
    t = tr.tracer_of(a)
    axes = None if axis is None else _axes_arg(axis, t.ndim)
    v = tr.b.squeeze(t._v, axes)
    return tr.wrap(v, base=t)


_implements("squeeze")(_squeeze)


@_implements("expand_dims")
def _expand_dims(tr: Trace, a: Any, axis: Any) -> Tracer:
    t = tr.tracer_of(a)
    axes = [int(axis)] if isinstance(axis, (int, np.integer)) else [int(a) for a in axis]
    return tr.wrap(tr.b.unsqueeze(t._v, axes), base=t)


@_implements("broadcast_to")
def _broadcast_to(tr: Trace, array: Any, shape: Any, subok: bool = False) -> Tracer:
    t = tr.tracer_of(array)
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if shape == t.shape:
        return tr.wrap(t._v, base=t)
    return tr.wrap(tr.b.broadcast_to(t._v, shape), base=t)


@_implements("flip")
def _flip(tr: Trace, m: Any, axis: Any = None) -> Tracer:
    t = tr.tracer_of(m)
    axes = _axes_arg(axis, t.ndim)
    axes = list(range(t.ndim)) if axes is None else axes
    if not axes:
        return tr.wrap(t._v, base=t)
    n = len(axes)
    return tr.wrap(tr.b.slice(t._v, axes, [-1] * n, [-(t.shape[a] + 1) for a in axes], [-1] * n), base=t)


@_implements("astype")
def _astype(tr: Trace, x: Any, dtype: Any, /, *, copy: bool = True, device: Any = None) -> Tracer:
    t = tr.tracer_of(x)
    name = dt.dtype_name(dtype)
    if name == t._v.dtype and not copy:
        return t
    return tr.wrap(tr.cast(t._v, name))


@_implements("copy")
def _copy(tr: Trace, a: Any, order: str = "K", subok: bool = False) -> Tracer:
    return tr.wrap(tr.tracer_of(a)._v)


@_implements("shape")
def _shape(tr: Trace, a: Any) -> tuple[int, ...]:
    return tr.tracer_of(a).shape


@_implements("ndim")
def _ndim(tr: Trace, a: Any) -> int:
    return tr.tracer_of(a).ndim


@_implements("size")
def _size(tr: Trace, a: Any, axis: Any = None) -> int:
    t = tr.tracer_of(a)
    return t.size if axis is None else t.shape[axis]


@_implements("result_type")
def _result_type(tr: Trace, *arrays_and_dtypes: Any) -> np.dtype:
    return np.result_type(*[a.dtype if isinstance(a, Tracer) else a for a in arrays_and_dtypes])


@_implements("round", "around")
def _round(tr: Trace, a: Any, decimals: int = 0, out: Any = None) -> Tracer:
    _no_out("numpy.round", out)
    x = tr.value(a)
    if not dt.is_float(x.dtype):
        if decimals >= 0:
            return tr.wrap(x)
        raise UnsupportedError("numpy.round of integers with negative decimals")
    if decimals == 0:
        return tr.wrap(tr.b.unary("round", x))
    # NumPy's own method: scale, round half to even, unscale.
    f = _const_like(tr, x, 10.0 ** abs(decimals))
    if decimals > 0:
        return tr.wrap(tr.b.binary("div", tr.b.unary("round", tr.b.binary("mul", x, f)), f))
    return tr.wrap(tr.b.binary("mul", tr.b.unary("round", tr.b.binary("div", x, f)), f))


def _full_like(tr: Trace, a: Any, fill: Any, dtype: Any, shape: Any) -> Tracer:
    t = tr.tracer_of(a)
    d = dt.dtype_name(dtype) if dtype is not None else t._v.dtype
    shp = t.shape if shape is None else ((int(shape),) if isinstance(shape, (int, np.integer)) else tuple(shape))
    if isinstance(fill, Tracer):
        return tr.wrap(tr.b.broadcast_to(tr.cast(fill._v, d), shp))
    if dt.scalar_kind(fill) is None and not isinstance(fill, np.generic):
        fill = np.asarray(fill)
        if fill.ndim:
            return tr.wrap(tr.b.broadcast_to(tr.value(fill, dt.to_numpy(d)), shp))
    return tr.wrap(tr.b.full(shp, float(np.asarray(fill, dtype=dt.to_numpy(d))), d))


@_implements("zeros_like", "empty_like")
def _zeros_like(tr: Trace, a: Any, dtype: Any = None, order: str = "K", subok: bool = True, shape: Any = None, **kw: Any) -> Tracer:
    return _full_like(tr, a, 0, dtype, shape)


@_implements("ones_like")
def _ones_like(tr: Trace, a: Any, dtype: Any = None, order: str = "K", subok: bool = True, shape: Any = None, **kw: Any) -> Tracer:
    return _full_like(tr, a, 1, dtype, shape)


@_implements("full_like")
def _np_full_like(tr: Trace, a: Any, fill_value: Any, dtype: Any = None, order: str = "K", subok: bool = True, shape: Any = None, **kw: Any) -> Tracer:
    return _full_like(tr, a, fill_value, dtype, shape)


@_implements("outer")
def _outer(tr: Trace, a: Any, b: Any, out: Any = None) -> Tracer:
    _no_out("numpy.outer", out)
    x = tr.b.reshape(tr.value(a), (-1, 1))
    y = tr.b.reshape(tr.value(b), (1, -1))
    return tr.ufunc(np.multiply, "__call__", (tr.wrap(x), tr.wrap(y)), {})


@_implements("isclose")
def _isclose(tr: Trace, a: Any, b: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> Tracer:
    # NumPy's formula: |a - b| <= atol + rtol * |b|, and exact equality (infinities) counts.
    x, y = tr.tracer_of(a), tr.tracer_of(b)
    if x.dtype.kind != "f" or y.dtype.kind != "f":
        ft = np.result_type(x.dtype, y.dtype, 1.0)
        x, y = x.astype(ft), y.astype(ft)
    close = (abs(x - y) <= atol + rtol * abs(y)) & np.isfinite(y)
    result = close | (x == y)
    if equal_nan:
        result = result | (np.isnan(x) & np.isnan(y))
    return result


@_implements("linalg.norm")
def _norm(tr: Trace, x: Any, ord: Any = None, axis: Any = None, keepdims: bool = False) -> Tracer:
    v = tr.value(x)
    if not dt.is_float(v.dtype):
        v = tr.cast(v, "f64")  # np.linalg.norm works in float64 for integers
    nd = v.ndim
    if axis is None:
        if ord is None or (ord in ("f", "fro") and nd == 2) or (ord == 2 and nd == 1):
            return tr.wrap(tr.b.norm(v, 2.0, None, bool(keepdims)))
        axes = list(range(nd))
    elif isinstance(axis, (tuple, list)):
        axes = [operator.index(a) for a in axis]
    else:
        axes = [operator.index(axis)]
    axes = [normalize_axes([a], nd)[0] for a in axes]
    if len(axes) == 1:
        a = axes
        if ord is None or ord == 2:
            return tr.wrap(tr.b.norm(v, 2.0, a, bool(keepdims)))
        if ord == 1:
            return tr.wrap(tr.b.norm(v, 1.0, a, bool(keepdims)))
        if ord == math.inf:
            return tr.wrap(tr.b.norm(v, math.inf, a, bool(keepdims)))
        if isinstance(ord, str):
            raise ValueError(f"Invalid norm order '{ord}' for vectors")
        absx = tr.b.unary("abs", v)
        if ord == -math.inf:
            return tr.wrap(tr.b.min(absx, a, bool(keepdims)))
        if ord == 0:
            nz = tr.b.cast(tr.b.binary("ne", v, _const_like(tr, v, 0)), v.dtype)
            return tr.wrap(tr.b.sum(nz, a, bool(keepdims)))
        p = float(ord)
        s = tr.b.sum(tr.b.binary("pow", absx, _const_like(tr, v, p)), a, bool(keepdims))
        return tr.wrap(tr.b.binary("pow", s, _const_like(tr, s, 1.0 / p)))
    if len(axes) == 2:
        r, c = axes
        if r == c:
            raise ValueError("Duplicate axes given.")
        absx = tr.b.unary("abs", v)
        if ord is None or ord in ("fro", "f"):
            return tr.wrap(tr.b.norm(v, 2.0, axes, bool(keepdims)))
        if ord in (1, -1, math.inf, -math.inf):
            inner, outer = (r, c) if ord in (1, -1) else (c, r)
            s = tr.b.sum(absx, [inner], True)
            red = tr.b.max if ord in (1, math.inf) else tr.b.min
            out = red(s, [outer], True)
            if not keepdims:
                out = tr.b.squeeze(out, sorted(axes))
            return tr.wrap(out)
        raise UnsupportedError(f"numpy.linalg.norm(ord={ord!r}) over two axes", "it needs a singular value decomposition")
    raise ValueError("Improper number of dimensions to norm.")


# ---------------------------------------------------------------------- assignment

def _masked_assign(tr: Trace, target: Tracer, mask: Any, value: Any) -> Value:
    """``target[mask] = value`` as ``where(mask, value, target)``."""
    m = tr.value(mask)
    if m.dtype != "bool":
        raise UnsupportedError("assignment through an integer index array", "use a boolean mask")
    if m.shape != target.shape[: m.ndim]:
        raise IndexError(f"boolean index of shape {m.shape} does not match the indexed array's {target.shape}")
    trailing = target.shape[m.ndim:]
    if m.ndim < target.ndim:
        m = tr.b.reshape(m, m.shape + (1,) * (target.ndim - m.ndim))
    v = _assigned_value(tr, target, value)
    ok = False
    if v.ndim <= len(trailing):
        try:
            ok = broadcast_shapes(v.shape, trailing) == trailing
        except ValueError:
            ok = False
    if not ok:
        if v.size != 1:
            raise UnsupportedError(
                f"masked assignment of a value of shape {v.shape}",
                "only a scalar or a value that broadcasts to every selected element is supported",
            )
        v = tr.b.reshape(v, ())
    return tr.b.where(m, v, target._v)


def _assigned_value(tr: Trace, target: Tracer, value: Any) -> Value:
    """The value to store, converted to the target's dtype as NumPy's setitem converts it."""
    if dt.scalar_kind(value) is not None:
        return tr.value(value, target.dtype)
    return tr.cast(tr.value(value), target._v.dtype)


def _basic_assign(tr: Trace, target: Tracer, key: Any, value: Any) -> Value:
    """``target[ints/slices/...] = value`` by stitching slices of the target around the value."""
    keys = key if isinstance(key, tuple) else (key,)
    for k in keys:
        if k is None or isinstance(k, (Tracer, np.ndarray, list)):
            raise UnsupportedError(f"assignment with index {k!r}", "only ints, slices, Ellipsis and boolean masks are supported")
    x = target._v
    n_idx = sum(1 for k in keys if k is not Ellipsis)
    if n_idx > x.ndim:
        raise IndexError(f"too many indices: array is {x.ndim}-dimensional, but {n_idx} were indexed")
    if any(k is Ellipsis for k in keys):
        i = next(i for i, k in enumerate(keys) if k is Ellipsis)
        keys = keys[:i] + (slice(None),) * (x.ndim - n_idx) + keys[i + 1:]
    else:
        keys = keys + (slice(None),) * (x.ndim - n_idx)
    regions: list[tuple[int, int, int]] = []  # (axis, start, stop) of axes not fully covered
    region_shape: list[int] = []  # the shape the value must broadcast to (int axes dropped)
    int_axes: list[int] = []
    for axis, k in enumerate(keys):
        dim = x.shape[axis]
        if isinstance(k, slice):
            start, stop, step = k.indices(dim)
            if step != 1:
                raise UnsupportedError("assignment to a strided slice", "only step 1 is supported")
            stop = max(stop, start)
            region_shape.append(stop - start)
        else:
            i = operator.index(k)
            raise_if_out_of_bounds(np.asarray(i), dim, axis)
            start, stop = i % dim, i % dim + 1
            int_axes.append(axis)
        if (start, stop) != (0, dim):
            regions.append((axis, start, stop))
    v = _assigned_value(tr, target, value)
    rs = tuple(region_shape)
    if broadcast_shapes(v.shape, rs) != rs:
        raise ValueError(f"could not broadcast input array from shape {v.shape} into shape {rs}")
    if v.shape != rs:
        v = tr.b.broadcast_to(v, rs)
    if int_axes:
        v = tr.b.unsqueeze(v, int_axes)
    if any(stop == start for _, start, stop in regions):
        return x  # an empty region: nothing changes

    def stitch(full: Value, todo: list[tuple[int, int, int]]) -> Value:
        if not todo:
            return v
        axis, start, stop = todo[0]
        dim = full.shape[axis]
        mid = stitch(tr.b.slice(full, [axis], [start], [stop]), todo[1:])
        parts = []
        if start > 0:
            parts.append(tr.b.slice(full, [axis], [0], [start]))
        parts.append(mid)
        if stop < dim:
            parts.append(tr.b.slice(full, [axis], [stop], [dim]))
        return parts[0] if len(parts) == 1 else tr.b.concat(parts, axis)

    return stitch(x, regions)


__all__ = ["Trace", "Tracer", "MAX_CONSTANT_ELEMENTS"]
