"""Custom builds on kilnd: the caller's own C++/CUDA sources built into a shared module (an
extension) or a cubin (a raw kernel), cached cluster-wide like compiled graphs.

This module is the one client-side implementation of the protocol (server/ext/ext.h states the
server's contract); :mod:`kiln.torch_extension` (``kiln.torch.load``/``load_inline``) and
:class:`kiln.cuda.RawKernel` build on it, and so does ``kiln prewarm`` for recorded builds.

Inputs travel as content-addressed blobs. A folder becomes a *tree*: an ``InputTree`` message
(files sorted by path, each with its SHA-256), serialized deterministically; its digest names
the folder. Before a build the client asks kilnd which tree digests it lacks, then which of
those trees' files, and uploads only those: a second client with the same PyTorch uploads
nothing. A build that finds a blob gone (evicted between the calls) answers with the missing
digests, and the client uploads them and asks again.

Hashing a header tree reads every file (PyTorch's is about 10k files, 60 MB). Digests are
remembered per file in ``<cache_dir>/trees`` keyed by path, size, mtime and inode, so later
processes only stat the files; a changed file is hashed again.
"""

from __future__ import annotations

import base64
import concurrent.futures
import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence, Union

from .cache import atomic_write
from .errors import KilnError
from .v1 import service_pb2

#: Blobs per UploadBlobs call, by bytes (kilnd accepts 64 MiB by default).
UPLOAD_BATCH_BYTES = 4 << 20
#: UploadBlobs calls outstanding at once.
UPLOAD_IN_FLIGHT = 3
#: Digests per FindMissingBlobs call.
FIND_BATCH = 20000
#: What a source folder contributes to its tree: sources and headers, not build output.
SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".cu", ".h", ".hh", ".hpp", ".hxx", ".cuh", ".inl", ".inc", ".ipp", ".tcc")
#: Bounds on one tree, so that a mistaken root (a home folder) fails fast and clearly.
MAX_TREE_FILES = 50000
MAX_TREE_BYTES = 1 << 30


@dataclasses.dataclass(frozen=True)
class TreeFile:
    path: str  # relative, '/'-separated
    digest: str
    size: int
    source: Union[str, Path, bytes]  # where the bytes are: a local file's path, or the bytes themselves

    def read(self) -> bytes:
        if isinstance(self.source, bytes):
            return self.source
        with open(self.source, "rb") as f:
            return f.read()


@dataclasses.dataclass
class Tree:
    """A folder as kilnd sees it: its files and the manifest blob that names them."""

    files: list[TreeFile]
    manifest: bytes
    digest: str

    @classmethod
    def from_files(cls, files: Iterable[TreeFile]) -> "Tree":
        ordered = sorted(files, key=lambda f: f.path.encode())
        msg = service_pb2.InputTree()
        for f in ordered:
            msg.files.add(path=f.path, digest=f.digest, size=f.size)
        manifest = msg.SerializeToString(deterministic=True)
        return cls(ordered, manifest, hashlib.sha256(manifest).hexdigest())

    @classmethod
    def from_bytes(cls, contents: dict[str, bytes]) -> "Tree":
        return cls.from_files(TreeFile(p, hashlib.sha256(b).hexdigest(), len(b), b) for p, b in contents.items())


class _DigestMemo:
    """Per-file digests of one folder, valid while a file's (size, mtime, inode) is unchanged.

    Kept as lines of ``path TAB stamp TAB digest``: for PyTorch's ~10k headers that reads in
    a fraction of the time JSON takes, and a warm lookup is mostly this read."""

    def __init__(self, cache_dir: Optional[Path], root: Path) -> None:
        self.path = None
        self.entries: dict[str, tuple[str, str]] = {}
        if cache_dir is not None:
            name = hashlib.sha256(str(root).encode()).hexdigest()[:32]
            self.path = Path(cache_dir) / "trees" / f"{name}.tsv"
            try:
                text = self.path.read_text()
            except (OSError, ValueError):
                text = ""
            for line in text.split("\n"):
                parts = line.split("\t")
                if len(parts) == 3:
                    self.entries[parts[0]] = (parts[1], parts[2])
        self.dirty = False

    def digest(self, rel: str, full: str, st: os.stat_result) -> str:
        stamp = f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"
        e = self.entries.get(rel)
        if e is not None and e[0] == stamp:
            return e[1]
        with open(full, "rb") as f:
            h = hashlib.sha256(f.read()).hexdigest()
        if "\t" not in rel and "\n" not in rel:
            self.entries[rel] = (stamp, h)
            self.dirty = True
        return h

    def save(self) -> None:
        if self.path is not None and self.dirty:
            text = "".join(f"{rel}\t{stamp}\t{h}\n" for rel, (stamp, h) in self.entries.items())
            try:
                atomic_write(self.path, text.encode())
            except OSError:
                pass  # only a speed-up


def tree_of_folder(root: Union[str, Path], *, suffixes: Optional[Sequence[str]] = None,
                   cache_dir: Optional[Path] = None) -> Tree:
    """The tree of ``root``'s regular files (links followed), recursively; only files ending in
    one of ``suffixes`` when given. KilnError when the folder is too large to be a header tree."""
    root = Path(root).resolve()
    if not root.is_dir():
        raise KilnError(f"{root} is not a folder")
    memo = _DigestMemo(cache_dir, root)
    ends = tuple(suffixes) if suffixes is not None else None
    files: list[TreeFile] = []
    total = 0
    # Plain strings and os.scandir, not pathlib: PyTorch's tree is ~10k files, and per-file
    # Path objects cost more than the stats themselves once the digests are remembered.
    pending = [(str(root), "")]
    while pending:
        folder, prefix = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            name = entry.name
            try:
                if entry.is_dir():
                    if not name.startswith(".") and name != "__pycache__":
                        pending.append((entry.path, prefix + name + "/"))
                    continue
                if ends is not None and not name.endswith(ends):
                    continue
                if not entry.is_file():
                    continue
                st = entry.stat()
            except OSError:
                continue
            total += st.st_size
            if len(files) >= MAX_TREE_FILES or total > MAX_TREE_BYTES:
                raise KilnError(f"{root} holds more than {MAX_TREE_FILES} files or {MAX_TREE_BYTES >> 20} MiB: "
                                f"not a header folder kiln uploads")
            rel = prefix + name
            files.append(TreeFile(rel, memo.digest(rel, entry.path, st), st.st_size, entry.path))
    memo.save()
    return Tree.from_files(files)


# ------------------------------------------------------------------------------ protocol


def _blob_sources(trees: Sequence[Tree]) -> dict[str, Union[TreeFile, bytes]]:
    out: dict[str, Union[TreeFile, bytes]] = {}
    for t in trees:
        out[t.digest] = t.manifest
        for f in t.files:
            out.setdefault(f.digest, f)
    return out


def _find_missing(client: Any, digests: Sequence[str], timeout: Optional[float]) -> list[str]:
    missing: list[str] = []
    for i in range(0, len(digests), FIND_BATCH):
        req = service_pb2.FindMissingBlobsRequest(digests=list(digests[i:i + FIND_BATCH]))
        missing.extend(client._call("FindMissingBlobs", req, timeout).missing)
    return missing


def _upload(client: Any, digests: Sequence[str], sources: dict[str, Union[TreeFile, bytes]],
            timeout: Optional[float]) -> int:
    """Uploads the blobs ``digests`` (manifests last, after the files they name); returns bytes sent.

    Reading and checking the next batch overlaps kilnd storing the previous ones: up to
    UPLOAD_IN_FLIGHT calls are outstanding, so neither side waits for the other on a cold
    upload of a header tree. Manifests go in a call of their own after every file's call has
    returned, so that kilnd never holds a tree before its files."""
    ordered = sorted(set(digests), key=lambda d: isinstance(sources[d], bytes))
    sent = 0
    batch: list[bytes] = []
    size = 0
    pending: list[concurrent.futures.Future] = []

    with concurrent.futures.ThreadPoolExecutor(UPLOAD_IN_FLIGHT, thread_name_prefix="kiln-upload") as pool:

        def send() -> None:
            """Sends the batch, leaving fewer than UPLOAD_IN_FLIGHT calls outstanding."""
            nonlocal batch, size
            if batch:
                req = service_pb2.UploadBlobsRequest(blobs=batch)
                pending.append(pool.submit(client._call, "UploadBlobs", req, timeout))
                batch, size = [], 0
            while len(pending) >= UPLOAD_IN_FLIGHT:
                pending.pop(0).result()

        def drain() -> None:
            """Sends the batch and waits for every call."""
            send()
            while pending:
                pending.pop(0).result()

        manifests = False
        for d in ordered:
            src = sources[d]
            if isinstance(src, bytes) and not manifests:
                drain()  # every file is held before the first manifest goes
                manifests = True
            data = src if isinstance(src, bytes) else src.read()
            if hashlib.sha256(data).hexdigest() != d:
                path = src.source if isinstance(src, TreeFile) else "a manifest"
                raise KilnError(f"{path} changed while kiln was uploading it: build again")
            if size + len(data) > UPLOAD_BATCH_BYTES:
                send()
            batch.append(data)
            size += len(data)
            sent += len(data)
        drain()
    return sent


def ensure_uploaded(client: Any, trees: Sequence[Tree], timeout: Optional[float] = None) -> int:
    """Makes kilnd hold every tree and file in ``trees``, uploading what it lacks. Returns the
    bytes uploaded (0 when kilnd had everything)."""
    missing_trees = set(_find_missing(client, [t.digest for t in trees], timeout))
    if not missing_trees:
        return 0
    sources = _blob_sources([t for t in trees if t.digest in missing_trees])
    files = [d for d in sources if d not in missing_trees]
    need = _find_missing(client, files, timeout) + sorted(missing_trees)
    return _upload(client, need, sources, timeout)


@dataclasses.dataclass
class BuildOutcome:
    handle: str
    result: Any  # kiln.v1.ActionResult
    cache_hit: bool
    uploaded_bytes: int
    seconds: float

    @property
    def log(self) -> str:
        return self.result.compile_log


def build_extension(client: Any, request: Any, trees: Sequence[Tree], *, timeout: Optional[float] = None) -> BuildOutcome:
    """Get-or-build ``request`` (a kiln.v1.BuildExtensionRequest naming ``trees``): asks first
    (a hit needs no upload), uploads what kilnd lacks when it says so, and asks again. The
    result is verified under the client's trust policy (its signature by a trusted key) like a
    compiled graph's, before anything of it is used."""
    start = time.perf_counter()
    timeout = timeout if timeout is not None else client.compile_timeout
    uploaded = 0
    sources = _blob_sources(trees)
    for attempt in range(3):
        resp = client._call("BuildExtension", request, timeout)
        if not resp.missing:
            # Before the module is fetched or loaded: a refused result raises VerificationError.
            client.trust.check(resp.handle, resp.result)
            return BuildOutcome(resp.handle, resp.result, resp.cache_hit, uploaded, time.perf_counter() - start)
        unknown = [d for d in resp.missing if d not in sources]
        if unknown:
            raise KilnError(f"kilnd asks for blobs this build does not have: {unknown[:3]}")
        if attempt == 0:
            uploaded += ensure_uploaded(client, trees, timeout)
        else:
            uploaded += _upload(client, list(resp.missing), sources, timeout)
    raise KilnError("kilnd kept losing the build's inputs (its input store may be too small)")


def record_build(client: Any, payload: dict[str, Any]) -> None:
    """Writes a custom build to the client's recorder (``$KILN_RECORD_DIR``), if any, as a
    ``.kbuild`` file that ``kiln prewarm`` replays."""
    rec = getattr(client, "recorder", None)
    if rec is None:
        return
    data = json.dumps(payload, sort_keys=True).encode()
    digest = hashlib.sha256(data).hexdigest()
    path = Path(rec.directory) / f"{digest}.kbuild"
    try:
        if not path.exists():
            atomic_write(path, data)
    except OSError:
        pass


def tree_to_record(tree: Tree, *, inline: bool) -> dict[str, Any]:
    """A tree for a recording: its files inline (sources), or its root's manifest only."""
    if inline:
        return {"files": {f.path: base64.b64encode(f.read()).decode() for f in tree.files}}
    return {"digest": tree.digest}


def tree_from_record(entry: dict[str, Any]) -> Tree:
    return Tree.from_bytes({p: base64.b64decode(b) for p, b in entry["files"].items()})


def bundle_blobs(directory: Path, trees: Sequence[Tree]) -> None:
    """Copies every blob of ``trees`` into ``directory/blobs`` (a self-contained recording: a
    machine without the same headers can replay it)."""
    out = Path(directory) / "blobs"
    out.mkdir(parents=True, exist_ok=True)
    for d, src in _blob_sources(trees).items():
        p = out / d
        if not p.exists():
            atomic_write(p, src if isinstance(src, bytes) else src.read())


def trees_from_bundle(directory: Path, digests: Sequence[str]) -> list[Tree]:
    """The trees ``digests`` rebuilt from a recording's ``blobs`` folder (bundle_blobs)."""
    blobs = Path(directory) / "blobs"
    trees = []
    for d in digests:
        manifest = (blobs / d).read_bytes()
        msg = service_pb2.InputTree.FromString(manifest)
        files = [TreeFile(f.path, f.digest, f.size, blobs / f.digest) for f in msg.files]
        trees.append(Tree(files, manifest, d))
    return trees


# ------------------------------------------------------------------------------ replay

RECORD_SUFFIX = ".kbuild"


def _replay_extension(client: Any, payload: dict[str, Any], record_dir: Path, priority: int) -> BuildOutcome:
    """A recorded extension build: sources from the recording; header trees from the
    recording's ``blobs`` folder when it has them (a self-contained recording), else from the
    recorded folders on this machine, which must hold the same headers."""
    request = service_pb2.BuildExtensionRequest.FromString(base64.b64decode(payload["request"]))
    request.priority = priority
    source_tree = tree_from_record(payload["source_tree"])
    if source_tree.digest != request.source_tree:
        raise KilnError(f"recording of {request.name}: its sources do not match its request")
    trees = [source_tree]
    for entry in payload["include_trees"]:
        if "files" in entry:  # a small tree kept inline
            trees.append(tree_from_record(entry))
            continue
        if (Path(record_dir) / "blobs" / entry["digest"]).exists():
            trees.extend(trees_from_bundle(record_dir, [entry["digest"]]))
            continue
        tree = tree_of_folder(entry["root"], cache_dir=client.cache.root)
        if tree.digest != entry["digest"]:
            raise KilnError(f"recording of {request.name}: the headers in {entry['root']} differ from the ones recorded "
                            f"(another PyTorch or Python?): record on a matching machine, or bundle the inputs")
        trees.append(tree)
    return build_extension(client, request, trees)


def compile_raw_kernel(client: Any, request: Any, *, timeout: Optional[float] = None) -> BuildOutcome:
    """Get-or-compile a raw CUDA kernel (a kiln.v1.CompileRawKernelRequest); its result is
    verified under the client's trust policy like a graph's."""
    start = time.perf_counter()
    resp = client._call("CompileRawKernel", request, timeout if timeout is not None else client.compile_timeout)
    client.trust.check(resp.handle, resp.result)
    return BuildOutcome(resp.handle, resp.result, resp.cache_hit, 0, time.perf_counter() - start)


def replay_file(client: Any, path: Union[str, Path], priority: int = 1) -> BuildOutcome:
    """Builds what a ``.kbuild`` recording describes (an extension or a raw kernel)."""
    path = Path(path)
    payload = json.loads(path.read_bytes())
    kind = payload.get("kind")
    if kind == "extension":
        return _replay_extension(client, payload, path.parent, priority)
    if kind == "raw_kernel":
        request = service_pb2.CompileRawKernelRequest.FromString(base64.b64decode(payload["request"]))
        request.priority = priority
        return compile_raw_kernel(client, request)
    raise KilnError(f"{path}: unknown recording kind {kind!r}")


def iter_build_records(paths: Sequence[Union[str, Path]]) -> list[Path]:
    """The ``.kbuild`` recordings among ``paths`` (files as given, folders searched)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(f for f in p.rglob(f"*{RECORD_SUFFIX}") if f.is_file()))
        elif p.suffix == RECORD_SUFFIX and p.is_file():
            out.append(p)
    return out
