"""The ``kiln`` torch.compile backend: its configuration, the backend callables Dynamo calls, and
the compile of one ATen graph from start to end.

Dynamo hands the backend an FX graph of torch-level ops; AOTAutograd (``aot_autograd``) turns
it into ATen graphs after the decompositions of :mod:`.decompositions`: one forward and one
backward graph when gradients are needed, one inference graph otherwise, each passed to
:func:`compile_aten_graph`. That function looks for the graph's program record
(:mod:`.records`), runs the ATen passes (:mod:`.passes`), partitions the graph
(:mod:`.partition`), stitches it back with every kiln part a :class:`~.runtime.KilnPart` module
called between the torch nodes (:mod:`.stitch`, which runs the torch-side passes), compiles the
parts on the daemon (concurrently; in the background with ``async``, :mod:`.async_compile`),
wraps the result for CUDA-graph replay when asked (:mod:`.cudagraphs`), and returns the
rewritten graph's forward as the compiled function.

Configuration comes from ``torch.compile``'s ``mode`` or ``options`` (torch.compile takes one
or the other), or from :func:`backend`, which takes both::

    torch.compile(fn, backend="kiln", options={"server": "kiln.example:50051"})
    torch.compile(fn, backend="kiln", mode="reduce-overhead")   # CUDA graphs on GPU
    torch.compile(fn, backend=kiln.torch.backend(server="kiln.example:50051", mode="reduce-overhead"))

Options: ``client`` (a :class:`kiln.Client`), ``server`` (an address; default
``$KILN_SERVER``, then localhost:50051), ``cpu_target`` (default ``"cpu"``: this machine's ISA
level), ``opt_level`` (0-3) or ``compile_options`` (a kiln.v1.CompileOptions), ``cudagraphs``
(bool; default on for ``mode="reduce-overhead"`` and ``"max-autotune"``), ``timeout`` (seconds
a compile may take), ``async`` (bool, default off: compile without waiting, below),
``native`` (bool, default on: parts run through the native part runner once it is loaded,
:mod:`kiln.native`; ``$KILN_TORCH_NATIVE=0`` turns it off process-wide), ``autotune`` (bool;
default on for ``mode="max-autotune"``: each static part's first call times its kernel
variants on the arguments it got and keeps the fastest, see :func:`kiln.autotune`; parts with
symbolic sizes keep the default, which serves every size; the winner is recorded
in kilnd per device model, so another process with the same GPU or CPU compiles the tuned
variant without timing anything), ``layout`` (``"auto"``, the default: graphs with
convolutions run them channels-last, the activations between them kept in that layout by
kiln's kernels, see :mod:`.passes.channels_last`, except float32 on CUDA with TF32 off, where
cuDNN's NCHW kernels are faster; ``"channels_last"``: always; ``"keep"``: the traced layouts), ``random`` (``"kiln"``: a
dropout's mask is drawn inside kiln's kernels from one seed per call, see :mod:`.rng`;
``"torch"``: torch's dropout op and generator, eager's numbers; ``"auto"``, the default: kiln
for graphs on CUDA, torch on the CPU, where torch's vectorised generator is faster than
kiln's per-element Philox).
``records`` (bool, default on; ``$KILN_TORCH_RECORDS=0`` turns them off process-wide): what
the backend makes of a graph is stored in kilnd as a program record, and a later process that
traces the same graph rebuilds it from there in one lookup, without partitioning (:mod:`.program`).
:func:`~.sealed.seal` (or ``$KILN_SEALED``) reports every graph that is not rebuilt so.

With ``options={"async": True}`` a new graph does not wait for kilnd: its parts compile in the
background while the graph runs in torch, and the first call after they are loaded switches
to the kiln kernels (and, in reduce-overhead mode, to CUDA graphs). A graph of static shapes
is also partitioned and lowered in the background, from the moment its first call returns
(the first calls run the traced ATen graph). The first result of a new model then waits only
for Dynamo's and AOTAutograd's tracing (which any torch.compile backend pays, and which must run
on the caller's thread: Dynamo drops its record of how it fakified the inputs once the frame is
compiled), not for kiln; :func:`kiln.torch.wait` blocks until every pending compile has
finished (benchmarks, tests, a warm-up step). :func:`kiln.torch.compile` (:mod:`.first_call`)
takes the trace off the first call too: the first call runs eagerly, the model is traced in a
background thread.

Whatever fails inside the backend (a part the daemon rejects, a daemon that cannot be reached,
a lowering bug) makes the affected part, or at worst the whole graph, run in torch after one
warning; the user's program goes on.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
import torch.fx

from .. import native
from ..client import Client
from ..connection import make_options
from ..errors import KilnFallbackWarning
from ..jit import default_client
from . import lowering as L
from .async_compile import AsyncGraph, submit_compile
from .counters import RECENT, bump
from .cudagraphs import CudaGraphRunner, replay_wins, wants_cuda_graphs
from .decompositions import decompositions
from .partition import partition
from .passes import run_aten_passes, run_cudagraph_passes
from .passes.channels_last import wants_channels_last
from .records import StoredRecord, from_record, record_key, reported_strides, store_record, with_record
from .runtime import CompileSettings, boxed, compile_parts, describe, graph_call, reraise_if_dynamo_control
from .sealed import SealedError, check_sealed
from .stitch import rewrite

log = logging.getLogger("kiln.torch")

_CUDAGRAPH_MODES = frozenset({"reduce-overhead", "max-autotune"})
_KNOWN_OPTIONS = frozenset({"client", "server", "cpu_target", "opt_level", "compile_options", "cudagraphs",
                            "triton.cudagraphs", "timeout", "async", "native", "autotune", "layout", "random",
                            "records", "precompile"})
_LAYOUTS = frozenset({"auto", "channels_last", "keep"})
_RANDOM = frozenset({"auto", "kiln", "torch"})


@dataclass
class BackendConfig:
    """The backend's settings for one ``torch.compile`` call (see the module docstring)."""

    client: Any = None
    server: Optional[str] = None
    cpu_target: str = "cpu"
    compile_options: Any = None
    cudagraphs: bool = False
    timeout: Optional[float] = None
    async_compile: bool = False
    native: bool = True
    autotune: bool = False
    layout: str = "auto"
    random: str = "auto"
    records: bool = True

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
            async_compile=bool(opts.get("async", False)),
            native=bool(opts.get("native", True)),
            autotune=bool(opts.get("autotune", mode == "max-autotune")),
            layout=str(opts.get("layout", "auto")),
            random=str(opts.get("random", "auto")),
            records=bool(opts.get("records", True)),
        )
        if cfg.layout not in _LAYOUTS:
            raise ValueError(f"kiln: options['layout'] is {cfg.layout!r}; expected one of {sorted(_LAYOUTS)}")
        if cfg.random not in _RANDOM:
            raise ValueError(f"kiln: options['random'] is {cfg.random!r}; expected one of {sorted(_RANDOM)}")
        if opts.get("compile_options") is not None:
            cfg.compile_options = opts["compile_options"]
        elif opts.get("opt_level") is not None:
            cfg.compile_options = make_options(opt_level=int(opts["opt_level"]))
        return cfg

    def settings(self) -> CompileSettings:
        return CompileSettings(client=self.resolve_client(), cpu_target=self.cpu_target,
                               options=self.compile_options, timeout=self.timeout, autotune=self.autotune)

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
        return default_client()
    with _clients_lock:
        c = _clients.get(address)
        if c is None:
            c = Client(address)
            _clients[address] = c
        return c


def compile_aten_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *, config: BackendConfig,
                       kind: str = "forward", user_outputs: Optional[int] = None,
                       **_: Any) -> Callable[[list[Any]], Any]:
    """Compiles one ATen graph from AOTAutograd; returns a boxed callable (``fn(args_list)``).
    ``user_outputs``: how many outputs Dynamo's graph has (a training forward returns more).

    Never raises because of kiln: on any failure the graph runs in torch, after a warning.

    With ``async``, a graph of static shapes is partitioned in the background too (its
    partitioning and lowering cost the first call as much as the compiles, and more on a warm
    cache); until then the ATen graph runs as traced. A graph with symbolic sizes is
    partitioned here, since lowering may read a size and so add a guard, which only counts
    while Dynamo is compiling the frame; a graph the layout pass rewrites too (it reports the
    new output strides to AOTAutograd, which is compiling now).
    """
    bump(graphs=1)
    eager = boxed(gm.forward)  # the traced code, kept even if a pass recompiles gm
    if config.async_compile and _static(example_inputs) and not wants_channels_last(gm, config.layout):
        settings = config.settings()
        built: list[Callable[[list[Any]], Any]] = []

        def job() -> None:
            built.append(_partition_and_compile(gm, example_inputs, config, kind, user_outputs, eager,
                                                settings=settings))

        return AsyncGraph(eager, job, lambda: built[0] if built else eager)  # starts after the first call
    return _partition_and_compile(gm, example_inputs, config, kind, user_outputs, eager)


def _static(example_inputs: Sequence[Any]) -> bool:
    """Whether every input is a tensor of static shape or a plain Python number."""
    return all(L.is_static_tensor(a) if isinstance(a, torch.Tensor) else isinstance(a, (int, float, bool))
               for a in example_inputs)


def _partition_and_compile(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: BackendConfig,
                           kind: str, user_outputs: Optional[int], eager: Callable[[list[Any]], Any], *,
                           settings: Optional[CompileSettings] = None) -> Callable[[list[Any]], Any]:
    """Partitions ``gm`` into kiln parts and compiles them: with ``settings`` (a background job
    of :func:`compile_aten_graph`) here and now, else in the background under ``async`` or here.
    Any failure: ``eager``, after a warning."""
    try:
        t0 = time.perf_counter()
        key = record_key(gm, example_inputs, config, kind, user_outputs)
        if key is not None:
            warm = from_record(key, config, settings, kind)
            if warm is not None:
                return warm
        check_sealed(f"a {kind} graph of {len(gm.graph.nodes)} nodes has no program record in kilnd"
                     + (f" (key {key[:12]})" if key else " (not recordable)"))
        strides_before = reported_strides()
        run_aten_passes(gm, example_inputs, random_in_kiln=config.random == "kiln", layout=config.layout,
                        kind=kind, user_outputs=user_outputs)
        segments = partition(gm)
        outer, parts = rewrite(gm, segments)
        bump(parts=len(parts),
             kiln_nodes=sum(len(s.nodes) for s in segments if s.is_kiln),
             torch_nodes=sum(1 for s in segments if not s.is_kiln for n in s.nodes if n.op == "call_function"))
        wrap_cuda_graphs = False
        if config.cudagraphs:
            wrap_cuda_graphs = wants_cuda_graphs(example_inputs)
            if wrap_cuda_graphs and run_cudagraph_passes(outer.graph):
                outer.recompile()
        fn: Callable[[list[Any]], Any] = boxed(graph_call(outer))
        bump(partition_s=time.perf_counter() - t0)

        def finish() -> Callable[[list[Any]], Any]:
            if wrap_cuda_graphs and replay_wins(outer, parts):
                return CudaGraphRunner(fn, name=f"{kind} graph")
            return fn

        use_native = config.native and native.enabled()
        for p in parts:
            p.use_native = p._native_pending = use_native

        reported = reported_strides()
        output_strides = reported[len(strides_before):] if reported is not None and strides_before is not None else None

        stored: list[Optional[StoredRecord]] = [None]

        def compile_all(settings: Any) -> None:
            if parts:
                if use_native:
                    native.start(settings.client)  # in the background; parts switch once it is loaded
                compile_parts(parts, settings)
            if key is not None and settings is not None:
                stored[0] = store_record(key, settings, outer, parts, output_strides, wrap_cuda_graphs)
            RECENT.append({"kind": kind, "parts": describe(parts), "segments": len(segments),
                           "_refs": [weakref.ref(p) for p in parts]})

        if settings is not None:
            compile_all(settings)
            return finish()
        if parts and config.async_compile:
            later = config.settings()
            return AsyncGraph(fn, submit_compile(lambda: compile_all(later)), finish)
        compile_all(config.settings() if parts or key is not None else None)
        return with_record(finish(), stored[0])
    except Exception as e:
        reraise_if_dynamo_control(e)
        if isinstance(e, SealedError):
            raise
        warnings.warn(f"kiln: could not compile a {kind} graph; running it in torch: {type(e).__name__}: {e}",
                      KilnFallbackWarning, stacklevel=2)
        bump(failed=1)
        return eager


def kiln_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *, mode: Optional[str] = None,
                 options: Optional[dict[str, Any]] = None, **kwargs: Any) -> Callable[..., Any]:
    """The torch.compile backend: ``torch.compile(fn, backend="kiln")`` calls this.

    ``mode`` and ``options`` are torch.compile's (see the module docstring); other keyword
    arguments Dynamo passes are ignored.
    """
    config = BackendConfig.from_args(mode, options)
    return make_backend(config)(gm, example_inputs)


def make_backend(config: BackendConfig, *,
                 wrap: Optional[Callable[[Callable[[list[Any]], Any], str], Any]] = None) -> Callable[..., Any]:
    """A backend callable for ``config``: AOTAutograd around :func:`compile_aten_graph`.

    ``wrap(compiled, kind)``, if given, replaces what each ATen graph compiled to
    (:mod:`.precompile`: an OutputCode that torch can serialize). After a call the backend's
    ``compiler_fn`` is the AOTAutograd it used (torch's AOT compile reads it), or None when the
    graph fell back to torch."""

    # The inference graph's call without AOTAutograd around it, and how many inputs the graph takes.
    direct: list[tuple[Callable[..., Any], int]] = []

    def compiler(kind: str, **fixed: Any) -> Callable[..., Any]:
        def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kw: Any) -> Any:
            fn = compile_aten_graph(gm, example_inputs, **fixed, kind=kind, **kw)
            if wrap is not None:
                return wrap(fn, kind)
            if kind == "inference":
                inputs = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
                call = direct_inference_call(fn, inputs)
                if call is not None:
                    direct.append((call, inputs))
            return fn

        return compile_graph

    def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **_: Any) -> Callable[..., Any]:
        t0 = time.perf_counter()
        backend.compiler_fn = None  # type: ignore[attr-defined]
        try:
            import torch.utils._pytree as pytree
            from functorch.compile import min_cut_rematerialization_partition
            from torch._dynamo.backends.common import aot_autograd

            if config.random == "auto":
                # Per graph: counter-based draws in kiln's kernels on CUDA, torch's generator on
                # the CPU (about 6 ns per number in a vectorised CPU loop against torch's ~1).
                on_cuda = any(isinstance(t, torch.Tensor) and t.device.type == "cuda" for t in example_inputs)
                graph_config = dataclasses.replace(config, random="kiln" if on_cuda else "torch")
            else:
                graph_config = config
            outs = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
            user_outputs = len(pytree.tree_leaves(outs.args))
            aot = aot_autograd(
                fw_compiler=compiler("forward", config=graph_config, user_outputs=user_outputs),
                bw_compiler=compiler("backward", config=graph_config),
                inference_compiler=compiler("inference", config=graph_config),
                decompositions=decompositions(random_in_kiln=graph_config.random == "kiln"),
                # Recomputes cheap pointwise ops in the backward instead of saving them, as
                # Inductor does: fewer tensors saved, larger fusable runs.
                partition_fn=min_cut_rematerialization_partition,
                keep_inference_input_mutations=True,
            )
            direct.clear()
            compiled = aot(gm, example_inputs)
            backend.compiler_fn = aot  # type: ignore[attr-defined]
            # Dynamo's inputs one for one: no duplicates merged, no parameters lifted.
            if direct and direct[0][1] == len(example_inputs) and _plain_inputs(example_inputs):
                bump(direct_graphs=1)
                return direct[0][0]
            return compiled
        except Exception as e:
            reraise_if_dynamo_control(e)
            if isinstance(e, SealedError):
                raise
            warnings.warn(f"kiln: AOTAutograd failed on a graph; running it in torch: {type(e).__name__}: {e}",
                          KilnFallbackWarning, stacklevel=2)
            return gm.forward
        finally:
            bump(backend_s=time.perf_counter() - t0)

    backend.__name__ = "kiln"
    backend.compiler_name = "kiln"  # type: ignore[attr-defined]
    backend.compiler_fn = None  # type: ignore[attr-defined]
    return backend


def direct_inference_call(fn: Callable[[list[Any]], Any], inputs: int) -> Optional[Callable[..., Any]]:
    """``fn`` (an inference graph of ``inputs`` arguments, compiled, boxed) as Dynamo calls a backend's result
    (``call(*args)``), when AOTAutograd's runtime wrapper around it would do nothing but turn
    grad mode off for the call: no input is mutated, no output aliases an input or another
    output, no effect tokens or RNG state are threaded through the graph, grad mode is not set
    inside it, no output is marked dynamic and autocast is off. Else None.

    Called while AOTAutograd compiles the graph (its metadata is in the tracing context). The
    backend also checks that the graph takes Dynamo's inputs one for one (no duplicate inputs
    merged, no parameters lifted, no tensor subclasses): then AOTAutograd's wrappers around
    the graph are the identity, and skipping them saves a few microseconds per call, much of
    a small graph's floor (two wrapper layers and a Dynamo ``disable`` frame of the three
    between Dynamo's guards and the graph)."""
    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None)
    if meta is None or torch._C._is_any_autocast_enabled():
        return None
    try:
        wrapped = (any(i.mutates_data or i.mutates_metadata for i in meta.input_info)
                   or any(o.output_type.name != "non_alias" for o in meta.output_info)
                   or meta.num_intermediate_bases or meta.tokens or meta.dynamic_outputs
                   or getattr(meta, "num_graphsafe_rng_states", 0)
                   or meta.grad_enabled_mutation is not None
                   or any(type(m).__name__ == "SubclassCreationMeta" for m in meta.subclass_inp_meta)
                   or torch._functorch.config.functionalize_rng_ops)
    except AttributeError:  # a torch whose metadata reads otherwise: keep its wrapper
        return None
    if wrapped:
        return None
    if len(meta.input_info) != inputs:
        return None
    if torch.is_grad_enabled():  # Dynamo guards on grad mode: it is on for every call of this graph
        def call_grad_off(*args: Any) -> Any:
            torch._C._set_grad_enabled(False)
            try:
                return fn(list(args))
            finally:
                torch._C._set_grad_enabled(True)

        return call_grad_off

    def call(*args: Any) -> Any:
        return fn(list(args))

    return call


def _plain_inputs(example_inputs: Sequence[Any]) -> bool:
    """Whether every input is a plain tensor (or a parameter) or a number, no tensor subclass."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    return all(not is_traceable_wrapper_subclass(a) if isinstance(a, torch.Tensor) else
               isinstance(a, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool))
               for a in example_inputs)


def backend(**options: Any) -> Callable[..., Any]:
    """A backend with fixed options, for ``torch.compile(fn, backend=kiln.torch.backend(...))``.

    Takes the same keys as torch.compile's ``options`` plus ``mode``.
    """
    mode = options.pop("mode", None)
    return make_backend(BackendConfig.from_args(mode, options))


__all__ = ["BackendConfig", "backend", "client_for", "compile_aten_graph", "kiln_backend", "make_backend"]

