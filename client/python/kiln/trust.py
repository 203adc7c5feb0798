"""Which results this client accepts: kilnd's Ed25519 signatures, checked before any code loads.

kilnd started with ``--signing-key`` signs every action result it produces. The signature covers
a canonical byte encoding (wire/FORMAT.md in the repository) of the handle, the target,
every artifact's kind, digest and size, the launch plan and the printed key; so once it checks
out, an artifact whose bytes hash to the signed digest is exactly what kilnd built.

:class:`TrustPolicy` holds the trusted public keys (PEM files: ``trusted_keys=`` or
``$KILN_TRUSTED_KEYS``, comma-separated; several at once, for key rotation) and whether
unsigned results are accepted (``allow_unsigned=`` or ``$KILN_ALLOW_UNSIGNED``). The default:
with no key configured, unsigned results are accepted (a local single-user setup), and with keys
configured, every result must carry a valid signature by one of them.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterable, Optional, Union

from . import core
from .errors import VerificationError

ALGORITHM = "ed25519"


def canonical_result_bytes(handle: str, result: Any) -> bytes:
    """The bytes a result's signature covers: computed by the native core from the result's
    deterministic serialization, by the same code as kilnd's ``wire::CanonicalResultBytes``."""
    return core.result_signed_bytes(handle, result.SerializeToString(deterministic=True))


def _load_public_key(trust: "core.Trust", path: Union[str, Path]) -> str:
    """Adds the PEM Ed25519 public key in ``path`` to ``trust``; its key id."""
    outcome, said = trust.add_key_file(str(Path(path).expanduser()))
    if outcome == core.TRUST_KEY_NOT_ED25519:
        raise ValueError(f"trusted key {path}: not an Ed25519 public key")
    if outcome != core.TRUST_OK:
        raise ValueError(f"trusted key {path}: not a readable PEM public key ({said})")
    return said


def _env_bool(name: str) -> Optional[bool]:
    v = os.environ.get(name, "").strip().lower()
    if not v:
        return None
    return v in ("1", "true", "yes", "on")


class TrustPolicy:
    """Trusted Ed25519 public keys and the unsigned-result switch. Thread-safe.

    The keys are read and results checked by the native core (:class:`kiln.core.Trust`), the
    code kilnd and the C++ client run: it decodes the record's deterministic serialization, so
    what it checks is this very record.

    A hot handle arrives again and again with the same record: records that verified are
    remembered by the SHA-256 of (handle, serialized record), so a repeat costs one
    serialization and one hash instead of the canonical encoding and an Ed25519 verification.
    Equal serialized bytes are an equal record, hence equal signed bytes: the shortcut accepts
    nothing the full check would refuse.
    """

    MEMO_ENTRIES = 4096

    def __init__(self, trusted_keys: Optional[Iterable[Union[str, Path]]] = None,
                 allow_unsigned: Optional[bool] = None) -> None:
        if trusted_keys is None:
            trusted_keys = [p for p in os.environ.get("KILN_TRUSTED_KEYS", "").split(",") if p.strip()]
        self.key_paths = [str(p).strip() for p in trusted_keys]
        self._keys: set[str] = set()
        # The core holds the keys; with none to load, nothing is checked and it is not needed.
        self._trust: Optional[core.Trust] = None
        if self.key_paths:
            trust = core.Trust()
            for p in self.key_paths:
                self._keys.add(_load_public_key(trust, p))
            self._trust = trust
        if allow_unsigned is None:
            allow_unsigned = _env_bool("KILN_ALLOW_UNSIGNED")
        self.allow_unsigned = (not self._keys) if allow_unsigned is None else bool(allow_unsigned)
        if not self._keys and not self.allow_unsigned:
            raise ValueError("refusing unsigned results needs at least one trusted key (KILN_TRUSTED_KEYS)")
        self._memo: OrderedDict[bytes, None] = OrderedDict()
        self._memo_lock = threading.Lock()

    @property
    def key_ids(self) -> list[str]:
        return sorted(self._keys)

    @property
    def verifying(self) -> bool:
        """Whether signatures are checked at all (some key is configured)."""
        return bool(self._keys)

    def check(self, handle: str, result: Any) -> None:
        """Returns when ``result`` (a kiln.v1.ActionResult for ``handle``) may be used; raises
        :class:`kiln.errors.VerificationError` otherwise."""
        if not self._keys:
            return
        serialized = result.SerializeToString(deterministic=True)
        memo = hashlib.sha256(handle.encode() + b"\0" + serialized).digest()
        with self._memo_lock:
            if memo in self._memo:
                self._memo.move_to_end(memo)
                return
        self._verify(handle, result, serialized)
        with self._memo_lock:
            self._memo[memo] = None
            if len(self._memo) > self.MEMO_ENTRIES:
                self._memo.popitem(last=False)

    def vouched(self, result: Any) -> bool:
        """Whether ``result``, read back from where this client kept it after :meth:`check`
        passed, may be used without verifying its signature again: when no key is trusted, or
        when it is signed by a key that is still trusted (a key taken out of the trusted set
        revokes what it signed). Says nothing about bytes from elsewhere."""
        if not self._keys:
            return True
        sig = result.signature if result.HasField("signature") else None
        return sig is not None and sig.algorithm == ALGORITHM and sig.key_id in self._keys

    def _verify(self, handle: str, result: Any, serialized: Optional[bytes] = None) -> None:
        """Checks ``result`` in full (the core's encoding and Ed25519 check); ``serialized`` is
        its deterministic serialization when the caller has it already."""
        trust = self._trust or core.Trust()  # no key: what is signed is not trusted here
        if serialized is None:
            serialized = result.SerializeToString(deterministic=True)
        outcome = trust.verify(handle, serialized)
        if outcome == core.TRUST_OK:
            return
        short = handle[:12]
        sig = result.signature
        if outcome == core.TRUST_UNSIGNED:
            if self.allow_unsigned:
                return
            raise VerificationError(f"the result for {short} is not signed, and this client trusts only "
                                    f"signed results (keys {', '.join(self.key_ids)})", handle)
        if outcome == core.TRUST_OTHER_ALGORITHM:
            raise VerificationError(f"the result for {short} is signed with {sig.algorithm[:32]!r}, not {ALGORITHM}", handle)
        if outcome == core.TRUST_UNTRUSTED_KEY:
            raise VerificationError(f"the result for {short} is signed by key {sig.key_id[:32]!r}, which is not trusted "
                                    f"(trusted: {', '.join(self.key_ids)})", handle)
        if outcome == core.TRUST_MISMATCH:
            raise VerificationError(f"the signature of the result for {short} (key {sig.key_id}) does not match "
                                    "its contents: refusing to load it", handle)
        # A serialization the core cannot read: never protobuf's own, so a bug worth naming.
        raise VerificationError(f"the result for {short} could not be checked: {core.last_error()}", handle)


__all__ = ["TrustPolicy", "canonical_result_bytes", "ALGORITHM"]
