"""kiln.torch: the ``kiln`` backend of ``torch.compile`` (PyTorch is an optional dependency).

Example::

    import kiln.torch  # registers the backend (also found through its entry point when installed)

    @torch.compile(backend="kiln")
    def f(x):
        return torch.sin(x) ** 2 + torch.cos(x) ** 2

Forward and backward graphs both reach kiln through AOTAutograd as ATen graphs. The ops kiln
supports (elementwise math, reductions, views, concatenation, softmax, layer_norm, gelu,
gathers, dropout's random draws...) are compiled on the kiln daemon in fused parts; the rest
(matmul, convolution, attention, scatters...) runs in torch between them. CPU tensors run the parts' shared objects, CUDA tensors
their kernels on torch's current stream; ``mode="reduce-overhead"`` replays GPU graphs through
CUDA graphs. A part kiln cannot compile runs in torch after one :class:`KilnFallbackWarning`.

- :func:`kiln_backend`: the backend function (what ``backend="kiln"`` resolves to).
- :func:`backend`: a backend with options bound (``backend=kiln.torch.backend(server=...)``).
- :func:`compile`: ``torch.compile`` with ``backend="kiln"``; with ``options={"async": True}``
  the first call runs eagerly and the model is traced in the background (:mod:`.first_call`).
- :func:`wait`: blocks until compiles started with ``options={"async": True}`` are done.
- :func:`stats`, :func:`reset_stats`, :func:`last_graphs`: what the backend did, for tests and
  diagnostics. :func:`register_lowering` extends the ATen-to-kiln mapping table.
- :func:`load`, :func:`load_inline`, :func:`build`: PyTorch extensions built by kilnd
  (``extension``, which is :mod:`kiln.torch_extension`); ``native`` is the native part runner
  (:mod:`kiln.native`), which the runtime layer below this package owns.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

import torch  # noqa: F401  (a clear ImportError when PyTorch is absent)

from .. import native
from .. import torch_extension as extension
from ..torch_extension import build, load, load_inline
from . import counters
from .async_compile import wait
from .dynamo_backend import BackendConfig, backend, compile_aten_graph, kiln_backend, make_backend
from .first_call import EagerFirst, compile
from .lowering import Unsupported, lowered_ops, register_lowering, unregister_lowering
from .runtime import KilnFallbackWarning, KilnPart, clear_memo, describe
from .sealed import SealedError, seal, unseal

#: The name the backend is registered under.
BACKEND_NAME = "kiln"
#: The entry point group torch.compile searches for backends.
ENTRY_POINT_GROUP = "torch_dynamo_backends"


def stats() -> dict[str, Any]:
    """A copy of the process-wide counters (see :class:`kiln.torch.counters.Stats`)."""
    return counters.snapshot()


def reset_stats() -> None:
    """Zeroes the counters :func:`stats` reports and forgets :func:`last_graphs`."""
    counters.reset_stats()
    counters.RECENT.clear()


def last_graphs() -> list[dict[str, Any]]:
    """The most recently compiled ATen graphs (up to 32): for each, its kind (forward, backward,
    inference), its number of segments, and per kiln part the ops, the handle or the error, as
    the part is now (a part that has been freed: as it was compiled)."""
    out = []
    for g in list(counters.RECENT):
        parts = list(g["parts"])
        for i, ref in enumerate(g.get("_refs", ())):
            part = ref()
            if part is not None:
                parts[i] = describe([part])[0]
        out.append({k: v for k, v in g.items() if k != "_refs"} | {"parts": parts})
    return out


def _entry_point_installed() -> bool:
    try:
        return any(ep.name == BACKEND_NAME for ep in entry_points(group=ENTRY_POINT_GROUP))
    except Exception:
        return False


def register() -> bool:
    """Registers :func:`kiln_backend` with Dynamo as ``"kiln"``; returns whether it did.

    Skipped when the name is taken already, and when the package's entry point is installed:
    Dynamo then loads the backend through it, and registering here too would make that load
    fail on a duplicate name.
    """
    # The entry point first: when it is installed, importing Dynamo (over a second) is left to
    # torch.compile, so that `import kiln.torch` for extensions alone stays quick.
    if _entry_point_installed():
        return False
    try:
        from torch._dynamo.backends import registry
    except Exception:  # a torch without Dynamo: nothing to register with
        return False
    if BACKEND_NAME in registry._COMPILER_FNS:
        return False
    registry.register_backend(kiln_backend, name=BACKEND_NAME)
    return True


register()

__all__ = [
    "BACKEND_NAME",
    "BackendConfig",
    "EagerFirst",
    "KilnFallbackWarning",
    "KilnPart",
    "SealedError",
    "Unsupported",
    "backend",
    "build",
    "clear_memo",
    "compile",
    "compile_aten_graph",
    "extension",
    "kiln_backend",
    "last_graphs",
    "load",
    "load_inline",
    "lowered_ops",
    "make_backend",
    "native",
    "seal",
    "unseal",
    "register",
    "register_lowering",
    "reset_stats",
    "stats",
    "unregister_lowering",
    "wait",
]
