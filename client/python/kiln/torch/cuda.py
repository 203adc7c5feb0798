"""The CUDA side of kiln.torch: launching kiln's CUDA kernels on torch's stream, and replaying
compiled graphs through CUDA graphs (``mode="reduce-overhead"``).

The driver API bindings, the per-device module cache and the plan launcher live in
:mod:`kiln.cuda`, which does not depend on torch; this module adds what is torch-specific:
devices given as ``torch.device``, torch's lazy CUDA initialisation, and CUDA graphs.

Kernel launches follow the launch plan of the compiled result (see :mod:`kiln.cuda`). The
cubin (or, failing that, the PTX) is loaded once per device into the device's primary context,
the one torch uses. Temporaries come from torch's caching allocator and kernels run on
``torch.cuda.current_stream()`` (the caller passes its handle to
:meth:`~kiln.cuda.CudaKernel.launch`), so kiln kernels order with torch's own work and torch's
memory reuse rules hold for them.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Sequence

import torch

from .. import cuda as _kcuda
from ..cuda import CudaKernel


def load_kernel(compiled: Any, device: torch.device) -> CudaKernel:
    """The kernels of ``compiled`` on ``device``: loaded once per process per device (the
    cache is :mod:`kiln.cuda`'s, shared with ``kiln.jit``)."""
    torch.cuda.init()
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _kcuda.load_kernel(compiled, int(index))


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
