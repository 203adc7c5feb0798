"""Sealed mode: after :func:`seal`, every graph that is not rebuilt from a program record is a
*sealed miss*, counted, reported and, with ``raise_on_miss``, refused (:class:`SealedError`).
"""

from __future__ import annotations

import os
import warnings

from ..errors import KilnError, KilnFallbackWarning
from .counters import bump


class SealedError(KilnError):
    """A graph had to be compiled while kiln.torch was sealed with ``raise_on_miss``."""


_SEALED: dict[str, bool] = {"on": os.environ.get("KILN_SEALED", "0") not in ("", "0"),
                            "raise": os.environ.get("KILN_SEALED", "0") == "raise"}


def seal(raise_on_miss: bool = False) -> None:
    """From now on every graph that is not rebuilt from a program record (a new model, shape,
    dtype, option, or a record kilnd lost) is a *sealed miss*: counted in
    ``kiln.torch.stats()["sealed_misses"]``, reported in one warning with its reason, and, with
    ``raise_on_miss``, raised as :class:`SealedError` instead of compiled. A deployment warms up
    (or prewarms its cluster), seals, and so proves it never compiles in production.
    ``$KILN_SEALED=1`` seals from the start, ``$KILN_SEALED=raise`` with ``raise_on_miss``."""
    _SEALED["on"], _SEALED["raise"] = True, bool(raise_on_miss)


def sealed() -> bool:
    """Whether misses are being counted (:func:`seal`)."""
    return _SEALED["on"]


def unseal() -> None:
    _SEALED["on"] = _SEALED["raise"] = False


def check_sealed(reason: str) -> None:
    """Counts (and reports, or raises) a sealed miss for ``reason`` when sealed."""
    if not _SEALED["on"]:
        return
    bump(sealed_misses=1)
    if _SEALED["raise"]:
        raise SealedError(f"kiln.torch is sealed: {reason}")
    warnings.warn(f"kiln: sealed miss: {reason}; compiling it", KilnFallbackWarning, stacklevel=3)


__all__ = ["SealedError", "check_sealed", "seal", "unseal"]
