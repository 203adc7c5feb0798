"""The local content-addressed artifact directory.

Under the root (``$KILN_CACHE_DIR``, else ``$XDG_CACHE_HOME/kiln``, else ``~/.cache/kiln``)::

    artifacts/...             artifact bytes, named by their SHA-256: the core's store, whose
                              layout client/core/store.h states (ArtifactCache.path_for asks it)
    handles/<handle>.json     what this machine knows about a handle's graph (input names,
                              dtypes, shapes, strides), written when a client compiles it, so a
                              handle alone can be run
    answers/<xx>/<name>       kilnd's answers to requests made from this machine, by request
                              key and daemon address (:meth:`ArtifactCache.load_answer`)

The artifact and answers folders are kept by the native client core (``client/core/store.h``
and ``answers.h``, through :mod:`kiln.core`), the very code the C++ client uses, so a machine
running both keeps each artifact once under one set of rules: written to a temporary name and
renamed into place (a reader never sees a partial artifact, several processes may fill the
folder at once), hashed before its first use in a process, deleted when it does not match its
name, and artifacts an older client left elsewhere adopted the first time they are asked for.
Answers are shared the same way: one a Python process saved answers a C++ ``Session`` and the
reverse (the file format is ``client/core/FORMAT.md``). Handle manifests are this package's own.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterable, Optional, Union

from . import core

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
    """A content-addressed folder of artifacts: the native core's store (:class:`kiln.core.Store`,
    the C++ client's too), plus this client's handle manifests. Thread-safe; safe across
    processes."""

    def __init__(self, root: Optional[Union[str, Path]] = None) -> None:
        self.root = Path(root).expanduser() if root is not None else default_cache_dir()
        self._store: Optional[core.Store] = None
        self._lock = threading.Lock()
        self._manifests: set[str] = set()  # handles whose manifest this process saw saved

    @property
    def store(self) -> core.Store:
        """The core's store, opened (and its folder created) on first use."""
        if self._store is None:
            with self._lock:
                if self._store is None:
                    self._store = core.Store(self.root)
        return self._store

    def path_for(self, digest: str) -> Path:
        """Where an artifact lives (whether or not it is there), as the core's store lays it out;
        ValueError for a malformed digest. The file there is not verified: :meth:`get` is."""
        check_digest(digest)
        return self.store.path_for(digest)

    def get(self, digest: str) -> Optional[Path]:
        """The path of a present, verified artifact, or None.

        The bytes are hashed the first time a process asks (and again if the file changed);
        a file whose hash does not match is removed.
        """
        check_digest(digest)
        return self.store.find(digest)

    def put_chunks(self, digest: str, chunks: Iterable[bytes], size: Optional[int] = None) -> Path:
        """Stores an artifact from a stream of byte chunks, verifying size and digest.

        Raises ValueError (leaving nothing behind) when the bytes do not hash to ``digest`` or
        their length is not ``size``.
        """
        check_digest(digest)
        data = b"".join(chunks)
        if size is not None and len(data) != size:
            raise ValueError(f"artifact {digest}: got {len(data)} bytes, expected {size}")
        try:
            return self.store.put(digest, data)
        except core.CoreError as e:
            if e.code == core.DATA_LOSS:
                raise ValueError(str(e)) from None
            raise

    def put_bytes(self, data: bytes) -> tuple[str, Path]:
        """Stores bytes under their own digest, computed by the store; returns (digest, path)."""
        return self.store.add(data)

    # Handle manifests: small JSON notes about graphs compiled from this machine.

    def _manifest_path(self, handle: str) -> Path:
        check_digest(handle)
        return self.root / "handles" / f"{handle}.json"

    def save_manifest(self, handle: str, manifest: dict[str, Any]) -> None:
        """Remembers ``manifest`` for ``handle`` (best effort: errors are ignored). A handle
        whose manifest is there already keeps it: the handle fixes the graph's dtypes, shapes
        and strides (only input names could differ), and a warm start looks up every part of a
        model, where reading each manifest back to compare cost a third of a cache hit."""
        if handle in self._manifests:
            return
        try:
            path = self._manifest_path(handle)
            if not path.is_file():
                atomic_write(path, json.dumps(manifest, sort_keys=True).encode())
            self._manifests.add(handle)
        except (OSError, ValueError):
            pass

    def manifest_saved(self, handle: str) -> bool:
        """Whether this process saw ``handle``'s manifest saved (save_manifest would do nothing)."""
        return handle in self._manifests

    def load_manifest(self, handle: str) -> Optional[dict[str, Any]]:
        """The manifest saved for ``handle``, or None."""
        try:
            return json.loads(self._manifest_path(handle).read_text())
        except (OSError, ValueError):
            return None

    # Answers: kilnd's responses to requests made from this machine (Client's answer tier), kept
    # by the core.

    def load_answer(self, name: str, max_age_s: float) -> Optional[tuple[bytes, bool]]:
        """The response stored under ``name`` (64 hex digits) when it is there, intact, and
        given by kilnd at most ``max_age_s`` seconds ago, with whether the file is private to
        this user (owned by it, writable by no one else); None otherwise. A damaged file is
        removed. ValueError for a malformed name."""
        try:
            return self.store.load_answer(name, max_age_s)
        except core.CoreError as e:
            raise ValueError(str(e)) from None

    def save_answer(self, name: str, response: bytes) -> None:
        """Stores a response kilnd gave under ``name`` (best effort: errors are ignored)."""
        with contextlib.suppress(core.CoreError):
            self.store.save_answer(name, response)

    def drop_answer(self, name: str) -> None:
        """Forgets the answer stored under ``name``."""
        with contextlib.suppress(core.CoreError):
            self.store.drop_answer(name)

    def _answer_path(self, name: str) -> str:
        """Where the answer ``name`` lives, whether or not it is there, as the core lays the
        folder out (``client/core/answers.h``): for tests that damage or age a file."""
        check_digest(name)
        return os.path.join(self.root, "answers", name[:2], name)
