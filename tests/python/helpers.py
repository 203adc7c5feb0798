"""Comparison helpers shared by the tests."""

from __future__ import annotations

import os
import subprocess
import sys
from types import ModuleType
from typing import Any

import numpy as np
import pytest


def kiln_cli(env: dict[str, str], *args: Any, check: bool = True) -> subprocess.CompletedProcess:
    """Runs ``python -m kiln ARGS`` with ``env``; raises with its output when ``check`` and it
    fails."""
    p = subprocess.run([sys.executable, "-m", "kiln", *map(str, args)], env=env, capture_output=True, text=True, timeout=600)
    if check and p.returncode != 0:
        raise AssertionError(f"kiln {' '.join(map(str, args))} exited {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def assert_same(got: Any, want: Any, rtol: float = 1e-6, atol: float = 1e-9, path: str = "result") -> None:
    """Asserts ``got`` has the structure, dtypes and (nearly) the values of ``want``.

    Arrays and NumPy scalars must agree in dtype and shape; floats within ``rtol``/``atol``
    (NaNs equal), everything else exactly.
    """
    if isinstance(want, (tuple, list)):
        assert type(got) is type(want), f"{path}: {type(got).__name__} vs {type(want).__name__}"
        assert len(got) == len(want), f"{path}: length {len(got)} vs {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, rtol, atol, f"{path}[{i}]")
        return
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), f"{path}: keys differ"
        for k in want:
            assert_same(got[k], want[k], rtol, atol, f"{path}.{k}")
        return
    if isinstance(want, (np.ndarray, np.generic)):
        assert isinstance(got, (np.ndarray, np.generic)), f"{path}: {type(got).__name__}, expected an array"
        assert isinstance(got, np.ndarray) == isinstance(want, np.ndarray), f"{path}: {type(got).__name__} vs {type(want).__name__}"
        assert got.dtype == want.dtype, f"{path}: dtype {got.dtype} vs {want.dtype}"
        assert got.shape == want.shape, f"{path}: shape {got.shape} vs {want.shape}"
        if want.dtype.kind in "fc":
            tol = rtol if want.dtype.itemsize >= 8 else max(rtol, 1e-5 if want.dtype.itemsize == 4 else 2e-3)
            np.testing.assert_allclose(got, want, rtol=tol, atol=atol, equal_nan=True, err_msg=path)
        else:
            np.testing.assert_array_equal(got, want, err_msg=path)
        return
    assert got == want, f"{path}: {got!r} vs {want!r}"


def assert_labels_match(labels: np.ndarray, X: np.ndarray, means: np.ndarray, want: np.ndarray) -> None:
    """k-means labels agree with NumPy's, except where two centres are equally near (within
    rounding), where either choice is right."""
    assert labels.dtype == want.dtype and labels.shape == want.shape
    diff = np.nonzero(labels != want)[0]
    if diff.size:
        dist = np.linalg.norm(X[diff][None, :, :] - means[:, None, :], axis=2)
        got_d = dist[labels[diff], np.arange(diff.size)]
        want_d = dist[want[diff], np.arange(diff.size)]
        np.testing.assert_allclose(got_d, want_d, rtol=1e-5, err_msg="labels differ beyond ties")


def import_torch() -> ModuleType:
    """PyTorch, which the suite needs (deploy/setup.sh installs it). Without it the calling
    test module fails, so that a run without torch cannot pass, unless KILN_SKIP_TORCH=1 asks
    to skip the torch tests instead (e.g. on a developer machine without torch)."""
    try:
        import torch

        return torch
    except ImportError as e:
        if os.environ.get("KILN_SKIP_TORCH") == "1":
            pytest.skip("PyTorch is not installed (KILN_SKIP_TORCH=1)", allow_module_level=True)
        raise ImportError("the kiln test suite needs PyTorch (deploy/setup.sh installs it); "
                          "set KILN_SKIP_TORCH=1 to skip the tests that use it") from e
