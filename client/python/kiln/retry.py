"""The client retry policy, shared with the C++ client (client/RETRY.md states it in full).

- UNAVAILABLE (nothing listens, the daemon restarts, its store is briefly down) is retried with
  exponential backoff and jitter for at most ``unavailable_timeout`` seconds (default 5), never
  past the call's deadline: a daemon that is down fails a call in seconds, not after the whole
  deadline, and one that comes back within that window is reached.
- RESOURCE_EXHAUSTED that the daemon marks as retryable (the trailer ``kiln-retry-after-ms``:
  its compile queue is full) is retried with backoff, waiting at least as long as the daemon
  asks, while the deadline allows. Unmarked RESOURCE_EXHAUSTED is a limit (a graph too large)
  and returns at once, as does every other code: retrying a bad graph only adds load.
- Attempt k waits ``initial_backoff * multiplier**(k-1)``, capped at ``max_backoff``, times a
  jitter factor drawn from [1 - jitter, 1 + jitter], so clients restarted together do not retry
  in step.

All Kiln RPCs are idempotent (Compile is get-or-compile), which is what makes retrying safe.
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Any, Callable, Optional, TypeVar

import grpc

#: Trailing metadata of a RESOURCE_EXHAUSTED worth retrying: milliseconds the daemon suggests.
RETRY_AFTER_TRAILER = "kiln-retry-after-ms"

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How a call is retried; see the module's documentation. Immutable."""

    initial_backoff: float = 0.1
    max_backoff: float = 2.0
    multiplier: float = 2.0
    jitter: float = 0.2
    #: Seconds UNAVAILABLE is retried, counted from the call's first attempt.
    unavailable_timeout: float = 5.0
    #: Retry RESOURCE_EXHAUSTED that carries the daemon's retry-after trailer.
    retry_overloaded: bool = True
    #: Attempts in all, whatever the code; 1 disables retrying.
    max_attempts: int = 1000

    def backoff(self, attempt: int) -> float:
        """The wait after failed attempt ``attempt`` (1-based), jitter included."""
        base = min(self.initial_backoff * self.multiplier ** (attempt - 1), self.max_backoff)
        return base * random.uniform(1 - self.jitter, 1 + self.jitter)


def retry_after(error: grpc.RpcError) -> Optional[float]:
    """Seconds the daemon asked to wait before retrying ``error``, or None when it did not mark
    the error as retryable."""
    try:
        trailers = error.trailing_metadata() or ()  # type: ignore[attr-defined]
    except Exception:  # not a call outcome
        return None
    for key, value in trailers:
        if key == RETRY_AFTER_TRAILER:
            try:
                return max(0.0, int(value) / 1000.0)
            except ValueError:
                return 0.0
    return None


def call_with_retries(attempt: Callable[[float], T], timeout: float, policy: RetryPolicy,
                      on_retry: Optional[Callable[[grpc.RpcError, float], Any]] = None) -> T:
    """Runs ``attempt(remaining_seconds)`` under ``policy`` until it returns, raises something
    the policy does not retry, or time runs out; then the last grpc.RpcError propagates.
    ``on_retry(error, wait)`` is told of each retry before its wait."""
    start = time.monotonic()
    deadline = start + timeout
    n = 0
    while True:
        n += 1
        try:
            return attempt(max(deadline - time.monotonic(), 0.001))
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            wait = policy.backoff(n)
            if code == grpc.StatusCode.UNAVAILABLE:
                limit = min(deadline, start + policy.unavailable_timeout)
            elif code == grpc.StatusCode.RESOURCE_EXHAUSTED and policy.retry_overloaded:
                hint = retry_after(e)
                if hint is None:
                    raise
                wait = max(wait, hint)
                limit = deadline
            else:
                raise
            if n >= policy.max_attempts or time.monotonic() + wait >= limit:
                raise
            if on_retry is not None:
                on_retry(e, wait)
            time.sleep(wait)
