"""Exceptions raised by the kiln client."""

from __future__ import annotations

from typing import Optional


class KilnError(Exception):
    """Base class of every error the kiln client raises on purpose."""


class UnsupportedError(KilnError, TypeError):
    """A traced function did something kiln cannot express as a graph.

    ``function`` names what was called (``"numpy.cumsum"``, ``"ndarray.__iter__"``...). It is a
    TypeError too, so code that guards NumPy calls with ``except TypeError`` keeps working.
    """

    def __init__(self, function: str, reason: str = "") -> None:
        self.function = function
        self.reason = reason
        msg = f"kiln.jit does not support {function}"
        if reason:
            msg += f": {reason}"
        super().__init__(msg)


class RpcError(KilnError):
    """A call to the daemon failed.

    ``code`` is the gRPC status code name (``"INVALID_ARGUMENT"``, ``"UNAVAILABLE"``...) and
    ``details`` the daemon's message, which names the node and the rule for a bad graph and
    carries the compiler log for an INTERNAL compile failure.
    """

    def __init__(self, method: str, code: str, details: str) -> None:
        self.method = method
        self.code = code
        self.details = details
        super().__init__(f"{method}: {code}: {details}")

    @property
    def unreachable(self) -> bool:
        """Whether the daemon could not be reached or gave no answer in time. Not when it
        answered with a limit of its own: a host compiler past its time limit is
        DEADLINE_EXCEEDED too, with the daemon's message, and the daemon is fine."""
        if self.code == "UNAVAILABLE":
            return True
        return self.code == "DEADLINE_EXCEEDED" and self.details.strip().lower() in ("", "deadline exceeded")


class CompileError(RpcError):
    """The daemon refused or failed to compile a graph (INVALID_ARGUMENT, INTERNAL...)."""


class NotFoundError(RpcError, KeyError):
    """A handle or digest is not (or no longer) in the daemon's cache."""

    def __str__(self) -> str:  # KeyError would quote the message
        return Exception.__str__(self)


class ArtifactError(KilnError):
    """An artifact is corrupt (digest mismatch), truncated, or cannot be loaded."""

    def __init__(self, message: str, digest: Optional[str] = None) -> None:
        self.digest = digest
        super().__init__(message)


class KilnFallbackWarning(UserWarning):
    """kiln could not compile or run something, which then ran without it: a torch.compile
    part in torch, or a ``kiln.jit(fallback=True)`` function in NumPy."""


class VerificationError(ArtifactError):
    """A result or artifact failed the trust check (kiln.trust): unsigned where signatures are
    required, signed by an untrusted key, a signature that does not match the result, or
    artifact bytes (fetched, or in the local cache) that do not match the signed digest.
    Nothing of it was loaded."""

    def __init__(self, message: str, handle: Optional[str] = None, digest: Optional[str] = None) -> None:
        self.handle = handle
        super().__init__(message, digest)
