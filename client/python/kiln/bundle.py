"""Bundles: a kilnd's stored entries as one file, to warm another kilnd (``kiln export`` /
``kiln import``).

A bundle carries every entry of the exporting daemon's local store: compile results with their
artifacts (``.so`` files, cubins), compiled-model records (:mod:`kiln.torch.precompile`,
program records), shared tunings. It moves a warm cache to a cluster that cannot reach the one
that compiled it (air-gapped sites, a new region, CI that prewarms once and ships the result).

File format (little-endian)::

    magic     8 bytes  b"KILNBDL1"
    entries   for each: b"E", u64 length, a serialized kiln.v1.BundleEntry (key, result, blobs)
    trailer   b"Z", u64 number of entries, 32-byte SHA-256 of every byte before the digest

The trailer makes a truncated or damaged file an error before anything is sent. It guards
against accidents, not against someone who rewrites the file: what protects the importing
cluster is the daemon's own check of every entry (each blob must hash to the digest its result
names) and the results' signatures: a kilnd that signs stores only entries signed by a key it
trusts (or, with ``resign``, signs them itself on the admin's word), and clients with trusted
keys verify every result they load, as for results compiled in place. Export and import need
role ``admin``.
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, Optional, Union

from .errors import KilnError
from .v1 import service_pb2

MAGIC = b"KILNBDL1"
_ENTRY = b"E"
_END = b"Z"
_LEN = struct.Struct("<Q")
#: Bytes of entries per ImportEntries call (one larger entry goes alone): well under kilnd's
#: default request limit of 64 MiB.
IMPORT_BATCH_BYTES = 16 << 20


class BundleError(KilnError):
    """The bundle file is not one, or is damaged or truncated."""


@dataclass
class BundleStats:
    entries: int = 0
    blobs: int = 0
    bytes: int = 0      # the file's size
    stored: int = 0     # import: entries the daemon wrote
    present: int = 0    # import: entries it already held


def export_bundle(client: Any, path: Union[str, os.PathLike[str]],
                  progress: Optional[Callable[[BundleStats], None]] = None) -> BundleStats:
    """Writes every entry ``client``'s daemon stores to ``path`` (through a temporary file
    renamed at the end, so an interrupted export leaves no partial bundle behind)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".part")
    stats = BundleStats()
    digest = hashlib.sha256()
    try:
        with open(tmp, "wb") as f:
            def write(data: bytes) -> None:
                digest.update(data)
                f.write(data)

            write(MAGIC)
            after = ""
            while True:
                entries, after = client.export_entries(after)
                for entry in entries:
                    data = entry.SerializeToString()
                    write(_ENTRY + _LEN.pack(len(data)) + data)
                    stats.entries += 1
                    stats.blobs += len(entry.blobs)
                if progress is not None:
                    progress(stats)
                if not after:
                    break
            write(_END + _LEN.pack(stats.entries))
            f.write(digest.digest())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    stats.bytes = path.stat().st_size
    return stats


def read_bundle(path: Union[str, os.PathLike[str]]) -> Iterator[Any]:
    """The entries of the bundle at ``path`` (kiln.v1.BundleEntry), after the whole file has
    been checked against its trailer: a damaged file raises :class:`BundleError` before the
    first entry is yielded."""
    count = _check(path)
    with open(path, "rb") as f:
        f.seek(len(MAGIC))
        for _ in range(count):
            f.read(1)
            (n,) = _LEN.unpack(f.read(_LEN.size))
            entry = service_pb2.BundleEntry()
            entry.ParseFromString(f.read(n))
            yield entry


def import_bundle(client: Any, path: Union[str, os.PathLike[str]], *, resign: bool = False,
                  batch_bytes: int = IMPORT_BATCH_BYTES,
                  progress: Optional[Callable[[BundleStats], None]] = None) -> BundleStats:
    """Stores the bundle's entries in ``client``'s daemon, in batches of about ``batch_bytes``.
    The file is checked whole first; the daemon checks each batch whole (a bad entry refuses
    its batch, naming the entry, and stores nothing of it)."""
    stats = BundleStats(bytes=os.path.getsize(path))
    batch: list[Any] = []
    size = 0

    def send() -> None:
        nonlocal batch, size
        stored, present = client.import_entries(batch, resign=resign)
        stats.stored += stored
        stats.present += present
        batch, size = [], 0
        if progress is not None:
            progress(stats)

    for entry in read_bundle(path):
        n = entry.ByteSize()
        if batch and size + n > batch_bytes:
            send()
        batch.append(entry)
        size += n
        stats.entries += 1
        stats.blobs += len(entry.blobs)
    if batch:
        send()
    return stats


def _check(path: Union[str, os.PathLike[str]]) -> int:
    """The number of entries of a sound bundle; BundleError naming what is wrong otherwise."""
    name = os.fspath(path)
    digest = hashlib.sha256()
    count = 0
    with open(path, "rb") as f:
        magic = f.read(len(MAGIC))
        if magic != MAGIC:
            raise BundleError(f"{name} is not a kiln bundle (it starts with {magic[:8]!r})")
        digest.update(magic)
        while True:
            tag = f.read(1)
            head = f.read(_LEN.size)
            if len(tag) != 1 or len(head) != _LEN.size:
                raise BundleError(f"{name} is truncated after {count} entries (no trailer)")
            digest.update(tag + head)
            (n,) = _LEN.unpack(head)
            if tag == _END:
                if n != count:
                    raise BundleError(f"{name}: the trailer counts {n} entries, the file holds {count}")
                if f.read(32) != digest.digest():
                    raise BundleError(f"{name} is damaged: its contents do not match the trailer's digest")
                if f.read(1):
                    raise BundleError(f"{name} has bytes after its trailer")
                return count
            if tag != _ENTRY:
                raise BundleError(f"{name}: unknown record {tag!r} after {count} entries")
            _copy_into(f, n, digest, name, count)
            count += 1


def _copy_into(f: BinaryIO, n: int, digest: Any, name: str, count: int) -> None:
    """Feeds the next ``n`` bytes of ``f`` to ``digest`` in bounded reads."""
    left = n
    while left:
        chunk = f.read(min(left, 1 << 20))
        if not chunk:
            raise BundleError(f"{name} is truncated inside entry {count}")
        digest.update(chunk)
        left -= len(chunk)


__all__ = ["BundleError", "BundleStats", "MAGIC", "export_bundle", "import_bundle", "read_bundle"]
