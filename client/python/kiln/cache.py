"""The local content-addressed artifact directory.

Layout under the root (``$KILN_CACHE_DIR``, else ``$XDG_CACHE_HOME/kiln``, else
``~/.cache/kiln``)::

    artifacts/<first two hex digits>/<sha256>   artifact bytes, named by their SHA-256
    handles/<handle>.json                       what this machine knows about a handle's graph
                                                (input names, dtypes, shapes, strides), written
                                                when a client compiles it, so a handle alone
                                                can be run

The artifact folder is the C++ client's (client/cpp/artifact_cache.h), root and layout alike,
so a machine running both keeps each artifact once; both write through a temporary file renamed
into place and hash a file before using it. Artifacts an older client left under
``cas/<xx>/<sha256>`` are moved into ``artifacts/`` the first time they are asked for.

Every file is written to a temporary name in the same folder and renamed into place, so a
reader never sees a partial artifact, and several processes may fill the cache at once. An
artifact's digest is verified before first use in a process; a file that does not match its
name is deleted and counts as absent.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterable, Optional, Union

_DIGEST_RE = re.compile(r"[0-9a-f]{64}")


def default_cache_dir() -> Path:
    """``$KILN_CACHE_DIR``, else ``$XDG_CACHE_HOME/kiln``, else ``~/.cache/kiln`` (the C++
    client's order)."""
    env = os.environ.get("KILN_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "kiln"
    return Path.home() / ".cache" / "kiln"


def check_digest(digest: str) -> str:
    """Returns ``digest`` when it is 64 lowercase hex digits; ValueError otherwise."""
    if not isinstance(digest, str) or not _DIGEST_RE.fullmatch(digest):
        raise ValueError(f"not a SHA-256 digest (64 lowercase hex digits): {digest!r}")
    return digest


def sha256_file(path: Union[str, Path]) -> str:
    """Lowercase hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def atomic_write(path: Path, data: bytes) -> None:
    """Writes ``data`` to ``path`` through a temporary file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise


def _unlink_quietly(path: Union[str, Path]) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class ArtifactCache:
    """A content-addressed folder of artifacts. Thread-safe; safe across processes."""

    def __init__(self, root: Optional[Union[str, Path]] = None) -> None:
        self.root = Path(root).expanduser() if root is not None else default_cache_dir()
        self._lock = threading.Lock()
        # digest -> (inode, size, mtime_ns) of the file whose bytes were verified.
        self._verified: dict[str, tuple[int, int, int]] = {}

    def path_for(self, digest: str) -> Path:
        """Where an artifact lives (whether or not it is there)."""
        check_digest(digest)
        return self.root / "artifacts" / digest[:2] / digest

    def get(self, digest: str) -> Optional[Path]:
        """The path of a present, verified artifact, or None.

        The bytes are hashed the first time a process asks (and again if the file changed);
        a file whose hash does not match is removed.
        """
        path = self.path_for(digest)
        try:
            st: Optional[os.stat_result] = path.stat()
        except FileNotFoundError:
            st = self._adopt_legacy(digest, path)
        if st is None:
            return None
        sig = (st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            if self._verified.get(digest) == sig:
                return path
        if sha256_file(path) != digest:
            _unlink_quietly(path)
            return None
        with self._lock:
            self._verified[digest] = sig
        return path

    def _adopt_legacy(self, digest: str, path: Path) -> Optional[os.stat_result]:
        """Moves an artifact an older client stored under ``cas/`` to ``path`` (verified by the
        caller like any file); None when there is none."""
        legacy = self.root / "cas" / digest[:2] / digest
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            os.replace(legacy, path)
            return path.stat()
        except OSError:
            return None

    def put_chunks(self, digest: str, chunks: Iterable[bytes], size: Optional[int] = None) -> Path:
        """Stores an artifact from a stream of byte chunks, verifying size and digest.

        Raises ValueError (leaving nothing behind) when the bytes do not hash to ``digest`` or
        their length is not ``size``.
        """
        path = self.path_for(digest)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        h = hashlib.sha256()
        n = 0
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    h.update(chunk)
                    f.write(chunk)
                    n += len(chunk)
            if size is not None and n != size:
                raise ValueError(f"artifact {digest}: got {n} bytes, expected {size}")
            if h.hexdigest() != digest:
                raise ValueError(f"artifact {digest}: the bytes hash to {h.hexdigest()}")
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            _unlink_quietly(tmp)
            raise
        st = path.stat()
        with self._lock:
            self._verified[digest] = (st.st_ino, st.st_size, st.st_mtime_ns)
        return path

    def put_bytes(self, data: bytes) -> tuple[str, Path]:
        """Stores bytes under their own digest; returns (digest, path)."""
        digest = hashlib.sha256(data).hexdigest()
        existing = self.get(digest)
        if existing is not None:
            return digest, existing
        return digest, self.put_chunks(digest, [data], len(data))

    # Handle manifests: small JSON notes about graphs compiled from this machine.

    def _manifest_path(self, handle: str) -> Path:
        check_digest(handle)
        return self.root / "handles" / f"{handle}.json"

    def save_manifest(self, handle: str, manifest: dict[str, Any]) -> None:
        """Remembers ``manifest`` for ``handle`` (best effort: errors are ignored). A handle
        whose manifest is there already keeps it: the handle fixes the graph's dtypes, shapes
        and strides (only input names could differ), and a warm start looks up every part of a
        model, where reading each manifest back to compare cost a third of a cache hit."""
        try:
            path = self._manifest_path(handle)
            if path.is_file():
                return
            atomic_write(path, json.dumps(manifest, sort_keys=True).encode())
        except (OSError, ValueError):
            pass

    def load_manifest(self, handle: str) -> Optional[dict[str, Any]]:
        """The manifest saved for ``handle``, or None."""
        try:
            return json.loads(self._manifest_path(handle).read_text())
        except (OSError, ValueError):
            return None
