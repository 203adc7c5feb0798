"""The ``kiln`` torch.compile backend.

Dynamo hands the backend an FX graph of torch-level ops; AOTAutograd (``aot_autograd``) turns
it into ATen graphs after the core ATen decompositions: one forward and one backward graph when
gradients are needed, one inference graph otherwise, each passed to :func:`compile_aten_graph`.
That function partitions the graph (:mod:`.partition`), rewrites it so that every kiln part is
a :class:`~.runtime.KilnPart` module called between the torch nodes, compiles the parts on the
daemon (concurrently), and returns the rewritten graph's forward as the compiled function.

Configuration comes from ``torch.compile``'s ``mode`` or ``options`` (torch.compile takes one
or the other), or from :func:`backend`, which takes both::

    torch.compile(fn, backend="kiln", options={"server": "kiln.example:50051"})
    torch.compile(fn, backend="kiln", mode="reduce-overhead")   # CUDA graphs on GPU
    torch.compile(fn, backend=kiln.torch.backend(server="kiln.example:50051", mode="reduce-overhead"))

Options: ``client`` (a :class:`kiln.Client`), ``server`` (an address; default
``$KILN_SERVER``, then localhost:50051), ``cpu_target`` (default ``"cpu"``: this machine's ISA
level), ``opt_level`` (0-3) or ``compile_options`` (a kiln.v1.CompileOptions), ``cudagraphs``
(bool; default on for ``mode="reduce-overhead"`` and ``"max-autotune"``), ``timeout`` (seconds
a compile may take).

Whatever fails inside the backend (a part the daemon rejects, a daemon that cannot be reached,
a lowering bug) makes the affected part, or at worst the whole graph, run in torch after one
warning; the user's program goes on.
"""

from __future__ import annotations

import collections
import functools
import operator
import os
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
import torch.fx

from . import lowering as L
from .partition import Segment, build_part, partition
from .runtime import CompileSettings, KilnFallbackWarning, KilnPart, bump, compile_parts, describe

_CUDAGRAPH_MODES = frozenset({"reduce-overhead", "max-autotune"})
_KNOWN_OPTIONS = frozenset({"client", "server", "cpu_target", "opt_level", "compile_options", "cudagraphs",
                            "triton.cudagraphs", "timeout"})


@dataclass
class BackendConfig:
    """The backend's settings for one ``torch.compile`` call (see the module docstring)."""

    client: Any = None
    server: Optional[str] = None
    cpu_target: str = "cpu"
    compile_options: Any = None
    cudagraphs: bool = False
    timeout: Optional[float] = None

    @staticmethod
    def from_args(mode: Optional[str] = None, options: Optional[dict[str, Any]] = None) -> "BackendConfig":
        opts = dict(options or {})
        unknown = sorted(set(opts) - _KNOWN_OPTIONS)
        if unknown:
            warnings.warn(f"kiln: ignoring unknown torch.compile options {unknown}", UserWarning, stacklevel=3)
        cfg = BackendConfig(
            client=opts.get("client"),
            server=opts.get("server"),
            cpu_target=opts.get("cpu_target", "cpu"),
            cudagraphs=bool(opts.get("cudagraphs", opts.get("triton.cudagraphs", mode in _CUDAGRAPH_MODES))),
            timeout=opts.get("timeout"),
        )
        if opts.get("compile_options") is not None:
            cfg.compile_options = opts["compile_options"]
        elif opts.get("opt_level") is not None:
            from ..client import make_options

            cfg.compile_options = make_options(opt_level=int(opts["opt_level"]))
        return cfg

    def settings(self) -> CompileSettings:
        return CompileSettings(client=self.resolve_client(), cpu_target=self.cpu_target,
                               options=self.compile_options, timeout=self.timeout)

    def resolve_client(self) -> Any:
        if self.client is None:
            self.client = client_for(self.server)
        return self.client


_clients: dict[str, Any] = {}
_clients_lock = threading.Lock()


def client_for(address: Optional[str]) -> Any:
    """A process-wide client per address; None means ``$KILN_SERVER`` as it is now, else
    :func:`kiln.default_client`."""
    address = address or os.environ.get("KILN_SERVER") or None
    if address is None:
        from ..jit import default_client

        return default_client()
    with _clients_lock:
        c = _clients.get(address)
        if c is None:
            from ..client import Client

            c = Client(address)
            _clients[address] = c
        return c


#: The parts of the most recently compiled graphs, for diagnostics (:func:`kiln.torch.last_graphs`).
RECENT: collections.deque[dict[str, Any]] = collections.deque(maxlen=32)


def _reraise_if_dynamo_control(e: BaseException) -> None:
    """Dynamo steers itself with exceptions (restart analysis...); those must pass through."""
    if type(e).__module__.startswith("torch._dynamo.exc") and "Restart" in type(e).__name__:
        raise e


def compile_aten_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *, config: BackendConfig,
                       kind: str = "forward", **_: Any) -> Callable[[list[Any]], Any]:
    """Compiles one ATen graph from AOTAutograd; returns a boxed callable (``fn(args_list)``).

    Never raises because of kiln: on any failure the graph runs in torch, after a warning.
    """
    from functorch.compile import make_boxed_func

    bump(graphs=1)
    try:
        segments = partition(gm)
        outer, parts = rewrite(gm, segments)
        bump(parts=len(parts),
             kiln_nodes=sum(len(s.nodes) for s in segments if s.is_kiln),
             torch_nodes=sum(1 for s in segments if not s.is_kiln for n in s.nodes if n.op == "call_function"))
        if parts:
            compile_parts(parts, config.settings())
        RECENT.append({"kind": kind, "parts": describe(parts), "segments": len(segments)})
        fn: Callable[[list[Any]], Any] = make_boxed_func(outer.forward)
        if config.cudagraphs:
            from . import cuda

            if cuda.wants_cuda_graphs(example_inputs):
                fn = cuda.CudaGraphRunner(fn, name=f"{kind} graph")
        return fn
    except Exception as e:
        _reraise_if_dynamo_control(e)
        warnings.warn(f"kiln: could not compile a {kind} graph; running it in torch: {type(e).__name__}: {e}",
                      KilnFallbackWarning, stacklevel=2)
        bump(failed=1)
        return make_boxed_func(gm.forward)


def rewrite(gm: torch.fx.GraphModule, segments: Sequence[Segment]) -> tuple[torch.fx.GraphModule, list[KilnPart]]:
    """A GraphModule computing what ``gm`` does with each kiln segment replaced by a call to a
    :class:`KilnPart` (not compiled yet), and the parts in order."""
    g = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    root: dict[str, Any] = {}
    parts: list[KilnPart] = []
    output_node: Optional[torch.fx.Node] = None
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            env[n] = g.node_copy(n, lambda a: env[a])
        elif n.op == "output":
            output_node = n
    for seg in segments:
        if not seg.is_kiln:
            for n in seg.nodes:
                if n.op == "get_attr":
                    root[n.target] = _get_attr(gm, n.target)
                elif n.op == "call_module":
                    root[n.target] = gm.get_submodule(n.target)
                env[n] = g.node_copy(n, lambda a: env[a])
            continue
        name = f"kiln_part_{len(parts)}"
        error = None
        try:
            pg = build_part(seg)
        except L.Unsupported as e:
            pg, error = None, f"lowering: {e}"
        assert seg.color is not None
        part = KilnPart(name, seg, pg, torch.device(seg.color), build_error=error)
        parts.append(part)
        root[name] = part
        call = g.call_module(name, tuple(env[a] for a in seg.inputs))
        for j, o in enumerate(seg.outputs):
            item = g.call_function(operator.getitem, (call, j))
            item.meta = dict(o.meta)
            env[o] = item
    assert output_node is not None
    g.node_copy(output_node, lambda a: env[a])
    g.lint()
    return torch.fx.GraphModule(root, g, class_name="KilnGraphModule"), parts


def _get_attr(gm: torch.nn.Module, target: str) -> Any:
    obj: Any = gm
    for atom in target.split("."):
        obj = getattr(obj, atom)
    return obj


@functools.lru_cache(maxsize=1)
def decompositions() -> Any:
    """The decomposition table AOTAutograd applies: torch's core ATen decompositions, which
    leave the ops kiln maps directly (softmax, layer_norm, gelu...) and break their backward
    ops into elementwise ops and reductions."""
    from torch._decomp import core_aten_decompositions

    return core_aten_decompositions()


def kiln_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *, mode: Optional[str] = None,
                 options: Optional[dict[str, Any]] = None, **kwargs: Any) -> Callable[..., Any]:
    """The torch.compile backend: ``torch.compile(fn, backend="kiln")`` calls this.

    ``mode`` and ``options`` are torch.compile's (see the module docstring); other keyword
    arguments Dynamo passes are ignored.
    """
    config = BackendConfig.from_args(mode, options)
    return make_backend(config)(gm, example_inputs)


def make_backend(config: BackendConfig) -> Callable[..., Any]:
    """A backend callable for ``config``: AOTAutograd around :func:`compile_aten_graph`."""

    def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **_: Any) -> Callable[..., Any]:
        try:
            from functorch.compile import min_cut_rematerialization_partition
            from torch._dynamo.backends.common import aot_autograd

            aot = aot_autograd(
                fw_compiler=functools.partial(compile_aten_graph, config=config, kind="forward"),
                bw_compiler=functools.partial(compile_aten_graph, config=config, kind="backward"),
                inference_compiler=functools.partial(compile_aten_graph, config=config, kind="inference"),
                decompositions=decompositions(),
                # Recomputes cheap pointwise ops in the backward instead of saving them, as
                # Inductor does: fewer tensors saved, larger fusable runs.
                partition_fn=min_cut_rematerialization_partition,
                keep_inference_input_mutations=True,
            )
            return aot(gm, example_inputs)
        except Exception as e:
            _reraise_if_dynamo_control(e)
            warnings.warn(f"kiln: AOTAutograd failed on a graph; running it in torch: {type(e).__name__}: {e}",
                          KilnFallbackWarning, stacklevel=2)
            return gm.forward

    backend.__name__ = "kiln"
    return backend


def backend(**options: Any) -> Callable[..., Any]:
    """A backend with fixed options, for ``torch.compile(fn, backend=kiln.torch.backend(...))``.

    Takes the same keys as torch.compile's ``options`` plus ``mode``.
    """
    mode = options.pop("mode", None)
    return make_backend(BackendConfig.from_args(mode, options))


__all__ = ["BackendConfig", "backend", "compile_aten_graph", "decompositions", "kiln_backend", "make_backend", "rewrite"]

