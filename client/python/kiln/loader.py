"""Loading and running CPU artifacts through ctypes.

A CPU artifact is a shared object exporting::

    uint32_t kiln_abi_version(void);
    int kiln_run(void* const* args, void* workspace, int num_threads);

or, for a graph with symbolic sizes (ABI version 2, kernels/codegen/ABI.md)::

    uint32_t kiln_abi_version(void);   /* 2 */
    int64_t kiln_workspace_bytes(const int64_t* sizes);
    int kiln_run(void* const* args, const int64_t* sizes, void* workspace, int num_threads);

``args`` holds the input buffers in graph input order, then the output buffers in graph output
order; ``workspace`` is ``plan.workspace_bytes`` bytes (NULL when 0); 0 means success. Each
shared object is opened once per process, keyed by its digest.

The loader is handed the bytes themselves, already hashed against the digest by the caller,
and the native client core (:mod:`kiln.core`) opens them from an anonymous in-memory file: the
code that runs is the code that was verified, whatever happens to the cache folder between the
check and the load.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import numpy as np

from . import core
from ._once import OncePerKey
from .errors import ArtifactError

#: The CPU artifact ABI this client speaks.
SUPPORTED_ABI_VERSIONS: frozenset[int] = frozenset({1, 2})

_ArgArray = ctypes.POINTER(ctypes.c_void_p)
_SizeArray = ctypes.POINTER(ctypes.c_int64)


_RunFn = ctypes.CFUNCTYPE(ctypes.c_int, _ArgArray, ctypes.c_void_p, ctypes.c_int)
_RunSizedFn = ctypes.CFUNCTYPE(ctypes.c_int, _ArgArray, _SizeArray, ctypes.c_void_p, ctypes.c_int)
_WorkspaceFn = ctypes.CFUNCTYPE(ctypes.c_int64, _SizeArray)


class CpuKernel:
    """An opened CPU artifact. Calls are thread-safe as far as the kernel is (kiln kernels keep
    no global state).

    The library is opened by the native client core (:mod:`kiln.core`), the C++ client's
    loader; its entry points are then called directly through ctypes (the GIL is released for
    each call)."""

    def __init__(self, image: Union[bytes, Path], digest: str) -> None:
        self.digest = digest
        try:
            if isinstance(image, (bytes, bytearray, memoryview)):
                library = core.CpuLibrary.open_image(image, digest)
            else:
                library = core.CpuLibrary.open(image)
        except core.CoreError as e:
            raise ArtifactError(f"cannot load {digest[:12]}: {e}", digest) from e
        self.abi_version = library.abi_version
        self._run_address = library.run_address
        self._workspace_address = library.workspace_address
        if self.abi_version == 2:
            self._run = _RunSizedFn(self._run_address)
            self._workspace_fn: Optional[Any] = _WorkspaceFn(self._workspace_address)
        else:
            self._run = _RunFn(self._run_address)
            self._workspace_fn = None

    def run(self, pointers: Sequence[int], workspace: Optional[int], num_threads: int,
            sizes: Optional[Sequence[int]] = None) -> int:
        """Calls ``kiln_run`` with raw buffer addresses (and, for ABI 2, the symbols' values);
        returns its status. The GIL is released for the duration of the call."""
        args = (ctypes.c_void_p * max(len(pointers), 1))(*pointers)
        if self.abi_version == 2:
            return int(self._run(args, _sizes(sizes), workspace, int(num_threads)))
        return int(self._run(args, workspace, int(num_threads)))

    @property
    def run_address(self) -> int:
        """The address of ``kiln_run``, for native callers (kiln.torch's part runner)."""
        return self._run_address

    @property
    def workspace_address(self) -> int:
        """The address of ``kiln_workspace_bytes`` (ABI 2), else 0."""
        return self._workspace_address

    def workspace_bytes(self, sizes: Sequence[int]) -> int:
        """ABI 2: the workspace this artifact needs for ``sizes`` (0 for ABI 1: see the plan)."""
        return int(self._workspace_fn(_sizes(sizes))) if self._workspace_fn is not None else 0


def _sizes(sizes: Optional[Sequence[int]]) -> Any:
    values = list(sizes or ())
    return (ctypes.c_int64 * max(len(values), 1))(*values)


_kernels = OncePerKey()  # digest -> CpuKernel


def load_cpu_kernel(image: Union[bytes, Path], digest: str, expected_abi: int) -> CpuKernel:
    """Opens the shared object (its verified bytes, or a path) once per process per digest and
    checks its ABI version. Different digests open concurrently."""
    k = _kernels.get(digest, lambda: CpuKernel(image, digest))
    if k.abi_version != expected_abi or k.abi_version not in SUPPORTED_ABI_VERSIONS:
        raise ArtifactError(
            f"artifact {digest[:12]} has ABI version {k.abi_version}; the plan says {expected_abi} "
            f"and this client supports {sorted(SUPPORTED_ABI_VERSIONS)}",
            digest,
        )
    return k


def loaded_kernel_count() -> int:
    """How many shared objects this process has opened (for tests and diagnostics)."""
    return len(_kernels)


def aligned_empty(nbytes: int, alignment: int = 64) -> np.ndarray:
    """An uninitialised uint8 buffer of ``nbytes`` whose data starts on ``alignment`` bytes."""
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    offset = (-raw.ctypes.data) % alignment
    return raw[offset:offset + nbytes]


def default_num_threads() -> int:
    """Threads a CPU kernel uses when the caller names none; the same rule as the C++ client
    (kernels/runtime/kiln_threads.h): ``$KILN_NUM_THREADS``, then ``$OMP_NUM_THREADS`` (its
    first entry: OpenMP allows a list per nesting level), then the CPUs this process may run on
    (its affinity mask). A variable that is not a positive integer is skipped."""
    for var in ("KILN_NUM_THREADS", "OMP_NUM_THREADS"):
        n = _positive_int(os.environ.get(var, "").split(",")[0])
        if n is not None:
            return n
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _positive_int(text: str) -> Optional[int]:
    try:
        n = int(text.strip())
    except ValueError:
        return None
    return n if n > 0 else None
