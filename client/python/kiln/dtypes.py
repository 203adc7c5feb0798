"""kiln element types: names, NumPy and wire equivalents, and NumPy-style promotion.

A dtype is named by a short string everywhere in the Python client: ``"f16" "bf16" "f32" "f64"
"i8" "i16" "i32" "i64" "u8" "bool"`` (the names the daemon prints). :func:`dtype_name` accepts
anything NumPy understands as a dtype too (``np.float32``, ``"float32"``, ``np.dtype("i8")``).

The rules here mirror the daemon's (``kernels/ir/dtype.h``), which follow NumPy 2:
:func:`promote` is ``np.result_type`` on arrays; :func:`float_result` is the type float-only ops
compute in; :func:`sum_result` the accumulator of ``sum``/``prod``; :func:`weak_scalar_dtype` is
NEP 50's rule for a Python scalar meeting a tensor.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import numpy as np

#: Every dtype kiln knows, by name.
DTYPES: tuple[str, ...] = ("f16", "bf16", "f32", "f64", "i8", "i16", "i32", "i64", "u8", "bool")

# The numbers match kiln.v1.DType on the wire.
_WIRE: dict[str, int] = {
    "f16": 1, "bf16": 2, "f32": 3, "f64": 4, "i8": 5, "i16": 6, "i32": 7, "i64": 8, "u8": 9, "bool": 10,
}
_FROM_WIRE: dict[int, str] = {v: k for k, v in _WIRE.items()}

_NUMPY: dict[str, Any] = {
    "f16": np.dtype(np.float16),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "i8": np.dtype(np.int8),
    "i16": np.dtype(np.int16),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
    "u8": np.dtype(np.uint8),
    "bool": np.dtype(np.bool_),
}
try:  # bfloat16 exists in NumPy only through the optional ml_dtypes package
    import ml_dtypes  # type: ignore

    _NUMPY["bf16"] = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    pass
_FROM_NUMPY: dict[Any, str] = {v: k for k, v in _NUMPY.items()}

_SIZES: dict[str, int] = {
    "f16": 2, "bf16": 2, "f32": 4, "f64": 8, "i8": 1, "i16": 2, "i32": 4, "i64": 8, "u8": 1, "bool": 1,
}

DTypeLike = Union[str, type, np.dtype, int]


def dtype_name(dt: Any) -> str:
    """The kiln name of ``dt``: a kiln name, a wire number, or anything ``np.dtype`` accepts.

    Python's ``float``/``int``/``bool`` give ``f64``/``i64``/``bool`` as in NumPy. Raises TypeError
    for a dtype kiln does not support (complex, unsigned wider than 8 bits, strings...).
    """
    if isinstance(dt, str) and dt in _WIRE:
        return dt
    if isinstance(dt, str) and dt == "bfloat16":
        return "bf16"
    if isinstance(dt, int) and not isinstance(dt, bool) and dt in _FROM_WIRE:
        return _FROM_WIRE[dt]
    try:
        npdt = np.dtype(dt)
    except TypeError as e:
        raise TypeError(f"not a dtype: {dt!r}") from e
    name = _FROM_NUMPY.get(npdt)
    if name is None:
        raise TypeError(f"kiln does not support dtype {npdt} (supported: {', '.join(DTYPES)})")
    return name


def to_numpy(dt: DTypeLike) -> np.dtype:
    """The NumPy dtype for a kiln dtype; TypeError for bf16 when ml_dtypes is not installed."""
    name = dtype_name(dt)
    try:
        return _NUMPY[name]
    except KeyError:
        raise TypeError(f"{name} has no NumPy equivalent here (install ml_dtypes)") from None


def to_wire(dt: DTypeLike) -> int:
    """The kiln.v1.DType number of ``dt``."""
    return _WIRE[dtype_name(dt)]


def from_wire(number: int) -> str:
    """The kiln name of a kiln.v1.DType number; ValueError for 0 or an unknown number."""
    try:
        return _FROM_WIRE[number]
    except KeyError:
        raise ValueError(f"unknown wire dtype {number}") from None


def itemsize(dt: DTypeLike) -> int:
    """Bytes per element."""
    return _SIZES[dtype_name(dt)]


def is_float(dt: DTypeLike) -> bool:
    return dtype_name(dt) in ("f16", "bf16", "f32", "f64")


def is_integer(dt: DTypeLike) -> bool:
    """Signed or unsigned integers; not bool."""
    return dtype_name(dt) in ("i8", "i16", "i32", "i64", "u8")


def is_bool(dt: DTypeLike) -> bool:
    return dtype_name(dt) == "bool"


def is_signed(dt: DTypeLike) -> bool:
    """Floats and signed integers."""
    return dtype_name(dt) in ("f16", "bf16", "f32", "f64", "i8", "i16", "i32", "i64")


def _bf16_as_f16(name: str) -> str:
    return "f16" if name == "bf16" else name


def promote(a: DTypeLike, b: DTypeLike) -> str:
    """The result type of a binary arithmetic op on two tensors (``np.result_type`` on arrays).

    bf16 promotes like f16, and f16 with bf16 gives f32, as the daemon does.
    """
    a, b = dtype_name(a), dtype_name(b)
    if a == b:
        return a
    if {a, b} == {"f16", "bf16"}:
        return "f32"
    if "bf16" in (a, b):
        r = dtype_name(np.result_type(_NUMPY[_bf16_as_f16(a)], _NUMPY[_bf16_as_f16(b)]))
        return "bf16" if r == "f16" else r
    return dtype_name(np.result_type(_NUMPY[a], _NUMPY[b]))


def promote_all(dtypes: list[str]) -> str:
    """:func:`promote` folded over a non-empty list."""
    out = dtypes[0]
    for d in dtypes[1:]:
        out = promote(out, d)
    return out


def float_result(dt: DTypeLike) -> str:
    """The type a float-only op (exp, div, mean...) computes in for input type ``dt``.

    Floats keep their type; bool, i8 and u8 give f16; i16 gives f32; i32 and i64 give f64.
    """
    name = dtype_name(dt)
    if is_float(name):
        return name
    return {"bool": "f16", "i8": "f16", "u8": "f16", "i16": "f32", "i32": "f64", "i64": "f64"}[name]


def sum_result(dt: DTypeLike) -> str:
    """The accumulator and result type of sum/prod: integers and bool give i64, floats keep."""
    name = dtype_name(dt)
    return name if is_float(name) else "i64"


def scalar_kind(value: Any) -> Optional[str]:
    """``"bool"``, ``"int"`` or ``"float"`` for a Python scalar; None for anything else.

    NumPy scalars (``np.float32(1)``) are not Python scalars: they carry a dtype and promote like
    0-d arrays.
    """
    if isinstance(value, np.generic):  # np.float64 subclasses float, yet is strongly typed
        return None
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    return None


def default_scalar_dtype(value: Any) -> str:
    """The dtype NumPy gives a Python scalar on its own: bool, i64 or f64."""
    kind = scalar_kind(value)
    if kind is None:
        raise TypeError(f"not a Python scalar: {value!r}")
    return {"bool": "bool", "int": "i64", "float": "f64"}[kind]


def weak_scalar_dtype(value: Any, other: Optional[DTypeLike]) -> str:
    """The dtype a Python scalar takes next to a tensor of dtype ``other`` (NumPy 2, NEP 50).

    The scalar takes the tensor's dtype when its kind allows: a bool always does; an int does
    with an integer or float tensor (with a bool tensor it is i64); a float does with a float
    tensor (with an integer or bool tensor it is f64). ``other=None`` gives the scalar's
    default dtype. Raises OverflowError when an int does not fit the integer dtype it would
    take, as NumPy does.
    """
    kind = scalar_kind(value)
    if kind is None:
        raise TypeError(f"not a Python scalar: {value!r}")
    if other is None:
        return default_scalar_dtype(value)
    o = dtype_name(other)
    if kind == "bool":
        return o
    if kind == "int":
        if is_bool(o):
            return "i64"
        if is_integer(o):
            info = np.iinfo(_NUMPY[o])
            if not info.min <= value <= info.max:
                raise OverflowError(f"Python integer {value} out of bounds for {o}")
        return o
    return o if is_float(o) else "f64"
