"""Running kiln's CUDA artifacts from Python: a per-device module cache and launching a compiled
graph's launch plan on CUDA arrays, through the client core's CUDA loader.

The loading and launching is the client core's (``client/core/cuda_loader.h`` in
``libkiln_core.so``, bound by :mod:`kiln.core`): the same code that runs kernels for the C++
client and the torch part runner. This module imports neither PyTorch nor CuPy unless the
arrays it is given come from them (or a DLPack capsule has to be wrapped). Two layers, each
usable alone:

- :class:`CudaKernel` / :func:`load_kernel`: a compiled result's cubin (or, failing that, its
  PTX) loaded once per device into the device's primary context, the context the CUDA runtime,
  PyTorch and CuPy all use. :meth:`CudaKernel.launch` runs the plan's steps given raw device
  pointers (inputs in graph order, then outputs), a workspace pointer and a ``CUstream``.
- :func:`run_compiled`: what ``Compiled.__call__`` does for a CUDA target. It takes PyTorch CUDA
  tensors, CuPy arrays, objects with ``__cuda_array_interface__`` or a CUDA ``__dlpack__``;
  allocates outputs and the workspace with the arrays' own allocator; launches on that
  framework's current stream; returns arrays of the same kind.

Every pointer must be 16-byte aligned (generated kernels use vector loads); :func:`run_compiled`
copies an argument that is not. :class:`RawKernel` compiles a hand-written kernel on kilnd and
launches it through the same core.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import importlib
import sys
import threading
from typing import Any, Optional, Sequence

import numpy as np

from . import core, ext, native
from . import dtypes as dt
from ._once import OncePerKey
from .connection import Connection
from .errors import KilnError
from .plan import eval_size, plan_json
from .v1 import service_pb2

#: Every buffer pointer a kiln kernel receives must be a multiple of this.
ALIGNMENT = 16
# DLPack device types that CUDA kernels can read: kDLCUDA and kDLCUDAManaged.
_DLPACK_CUDA = (2, 13)


# ---------------------------------------------------------------------------------- devices

def _loaded(name: str) -> Any:
    """A framework module if this process already imported it (never imports it)."""
    return sys.modules.get(name)


def _import(name: str) -> Any:
    """A framework module, imported on demand; None when it is not installed."""
    mod = sys.modules.get(name)
    if mod is not None:
        return mod
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def cuda_available() -> bool:
    """Whether this process can run CUDA kernels: a driver and at least one device."""
    try:
        return core.cuda_device_count() > 0
    except KilnError:
        return False


def current_device() -> int:
    """The current CUDA device: PyTorch's or CuPy's when the process uses one of them, else the
    device of the thread's current driver context, else 0."""
    torch = _loaded("torch")
    if torch is not None and torch.cuda.is_available():
        return int(torch.cuda.current_device())
    cupy = _loaded("cupy")
    if cupy is not None:
        return int(cupy.cuda.runtime.getDevice())
    return core.cuda_current_device()


_sm_cache: dict[int, int] = {}


def device_sm(device_index: int) -> int:
    """The compute capability of a device as kiln's sm number (90 for 9.0): from
    ``torch.cuda.get_device_capability`` when PyTorch is in use, else from the driver."""
    sm = _sm_cache.get(device_index)
    if sm is None:
        torch = _loaded("torch")
        if torch is not None and torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(device_index)
            sm = int(major) * 10 + int(minor)
        else:
            sm = core.cuda_device_sm(device_index)
        _sm_cache[device_index] = sm
    return sm


def current_device_sm() -> int:
    """The sm number of the current device (what a plain ``"cuda"`` target means)."""
    return device_sm(current_device())


# ---------------------------------------------------------------------------------- kernels

def _dims(v: Sequence[int]) -> tuple[int, int, int]:
    d = [int(x) for x in v][:3]
    while len(d) < 3:
        d.append(1)
    return d[0], d[1], d[2]


def _device_index(device: Any) -> int:
    """A device index from an int or anything with an ``index`` (a ``torch.device``)."""
    if isinstance(device, int):
        return device
    index = getattr(device, "index", None)
    return int(index) if index is not None else current_device()


class CudaKernel:
    """A compiled result's kernels loaded on one device, launchable on any stream there.

    ``compiled`` is a :class:`kiln.Compiled` for a CUDA target (its plan and artifacts are read;
    the images are fetched and verified through its client). ``device`` is a device index (or
    a ``torch.device``). Loading fails with KilnError when the device is older than the target,
    or when neither the cubin nor the PTX loads. Use :func:`load_kernel` to load once per
    process. :meth:`launch` is thread-safe.
    """

    def __init__(self, compiled: Any, device: Any) -> None:
        plan = compiled.plan
        self.handle: str = compiled.handle
        self.device_index = _device_index(device)
        target = getattr(compiled, "target", None)
        dev_sm = device_sm(self.device_index)
        if target is not None and target.is_cuda and target.sm > dev_sm:
            raise KilnError(f"{self.handle[:12]} was compiled for {target}, but device {self.device_index} is "
                            f"sm_{dev_sm}: compile for cuda:sm_{dev_sm}")
        images: dict[int, bytes] = {}
        for kind in (service_pb2.CUBIN, service_pb2.PTX):
            art = compiled.artifact(kind)
            if art is not None:
                images[kind] = compiled.client.read_verified(art.digest, size=art.size or None)
        if not images:
            raise KilnError(f"{self.handle[:12]} has neither a cubin nor PTX")
        try:
            self._module = core.CudaModule(self.device_index, images.get(service_pb2.CUBIN),
                                           images.get(service_pb2.PTX), plan_json(plan))
        except core.CoreError as e:
            raise KilnError(f"cannot load {self.handle[:12]} on device {self.device_index} (sm_{dev_sm}): {e}") from e
        self.image_kind = "PTX" if self._module.from_ptx else "CUBIN"
        #: Whether the plan has symbolic sizes (ABI 2): launches then take the sizes.
        self.symbolic = self._module.num_symbols > 0
        self.num_symbols = self._module.num_symbols
        self.num_pointers = self._module.num_inputs + self._module.num_outputs
        self._static_workspace = 0 if self.symbolic else self._module.workspace_bytes()

    def workspace_bytes(self, sizes: Optional[Sequence[int]] = None) -> int:
        """Workspace bytes a launch needs (at ``sizes`` for a symbolic plan); KilnError for
        sizes its kernels cannot run at."""
        if not self.symbolic:
            return self._static_workspace
        try:
            return self._module.workspace_bytes(sizes or ())
        except core.CoreError as e:
            raise KilnError(f"{self.handle[:12]}: {e}") from e

    def launch(self, ptrs: Sequence[int], workspace: Optional[int], stream: int,
               sizes: Optional[Sequence[int]] = None) -> None:
        """Launches every step, in order, on ``stream`` (a ``CUstream`` handle as an int; 0 is
        the legacy default stream).

        ``ptrs``: device pointers of the inputs in graph order, then the outputs.
        ``workspace``: :meth:`workspace_bytes` bytes of device memory (None when 0).
        ``sizes``: a symbolic plan's sizes, one per ``plan.symbols``.
        Launches are asynchronous; the caller keeps the buffers alive (and, with a
        stream-ordered allocator such as PyTorch's or CuPy's, allocated on ``stream``) until
        the kernels are done.
        """
        if len(ptrs) < self.num_pointers:
            raise KilnError(f"{self.handle[:12]} takes {self.num_pointers} buffer pointers, got {len(ptrs)}")
        if self.symbolic and sizes is None:
            raise KilnError(f"{self.handle[:12]} has symbolic sizes: launch it with sizes=")
        if self.symbolic and not workspace and self.workspace_bytes(sizes) > 0:
            raise KilnError(f"{self.handle[:12]} needs a workspace of {self.workspace_bytes(sizes)} bytes "
                            f"at sizes {list(sizes or ())}")
        if not self.symbolic and not workspace and self._static_workspace > 0:
            raise KilnError(f"{self.handle[:12]} needs a workspace of {self._static_workspace} bytes")
        try:
            self._module.run(ptrs[:self.num_pointers], workspace, stream, sizes if self.symbolic else ())
        except core.CoreError as e:
            raise KilnError(f"{self.handle[:12]}: {e}") from e


_kernels = OncePerKey()  # (handle, device index) -> CudaKernel


def load_kernel(compiled: Any, device: Any = None) -> CudaKernel:
    """The kernels of ``compiled`` on ``device`` (an index, a ``torch.device``, or None for the
    current device): fetched and loaded once per process per device; different results load
    concurrently."""
    index = current_device() if device is None else _device_index(device)
    return _kernels.get((compiled.handle, index), lambda: CudaKernel(compiled, index))


def loaded_kernel_count() -> int:
    """How many (result, device) pairs this process has loaded (for tests and diagnostics)."""
    return len(_kernels)


# ---------------------------------------------------------------------------------- arrays

class _Torch:
    """PyTorch CUDA tensors: torch's caching allocator and current stream."""

    name = "torch"

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self._to_kiln = {
            torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32", torch.float64: "f64",
            torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64",
            torch.uint8: "u8", torch.bool: "bool",
        }
        self._from_kiln = {v: k for k, v in self._to_kiln.items()}

    def owns(self, a: Any) -> bool:
        return isinstance(a, self.torch.Tensor)

    def dtype(self, a: Any) -> str:
        try:
            return self._to_kiln[a.dtype]
        except KeyError:
            raise TypeError(f"kiln does not support dtype {a.dtype} (supported: {', '.join(dt.DTYPES)})") from None

    def shape(self, a: Any) -> tuple[int, ...]:
        return tuple(a.shape)

    def device(self, a: Any) -> int:
        return int(a.device.index) if a.device.index is not None else int(self.torch.cuda.current_device())

    def ptr(self, a: Any) -> int:
        return int(a.data_ptr())

    def strides(self, a: Any) -> tuple[int, ...]:
        return tuple(a.stride())

    def is_contiguous(self, a: Any) -> bool:
        return bool(a.is_contiguous())

    def contiguous_copy(self, a: Any) -> Any:
        return a.clone(memory_format=self.torch.contiguous_format)

    def empty(self, shape: Sequence[int], dtype: str, device: int) -> Any:
        return self.torch.empty(tuple(shape), dtype=self._from_kiln[dtype], device=self.torch.device("cuda", device))

    def empty_bytes(self, nbytes: int, device: int) -> Any:
        return self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.torch.device("cuda", device))

    def stream(self, device: int) -> int:
        return int(self.torch.cuda.current_stream(device).cuda_stream)

    def on_device(self, device: int) -> Any:
        return contextlib.nullcontext()  # every call above names the device

    def wrap(self, a: Any) -> Any:
        """A zero-copy tensor over another CUDA array (``__cuda_array_interface__``)."""
        return self.torch.as_tensor(a)

    def from_dlpack(self, a: Any) -> Any:
        return self.torch.from_dlpack(a)


class _Cupy:
    """CuPy arrays: CuPy's memory pool and the current device's current stream."""

    name = "cupy"

    def __init__(self) -> None:
        import cupy

        self.cupy = cupy

    def owns(self, a: Any) -> bool:
        return isinstance(a, self.cupy.ndarray)

    def dtype(self, a: Any) -> str:
        return dt.dtype_name(a.dtype)

    def shape(self, a: Any) -> tuple[int, ...]:
        return tuple(a.shape)

    def device(self, a: Any) -> int:
        return int(a.device.id)

    def ptr(self, a: Any) -> int:
        return int(a.data.ptr)

    def strides(self, a: Any) -> tuple[int, ...]:
        size = a.itemsize
        if any(s % size for s in a.strides):
            return tuple(-1 for _ in a.strides)  # not expressible in elements: never matches
        return tuple(s // size for s in a.strides)

    def is_contiguous(self, a: Any) -> bool:
        return bool(a.flags.c_contiguous)

    def contiguous_copy(self, a: Any) -> Any:
        return self.cupy.array(a, order="C", copy=True)

    def empty(self, shape: Sequence[int], dtype: str, device: int) -> Any:
        with self.cupy.cuda.Device(device):
            return self.cupy.empty(tuple(shape), dtype=dt.to_numpy(dtype))

    def empty_bytes(self, nbytes: int, device: int) -> Any:
        with self.cupy.cuda.Device(device):
            return self.cupy.empty(nbytes, dtype=np.uint8)

    def stream(self, device: int) -> int:
        with self.cupy.cuda.Device(device):
            return int(self.cupy.cuda.get_current_stream().ptr)

    def on_device(self, device: int) -> Any:
        # CuPy allocates on, and copies with the stream of, the current device.
        return self.cupy.cuda.Device(device)

    def wrap(self, a: Any) -> Any:
        return self.cupy.asarray(a)

    def from_dlpack(self, a: Any) -> Any:
        return self.cupy.from_dlpack(a)


_frameworks: dict[str, Any] = {}


def _framework(name: str) -> Any:
    fw = _frameworks.get(name)
    if fw is None:
        fw = _Torch() if name == "torch" else _Cupy()
        _frameworks[name] = fw
    return fw


_HOST_HINT = ("pass a CUDA array (a PyTorch CUDA tensor, a CuPy array, or an object with "
              "__cuda_array_interface__ or a CUDA __dlpack__), e.g. torch.as_tensor(x, device='cuda') "
              "or cupy.asarray(x)")


def as_cuda_array(obj: Any, what: str) -> tuple[Any, str]:
    """``obj`` as a PyTorch tensor or CuPy array on a CUDA device, and which of the two.

    PyTorch tensors and CuPy arrays are taken as they are. Other objects with
    ``__cuda_array_interface__`` are wrapped without a copy (by CuPy when installed, else
    PyTorch); objects with a CUDA ``__dlpack__`` go through ``torch.from_dlpack`` (or CuPy's).
    Raises TypeError, naming ``what``, for host memory (NumPy arrays, CPU tensors) and for
    anything else.
    """
    torch = _loaded("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        if obj.device.type != "cuda":
            raise TypeError(f"{what} is a torch tensor on {obj.device}; {_HOST_HINT}")
        return obj, "torch"
    cupy = _loaded("cupy")
    if cupy is not None and isinstance(obj, cupy.ndarray):
        return obj, "cupy"
    if isinstance(obj, (np.ndarray, np.generic)):
        raise TypeError(f"{what} is a NumPy {'array' if isinstance(obj, np.ndarray) else 'scalar'} in host memory; {_HOST_HINT}")
    if hasattr(obj, "__cuda_array_interface__"):
        for name in ("cupy", "torch"):
            if _import(name) is not None:
                fw = _framework(name)
                return fw.wrap(obj), name
        raise TypeError(f"{what} ({type(obj).__name__}) has __cuda_array_interface__, but wrapping it needs CuPy or PyTorch")
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        dev_type = int(obj.__dlpack_device__()[0])
        if dev_type not in _DLPACK_CUDA:
            raise TypeError(f"{what} ({type(obj).__name__}) lives on DLPack device type {dev_type}, not CUDA; {_HOST_HINT}")
        for name in ("torch", "cupy"):
            if _import(name) is not None:
                fw = _framework(name)
                return fw.from_dlpack(obj), name
        raise TypeError(f"{what} ({type(obj).__name__}) is a DLPack CUDA array, but importing it needs PyTorch or CuPy")
    raise TypeError(f"{what} ({type(obj).__name__}) is not a CUDA array; {_HOST_HINT}")


def describe(obj: Any, framework: str) -> tuple[str, tuple[int, ...], int]:
    """(kiln dtype, shape, device index) of an array :func:`as_cuda_array` returned."""
    fw = _framework(framework)
    return fw.dtype(obj), fw.shape(obj), fw.device(obj)


def default_framework() -> str:
    """The framework outputs come from when a call has no array inputs: PyTorch when this
    process uses it, else CuPy, else whichever is installed."""
    for name in ("torch", "cupy"):
        if _loaded(name) is not None:
            return name
    for name in ("torch", "cupy"):
        if _import(name) is not None:
            return name
    raise KilnError("running a CUDA graph without array inputs needs PyTorch or CuPy to allocate its outputs")


def run_compiled(compiled: Any, arrays: Sequence[Any], out: Optional[Sequence[Any]] = None) -> Any:
    """Runs a CUDA-compiled graph on CUDA arrays; what ``Compiled.__call__`` does for CUDA.

    ``arrays``: the inputs in graph order (see :func:`as_cuda_array` for what is accepted), on
    one device, with the graph's dtypes and shapes (TypeError/ValueError otherwise). An input
    that is not C-contiguous is copied first, unless the graph declared its strides, in which
    case it must have exactly those; one that is not 16-byte aligned is copied too.

    Outputs (unless ``out`` gives contiguous arrays of the right dtypes and shapes on that
    device) and the workspace are allocated by the inputs' framework: ``torch.empty`` when any
    input is a PyTorch tensor (CuPy inputs are then viewed as tensors), else ``cupy.empty``.
    The kernels run on that framework's current stream for the device, asynchronously, like
    its own operations. Returns the output array for a one-output graph, else a tuple.

    PyTorch tensors take a native path once the native part runner is loaded (its build on
    the result's daemon starts with the first such call): the same checks, allocations and
    launches in one C++ call through the C++ client's loader (about a tenth of the host time).
    """
    if out is None and arrays:
        got = _native_call(compiled, arrays)
        if got is not None:
            return got[0] if len(got) == 1 else got
    handle = compiled.handle[:12]
    specs = compiled.inputs
    if len(arrays) != len(specs):
        raise TypeError(f"{handle} takes {len(specs)} inputs, got {len(arrays)}")
    adapted: list[Any] = []
    kinds: list[str] = []
    for spec, a in zip(specs, arrays):
        obj, kind = as_cuda_array(a, f"input {spec.name!r} of {handle} (compiled for {compiled.target})")
        adapted.append(obj)
        kinds.append(kind)
    name = "torch" if "torch" in kinds else kinds[0] if kinds else default_framework()
    fw = _framework(name)
    # A CuPy array next to PyTorch tensors is viewed as a tensor (no copy).
    adapted = [a if k == name else fw.wrap(a) for a, k in zip(adapted, kinds)]
    devices = {fw.device(a) for a in adapted}
    if len(devices) > 1:
        raise ValueError(f"{handle}: inputs on several devices {sorted(devices)}; kiln runs a graph on one")
    device = devices.pop() if devices else current_device()

    sizes: Optional[list[int]] = None
    in_shapes = [tuple(spec.shape) for spec in specs]
    out_shapes = [tuple(spec.shape) for spec in compiled.outputs]
    if compiled.symbols:
        # Symbolic sizes: read from the input dimensions the plan names; every input is then
        # checked against, and every output allocated from, its shape expressions.
        sizes = []
        for sym in compiled.plan.symbols:
            shape = fw.shape(adapted[sym.input])
            if sym.axis >= len(shape):
                raise ValueError(f"input {specs[sym.input].name!r}: rank {len(shape)}, expected {len(specs[sym.input].shape)}")
            sizes.append(int(shape[sym.axis]))
        in_shapes = [tuple(eval_size(e, sizes) for e in exprs) for exprs in compiled._in_exprs]
        out_shapes = [tuple(eval_size(e, sizes) for e in exprs) for exprs in compiled._out_exprs]

    with fw.on_device(device):
        keep: list[Any] = []
        ptrs: list[int] = []
        for spec, a, want in zip(specs, adapted, in_shapes):
            dtype = fw.dtype(a)
            if dtype != spec.dtype:
                raise TypeError(f"input {spec.name!r}: dtype {dtype}, expected {spec.dtype}")
            if fw.shape(a) != want:
                shown = compiled._shape_text(spec, want) if sizes is not None else str(want)
                raise ValueError(f"input {spec.name!r}: shape {fw.shape(a)}, expected {shown}")
            if spec.strides:
                if fw.strides(a) != tuple(spec.strides):
                    raise ValueError(f"input {spec.name!r}: strides {fw.strides(a)} (elements), the graph declared {tuple(spec.strides)}")
            elif not fw.is_contiguous(a):
                a = fw.contiguous_copy(a)
            if fw.ptr(a) % ALIGNMENT and not spec.strides:
                # A view at an odd offset: kiln's vector loads need 16-byte alignment.
                a = fw.contiguous_copy(a)
            elif fw.ptr(a) % ALIGNMENT:
                raise ValueError(f"input {spec.name!r}: a strided view at address {fw.ptr(a):#x}, "
                                 f"not {ALIGNMENT}-byte aligned as kiln's kernels need")
            keep.append(a)
            ptrs.append(fw.ptr(a))
        results: list[Any] = []
        for i, (spec, shape) in enumerate(zip(compiled.outputs, out_shapes)):
            if out is not None:
                o = out[i]
                if (not fw.owns(o) or fw.dtype(o) != spec.dtype or fw.shape(o) != shape
                        or not fw.is_contiguous(o) or fw.device(o) != device or fw.ptr(o) % ALIGNMENT):
                    raise ValueError(f"out[{i}] must be a contiguous, {ALIGNMENT}-byte aligned {name} array of "
                                     f"{spec.dtype} {shape} on device {device}")
            else:
                o = fw.empty(shape, spec.dtype, device)
            results.append(o)
            ptrs.append(fw.ptr(o))
        kernel = load_kernel(compiled, device)
        ws_bytes = kernel.workspace_bytes(sizes)
        ws = fw.empty_bytes(ws_bytes, device) if ws_bytes > 0 else None
        kernel.launch(ptrs, fw.ptr(ws) if ws is not None else None, fw.stream(device), sizes)
        # The input copies and the workspace go back to the allocator here. Both PyTorch's
        # and CuPy's are stream-ordered: the memory is reused only by work queued after these
        # kernels on this stream.
        del keep, ws
    return results[0] if len(results) == 1 else tuple(results)


# Per (handle, device): the native runner's Part for a result, or False where it cannot take it.
_native_parts: dict[tuple[str, int], Any] = {}


def _native_call(compiled: Any, arrays: Sequence[Any]) -> Optional[tuple[Any, ...]]:
    """PyTorch CUDA tensors, with the native part runner loaded (:mod:`kiln.native`):
    the checks, allocations and launches of this call in one C++ call, through the C++
    client's loader. None where that path does not apply (other arrays, a layout or shape it
    leaves to the general path, which also words the errors); the first call with PyTorch
    tensors starts the runner's build on the result's daemon."""
    torch = sys.modules.get("torch")
    first = arrays[0]
    if torch is None or not isinstance(first, torch.Tensor) or not first.is_cuda:
        return None
    if native.RUNNER is None:
        native.start(compiled.client)
        return None
    device = first.get_device()
    key = (compiled.handle, device)
    part = _native_parts.get(key)
    if part is None:
        part = False
        declared = any(spec.strides for spec in compiled.inputs)
        if not (declared and compiled.symbols):  # symbolic parts take contiguous inputs only
            try:
                dtypes = _framework("torch")._from_kiln
                part = native.part_for(compiled, device, [dtypes[s.dtype] for s in compiled.inputs],
                                       [dtypes[s.dtype] for s in compiled.outputs],
                                       [tuple(s.strides) if s.strides else None for s in compiled.inputs],
                                       [None] * len(compiled.outputs), list(range(len(compiled.outputs))))
            except Exception:  # the general path serves this result
                part = False
        _native_parts[key] = part
    if part is False:
        return None
    return part(*arrays)


class RawKernel:
    """A hand-written CUDA kernel compiled by kilnd with NVRTC and cached cluster-wide, in the
    spirit of CuPy's ``RawKernel``.

    ``source``: CUDA C++; ``name``: the ``__global__`` function to launch (an ``extern "C"``
    name, or a C++ name expression such as ``"scale<float>"``, which kilnd lowers to its mangled
    name); ``options``: NVRTC options (``-arch`` is kiln's, from the device). Compiles on first
    use per architecture (or ahead of time with :meth:`compile`, on a machine without a GPU).

    Calling ``kernel(grid, block, args, shared_mem=0, stream=None)`` launches it: ``args`` are
    CUDA arrays (PyTorch tensors, CuPy arrays, anything with ``__cuda_array_interface__``:
    passed as their device pointer), NumPy scalars (passed with their own type), Python
    ``int`` (as a 64-bit integer), ``float`` (as a double) and ``bool``. The launch is
    asynchronous, on ``stream`` (a ``CUstream`` handle as an int) or else the current stream of
    the arrays' framework (PyTorch's, then CuPy's).
    """

    def __init__(self, source: str, name: str, options: Sequence[str] = (), *, client: Any = None) -> None:
        self.source = source
        self.name = name
        self.options = tuple(options)
        self._client = client
        self._built: dict[int, tuple[bytes, str]] = {}
        self._functions: dict[int, core.CudaFunction] = {}
        self._lock = threading.Lock()

    def _get_client(self) -> Any:
        if self._client is None:
            self._client = Connection()
        return self._client

    def compile(self, sm: int) -> tuple[bytes, str]:
        """(cubin, lowered name) for ``sm`` (e.g. 90), from kilnd's cache or compiled there."""
        with self._lock:
            if sm in self._built:
                return self._built[sm]
        client = self._get_client()
        request = service_pb2.CompileRawKernelRequest(source=self.source, name=self.name, options=list(self.options), sm=sm)
        outcome = ext.compile_raw_kernel(client, request)
        art = next((a for a in outcome.result.artifacts if a.kind == service_pb2.CUBIN), None)
        if art is None or not outcome.result.plan.steps:
            raise KilnError(f"kilnd's result for raw kernel {self.name!r} holds no cubin")
        cubin = client.read_verified(art.digest, size=art.size or None)
        lowered = outcome.result.plan.steps[0].kernel
        rec = dict(kind="raw_kernel", name=self.name,
                   request=base64.b64encode(request.SerializeToString(deterministic=True)).decode())
        ext.record_build(client, rec)
        with self._lock:
            self._built[sm] = (cubin, lowered)
        return cubin, lowered

    @property
    def lowered_name(self) -> Optional[str]:
        """The mangled name of the last compile, when there was one."""
        return next(iter(self._built.values()))[1] if self._built else None

    def _function(self, device: int) -> core.CudaFunction:
        with self._lock:
            hit = self._functions.get(device)
        if hit is not None:
            return hit
        cubin, lowered = self.compile(device_sm(device))
        try:
            fn = core.CudaFunction(device, cubin, lowered)
        except core.CoreError as e:
            raise KilnError(f"raw kernel {self.name!r} on device {device}: {e}") from e
        with self._lock:
            return self._functions.setdefault(device, fn)

    @staticmethod
    def _arg(a: Any, i: int) -> tuple[Any, Optional[int], Optional[str]]:
        """(ctypes value, device, framework) of one launch argument."""
        if isinstance(a, bool):
            return ctypes.c_bool(a), None, None
        if isinstance(a, int):
            return ctypes.c_int64(a), None, None
        if isinstance(a, float):
            return ctypes.c_double(a), None, None
        if isinstance(a, np.generic):
            kinds = {np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double,
                     np.dtype(np.int8): ctypes.c_int8, np.dtype(np.int16): ctypes.c_int16,
                     np.dtype(np.int32): ctypes.c_int32, np.dtype(np.int64): ctypes.c_int64,
                     np.dtype(np.uint8): ctypes.c_uint8, np.dtype(np.uint16): ctypes.c_uint16,
                     np.dtype(np.uint32): ctypes.c_uint32, np.dtype(np.uint64): ctypes.c_uint64,
                     np.dtype(np.bool_): ctypes.c_bool, np.dtype(np.float16): ctypes.c_uint16}
            t = kinds.get(a.dtype)
            if t is None:
                raise TypeError(f"argument {i}: NumPy scalars of {a.dtype} are not kernel arguments")
            return t(a.view(np.uint16).item() if a.dtype == np.float16 else a.item()), None, None
        obj, kind = as_cuda_array(a, f"argument {i}")
        fw = _framework(kind)
        return ctypes.c_void_p(fw.ptr(obj)), fw.device(obj), kind

    def __call__(self, grid: Sequence[int], block: Sequence[int], args: Sequence[Any], *, shared_mem: int = 0,
                 stream: Optional[int] = None) -> None:
        values = [self._arg(a, i) for i, a in enumerate(args)]
        devices = {d for _, d, _ in values if d is not None}
        if len(devices) > 1:
            raise ValueError(f"raw kernel {self.name!r}: arguments on several devices {sorted(devices)}")
        device = devices.pop() if devices else current_device()
        fn = self._function(device)
        if stream is None:
            kinds = [k for _, _, k in values if k is not None]
            name = "torch" if "torch" in kinds else kinds[0] if kinds else default_framework()
            stream = _framework(name).stream(device)
        holders = [v for v, _, _ in values]
        # One pointer per argument, to its value, and a null after the last.
        params = (ctypes.c_void_p * (len(holders) + 1))(*[ctypes.addressof(h) for h in holders])
        try:
            fn.launch(_dims(grid), _dims(block), int(shared_mem), stream, params)
        except core.CoreError as e:
            raise KilnError(f"launching raw kernel {self.name!r}: {e}") from e


__all__ = [
    "ALIGNMENT",
    "CudaKernel",
    "RawKernel",
    "as_cuda_array",
    "cuda_available",
    "current_device",
    "current_device_sm",
    "default_framework",
    "describe",
    "device_sm",
    "load_kernel",
    "loaded_kernel_count",
    "run_compiled",
]
