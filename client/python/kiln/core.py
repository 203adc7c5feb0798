"""The binding to kiln's native client core (``libkiln_core.so``, C ABI in
``client/core/kiln_core.h``): the one implementation of the artifact store and the answers
folder beside it, the CPU library loader and the CUDA loader and launcher that the C++ client
uses too, and of what kilnd and every client must compute alike (the bytes a result's signature
covers, its Ed25519 check, the request key), reached through ctypes.

The library ships inside the wheel (``kiln/_native/libkiln_core.so``, built by the wheel's
build hook with libcrypto and the C++ runtime linked in, so it needs only libc).
``$KILN_CORE_LIBRARY`` names another copy (a developer's build tree, for one).
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from .errors import KilnError

#: The C ABI version this module speaks (KILN_CORE_ABI_VERSION).
ABI_VERSION = 5

# enum kiln_core_error.
OK, INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, DATA_LOSS, UNAVAILABLE, INTERNAL = range(7)

_PATH_MAX = 4096


class CoreError(KilnError):
    """A failure reported by the native core; ``code`` is its error class."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def library_path() -> Path:
    """Where the core is loaded from: ``$KILN_CORE_LIBRARY``, else the copy in the package."""
    env = os.environ.get("KILN_CORE_LIBRARY")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent / "_native" / "libkiln_core.so"


_lib: Optional[ctypes.CDLL] = None
_lock = threading.Lock()


def lib() -> ctypes.CDLL:
    """The core, opened and bound once per process."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            _lib = _open(library_path())
    return _lib


def _open(path: Path) -> ctypes.CDLL:
    if not path.is_file():
        raise KilnError(
            f"kiln's native core is missing ({path}): reinstall the kiln wheel, or set "
            "KILN_CORE_LIBRARY to a libkiln_core.so")
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise KilnError(f"cannot load kiln's native core {path}: {e}") from e
    # The version first: an older core lacks functions this module binds.
    lib.kiln_core_abi_version.restype = ctypes.c_uint32
    version = lib.kiln_core_abi_version()
    if version != ABI_VERSION:
        raise KilnError(f"kiln's native core {path} speaks ABI {version}; this package needs {ABI_VERSION}")
    vp, cp, sz, i64 = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int64
    p64 = ctypes.POINTER(i64)
    sigs: dict[str, tuple[list[Any], Any]] = {
        "kiln_core_abi_version": ([], ctypes.c_uint32),
        "kiln_core_last_error": ([], cp),
        "kiln_core_last_error_code": ([], ctypes.c_int),
        "kiln_store_open": ([cp], vp),
        "kiln_store_close": ([vp], None),
        "kiln_store_root": ([vp], cp),
        "kiln_store_path_for": ([vp, cp, ctypes.c_char_p, sz], ctypes.c_int),
        "kiln_store_find": ([vp, cp, ctypes.c_char_p, sz], ctypes.c_int),
        "kiln_store_put": ([vp, cp, vp, sz, ctypes.c_char_p, sz], ctypes.c_int),
        "kiln_store_add": ([vp, vp, sz, ctypes.c_char_p, ctypes.c_char_p, sz], ctypes.c_int),
        "kiln_store_counters": ([vp, p64, p64, p64], None),
        "kiln_sha256_hex": ([vp, sz, ctypes.c_char_p], None),
        "kiln_answer_name": ([cp, cp, ctypes.c_char_p], None),
        "kiln_store_load_answer": ([vp, cp, ctypes.c_double, ctypes.POINTER(vp), ctypes.POINTER(sz),
                                    ctypes.POINTER(ctypes.c_int)], ctypes.c_int),
        "kiln_store_save_answer": ([vp, cp, vp, sz], ctypes.c_int),
        "kiln_store_drop_answer": ([vp, cp], ctypes.c_int),
        "kiln_core_free": ([vp], None),
        "kiln_result_signed_bytes": ([cp, vp, sz, ctypes.POINTER(vp), ctypes.POINTER(sz)], ctypes.c_int),
        "kiln_request_key": ([vp, sz, vp, sz, vp, sz, ctypes.c_char_p], None),
        "kiln_trust_new": ([], vp),
        "kiln_trust_free": ([vp], None),
        "kiln_trust_add_key_file": ([vp, cp, ctypes.c_char_p], ctypes.c_int),
        "kiln_trust_verify": ([vp, cp, vp, sz], ctypes.c_int),
        "kiln_cpu_open": ([cp], vp),
        "kiln_cpu_open_image": ([vp, sz, cp], vp),
        "kiln_cpu_abi_version": ([vp], ctypes.c_uint32),
        "kiln_cpu_run_function": ([vp], vp),
        "kiln_cpu_workspace_function": ([vp], vp),
        "kiln_cpu_library_count": ([], i64),
        "kiln_cuda_device_count": ([], ctypes.c_int),
        "kiln_cuda_device_sm": ([ctypes.c_int], ctypes.c_int),
        "kiln_cuda_current_device": ([], ctypes.c_int),
        "kiln_cuda_load": ([ctypes.c_int, vp, sz, cp, cp], vp),
        "kiln_cuda_free": ([vp], None),
        "kiln_cuda_loaded_from_ptx": ([vp], ctypes.c_int),
        "kiln_cuda_num_inputs": ([vp], ctypes.c_int),
        "kiln_cuda_num_outputs": ([vp], ctypes.c_int),
        "kiln_cuda_num_symbols": ([vp], ctypes.c_int),
        "kiln_cuda_workspace_bytes": ([vp, p64, ctypes.c_int], i64),
        "kiln_cuda_run": ([vp, ctypes.POINTER(vp), vp, vp, p64, ctypes.c_int], ctypes.c_int),
        "kiln_cuda_function_load": ([ctypes.c_int, vp, sz, cp], vp),
        "kiln_cuda_function_free": ([vp], None),
        "kiln_cuda_function_launch": ([vp, ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_uint),
                                       ctypes.c_uint, vp, ctypes.POINTER(vp)], ctypes.c_int),
    }
    for name, (argtypes, restype) in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = restype
    return lib


def last_error() -> CoreError:
    """The calling thread's last core failure, as an exception."""
    lib_ = lib()
    message = (lib_.kiln_core_last_error() or b"").decode(errors="replace")
    return CoreError(message or "kiln core call failed", int(lib_.kiln_core_last_error_code()))


def _bytes_pointer(data: Union[bytes, bytearray, memoryview]) -> tuple[Any, int, Any]:
    """(pointer, length, keep-alive) for a buffer handed to the core without a copy when it can
    be: bytes are passed as they are, writable buffers through ctypes."""
    if isinstance(data, bytes):
        return ctypes.c_char_p(data), len(data), data
    view = memoryview(data).cast("B")
    if view.readonly:
        raw = view.tobytes()
        return ctypes.c_char_p(raw), len(raw), raw
    buf = (ctypes.c_char * len(view)).from_buffer(view)
    return buf, len(view), (buf, view)


def sha256_hex(data: Union[bytes, bytearray, memoryview]) -> str:
    """Lowercase hex SHA-256, computed by the core."""
    ptr, n, _keep = _bytes_pointer(data)
    out = ctypes.create_string_buffer(65)
    lib().kiln_sha256_hex(ctypes.cast(ptr, ctypes.c_void_p), n, out)
    return out.value.decode()


def answer_name(address: str, request_key: str) -> str:
    """The name of the answer to ``request_key`` from the daemon at ``address`` in the answers
    folder (``client/core/FORMAT.md``)."""
    out = ctypes.create_string_buffer(65)
    lib().kiln_answer_name(address.encode(), request_key.encode(), out)
    return out.value.decode()


# ------------------------------------------------------------------- signed results, request keys

# enum kiln_trust_outcome.
(TRUST_OK, TRUST_KEY_UNREADABLE, TRUST_KEY_NOT_PEM, TRUST_KEY_NOT_ED25519, TRUST_MALFORMED, TRUST_UNSIGNED,
 TRUST_OTHER_ALGORITHM, TRUST_UNTRUSTED_KEY, TRUST_MISMATCH) = range(9)


def result_signed_bytes(handle: str, result: bytes) -> bytes:
    """The bytes the signature of ``result`` (a serialized kiln.v1.ActionResult) for the action
    ``handle`` covers (wire/FORMAT.md); CoreError INVALID_ARGUMENT for bytes that are no result."""
    lib_ = lib()
    data, size = ctypes.c_void_p(), ctypes.c_size_t()
    if lib_.kiln_result_signed_bytes(handle.encode(), result, len(result), ctypes.byref(data),
                                     ctypes.byref(size)) != 0:
        raise last_error()
    try:
        return ctypes.string_at(data, size.value)
    finally:
        lib_.kiln_core_free(data)


def request_key(graph: bytes, target: bytes, options: bytes) -> str:
    """The request key of a request given as its three messages' deterministic serializations."""
    out = ctypes.create_string_buffer(65)
    lib().kiln_request_key(graph, len(graph), target, len(target), options, len(options), out)
    return out.value.decode()


class Trust:
    """Trusted Ed25519 public keys held by the core, and the check of a result's signature
    against them. Keys are added before the object is shared between threads."""

    def __init__(self) -> None:
        lib_ = lib()
        handle = lib_.kiln_trust_new()
        if not handle:
            raise CoreError("out of memory", INTERNAL)
        self._handle = handle
        self._lib = lib_
        self._verify = lib_.kiln_trust_verify

    def __del__(self) -> None:
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            self._lib.kiln_trust_free(handle)

    def add_key_file(self, path: str) -> tuple[int, str]:
        """Adds the PEM Ed25519 public key in ``path``: (TRUST_OK, its key id), or (the outcome,
        the core's message) when the file is not such a key."""
        key_id = ctypes.create_string_buffer(17)
        outcome = self._lib.kiln_trust_add_key_file(self._handle, path.encode(), key_id)
        if outcome < 0:
            raise last_error()
        if outcome != TRUST_OK:
            return outcome, last_error().args[0]
        return TRUST_OK, key_id.value.decode()

    def verify(self, handle: str, result: bytes) -> int:
        """The outcome of checking ``result`` (a serialized kiln.v1.ActionResult) for the action
        ``handle``: TRUST_OK, or what refuses it (the core's message in :func:`last_error`)."""
        outcome = self._verify(self._handle, handle.encode(), result, len(result))
        if outcome < 0:
            raise last_error()
        return int(outcome)


class Store:
    """The machine's artifact store (``client/core/store.h`` states its layout and rules), and
    the answers folder under the same root (``client/core/answers.h``)."""

    def __init__(self, root: Optional[Union[str, Path]] = None) -> None:
        lib_ = lib()
        handle = lib_.kiln_store_open(str(root).encode() if root is not None else None)
        if not handle:
            raise last_error()
        self._handle = handle
        self._lib = lib_
        self.root = Path(lib_.kiln_store_root(handle).decode())

    def __del__(self) -> None:
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            self._lib.kiln_store_close(handle)

    def path_for(self, digest: str) -> Path:
        """Where the store keeps ``digest`` (whether or not it is there; the layout is the
        core's): CoreError INVALID_ARGUMENT for a malformed digest. Not verified: see find."""
        out = ctypes.create_string_buffer(_PATH_MAX)
        if self._lib.kiln_store_path_for(self._handle, digest.encode(), out, _PATH_MAX) < 0:
            raise last_error()
        return Path(out.value.decode())

    def find(self, digest: str) -> Optional[Path]:
        """The path of a verified artifact, or None (a corrupt file is deleted and absent)."""
        out = ctypes.create_string_buffer(_PATH_MAX)
        rc = self._lib.kiln_store_find(self._handle, digest.encode(), out, _PATH_MAX)
        if rc < 0:
            raise last_error()
        return Path(out.value.decode()) if rc == 1 else None

    def put(self, digest: str, data: Union[bytes, bytearray, memoryview]) -> Path:
        """Stores ``data`` under ``digest`` once it hashes to it (CoreError DATA_LOSS otherwise,
        nothing written); returns the path."""
        ptr, n, _keep = _bytes_pointer(data)
        out = ctypes.create_string_buffer(_PATH_MAX)
        rc = self._lib.kiln_store_put(self._handle, digest.encode(), ctypes.cast(ptr, ctypes.c_void_p), n,
                                      out, _PATH_MAX)
        if rc < 0:
            raise last_error()
        return Path(out.value.decode())

    def add(self, data: Union[bytes, bytearray, memoryview]) -> tuple[str, Path]:
        """Stores ``data`` under its SHA-256, which the core computes (once); returns (digest,
        path)."""
        ptr, n, _keep = _bytes_pointer(data)
        digest = ctypes.create_string_buffer(65)
        out = ctypes.create_string_buffer(_PATH_MAX)
        rc = self._lib.kiln_store_add(self._handle, ctypes.cast(ptr, ctypes.c_void_p), n, digest, out, _PATH_MAX)
        if rc < 0:
            raise last_error()
        return digest.value.decode(), Path(out.value.decode())

    def load_answer(self, name: str, max_age_s: float) -> Optional[tuple[bytes, bool]]:
        """The answer saved under ``name`` when it is there, intact and at most ``max_age_s``
        seconds old, with whether its file is private to this user; None otherwise (a damaged
        file is removed). CoreError INVALID_ARGUMENT for a malformed name."""
        data, size, private = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_int()
        rc = self._lib.kiln_store_load_answer(self._handle, name.encode(), max_age_s, ctypes.byref(data),
                                              ctypes.byref(size), ctypes.byref(private))
        if rc <= 0:
            if rc < 0:
                raise last_error()
            return None
        try:
            return ctypes.string_at(data, size.value), bool(private.value)
        finally:
            self._lib.kiln_core_free(data)

    def save_answer(self, name: str, response: bytes) -> None:
        """Saves ``response`` as the answer ``name``, atomically (CoreError when the name is
        malformed or the file system refuses)."""
        if self._lib.kiln_store_save_answer(self._handle, name.encode(), response, len(response)) < 0:
            raise last_error()

    def drop_answer(self, name: str) -> None:
        """Forgets the answer ``name`` (CoreError INVALID_ARGUMENT for a malformed name)."""
        if self._lib.kiln_store_drop_answer(self._handle, name.encode()) < 0:
            raise last_error()

    def counters(self) -> dict[str, int]:
        """hits, corruptions and puts since this store was opened."""
        values = [ctypes.c_int64() for _ in range(3)]
        self._lib.kiln_store_counters(self._handle, *(ctypes.byref(v) for v in values))
        return dict(zip(("hits", "corruptions", "puts"), (v.value for v in values)))


class CpuLibrary:
    """A CPU kernel library opened by the core (once per process per path or name)."""

    def __init__(self, handle: int) -> None:
        lib_ = lib()
        self.abi_version = int(lib_.kiln_cpu_abi_version(handle))
        self.run_address = int(lib_.kiln_cpu_run_function(handle) or 0)
        self.workspace_address = int(lib_.kiln_cpu_workspace_function(handle) or 0)

    @classmethod
    def open(cls, path: Union[str, Path]) -> "CpuLibrary":
        handle = lib().kiln_cpu_open(str(path).encode())
        if not handle:
            raise last_error()
        return cls(handle)

    @classmethod
    def open_image(cls, image: Union[bytes, bytearray, memoryview], name: str) -> "CpuLibrary":
        ptr, n, _keep = _bytes_pointer(image)
        handle = lib().kiln_cpu_open_image(ctypes.cast(ptr, ctypes.c_void_p), n, name.encode())
        if not handle:
            raise last_error()
        return cls(handle)


def cpu_library_count() -> int:
    """How many kernel libraries this process has opened through the core."""
    return int(lib().kiln_cpu_library_count())


# ---------------------------------------------------------------------------------- CUDA

def cuda_device_count() -> int:
    """How many CUDA devices the driver sees; CoreError without a usable driver."""
    n = lib().kiln_cuda_device_count()
    if n < 0:
        raise last_error()
    return int(n)


def cuda_device_sm(device: int) -> int:
    """The compute capability of ``device`` as kiln's sm number (90 for 9.0)."""
    sm = lib().kiln_cuda_device_sm(int(device))
    if sm < 0:
        raise last_error()
    return int(sm)


def cuda_current_device() -> int:
    """The device of the calling thread's current CUDA context (0 when it has none)."""
    dev = lib().kiln_cuda_current_device()
    if dev < 0:
        raise last_error()
    return int(dev)


def _sizes_array(sizes: Sequence[int]) -> tuple[Any, int]:
    n = len(sizes)
    return ((ctypes.c_int64 * n)(*sizes) if n else None), n


class CudaModule:
    """A CUDA result loaded by the core on one device (``client/core/cuda_loader.h``): its cubin,
    or its PTX when the driver refuses the cubin, bound to its launch plan (plan.json's text,
    :func:`kiln.plan.plan_json`). ``device`` -1 loads into the calling thread's context."""

    def __init__(self, device: int, cubin: Optional[bytes], ptx: Optional[bytes], plan_json: str) -> None:
        lib_ = lib()
        image = cubin or b""
        handle = lib_.kiln_cuda_load(int(device), image or None, len(image),
                                     ptx, plan_json.encode())
        if not handle:
            raise last_error()
        self._handle = handle
        self._lib = lib_
        self.from_ptx = bool(lib_.kiln_cuda_loaded_from_ptx(handle))
        self.num_inputs = int(lib_.kiln_cuda_num_inputs(handle))
        self.num_outputs = int(lib_.kiln_cuda_num_outputs(handle))
        self.num_symbols = int(lib_.kiln_cuda_num_symbols(handle))
        self._run = lib_.kiln_cuda_run
        self._pointers = ctypes.c_void_p * (self.num_inputs + self.num_outputs)

    def __del__(self) -> None:
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            self._lib.kiln_cuda_free(handle)

    def workspace_bytes(self, sizes: Sequence[int] = ()) -> int:
        """The workspace a run at ``sizes`` needs (CoreError INVALID_ARGUMENT for sizes the
        kernels cannot run at)."""
        arr, n = _sizes_array(sizes)
        got = self._lib.kiln_cuda_workspace_bytes(self._handle, arr, n)
        if got < 0:
            raise last_error()
        return int(got)

    def run(self, pointers: Sequence[int], workspace: Optional[int], stream: int, sizes: Sequence[int] = ()) -> None:
        """Launches the plan on ``stream``: ``pointers`` are the inputs' then the outputs' device
        addresses; ``workspace`` :meth:`workspace_bytes` bytes (None: the module's own)."""
        arr, n = _sizes_array(sizes)
        if self._run(self._handle, self._pointers(*pointers), workspace, stream or None, arr, n) != 0:
            raise last_error()


class CudaFunction:
    """One kernel of a cubin loaded by the core on ``device``, without a launch plan (a raw
    kernel): launched with the caller's parameter block."""

    def __init__(self, device: int, cubin: bytes, name: str) -> None:
        lib_ = lib()
        handle = lib_.kiln_cuda_function_load(int(device), cubin, len(cubin), name.encode())
        if not handle:
            raise last_error()
        self._handle = handle
        self._lib = lib_

    def __del__(self) -> None:
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            self._lib.kiln_cuda_function_free(handle)

    def launch(self, grid: Sequence[int], block: Sequence[int], shared_bytes: int, stream: int, params: Any) -> None:
        """cuLaunchKernel with ``params`` (a ctypes array of pointers to each argument's value)."""
        g = (ctypes.c_uint * 3)(*grid)
        b = (ctypes.c_uint * 3)(*block)
        if self._lib.kiln_cuda_function_launch(self._handle, g, b, int(shared_bytes), stream or None, params) != 0:
            raise last_error()
