"""Work done once per key in a process: loaded kernels, downloads."""

from __future__ import annotations

import threading
from typing import Any, Callable, Hashable


class KeyedLocks:
    """One lock per key, made on first request: work on different keys runs concurrently,
    work on one key one caller at a time."""

    def __init__(self) -> None:
        self._locks: dict[Hashable, threading.Lock] = {}
        self._guard = threading.Lock()

    def __call__(self, key: Hashable) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def forget(self, key: Hashable) -> None:
        with self._guard:
            self._locks.pop(key, None)


class OncePerKey:
    """A map whose values are made on first request, once per key: later callers of a key wait
    for the first caller's value, and different keys are made concurrently (a graph's parts
    load their kernels from several threads; the file reads, digests and driver calls release
    the GIL). A maker that raises leaves the key unmade, for the next caller to try."""

    def __init__(self) -> None:
        self._values: dict[Hashable, Any] = {}
        self._locks = KeyedLocks()

    def get(self, key: Hashable, make: Callable[[], Any]) -> Any:
        value = self._values.get(key)
        if value is not None:
            return value
        with self._locks(key):
            value = self._values.get(key)
            if value is None:
                value = make()
                self._values[key] = value
                self._locks.forget(key)
        return value

    def peek(self, key: Hashable) -> Any:
        """The value of ``key`` when made, else None (nothing is made)."""
        return self._values.get(key)

    def __len__(self) -> int:
        return len(self._values)
