"""NumPy functions the tests trace, with inputs to try them on.

``kmeans`` and ``numpy_fn`` are the acceptance examples, verbatim. ``CASES`` is a catalogue of
smaller functions covering the traced NumPy surface; each comes with a function making its
inputs from a ``np.random.Generator``.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np


def kmeans(X, means):
    return np.argmin(np.linalg.norm(X - means[:, None], axis=2), axis=0)


def numpy_fn(X, Y):
    X_mean, X_std = X.mean(axis=0), X.std(axis=0)
    Y_mean, Y_std = Y.mean(axis=0), Y.std(axis=0)
    X_std[X_std == 0] = 1
    Y_std[Y_std == 0] = 1
    Xn = (X - X_mean) / X_std
    Yn = (Y - Y_mean) / Y_std
    r = np.sum(Xn[:, :, None] * Yn[:, None, :], axis=(-2, -1))
    r = np.exp(np.clip(r, -1, 1))
    return r + 0.001 * np.sum(Xn ** 2 + Yn ** 2, axis=1)


def kmeans_inputs(rng: np.random.Generator, n: int = 1000, k: int = 5, dtype: Any = np.float64) -> tuple[np.ndarray, np.ndarray]:
    X = rng.standard_normal((n, 2)).astype(dtype)
    means = rng.standard_normal((k, 2)).astype(dtype)
    return X, means


def numpy_fn_inputs(rng: np.random.Generator, n: int = 200, d: int = 6) -> tuple[np.ndarray, np.ndarray]:
    X = rng.standard_normal((n, d))
    Y = rng.standard_normal((n, d)) * 3 + 1
    X[:, 2] = 5.0  # a constant column: its std is 0 and the masked assignment kicks in
    Y[:, 0] = -1.0
    return X, Y


def f(shape: tuple[int, ...], dtype: Any = np.float64) -> Callable[[np.random.Generator], np.ndarray]:
    def make(rng: np.random.Generator) -> np.ndarray:
        if np.dtype(dtype).kind == "f":
            return rng.standard_normal(shape).astype(dtype)
        if np.dtype(dtype).kind == "b":
            return rng.random(shape) < 0.5
        return rng.integers(-20, 20, shape).astype(dtype)

    return make


def pos(shape: tuple[int, ...], dtype: Any = np.float64) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda rng: (rng.random(shape) + 0.1).astype(dtype)


def _setitem_slices(x):
    y = x * 2
    y[1:3, ::1] = 0.5
    y[0] = y[-1] + 1
    y[..., -1] = -7
    return y


def _inplace(x, y):
    z = x + 0
    z += y
    z *= 2
    z -= 1
    return z


def _masked_rows(x):
    y = x.copy()
    y[x[:, 0] > 0] = 0
    return y


def _tuple_out(x, y):
    return x + y, (x * y).sum(axis=1), {"m": np.maximum(x, y)}


def _norms(x):
    return (
        np.linalg.norm(x),
        np.linalg.norm(x, axis=1),
        np.linalg.norm(x, ord=1, axis=0),
        np.linalg.norm(x, ord=np.inf, axis=1, keepdims=True),
        np.linalg.norm(x, ord=3, axis=1),
        np.linalg.norm(x, ord="fro", axis=(0, 1)),
        np.linalg.norm(x, ord=1, axis=(0, 1)),
    )


# (name, function, input makers)
CASES: list[tuple[str, Callable[..., Any], list[Callable[[np.random.Generator], np.ndarray]]]] = [
    ("broadcast_arith", lambda x, y: (x + y) * (x - y) / (y * y + 1), [f((4, 5)), f((5,))]),
    ("scalar_weak_f32", lambda x: x * 2 + 0.5 - 1 / (x * x + 1), [f((3, 7), np.float32)]),
    ("int_plus_float_scalar", lambda x: x + 0.5, [f((6,), np.int32)]),
    ("int_arith", lambda x, y: (x * y + 3) // 4 + (x % 5) - abs(y), [f((8,), np.int64), f((8,), np.int64)]),
    ("int_true_divide", lambda x: x / 3, [f((5,), np.int32)]),
    ("unary_math", lambda x: np.exp(-x) + np.log1p(np.abs(x)) + np.sin(x) * np.cos(x) + np.tanh(x) - np.sqrt(np.abs(x)), [f((10,))]),
    ("log_family", lambda x: np.log(x) + np.log2(x) + np.log10(x) + np.exp2(x) - np.expm1(x), [pos((9,))]),
    ("rounding", lambda x: np.floor(x * 3) + np.ceil(x) + np.rint(x * 2.5) + np.trunc(x * 4) + np.round(x, 2), [f((12,))]),
    ("compare_where", lambda x, y: np.where(x > y, x, y * 2) + np.where(x <= 0, 1.0, 0.0), [f((4, 4)), f((4, 4))]),
    ("logical", lambda x, y: np.logical_and(x > 0, y < 0) | ~(x > 1) ^ (y == 0), [f((6,)), f((6,))]),
    ("maximum_minimum", lambda x, y: np.maximum(x, 0) + np.minimum(x, y) + np.fmax(x, y), [f((5, 3)), f((3,))]),
    ("power", lambda x: x ** 2 + x ** 3 + np.power(np.abs(x), 0.5) + 2.0 ** x, [f((7,))]),
    ("square_neg", lambda x: -np.square(x) + (+x), [f((5,))]),
    ("reductions", lambda x: (x.sum(), x.sum(axis=0), x.mean(axis=1, keepdims=True), x.max(axis=-1), np.min(x, axis=0), x.prod(axis=1)), [f((4, 6))]),
    ("var_std", lambda x: (x.var(), x.std(axis=0, ddof=1), np.var(x, axis=1, keepdims=True), np.std(x)), [f((5, 7))]),
    ("int_reductions", lambda x: (x.sum(axis=0), x.mean(), np.std(x, axis=1), x.max()), [f((3, 4), np.int32)]),
    ("bool_reductions", lambda x: (np.any(x > 1, axis=0), np.all(x > -3), (x > 0).sum(axis=1)), [f((5, 4))]),
    ("argminmax", lambda x: (np.argmin(x, axis=1), np.argmax(x), x.argmax(axis=0), np.argmin(x, axis=0, keepdims=True)), [f((6, 5))]),
    ("clip_variants", lambda x: (np.clip(x, -0.5, 0.5), x.clip(min=0), np.clip(x, None, 1), np.clip(x, x * 0.5, 1.0)), [f((8,))]),
    ("clip_int_float_bounds", lambda x: np.clip(x, 0.5, 10.5), [f((8,), np.int64)]),
    ("indexing", lambda x: (x[1:, ::2], x[::-1], x[-1], x[:, None, 2:4], x[..., 0], x[2:1], x[1, 3]), [f((5, 6))]),
    ("indexing_3d", lambda x: x[None, 1:3, ..., ::-2] * x[0, :, None, 1], [f((4, 3, 5))]),
    ("reshape_transpose", lambda x: (x.reshape(3, 8), x.reshape(-1), x.T, x.transpose(1, 0, 2), np.transpose(x), x.swapaxes(0, 2), np.moveaxis(x, 0, -1)), [f((2, 3, 4))]),
    ("squeeze_expand", lambda x: (np.squeeze(x), x.squeeze(axis=0), np.expand_dims(x, (0, 3)), np.broadcast_to(x, (3, 1, 4, 1))), [f((1, 4, 1))]),
    ("concat_stack", lambda x, y: (np.concatenate([x, y], axis=0), np.concatenate((x, y), axis=None), np.stack([x, y], axis=1), np.vstack([x, y]), np.hstack([x, y])), [f((2, 3)), f((2, 3))]),
    ("astype", lambda x: (x.astype(np.float32) * 2, x.astype(np.int32), (x > 0).astype(np.float64), x.astype(bool)), [f((7,))]),
    ("numpy_scalars_are_strong", lambda x: (x * np.float64(0.5), x + np.int8(3), x ** np.float32(2)), [f((4,), np.float32)]),
    ("small_int_dtypes", lambda x, y: (x + y - 3, x * y, y.sum(), np.abs(y) // 3, y % 7), [f((8,), np.uint8), f((8,), np.int8)]),
    ("bool_arithmetic", lambda x, y: (x + y, x * y, np.maximum(x, y), ~x, x.sum(), np.mean(x)), [f((6,), bool), f((6,), bool)]),
    ("mixed_dtypes", lambda x, y: x * y + (x > 0), [f((4,), np.float32), f((4,), np.int16)]),
    ("constants_captured", lambda x: x * np.arange(4.0) + np.zeros((3, 4)) + np.float32(2), [f((3, 4), np.float32)]),
    ("norms", _norms, [f((4, 5))]),
    ("setitem_slices", _setitem_slices, [f((4, 5))]),
    ("inplace_ops", _inplace, [f((3, 3)), f((3,))]),
    ("masked_rows", _masked_rows, [f((6, 3))]),
    ("tuple_dict_out", _tuple_out, [f((3, 2)), f((3, 2))]),
    ("like_functions", lambda x: np.zeros_like(x) + np.ones_like(x, dtype=np.int32) + np.full_like(x, 3.5), [f((2, 3))]),
    ("isfinite_isnan", lambda x: (np.isfinite(x / (x > 0)), np.isnan(np.sqrt(x)), np.isinf(1 / (x * 0))), [f((6,))]),
    ("ufunc_reduce_outer", lambda x, y: (np.add.reduce(x), np.maximum.reduce(x, axis=1), np.subtract.outer(y, y)), [f((3, 4)), f((5,))]),
    ("isclose_flip", lambda x, y: (np.isclose(x, x + 1e-9), np.flip(y, axis=0), np.flip(y)), [f((4,)), f((3, 2))]),
    ("arctan2_hypot_logaddexp", lambda x, y: np.arctan2(x, y) + np.hypot(x, y) + np.logaddexp(x, y), [f((6,)), f((6,))]),
    ("zero_d", lambda x: (x.sum() * 2 + 1, x[0, 0]), [f((2, 2))]),
    ("len_and_shape", lambda x: x.reshape(len(x), -1).sum(axis=1) / x.shape[1], [f((3, 2, 2))]),
]
