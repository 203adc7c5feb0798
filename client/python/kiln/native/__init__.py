"""The native part runner: the call path of a kiln part on PyTorch tensors in C++ (``runner.cc``).

A kiln part called from Python pays for argument checks, one ``torch.empty`` per output and
ctypes launches: 26-30 µs of host time per call on an H100 host, most of a BERT step's
overhead. ``runner.cc`` does the same work in one C++ call (checks against what the part was
compiled for, outputs from torch's allocator, the CPU artifact's ``kiln_run`` or the client
core's CUDA loader and launcher) and returns the results, or None when the arguments need the
general path. Two callers use it: kiln.torch's parts (:class:`kiln.torch.runtime.KilnPart`,
which then runs its Python path) and :func:`kiln.cuda.run_compiled` for PyTorch CUDA tensors
(``kiln.jit`` on CUDA, a CUDA :class:`kiln.Compiled` called directly), which otherwise launch
through :mod:`kiln.cuda` (the same loader in libkiln_core.so, one ctypes call per launch). It
is also importable as ``kiln.torch.native``.

How it is built: as a PyTorch extension, by kilnd (:mod:`kiln.torch_extension`), from
``runner.cc`` and the client core's CUDA loader sources (``client/core/cuda_plan.*`` and
``cuda_loader.*``, listed in ``loader_files.txt``: one loader and launcher for every kiln
client and this runner). The build is keyed by the sources, PyTorch's headers and ABI and the Python
version, so a cluster builds it once per PyTorch version and every other process gets it from
kilnd's cache. It starts in the background with the first compiled graph or the first CUDA call
on PyTorch tensors (:func:`start`); callers use the Python path until it is loaded, then
switch. :func:`wait` blocks until it is loaded or has failed. A failure is logged once and
leaves the Python path in place: nothing the runner does can make a program fail.

``KILN_TORCH_NATIVE=0`` (or the backend option ``native=False``) turns it off;
``KILN_TORCH_NATIVE=local`` builds it on this machine with ``torch.utils.cpp_extension``
instead (g++ and ninja needed here), for a kilnd that serves no custom builds. PyTorch is
imported only where the runner is built or a part made, by callers that hold tensors already.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

from .. import torch_extension as extension
from .._once import OncePerKey
from ..cache import atomic_write
from ..plan import expr_text, plan_json
from ..strides import inverse_order, memory_order
from ..v1 import service_pb2

log = logging.getLogger("kiln.torch")

#: The module's name; a change to runner.cc's interface changes it.
NAME = "kiln_torch_runner_v2"
# The C++ client's loader sources the runner compiles (the wheel's build hook reads the list too).
_LOADER_FILES = tuple((Path(__file__).with_name("loader_files.txt")).read_text().split())

_lock = threading.Lock()
_thread: Optional[threading.Thread] = None
_done = threading.Event()
_failed_at = 0.0
_failed_client: Optional[int] = None
_failures = 0
#: After a failed build, another through the same client is tried no sooner than this (a
#: daemon that was down, say), and not at all after MAX_ATTEMPTS failures (a daemon that serves
#: no custom builds). Another client may try at once: the one that failed may have been
#: closed while its build ran (a ``with kiln.Client(...)`` block of kiln.jit calls, say).
RETRY_AFTER_S = 60.0
MAX_ATTEMPTS = 3
#: The loaded module, once :func:`start`'s build has finished (None before, and on failure).
RUNNER: Any = None
#: Why the runner is not available, when its build failed.
ERROR: Optional[str] = None
#: How the last build found the runner: ``"memo"`` (the local artifact folder), else
#: ``"built (why the memo did not serve)"`` (a build request to kilnd).
FOUND: Optional[str] = None


def enabled() -> bool:
    """False when ``$KILN_TORCH_NATIVE`` turns the runner off."""
    return os.environ.get("KILN_TORCH_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")


def loader_sources() -> Path:
    """The folder holding the client core's CUDA loader sources: a wheel carries a copy beside
    this file (``client/core``); a source tree has them at the repository's ``client/core``."""
    here = Path(__file__).resolve().parent
    for folder in (here / "client" / "core", here.parents[2] / "core"):
        if all((folder / f).is_file() for f in _LOADER_FILES):
            return folder
    raise FileNotFoundError("the client core's CUDA loader sources (cuda_plan.cc, cuda_loader.cc) are missing")


def _stage(into: Path) -> list[Path]:
    """Copies the runner's sources into ``into`` with the layout its includes expect
    (``runner.cc``, ``client/core/...``); returns the files to compile."""
    core = into / "client" / "core"
    core.mkdir(parents=True)
    shutil.copyfile(Path(__file__).resolve().parent / "runner.cc", into / "runner.cc")
    src = loader_sources()
    for f in _LOADER_FILES:
        shutil.copyfile(src / f, core / f)
    return [into / "runner.cc", core / "cuda_plan.cc", core / "cuda_loader.cc"]


# The core's loader sources are C++20, whatever standard PyTorch's extensions default to.
_CFLAGS = ["-O2", "-std=c++20"]


#: The format of the cluster-wide record naming the runner built for one PyTorch build.
RECORD_FORMAT = "kiln.torch.runner/1"


def build(client: Any) -> Any:
    """Builds (or gets from kilnd's cache) and imports the runner; raises on failure.

    Three ways to the runner, cheapest first:

    1. the memo in the local artifact folder (``<cache>/runner``, keyed by :func:`_memo_key`:
       the runner's sources, PyTorch's version and install, the Python version and the flags)
       names an artifact already here;
    2. kilnd holds a record (:data:`RECORD_FORMAT`, keyed by :func:`_cluster_key`: the same
       inputs, PyTorch named by its build rather than by this machine's files) naming the
       runner another machine built for this PyTorch build: one GetModel and one download;
    3. the build request, whose key covers PyTorch's ~10,000 headers: walking them costs a
       thread that holds the GIL against the first call's own work 1 to 1.5 s, which is what
       (1) and (2) spare every process but the cluster's first.

    A module from (1) or (2) that does not import (a PyTorch the key could not tell apart)
    falls through to the next way."""
    with tempfile.TemporaryDirectory(prefix="kiln-runner-") as tmp:
        sources = _stage(Path(tmp))
        if os.environ.get("KILN_TORCH_NATIVE", "").strip().lower() == "local":
            import torch.utils.cpp_extension as cpp

            return cpp.load(NAME, [str(s) for s in sources], extra_cflags=_CFLAGS, extra_include_paths=[tmp])
        global FOUND
        memo = client.cache.root / "runner" / f"{_memo_key(sources)}.json"
        misses = []
        try:
            digest = json.loads(memo.read_text())["digest"]
            client.read_verified(digest)  # present and intact, or an error
            module = extension._import_module(NAME, client.cache.path_for(digest))
            FOUND = "memo"
            return module
        except Exception as e:  # no memo, an artifact gone or damaged
            misses.append(f"memo: {type(e).__name__}: {e}")
        key = _cluster_key(sources)
        try:
            digest = _from_cluster(client, key)
            module = extension._import_module(NAME, client.cache.path_for(digest))
            _write_memo(memo, digest)
            FOUND = "cluster"
            return module
        except Exception as e:  # no record (the cluster's first build), or one that failed
            misses.append(f"cluster: {type(e).__name__}: {e}")
        FOUND = f"built ({'; '.join(misses)})"
        prepared = extension.prepare(NAME, sources, _CFLAGS, extra_include_paths=[tmp], cache_dir=client.cache.root)
        path, outcome = extension.build_prepared(prepared, client)
        module = extension._import_module(NAME, path)
        _write_memo(memo, path.name)
        try:
            client.put_model(key, RECORD_FORMAT, json.dumps({"name": NAME, "digest": path.name}).encode(),
                             [outcome.handle])
        except Exception as e:  # only a speed-up for the cluster's other machines
            log.debug("kiln.torch: the runner's cluster record was not stored: %s", e)
        return module


def _write_memo(memo: Path, digest: str) -> None:
    try:
        atomic_write(memo, json.dumps({"digest": digest}).encode())
    except OSError:
        pass  # only a speed-up


def _from_cluster(client: Any, key: str) -> str:
    """The digest of the runner kilnd's record names for ``key``, fetched into the local folder
    and verified (the record's signature and digest by :meth:`~kiln.Client.get_model`, the
    build result's signature here, the module's bytes against the digest that result names)."""
    got = client.get_model(key, RECORD_FORMAT)
    if got is None:
        raise FileNotFoundError("kilnd holds no runner for this PyTorch build")
    record, parts = got
    digest = json.loads(record)["digest"]
    if len(parts) != 1:
        raise ValueError(f"the runner's record names {len(parts)} builds")
    client.trust.check(parts[0].handle, parts[0].result)
    modules = [a for a in parts[0].result.artifacts if a.kind == service_pb2.SHARED_OBJECT]
    if [a.digest for a in modules] != [digest]:
        raise ValueError("the runner's record names a module its build result does not hold")
    client.fetch_many([digest])
    client.read_verified(digest, size=modules[0].size or None)
    return digest


def _memo_key(sources: list[Path]) -> str:
    """What the runner built from ``sources`` depends on, as a digest: the sources' bytes,
    PyTorch's version and the files a reinstall replaces (their inode and mtime), the Python
    version and the compile flags."""
    import torch

    h = _sources_digest(sources)
    root = Path(torch.__file__).parent
    for f in [root / "version.py", root / "include", *sorted(root.glob("_C*.so"))]:
        try:
            st = f.stat()
            h.update(f"{f}:{st.st_ino}:{st.st_mtime_ns}:{st.st_size}\0".encode())
        except OSError:  # not in this install: its absence is part of the key
            h.update(f"{f}:absent\0".encode())
    h.update(f"{NAME}\0{torch.__version__}\0{sys.version}\0{' '.join(_CFLAGS)}".encode())
    return h.hexdigest()


def _cluster_key(sources: list[Path]) -> str:
    """The key of the runner's cluster-wide record: the sources' bytes, the Python version, the
    flags, and PyTorch named by its build (version, git revision, CUDA or ROCm version, C++
    ABI) and by the sizes of its native libraries (two installs of one wheel agree on all of
    these; a rebuilt PyTorch with the same version string rarely does). A machine-independent
    stand-in for the build request's digest of every header."""
    import torch

    h = _sources_digest(sources)
    root = Path(torch.__file__).parent
    for f in sorted([*root.glob("_C*.so"), *(root / "lib").glob("lib*.so*")]):
        try:
            h.update(f"{f.name}:{f.stat().st_size}\0".encode())
        except OSError:
            h.update(f"{f.name}:absent\0".encode())
    v = torch.version
    h.update(f"{NAME}\0{torch.__version__}\0{getattr(v, 'git_version', '')}\0{v.cuda}\0{getattr(v, 'hip', None)}"
             f"\0{torch.compiled_with_cxx11_abi()}\0{sys.version}\0{platform.machine()}\0{' '.join(_CFLAGS)}".encode())
    return h.hexdigest()


def _sources_digest(sources: list[Path]) -> Any:
    h = hashlib.sha256()
    for f in sources + sorted(Path(sources[0]).parent.joinpath("client", "cpp").glob("*.h")):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h


def _build_in_background(client: Any, done: threading.Event) -> None:
    global RUNNER, ERROR, _failed_at, _failed_client, _failures
    try:
        RUNNER = build(client)
        ERROR = None
    except Exception as e:  # a daemon that is down, without a compiler, ...
        ERROR = f"{type(e).__name__}: {e}"
        if getattr(client, "closed", False):
            # Its caller closed the client while the build ran (a ``with kiln.Client(...)``
            # block that ended): that says nothing of the daemon, so it is no failure, and the
            # next start() through any client builds again.
            log.debug("kiln.torch: the native part runner's build stopped with its closed client: %s", ERROR)
            return
        _failed_at = time.monotonic()
        _failed_client = id(client)
        _failures += 1
        # A process whose main thread has returned is exiting: its cleanup removes the staged
        # sources under this thread, and nothing will run a part any more.
        level = logging.WARNING if threading.main_thread().is_alive() else logging.DEBUG
        log.log(level, "kiln.torch: the native part runner is unavailable, parts run through Python: %s", ERROR)
    finally:
        done.set()


def start(client: Any) -> None:
    """Starts building the runner in the background, once per process (no-op when disabled
    or already started)."""
    global _thread, _done
    if not enabled() or RUNNER is not None:
        return
    with _lock:
        if _thread is not None and (
                not _done.is_set() or _failures >= MAX_ATTEMPTS
                or (time.monotonic() - _failed_at < RETRY_AFTER_S and id(client) == _failed_client)):
            return  # running, failed moments ago through this client, or failed for good
        _done = threading.Event()
        _thread = threading.Thread(target=_build_in_background, args=(client, _done), name="kiln-runner", daemon=True)
        _thread.start()


def wait(timeout: Optional[float] = None) -> bool:
    """Blocks until a started build has finished; True when the runner is loaded."""
    if _thread is not None:
        _done.wait(timeout)
    return RUNNER is not None


# ------------------------------------------------------------------ parts

def part_for(compiled: Any, device_index: int, in_dtypes: list[Any], out_dtypes: list[Any],
             in_strides: list[Optional[tuple[int, ...]]], out_layouts: list[Optional[tuple[Any, Any]]],
             results: list[int], cpu_kernel: Any = None) -> Any:
    """A runner Part (runner.cc's make_part) for a compiled result on a device (-1: the CPU,
    ``cpu_kernel`` its opened artifact): inputs of the result's shapes (expressions of its
    symbols when it has some) with these torch dtypes and, where given, exactly these strides
    (else any layout, copied to contiguous when needed); outputs of these dtypes, where
    ``out_layouts`` gives one a (torch shape, strides) allocated in that dense layout (the
    kernel stores the output's dimensions in memory order, the plan's shape; symbolic parts
    give the example shape and strides, and the result is the plan's output viewed back);
    ``results`` the output index of each value the Part returns. Needs :data:`RUNNER`."""
    runner = RUNNER
    names = list(compiled.symbols)
    if names:
        in_dims = [[expr_text(e, names) for e in exprs] for exprs in compiled._in_exprs]
        out_dims = [[expr_text(e, names) for e in exprs] for exprs in compiled._out_exprs]
    else:
        in_dims = [[str(int(d)) for d in spec.shape] for spec in compiled.inputs]
        out_dims = [[str(int(d)) for d in spec.shape] for spec in compiled.outputs]
    symbols = [v for sym in compiled.plan.symbols for v in (int(sym.input), int(sym.axis))]
    inputs = [(dt, dims, st) for dt, dims, st in zip(in_dtypes, in_dims, in_strides)]
    outputs: list[Any] = []
    for dt, dims, layout in zip(out_dtypes, out_dims, out_layouts):
        if layout is None:
            outputs.append((dt, dims))
            continue
        shape, strides = tuple(int(d) for d in layout[0]), tuple(int(s) for s in layout[1])
        order = memory_order(shape, strides)
        if order is None or len(order) != len(dims) or (not names and [str(shape[d]) for d in order] != dims):
            raise ValueError(f"output layout {shape} {strides} is not a dense layout of the plan's {dims}")
        if names:  # the plan's shape is in memory order: allocated so, viewed back
            outputs.append((dt, dims, None, inverse_order(order)))
            continue
        outputs.append((dt, [str(d) for d in shape], strides))
    if device_index >= 0:
        import torch

        target: Any = cuda_module(runner, compiled, device_index)
        stream_fn = torch._C._cuda_getCurrentRawStream
    else:
        if int(cpu_kernel.abi_version) != (2 if names else 1):
            raise ValueError(f"CPU artifact ABI {cpu_kernel.abi_version} for a {'symbolic' if names else 'static'} graph")
        target, stream_fn = (cpu_kernel.run_address, cpu_kernel.workspace_address), None
    return runner.make_part(device_index, target, stream_fn, symbols, names, inputs, outputs, results,
                            int(compiled.plan.workspace_bytes))


_modules = OncePerKey()  # (handle, device index) -> the C++ loader's module


def cuda_module(runner: Any, compiled: Any, device_index: int) -> Any:
    """The compiled result's kernels loaded by the C++ loader on ``device_index``, once per
    process (the images are the verified bytes the Python loader reads); different results
    load concurrently."""
    return _modules.get((compiled.handle, device_index), lambda: _load_cuda_module(runner, compiled, device_index))


def _load_cuda_module(runner: Any, compiled: Any, device_index: int) -> Any:
    import torch

    images = []
    for kind in (service_pb2.CUBIN, service_pb2.PTX):
        art = compiled.artifact(kind)
        images.append(compiled.client.read_verified(art.digest, size=art.size or None) if art is not None else b"")
    with torch.cuda.device(device_index):  # the module belongs to this device's context
        return runner.cuda_load(images[0], images[1], plan_json(compiled.plan))
