"""The CUDA side of kiln.torch: launching kiln's CUDA kernels on torch's stream, and replaying
compiled graphs through CUDA graphs (``mode="reduce-overhead"``).

Everything that touches the CUDA driver is in this module, so it can be fixed or swapped (for
the client library's C++ loader, say) without touching the rest of the backend. It talks to
``libcuda.so.1`` through ctypes: the library torch already loaded, so nothing is built.

Kernel launches follow the launch plan of the compiled result:

- ``plan.buffers``: inputs and outputs numbered in graph order (``index``), temporaries at a
  byte ``offset`` in one workspace of ``plan.workspace_bytes`` bytes;
- ``plan.steps``: one launch each: ``kernel`` (the function's name in the cubin), ``grid`` and
  ``block`` (x, y, z; missing ones are 1), ``shared_bytes`` of dynamic shared memory, and
  ``args``: indices into ``plan.buffers``, passed to the kernel as device pointers, in order.

The cubin (or, failing that, the PTX) is loaded once per device into torch's primary context.
Temporaries come from torch's caching allocator and kernels run on
``torch.cuda.current_stream()``, so kiln kernels order with torch's own work and torch's memory
reuse rules hold for them.
"""

from __future__ import annotations

import ctypes
import threading
import warnings
from typing import Any, Callable, Optional, Sequence

import torch

from .. import service_pb2
from ..errors import KilnError

# CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: needed before launching with more than 48 KiB.
_MAX_DYNAMIC_SHARED = 8
_STATIC_SHARED_LIMIT = 48 * 1024


class _Driver:
    """The few CUDA driver entry points kiln needs, bound once per process."""

    _instance: Optional["_Driver"] = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise KilnError(f"cannot open the CUDA driver (libcuda.so.1): {e}") from e
        vp, P = ctypes.c_void_p, ctypes.POINTER
        self._fns: dict[str, Any] = {}
        sigs: dict[str, list[Any]] = {
            "cuInit": [ctypes.c_uint],
            "cuCtxGetCurrent": [P(vp)],
            "cuCtxSetCurrent": [vp],
            "cuDeviceGet": [P(ctypes.c_int), ctypes.c_int],
            "cuDevicePrimaryCtxRetain": [P(vp), ctypes.c_int],
            "cuModuleLoadData": [P(vp), ctypes.c_char_p],
            "cuModuleGetFunction": [P(vp), vp, ctypes.c_char_p],
            "cuFuncSetAttribute": [vp, ctypes.c_int, ctypes.c_int],
            "cuLaunchKernel": [vp, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                               ctypes.c_uint, ctypes.c_uint, vp, P(vp), P(vp)],
            "cuGetErrorString": [ctypes.c_int, P(ctypes.c_char_p)],
        }
        for name, argtypes in sigs.items():
            fn = getattr(lib, name)
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int
            self._fns[name] = fn
        self.lib = lib
        self.check(self._fns["cuInit"](0), "cuInit")

    @classmethod
    def get(cls) -> "_Driver":
        with cls._lock:
            if cls._instance is None:
                cls._instance = _Driver()
            return cls._instance

    def __getattr__(self, name: str) -> Any:
        try:
            return self._fns[name]
        except KeyError:
            raise AttributeError(name) from None

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            msg = ctypes.c_char_p()
            self._fns["cuGetErrorString"](rc, ctypes.byref(msg))
            text = msg.value.decode(errors="replace") if msg.value else "unknown error"
            raise KilnError(f"{what} failed: CUDA error {rc} ({text})")

    def primary_context(self, device_index: int) -> int:
        """Torch's context on ``device_index`` (the device's primary context), made current."""
        dev = ctypes.c_int()
        self.check(self.cuDeviceGet(ctypes.byref(dev), device_index), "cuDeviceGet")
        ctx = ctypes.c_void_p()
        self.check(self.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        self.check(self.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        return int(ctx.value or 0)

    def make_current(self, ctx: int) -> None:
        """Makes ``ctx`` current on this thread unless it already is (autograd runs backward
        on its own threads, where nothing may be current yet)."""
        cur = ctypes.c_void_p()
        self.check(self.cuCtxGetCurrent(ctypes.byref(cur)), "cuCtxGetCurrent")
        if (cur.value or 0) != ctx:
            self.check(self.cuCtxSetCurrent(ctypes.c_void_p(ctx)), "cuCtxSetCurrent")


def _dims(v: Sequence[int]) -> tuple[int, int, int]:
    d = [int(x) for x in v][:3]
    while len(d) < 3:
        d.append(1)
    return d[0], d[1], d[2]


class CudaKernel:
    """A compiled result's kernels loaded on one device, launchable on any stream there.

    :meth:`launch` takes the part's device pointers (inputs in graph order, then outputs) and
    the workspace pointer, like the CPU ABI's ``kiln_run``.
    """

    def __init__(self, compiled: Any, device: torch.device) -> None:
        plan = compiled.plan
        art = compiled.artifact(service_pb2.CUBIN) or compiled.artifact(service_pb2.PTX)
        if art is None:
            raise KilnError(f"{compiled.handle[:12]} has neither a cubin nor PTX")
        image = compiled.client.fetch(art.digest, size=art.size or None).read_bytes()
        if art.kind == service_pb2.PTX and not image.endswith(b"\0"):
            image += b"\0"  # the driver reads PTX as a C string
        self.device_index = device.index if device.index is not None else torch.cuda.current_device()
        drv = _Driver.get()
        self._drv = drv
        torch.cuda.init()
        with torch.cuda.device(self.device_index):
            self.ctx = drv.primary_context(self.device_index)
            module = ctypes.c_void_p()
            # The image must stay alive during the call only: the driver copies it.
            drv.check(drv.cuModuleLoadData(ctypes.byref(module), image), "cuModuleLoadData")
            self._module = module
            n_in = sum(1 for b in plan.buffers if b.role == service_pb2.INPUT)
            # Each plan buffer as (slot in the pointer list, byte offset): inputs first, then
            # outputs, then the workspace at slot -1.
            where: list[tuple[int, int]] = []
            for b in plan.buffers:
                if b.role == service_pb2.INPUT:
                    where.append((b.index, 0))
                elif b.role == service_pb2.OUTPUT:
                    where.append((n_in + b.index, 0))
                elif b.role == service_pb2.TEMP:
                    where.append((-1, int(b.offset)))
                else:
                    raise KilnError(f"plan buffer with role {b.role}")
            functions: dict[str, ctypes.c_void_p] = {}
            self._steps: list[tuple[Any, ...]] = []
            for s in plan.steps:
                fn = functions.get(s.kernel)
                if fn is None:
                    fn = ctypes.c_void_p()
                    drv.check(drv.cuModuleGetFunction(ctypes.byref(fn), module, s.kernel.encode()),
                              f"cuModuleGetFunction({s.kernel})")
                    functions[s.kernel] = fn
                if s.shared_bytes > _STATIC_SHARED_LIMIT:
                    drv.check(drv.cuFuncSetAttribute(fn, _MAX_DYNAMIC_SHARED, int(s.shared_bytes)),
                              f"cuFuncSetAttribute({s.kernel})")
                if not s.grid or not s.block:
                    raise KilnError(f"step {s.kernel} has no grid or block")
                refs = [where[a] for a in s.args]
                # The argument block is built once: each launch only rewrites the pointer
                # values (the driver copies them at launch, so the block can be reused).
                vals = (ctypes.c_void_p * max(len(refs), 1))()
                params = (ctypes.c_void_p * max(len(refs), 1))(
                    *[ctypes.addressof(vals) + i * ctypes.sizeof(ctypes.c_void_p) for i in range(len(refs))])
                self._steps.append((fn, _dims(s.grid), _dims(s.block), int(s.shared_bytes), refs, vals, params))
        self._launch_lock = threading.Lock()
        self.handle = compiled.handle

    def launch(self, ptrs: Sequence[int], workspace: Optional[int], stream: int) -> None:
        """Launches every step on ``stream`` (a CUstream handle, as torch's ``cuda_stream``)."""
        drv = self._drv
        drv.make_current(self.ctx)
        ws = workspace or 0
        s = ctypes.c_void_p(stream)
        launch = drv.cuLaunchKernel
        with self._launch_lock:
            for fn, grid, block, shared, refs, vals, params in self._steps:
                for i, (slot, off) in enumerate(refs):
                    vals[i] = (ws if slot < 0 else ptrs[slot]) + off
                rc = launch(fn, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared, s, params, None)
                if rc != 0:
                    drv.check(rc, "cuLaunchKernel")


_kernels: dict[tuple[str, int], CudaKernel] = {}
_kernels_lock = threading.Lock()


def load_kernel(compiled: Any, device: torch.device) -> CudaKernel:
    """The kernels of ``compiled`` on ``device``: loaded once per process per device."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (compiled.handle, index)
    with _kernels_lock:
        k = _kernels.get(key)
        if k is None:
            k = CudaKernel(compiled, torch.device("cuda", index))
            _kernels[key] = k
        return k


# ---------------------------------------------------------------------------------- CUDA graphs

class CudaGraphRunner:
    """Replays a boxed compiled function (``fn(list_of_args) -> list``) through CUDA graphs.

    One graph per argument signature (shapes, strides, dtypes, devices). The first call with a
    signature runs ``fn`` as it is (a warm-up: lazy initialisation, library handles); the
    second captures it into a ``torch.cuda.CUDAGraph`` reading from static copies of the
    arguments; later calls copy the arguments in, replay, and return copies of the static
    results, so a result stays valid after the next replay. Arguments that are not all CUDA
    tensors, or a capture that fails (an op that synchronises with the host), make it run
    ``fn`` directly from then on, after one warning.
    """

    def __init__(self, fn: Callable[[list[Any]], Any], name: str = "graph") -> None:
        # An instance attribute: AOTAutograd looks for it on wrappers that copy __dict__ only.
        self._boxed_call = True
        self.fn = fn
        self.name = name
        self._graphs: dict[Any, tuple[Any, list[torch.Tensor], Any]] = {}
        self._seen: set[Any] = set()
        self._disabled = False

    def __call__(self, args: list[Any]) -> Any:
        if self._disabled:
            return self.fn(args)
        sig = self._signature(args)
        if sig is None:
            return self.fn(args)
        entry = self._graphs.get(sig)
        if entry is None:
            if sig not in self._seen:
                self._seen.add(sig)
                return self.fn(args)
            try:
                entry = self._capture(args)
            except Exception as e:
                self._disabled = True
                warnings.warn(f"kiln: CUDA graph capture of {self.name} failed; running without CUDA graphs: "
                              f"{type(e).__name__}: {e}", RuntimeWarning, stacklevel=2)
                return self.fn(args)
            self._graphs[sig] = entry
        graph, static_in, static_out = entry
        for dst, src in zip(static_in, args):
            dst.copy_(src)
        graph.replay()
        return [o.clone() if isinstance(o, torch.Tensor) else o for o in static_out]

    @staticmethod
    def _signature(args: Sequence[Any]) -> Any:
        sig = []
        for a in args:
            if not isinstance(a, torch.Tensor) or a.device.type != "cuda":
                return None
            sig.append((tuple(a.shape), a.stride(), a.dtype, a.device))
        return tuple(sig)

    def _capture(self, args: list[Any]) -> tuple[Any, list[torch.Tensor], Any]:
        static_in = [torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device).copy_(a) for a in args]
        # Warm up on a side stream with the static buffers, as torch's CUDA graph notes advise.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.fn(list(static_in))
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = self.fn(list(static_in))
        return graph, static_in, static_out


def wants_cuda_graphs(example_inputs: Sequence[Any]) -> bool:
    """Whether a graph's inputs are all on CUDA (CUDA graphs apply to GPU graphs only)."""
    tensors = [a for a in example_inputs if isinstance(a, torch.Tensor)]
    return bool(tensors) and all(t.device.type == "cuda" for t in tensors)


__all__ = ["CudaGraphRunner", "CudaKernel", "load_kernel", "wants_cuda_graphs"]
