"""The recorder: keeps every graph a client compiles, for replay with ``kiln prewarm``.

With ``KILN_RECORD_DIR`` set (or a :class:`Recorder` passed to :class:`kiln.Client`), each
compile writes one file to that folder:

    ``<sha256>.kreq``: a binary kiln.v1.CompileRequest holding the graph and the options, with
    ``target`` and ``priority`` cleared; the name is the SHA-256 of those (deterministically
    serialized) bytes.

So a graph compiled for several targets, or by several processes, is recorded once, and a CI
job can replay the folder for any list of targets: ``kiln prewarm DIR --target cpu:x86-64-v3
--target cuda:sm_90``. Files are written atomically; recording never fails a compile (an
unwritable folder is reported once as a warning).
"""

from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence, Union

from .cache import atomic_write
from .graphio import ALL_SUFFIXES
from .v1 import service_pb2

SUFFIX = ".kreq"


def request_key(request: Any) -> tuple[str, bytes]:
    """The record's (name digest, bytes) for a CompileRequest: target and priority cleared."""
    r = service_pb2.CompileRequest()
    r.CopyFrom(request)
    r.ClearField("target")
    r.ClearField("priority")
    data = r.SerializeToString(deterministic=True)
    return hashlib.sha256(data).hexdigest(), data


class Recorder:
    """Writes compile requests to a folder, one ``.kreq`` file per distinct request."""

    def __init__(self, directory: Union[str, Path]) -> None:
        self.directory = Path(directory).expanduser()
        self._warned = False

    @classmethod
    def from_env(cls) -> Optional["Recorder"]:
        """A recorder for ``$KILN_RECORD_DIR``, or None when it is unset or empty."""
        d = os.environ.get("KILN_RECORD_DIR")
        return cls(d) if d else None

    def record(self, request: Any) -> Optional[Path]:
        """Writes ``request`` (unless already recorded); returns its path, or None on an error."""
        digest, data = request_key(request)
        path = self.directory / f"{digest}{SUFFIX}"
        try:
            if not path.exists():
                atomic_write(path, data)
            return path
        except OSError as e:
            if not self._warned:
                warnings.warn(f"kiln: cannot record graphs in {self.directory}: {e}")
                self._warned = True
            return None


def iter_graph_files(paths: Sequence[Union[str, Path]]) -> Iterator[Path]:
    """The graph and request files named by ``paths``: files as given, folders searched
    recursively for known extensions, in sorted order. FileNotFoundError for a missing path."""
    for p in map(Path, paths):
        if p.is_dir():
            for f in sorted(p.rglob("*")):
                if f.is_file() and f.suffix.lower() in ALL_SUFFIXES and not f.name.startswith("."):
                    yield f
        elif p.is_file():
            yield p
        else:
            raise FileNotFoundError(f"no such file or folder: {p}")
