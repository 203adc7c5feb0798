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
import struct
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterable, Optional, Union

from .errors import VerificationError

ALGORITHM = "ed25519"
_DOMAIN = b"kiln-result-signature-v1\n"
_I64 = struct.Struct("<q")


def _int(out: list[bytes], v: int) -> None:
    out.append(_I64.pack(v))


def _str(out: list[bytes], s: Union[str, bytes]) -> None:
    b = s.encode() if isinstance(s, str) else s
    out.append(_I64.pack(len(b)))
    out.append(b)


def _ints(out: list[bytes], values: Iterable[int]) -> None:
    vals = list(values)
    out.append(_I64.pack(len(vals)))
    if vals:
        out.append(struct.pack(f"<{len(vals)}q", *vals))


def canonical_result_bytes(handle: str, result: Any) -> bytes:
    """The bytes a result's signature covers; the same encoding as kilnd's
    ``auth::CanonicalResultBytes``."""
    out: list[bytes] = [_DOMAIN]
    _str(out, handle)
    t = result.target
    which = t.WhichOneof("kind")
    if which == "cpu":
        _int(out, 1)
        _str(out, t.cpu.isa)
        _int(out, len(t.cpu.features))
        for f in t.cpu.features:
            _str(out, f)
    elif which == "cuda":
        _int(out, 2)
        _int(out, t.cuda.sm)
    else:
        _int(out, 0)
    _int(out, len(result.artifacts))
    for a in result.artifacts:
        _int(out, a.kind)
        _str(out, a.digest)
        _int(out, a.size)
    plan = result.plan
    _int(out, len(plan.buffers))
    for b in plan.buffers:
        _int(out, b.role)
        _int(out, b.index)
        _int(out, b.dtype)
        _ints(out, b.shape)
        _int(out, b.bytes)
        _int(out, b.offset)
    _int(out, len(plan.steps))
    for s in plan.steps:
        _str(out, s.kernel)
        _ints(out, s.grid)
        _ints(out, s.block)
        _int(out, s.shared_bytes)
        _ints(out, s.args)
    _int(out, plan.workspace_bytes)
    _int(out, plan.abi_version)
    if plan.symbols:  # symbolic plans only (wire/FORMAT.md)
        def expr(e: Any) -> None:
            _int(out, len(e.terms))
            for t in e.terms:
                _int(out, t.coeff)
                _ints(out, t.exponents)

        _int(out, len(plan.symbols))
        for sym in plan.symbols:
            _str(out, sym.name)
            _int(out, sym.input)
            _int(out, sym.axis)
        for b in plan.buffers:
            _int(out, len(b.shape_exprs))
            for e in b.shape_exprs:
                expr(e)
            expr(b.bytes_expr)
        if any(s.grid_per_block > 0 for s in plan.steps):  # symbolic CUDA plans only
            for s in plan.steps:
                expr(s.grid_work)
                _int(out, s.grid_per_block)
            expr(plan.index_bound)
            if any(s.guard_min > 0 or s.guard_max > 0 for s in plan.steps):  # launch-time choices
                for s in plan.steps:
                    expr(s.guard)
                    _int(out, s.guard_min)
                    _int(out, s.guard_max)
    _str(out, result.key_debug)
    _int(out, len(result.key_fields))
    for f in result.key_fields:
        _str(out, f.label)
        _str(out, f.value)
    return b"".join(out)


def key_id_of(raw_public_key: bytes) -> str:
    """First 16 hex digits of the SHA-256 of the raw 32-byte Ed25519 public key."""
    return hashlib.sha256(raw_public_key).hexdigest()[:16]


def _load_public_key(path: Union[str, Path]) -> Any:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        key = serialization.load_pem_public_key(Path(path).expanduser().read_bytes())
    except (OSError, ValueError) as e:
        raise ValueError(f"trusted key {path}: not a readable PEM public key ({e})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"trusted key {path}: not an Ed25519 public key")
    return key


def _env_bool(name: str) -> Optional[bool]:
    v = os.environ.get(name, "").strip().lower()
    if not v:
        return None
    return v in ("1", "true", "yes", "on")


class TrustPolicy:
    """Trusted Ed25519 public keys and the unsigned-result switch. Thread-safe.

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
        self._keys: dict[str, Any] = {}
        for p in self.key_paths:
            # Imported only with keys to load: a client that trusts no key needs no cryptography.
            from cryptography.hazmat.primitives import serialization

            key = _load_public_key(p)
            raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
            self._keys[key_id_of(raw)] = key
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
        memo = hashlib.sha256(handle.encode() + b"\0" + result.SerializeToString(deterministic=True)).digest()
        with self._memo_lock:
            if memo in self._memo:
                self._memo.move_to_end(memo)
                return
        self._verify(handle, result)
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

    def _verify(self, handle: str, result: Any) -> None:
        short = handle[:12]
        if not result.HasField("signature") or not result.signature.signature:
            if self.allow_unsigned:
                return
            raise VerificationError(f"the result for {short} is not signed, and this client trusts only "
                                    f"signed results (keys {', '.join(self.key_ids)})", handle)
        sig = result.signature
        if sig.algorithm != ALGORITHM:
            raise VerificationError(f"the result for {short} is signed with {sig.algorithm[:32]!r}, not {ALGORITHM}", handle)
        key = self._keys.get(sig.key_id)
        if key is None:
            raise VerificationError(f"the result for {short} is signed by key {sig.key_id[:32]!r}, which is not trusted "
                                    f"(trusted: {', '.join(self.key_ids)})", handle)
        from cryptography.exceptions import InvalidSignature

        try:
            key.verify(bytes(sig.signature), canonical_result_bytes(handle, result))
        except InvalidSignature:
            raise VerificationError(f"the signature of the result for {short} (key {sig.key_id}) does not match "
                                    "its contents: refusing to load it", handle) from None


__all__ = ["TrustPolicy", "canonical_result_bytes", "key_id_of", "ALGORITHM"]
