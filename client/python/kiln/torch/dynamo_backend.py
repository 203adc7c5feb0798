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
a compile may take), ``async`` (bool, default off: compile without waiting, below),
``native`` (bool, default on: parts run through the native part runner once it is loaded,
:mod:`.native`; ``$KILN_TORCH_NATIVE=0`` turns it off process-wide), ``autotune`` (bool;
default on for ``mode="max-autotune"``: each static part's first call times its kernel
variants on the arguments it got and keeps the fastest, see :func:`kiln.autotune`; parts with
symbolic sizes keep the default, which serves every size; the winner is recorded
in kilnd per device model, so another process with the same GPU or CPU compiles the tuned
variant without timing anything), ``layout`` (``"channels_last"``, the default: graphs
with convolutions run them channels-last, the activations between them kept in that layout by
kiln's kernels, see :mod:`.layout`; ``"keep"``: the traced layouts), ``random`` (``"kiln"``: a
dropout's mask is drawn inside kiln's kernels from one seed per call, see :mod:`.rng`;
``"torch"``: torch's dropout op and generator, eager's numbers; ``"auto"``, the default: kiln
for graphs on CUDA, torch on the CPU, where torch's vectorised generator is faster than
kiln's per-element Philox).
``records`` (bool, default on; ``$KILN_TORCH_RECORDS=0`` turns them off process-wide): what
the backend makes of a graph is stored in kilnd as a program record, and a later process that
traces the same graph rebuilds it from there in one lookup, without partitioning (:mod:`.program`).
:func:`seal` (or ``$KILN_SEALED``) reports every graph that is not rebuilt so.

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

import collections
import concurrent.futures
import dataclasses
import functools
import logging
import operator
import os
import struct
import threading
import time
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
import torch.fx

from . import lowering as L
from . import native
from .layout import channels_last_convolutions, report_output_strides, saved_outputs, wants_channels_last
from .partition import NothingToCompute, Segment, build_part, partition
from .rng import dropout_decomposition, seed_draws
from . import program
from .program import direct_calls, get_attr
from .. import service_pb2
from ..client import Compiled
from ..errors import KilnError
from .runtime import CompileSettings, KilnFallbackWarning, KilnPart, boxed, bump, compile_parts, describe, run_parts

log = logging.getLogger("kiln.torch")

_CUDAGRAPH_MODES = frozenset({"reduce-overhead", "max-autotune"})
_KNOWN_OPTIONS = frozenset({"client", "server", "cpu_target", "opt_level", "compile_options", "cudagraphs",
                            "triton.cudagraphs", "timeout", "async", "native", "autotune", "layout", "random",
                            "records", "precompile"})
_LAYOUTS = frozenset({"channels_last", "keep"})
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
    layout: str = "channels_last"
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
            layout=str(opts.get("layout", "channels_last")),
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
            from ..client import make_options

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
        record_key = _record_key(gm, example_inputs, config, kind, user_outputs)
        if record_key is not None:
            warm = _from_record(record_key, config, settings, kind)
            if warm is not None:
                return warm
        check_sealed(f"a {kind} graph of {len(gm.graph.nodes)} nodes has no program record in kilnd"
                     + (f" (key {record_key[:12]})" if record_key else " (not recordable)"))
        strides_before = _reported_strides()
        eliminate_common_subexpressions(gm)
        if config.random == "kiln":
            bump(random_draws=seed_draws(gm))
        if wants_channels_last(gm, config.layout):
            free = saved_outputs(gm, kind, user_outputs)
            copies = channels_last_convolutions(gm, free, example_inputs)
            if copies and free:
                report_output_strides(gm)
            bump(layout_copies=copies)
        # After the layout pass, which propagates fake tensors through the graph: a folded
        # value is a real tensor.
        bump(constants=fold_constant_subgraphs(gm))
        segments = partition(gm)
        outer, parts = rewrite(gm, segments)
        bump(parts=len(parts),
             kiln_nodes=sum(len(s.nodes) for s in segments if s.is_kiln),
             torch_nodes=sum(1 for s in segments if not s.is_kiln for n in s.nodes if n.op == "call_function"))
        wrap_cuda_graphs = False
        if config.cudagraphs:
            from . import cuda

            wrap_cuda_graphs = cuda.wants_cuda_graphs(example_inputs)
            if wrap_cuda_graphs and cuda.philox_state_on_host(outer.graph):
                outer.recompile()
        fn: Callable[[list[Any]], Any] = boxed(outer.forward)
        bump(partition_s=time.perf_counter() - t0)

        def finish() -> Callable[[list[Any]], Any]:
            if wrap_cuda_graphs:
                from . import cuda

                return cuda.CudaGraphRunner(fn, name=f"{kind} graph")
            return fn

        use_native = config.native and native.enabled()
        for p in parts:
            p.use_native = p._native_pending = use_native

        reported = _reported_strides()
        output_strides = reported[len(strides_before):] if reported is not None and strides_before is not None else None

        stored: list[Optional[StoredRecord]] = [None]

        def compile_all(settings: Any) -> None:
            if parts:
                if use_native:
                    native.start(settings.client)  # in the background; parts switch once it is loaded
                compile_parts(parts, settings)
            if record_key is not None and settings is not None:
                stored[0] = _store_record(record_key, settings, outer, parts, output_strides, wrap_cuda_graphs)
            RECENT.append({"kind": kind, "parts": describe(parts), "segments": len(segments),
                           "_refs": [weakref.ref(p) for p in parts]})

        if settings is not None:
            compile_all(settings)
            return finish()
        if parts and config.async_compile:
            later = config.settings()
            return AsyncGraph(fn, submit_compile(lambda: compile_all(later)), finish)
        compile_all(config.settings() if parts or record_key is not None else None)
        return _with_record(finish(), stored[0])
    except Exception as e:
        _reraise_if_dynamo_control(e)
        if isinstance(e, SealedError):
            raise
        warnings.warn(f"kiln: could not compile a {kind} graph; running it in torch: {type(e).__name__}: {e}",
                      KilnFallbackWarning, stacklevel=2)
        bump(failed=1)
        return eager


# ------------------------------------------------------------------------- program records


# What happened to this process's program records, newest last (diagnostics, benchmarks).
RECORD_EVENTS: collections.deque[str] = collections.deque(maxlen=64)


def _record_key(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: BackendConfig, kind: str,
                user_outputs: Optional[int]) -> Optional[str]:
    """The program record key of ``gm`` (:mod:`.program`), or None when records are off or the
    graph cannot have one (symbolic sizes, autotuning, a target a record cannot name)."""
    if not (config.records and program.enabled()) or config.autotune:
        return None
    opts = config.compile_options
    settings = [f"kind={kind}", f"user_outputs={user_outputs}", f"cpu_target={config.cpu_target}",
                f"cudagraphs={config.cudagraphs}", f"layout={config.layout}", f"random={config.random}",
                f"native={config.native}", f"torch_threads={torch.get_num_threads()}",
                "options=" + (opts.SerializeToString(deterministic=True).hex() if opts is not None else "")]
    try:
        with _real_tensors():
            return program.model_key(gm, example_inputs, settings)
    except program.NotRecordable:
        return None
    except Exception as e:  # a key that cannot be computed costs the record, nothing else
        log.debug("kiln.torch: no record key: %s: %s", type(e).__name__, e)
        return None


def _reported_strides() -> Optional[list[Any]]:
    tc = torch._guards.TracingContext.try_get()
    return list(tc.output_strides) if tc is not None and tc.output_strides is not None else None


def _from_record(key: str, config: BackendConfig, settings: Optional[CompileSettings],
                 kind: str) -> Optional[Callable[[list[Any]], Any]]:
    """The compiled graph rebuilt from kilnd's record under ``key``, or None on a miss (or any
    failure, which costs only the time it took: the graph is then compiled as usual)."""
    t0 = time.perf_counter()
    try:
        with _real_tensors():
            return _rebuild_from_record(key, config, settings, kind)
    except Exception as e:
        _reraise_if_dynamo_control(e)
        record_not_used(key[:12], e, "record_misses")
        return None
    finally:
        bump(record_s=time.perf_counter() - t0)


def record_not_used(label: str, e: BaseException, counter: str) -> None:
    """Reports a record that was found but could not be used (logged, in RECORD_EVENTS, counted
    as a miss under ``counter``): the graph or model is then compiled as if it had none."""
    log.warning("kiln.torch: %s not used: %s: %s", label, type(e).__name__, e)
    RECORD_EVENTS.append(f"{label} not used: {type(e).__name__}: {e}")
    bump(**{counter: 1})


def _real_tensors() -> Any:
    """Leaves the fake tensor mode AOTAutograd compiles under: a record's constants are real
    tensors, read (to store them) and made (to rebuild them) as such."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    return unset_fake_temporarily()


def _rebuild_from_record(key: str, config: BackendConfig, settings: Optional[CompileSettings],
                         kind: str) -> Optional[Callable[[list[Any]], Any]]:
    settings = settings or config.settings()
    got = settings.client.get_model(key, program.FORMAT)
    if got is None:
        bump(record_misses=1)
        RECORD_EVENTS.append(f"{key[:12]} missed")
        return None
    record, responses = got
    return rebuild_record(StoredRecord(key, record, [r.handle for r in responses]), responses, config, settings, kind)


@dataclass(frozen=True)
class StoredRecord:
    """A program record kilnd holds: its key, its bytes and its parts' handles (what a
    precompiled model, :mod:`.precompile`, carries of each graph)."""

    key: str
    record: bytes
    handles: list[str]


def _with_record(fn: Callable[[list[Any]], Any], stored: Optional[StoredRecord]) -> Callable[[list[Any]], Any]:
    """``fn`` (a compiled graph) marked with the program record it was stored as or rebuilt
    from, if any: :mod:`.precompile` keeps that record in place of the graph."""
    if stored is not None:
        fn.kiln_record = stored  # type: ignore[attr-defined]
    return fn


def fetch_loadables(client: Any, responses: Sequence[Any]) -> None:
    """Every artifact the parts of ``responses`` (kiln.v1.CompileResponse) load, brought in one
    call where the local folder lacks any."""
    client.fetch_many([a.digest for r in responses for a in r.result.artifacts
                       if a.kind in (service_pb2.SHARED_OBJECT, service_pb2.CUBIN)])


def rebuild_record(stored: StoredRecord, responses: Sequence[Any], config: BackendConfig,
                   settings: Optional[CompileSettings], kind: str) -> Callable[[list[Any]], Any]:
    """The compiled graph of a program record, given the daemon's answers for its parts (as
    GetModel returns them): parts adopt their results without any lookup; artifacts the local
    folder lacks are fetched in one call."""
    settings = settings or config.settings()
    client = settings.client
    key = stored.key
    header, data = program.decode(stored.record)
    if len(responses) != len(header["parts"]):
        raise KilnError(f"the record names {len(header['parts'])} parts, the daemon sent {len(responses)}")
    graphs = program.part_graphs(header)
    compiled = [Compiled(client, r, graph=g) for r, g in zip(responses, graphs)]
    fetch_loadables(client, responses)
    use_native = config.native and native.enabled()

    def make_part(rec: dict[str, Any], pg: Any, eager_g: torch.fx.Graph, c: Any) -> KilnPart:
        part = KilnPart(rec["name"], None, pg, torch.device(rec["device"]), eager=eager_g, ops=rec["ops"])
        part.use_native = part._native_pending = use_native
        return part

    outer, parts = program.rebuild(header, data, graphs, compiled, make_part)
    if parts and use_native:
        native.start(client)
    result_of = {id(p): c for p, c in zip(parts, compiled)}
    run_parts(parts, settings, lambda p: p.adopt(result_of[id(p)], settings))
    tc = torch._guards.TracingContext.try_get()
    if header.get("output_strides") is not None and tc is not None and tc.output_strides is not None:
        tc.output_strides.extend(tuple(s) if s is not None else None for s in header["output_strides"])
    fn: Callable[[list[Any]], Any] = boxed(outer.forward)
    bump(record_hits=1, parts=len(parts))
    RECORD_EVENTS.append(f"{key[:12]} rebuilt: {len(parts)} parts")
    RECENT.append({"kind": kind, "parts": describe(parts), "segments": None, "record": key,
                   "_refs": [weakref.ref(p) for p in parts]})
    if header.get("cudagraphs"):
        from . import cuda

        fn = cuda.CudaGraphRunner(fn, name=f"{kind} graph")
    return _with_record(fn, stored)


def _store_record(key: str, settings: CompileSettings, outer: torch.fx.GraphModule, parts: Sequence[KilnPart],
                  output_strides: Optional[list[Any]], cudagraphs: bool) -> Optional[StoredRecord]:
    """Writes the program record of a freshly compiled graph to kilnd; only when every part
    compiled (a part left to torch by a passing failure must not be frozen into the record).
    Returns what was stored, or None."""
    failed = [p.part_name for p in parts if p.compiled is None or p.error]
    if failed:
        RECORD_EVENTS.append(f"{key[:12]} not stored: parts {failed[:4]} did not compile")
        return None
    try:
        with _real_tensors():
            record, handles = program.encode(outer, parts, output_strides=output_strides, cudagraphs=cudagraphs)
        settings.client.put_model(key, program.FORMAT, record, handles)
        bump(records_stored=1)
        RECORD_EVENTS.append(f"{key[:12]} stored: {len(record)} bytes, {len(handles)} parts")
        return StoredRecord(key, record, list(handles))
    except program.NotRecordable as e:
        log.debug("kiln.torch: graph not recorded: %s", e)
        RECORD_EVENTS.append(f"{key[:12]} not recordable: {e}")
    except Exception as e:
        log.warning("kiln.torch: storing program record %s failed: %s: %s", key[:12], type(e).__name__, e)
        RECORD_EVENTS.append(f"{key[:12]} not stored: {type(e).__name__}: {e}")
    return None


# ------------------------------------------------------------------------------ sealed mode

class SealedError(KilnError):
    """A graph had to be compiled while kiln.torch was sealed with ``raise_on_miss``."""


_SEALED: dict[str, bool] = {"on": os.environ.get("KILN_SEALED", "0") not in ("", "0"),
                            "raise": os.environ.get("KILN_SEALED", "0") == "raise"}


def seal(raise_on_miss: bool = False) -> None:
    """From now on every graph that is not rebuilt from a program record (a new model, shape,
    dtype, option, or a record kilnd lost) is a *sealed miss*: counted in
    ``kiln.torch.stats()["sealed_misses"]``, reported in one warning with its reason, and, with
    ``raise_on_miss``, raised as :class:`SealedError` instead of compiled. A deployment warms up
    (or prewarms its cluster), seals, and so proves it never compiles in production.
    ``$KILN_SEALED=1`` seals from the start, ``$KILN_SEALED=raise`` with ``raise_on_miss``."""
    _SEALED["on"], _SEALED["raise"] = True, bool(raise_on_miss)


def unseal() -> None:
    _SEALED["on"] = _SEALED["raise"] = False


def check_sealed(reason: str) -> None:
    """Counts (and reports, or raises) a sealed miss for ``reason`` when sealed."""
    if not _SEALED["on"]:
        return
    bump(sealed_misses=1)
    if _SEALED["raise"]:
        raise SealedError(f"kiln.torch is sealed: {reason}")
    warnings.warn(f"kiln: sealed miss: {reason}; compiling it", KilnFallbackWarning, stacklevel=3)


# Compiles started with options={"async": True} that have not finished, for wait().
_pending: set[concurrent.futures.Future[Any]] = set()
_pending_lock = threading.Lock()
_async_pool: Optional[concurrent.futures.ThreadPoolExecutor] = None


def submit_compile(job: Callable[[], None]) -> concurrent.futures.Future[Any]:
    """Runs ``job`` (a graph's compile_parts) on the background pool; :func:`wait` sees it."""
    global _async_pool
    with _pending_lock:
        if _async_pool is None:
            # One thread: compile_parts itself compiles a graph's parts concurrently, and graphs
            # queued behind each other reach the kernels in the order the program met them.
            _async_pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="kiln-async")
        fut = _async_pool.submit(job)
        _pending.add(fut)
    fut.add_done_callback(_forget)
    return fut


def _forget(fut: concurrent.futures.Future[Any]) -> None:
    with _pending_lock:
        _pending.discard(fut)


def wait(timeout: Optional[float] = None) -> bool:
    """Blocks until every compile started with ``async`` has finished (its parts loaded or
    fallen back); returns False if ``timeout`` seconds passed first."""
    with _pending_lock:
        pending = list(_pending)
    t0 = time.monotonic()
    done, not_done = concurrent.futures.wait(pending, timeout=timeout)
    # The native part runner too (its first build on a cluster takes a few seconds).
    native.wait(None if timeout is None else max(0.0, timeout - (time.monotonic() - t0)))
    return not not_done


class AsyncGraph:
    """A compiled graph whose parts are still compiling: runs ``eager`` (the rewritten graph
    with every part in torch, or the traced ATen graph) until the compile is done, then the
    final function (``finish()``: CUDA graphs around it if asked).

    ``work`` is either the compile's future, or a job to start once the first call returned
    (:func:`compile_aten_graph`'s background partitioning: Python work that, started at once,
    would hold the interpreter lock against Dynamo's guard building and the first call, and
    delayed BERT-base's first result by ~2 s on an H200's host).

    The switch happens between calls, never inside one; a part loads its kernel before it is
    visible to callers (KilnPart.compile assigns it last)."""

    def __init__(self, eager: Callable[[list[Any]], Any],
                 work: "concurrent.futures.Future[Any] | Callable[[], None]",
                 finish: Callable[[], Callable[[list[Any]], Any]]) -> None:
        self._boxed_call = True  # AOTAutograd calls it with one list of arguments
        self._eager = eager
        self._future: Optional[concurrent.futures.Future[Any]] = None
        self._job: Optional[Callable[[], None]] = None
        if isinstance(work, concurrent.futures.Future):
            self._future = work
        else:
            self._job = work
        self._start = threading.Lock()
        self._finish = finish
        self._final: Optional[Callable[[list[Any]], Any]] = None

    def __call__(self, args: list[Any]) -> Any:
        final = self._final
        if final is None:
            future = self._future
            if future is None:
                try:
                    return self._eager(args)
                finally:
                    with self._start:
                        if self._future is None and self._job is not None:
                            self._future = submit_compile(self._job)
                            self._job = None
            if not future.done():
                return self._eager(args)
            final = self._final = self._finish()
        return final(args)


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
    def in_torch(nodes: Sequence[torch.fx.Node]) -> None:
        for n in nodes:
            if n.op == "get_attr":
                root[n.target] = get_attr(gm, n.target)
            elif n.op == "call_module":
                root[n.target] = gm.get_submodule(n.target)
            env[n] = _direct_call(g.node_copy(n, lambda a: env[a]))

    for seg in segments:
        if not seg.is_kiln:
            in_torch(seg.nodes)
            continue
        name = f"kiln_part_{len(parts)}"
        error = None
        try:
            pg = build_part(seg)
        except NothingToCompute:
            in_torch(seg.nodes)
            continue
        except L.Unsupported as e:
            pg, error = None, f"lowering: {e}"
        assert seg.color is not None
        part = KilnPart(name, seg, pg, torch.device(seg.color), build_error=error)
        parts.append(part)
        root[name] = part
        call = g.call_module(name, tuple(env[a] for a in seg.inputs))
        for o, chain in seg.torch_views.items():  # views of the part's arguments: made here
            local: dict[torch.fx.Node, torch.fx.Node] = {}
            for c in chain:
                local[c] = _direct_call(g.node_copy(c, lambda a: local[a] if a in local else env[a]))
            env[o] = local[o]
        for j, o in enumerate(seg.outputs):
            item = g.call_function(operator.getitem, (call, j))
            item.meta = dict(o.meta)
            env[o] = item
    assert output_node is not None
    g.node_copy(output_node, lambda a: env[a])
    fold_views(g)
    fold_linear(g)
    fold_reinterpret(g)
    reshape_other_views(g)
    fold_clones(g)
    fold_fresh_index_add(g)
    launch_long_kernels_first(g)
    g.lint()
    outer = torch.fx.GraphModule(root, g, class_name="KilnGraphModule")
    # The generated forward reads each part as ``self.kiln_part_N``: found in the instance
    # dict, that skips nn.Module.__getattr__'s Python lookup in ``_modules`` on every call.
    for p in parts:
        outer.__dict__[p.part_name] = p
    return outer, parts


def eliminate_common_subexpressions(gm: torch.fx.GraphModule) -> int:
    """Merges identical pure ATen nodes (the same op on the same arguments) of ``gm`` in place;
    returns how many nodes went. Inference graphs reach the backend without this pass (AOTAutograd
    runs one on a training graph's joint graph): BERT at a symbolic sequence length padded its
    attention mask once per layer, 12 identical pads (each an allocation, a fill and a copy) that
    are now one.

    kiln's own pass rather than torch's ``fx_graph_cse``: torch's imports Inductor's pattern
    matcher, and with it most of Inductor (1.6 s of a warm start's first call on a 2-core
    machine, for a pass that takes milliseconds). The rules are the usual ones: only functional
    ATen ops and ``getitem``; never random ops (tagged ``nondeterministic_seeded``) nor
    uninitialised allocations; a node whose storage a graph output shares stays (two equal
    outputs must stay two tensors); and nodes merge only within the same mutation region (the
    stretch between two in-place ops), since an in-place op may change what equal arguments
    hold."""
    g = gm.graph
    out_node = next(n for n in reversed(g.nodes) if n.op == "output")
    outs = out_node.all_input_nodes
    out_storages = {st for a in outs for st in _storages(a)}
    # Outputs, and the tuple-valued nodes whose items an output is or views (an item's traced
    # value is another tensor than the tuple's, so storages do not tell).
    kept_apart = set(outs)
    for n in g.nodes:
        if n.target is operator.getitem and (n in kept_apart or not out_storages.isdisjoint(_storages(n))):
            kept_apart.add(n.args[0])
    written = _written_nodes(g)
    seen: dict[Any, torch.fx.Node] = {}
    region = 0
    removed = 0
    for n in list(g.nodes):
        if n.op != "call_function":
            continue
        target = n.target
        if not _pure(target):
            if _may_mutate(target):
                region += 1
            continue
        if n in written or isinstance(n.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool)):
            continue  # a tensor written in place later; a size (merging could lose a symbol)
        if n in kept_apart or not out_storages.isdisjoint(_storages(n)):
            continue
        try:
            key = (target, _cse_key(n.args), _cse_key(n.kwargs), region)
            kept = seen.get(key)
        except TypeError:  # an argument kiln cannot compare by value
            continue
        if kept is None:
            seen[key] = n
            continue
        n.replace_all_uses_with(kept)
        g.erase_node(n)
        removed += 1
    if removed:
        gm.recompile()
    return removed


_UNINITIALISED = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                            "empty_permuted"})


# A folded value larger than this (elements) is computed on every call instead of being held.
_MAX_CONSTANT_ELEMENTS = 1 << 24
# Ops that fill a tensor with one value: kept as they are by fold_constant_subgraphs.
_FILLS = frozenset({"full", "zeros", "ones", "scalar_tensor", "full_like", "zeros_like", "ones_like", "fill"})


def fold_constant_subgraphs(gm: torch.fx.GraphModule) -> int:
    """Computes once, now, the values of ``gm`` that read no graph input or parameter: a
    tensor made by ``full``/``arange`` and the trace's tensor constants and changed by
    functional ops, such as the shifted-window attention mask Swin builds in every forward
    from zeros by nine slice assignments (functional ``slice_scatter``s, run by torch: a clone
    and a copy each; on CUDA each assigned number is a 0-d tensor constant, copied once more)
    or a roll's index arithmetic. Each such value read by the rest of the graph becomes a
    buffer of ``gm``; returns how many.

    Only static shapes, ops :func:`_pure` accepts (no random draws, no uninitialised memory),
    values nothing writes in place, never a graph output or a value an output views (the
    caller could write it, and would share it with the next call), and not a plain fill or a
    view of one: kiln computes those inside the parts that read them, for nothing, where a
    buffer would be read from memory."""
    g = gm.graph
    written = _written_nodes(g)
    out = next((n for n in reversed(g.nodes) if n.op == "output"), None)
    returned = set(out.all_input_nodes) if out is not None else set()
    const: set[torch.fx.Node] = set()
    computed: set[torch.fx.Node] = set()  # const values that are more than a fill seen through views
    for n in g.nodes:
        if n.op == "get_attr" and n not in written and _tensor_constant(gm, n) is not None:
            const.add(n)  # a leaf, like a fill: folding it alone would gain nothing
            continue
        if n.op != "call_function" or not _pure(n.target) or n in written:
            continue
        flat: list[Any] = []
        torch.fx.node.map_aggregate((n.args, n.kwargs), flat.append)
        leaves_ok = all(v in const if isinstance(v, torch.fx.Node)
                        else not isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool, torch.Tensor))
                        for v in flat)
        val = n.meta.get("val")
        vals = val if isinstance(val, (list, tuple)) else (val,)
        if leaves_ok and all(isinstance(v, torch.Tensor) and L.is_static_tensor(v) for v in vals):
            const.add(n)
            fill_or_view = _returns_alias(n.target) or (isinstance(n.target, torch._ops.OpOverload)
                                                        and n.target.overloadpacket.__name__ in _FILLS)
            if not fill_or_view or any(v in computed for v in flat if isinstance(v, torch.fx.Node)):
                computed.add(n)
    frontier = [n for n in g.nodes if n in computed and any(u not in const for u in n.users)
                and isinstance(n.meta.get("val"), torch.Tensor)
                and n.meta["val"].numel() <= _MAX_CONSTANT_ELEMENTS
                and not any(_is_view_of(r, n) for r in returned)]
    if not frontier:
        return 0
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    # Only what the folded values are made of (a large fill a part reads is left alone, not
    # allocated here).
    needed: set[torch.fx.Node] = set()
    stack = list(frontier)
    while stack:
        n = stack.pop()
        if n not in needed:
            needed.add(n)
            stack.extend(a for a in n.all_input_nodes if a in const)
    values: dict[torch.fx.Node, Any] = {}
    with unset_fake_temporarily(), torch.no_grad():
        for n in g.nodes:
            if n not in needed:
                continue
            if n.op == "get_attr":
                values[n] = _tensor_constant(gm, n)
                continue
            args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: values[a])
            values[n] = n.target(*args, **kwargs)
    for i, n in enumerate(frontier):
        name = f"_kiln_constant_{i}"
        while hasattr(gm, name):
            name += "_"
        value = values[n]
        want = n.meta["val"]
        if tuple(value.stride()) != tuple(want.stride()):  # the traced layout, which the graph assumes
            value = torch.empty_strided(want.shape, want.stride(), dtype=want.dtype, device=want.device).copy_(value)
        gm.register_buffer(name, value)
        with g.inserting_before(n):
            attr = g.get_attr(name)
        attr.meta = dict(n.meta)
        n.replace_all_uses_with(attr, delete_user_cb=lambda u: u not in const)
    g.eliminate_dead_code()
    gm.recompile()
    return len(frontier)


def _tensor_constant(gm: torch.fx.GraphModule, n: torch.fx.Node) -> Optional[torch.Tensor]:
    """The value of a ``get_attr`` node that is a tensor constant of the trace (a tensor the
    traced code made, such as the 0-d tensor a Python number becomes when it is assigned into
    a CUDA tensor's slice), or None: parameters, tensors of symbolic or fake values, tensors
    that require gradients and other attributes are not constants."""
    try:
        v = get_attr(gm, n.target)
    except AttributeError:
        return None
    if not isinstance(v, torch.Tensor) or isinstance(v, torch.nn.Parameter) or v.requires_grad:
        return None
    from torch._subclasses.fake_tensor import is_fake

    return v if not is_fake(v) and L.is_static_tensor(v) else None


def _is_view_of(n: torch.fx.Node, base: torch.fx.Node) -> bool:
    """Whether ``n`` is ``base`` seen through a chain of view ops."""
    while isinstance(n, torch.fx.Node) and n is not base:
        if not _returns_alias(n.target):
            return False
        n = n.args[0] if n.args else None
    return n is base


def _returns_alias(target: Any) -> bool:
    """Whether ``target`` is an ATen op whose result shares memory with an argument (a view)."""
    return isinstance(target, torch._ops.OpOverload) and any(r.alias_info is not None
                                                             for r in target._schema.returns)


def _pure(target: Any) -> bool:
    """Whether a call of ``target`` may be merged with an identical one."""
    if target is operator.getitem:
        return True
    if not isinstance(target, torch._ops.OpOverload) or target.namespace not in ("aten", "prims"):
        return False
    schema = target._schema
    if schema.is_mutable or any(r.alias_info is not None and r.alias_info.is_write for r in schema.returns):
        return False
    if torch.Tag.nondeterministic_seeded in target.tags:
        return False
    return target.overloadpacket.__name__ not in _UNINITIALISED


def _may_mutate(target: Any) -> bool:
    """Whether a call of ``target`` (not :func:`_pure`) may write a tensor other nodes read."""
    if isinstance(target, torch._ops.OpOverload):
        return bool(target._schema.is_mutable)
    return not (target is operator.getitem or getattr(target, "__module__", "") in ("_operator", "math"))


def _written_nodes(g: torch.fx.Graph) -> set[torch.fx.Node]:
    """The nodes an in-place op of ``g`` writes, and the nodes those view: merging a fresh
    tensor that is later written with an equal one would let the write reach both."""
    out: set[torch.fx.Node] = set()
    for n in g.nodes:
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
            continue
        schema = n.target._schema
        if not schema.is_mutable:
            continue
        for i, arg in enumerate(schema.arguments):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            value = n.args[i] if i < len(n.args) else n.kwargs.get(arg.name)
            for x in value if isinstance(value, (list, tuple)) else (value,):
                while isinstance(x, torch.fx.Node) and x not in out:
                    out.add(x)
                    # Through views back to the tensor they share memory with.
                    x = x.args[0] if _returns_alias(x.target) and x.args else None
    return out


def _storages(n: Any) -> list[Any]:
    """The storages of a node's traced value (each tensor of a tuple-valued one); empty when
    there are none to compare."""
    val = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
    from torch.multiprocessing.reductions import StorageWeakRef

    out = []
    for v in val if isinstance(val, (list, tuple)) else (val,):
        if isinstance(v, torch.Tensor):
            try:
                out.append(StorageWeakRef(v.untyped_storage()))
            except Exception:  # sparse or otherwise storage-less values
                pass
    return out


def _cse_key(a: Any) -> Any:
    """An argument as a hashable value that equals another's only when the two mean the same:
    nodes by identity, sequences element by element, numbers with their type (1, 1.0 and True
    differ) and floats by their bits (0.0 and -0.0 differ, NaN equals NaN)."""
    if isinstance(a, torch.fx.Node):
        return a
    if isinstance(a, (list, tuple)):
        return (type(a).__name__,) + tuple(_cse_key(x) for x in a)
    if isinstance(a, dict):
        return ("dict",) + tuple((k, _cse_key(v)) for k, v in sorted(a.items()))
    if isinstance(a, float):
        return ("float", struct.pack("<d", a))
    if isinstance(a, (bool, int)):
        return (type(a).__name__, a)
    if a is None or isinstance(a, (str, torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return (type(a).__name__, a)
    raise TypeError(f"no CSE key for {type(a).__name__}")


_DIRECT: Optional[dict[Any, tuple[str, Any]]] = None


def _direct_call(n: torch.fx.Node) -> torch.fx.Node:
    """``n`` (a copied torch-side node) rewritten to its direct call when it has one."""
    global _DIRECT
    if n.op != "call_function":
        return n
    if _DIRECT is None:
        _DIRECT = direct_calls()
    hit = _DIRECT.get(n.target)
    if hit is None or not n.args or not isinstance(n.args[0], torch.fx.Node):
        return n
    if n.target is torch.ops.aten.expand.default and n.kwargs:
        return n  # expand's ``implicit`` flag has no Tensor.expand spelling
    from .cuda import draws_random

    if draws_random(n):
        return n
    n.op, n.target = hit
    return n


def _val(n: Any) -> Any:
    return n.meta.get("val") if isinstance(n, torch.fx.Node) else None


def _static_shape(n: Any) -> Optional[tuple[int, ...]]:
    v = _val(n)
    if not isinstance(v, torch.Tensor) or any(not isinstance(d, int) for d in v.shape):
        return None
    return tuple(v.shape)


def fold_linear(g: torch.fx.Graph) -> int:
    """Rewrites the torch side's matrix products of a transposed 2-D operand into
    ``torch.nn.functional.linear``, which makes the same cuBLAS call (``mm``/``addmm`` of the
    transposed weight) from one Python call instead of several; returns how many it rewrote.

    - ``mm(a, b.permute(1, 0))`` -> ``linear(a, b)``; ``addmm(bias, a, b.permute(1, 0))`` with
      a 1-D bias -> ``linear(a, b, bias)`` (the transpose node goes when nothing else reads it);
    - when ``a`` is ``x.view(-1, K)`` of an N-D ``x`` and the product's only reader views it
      back to ``x``'s leading dimensions (a linear layer on [B, T, K], as AOTAutograd spells
      it), the views go too: ``linear(x, b)`` takes and gives N-D tensors (static shapes only).

    A BERT-base layer runs 6 linear layers: this takes ~15 Python-level calls (views and
    transposes, ~3-5 µs of host time each on a GPU server) out of each layer's forward."""
    linear = torch.nn.functional.linear
    count = 0
    for n in list(g.nodes):
        if n.op != "call_function" or n.target not in (torch.mm, torch.addmm) or n.kwargs:
            continue
        if n.target is torch.mm:
            if len(n.args) != 2:
                continue
            bias, a, bt = None, n.args[0], n.args[1]
        else:
            bias_shape = _static_shape(n.args[0]) if len(n.args) == 3 else None
            if bias_shape is None or len(bias_shape) != 1:
                continue
            bias, a, bt = n.args
        if not (isinstance(bt, torch.fx.Node) and bt.op == "call_method" and
                ((bt.target == "permute" and list(bt.args[1:]) in ([[1, 0]], [1, 0])) or
                 (bt.target == "t" and len(bt.args) == 1))):
            continue
        b = bt.args[0]
        bv = _val(b)
        if not isinstance(bv, torch.Tensor) or bv.dim() != 2:
            continue
        x, out_view = a, None
        # a = x.view(M, K) of an N-D x, and the product's only reader is .view(x's leading
        # dims + [N]): linear on x itself gives that shape.
        is_view = isinstance(a, torch.fx.Node) and a.op == "call_method" and a.target == "view"
        xs = _static_shape(a.args[0]) if is_view else None
        ns = _static_shape(n)
        if xs is not None and ns is not None and len(xs) >= 3 and len(n.users) == 1:
            (user,) = n.users
            want = list(xs[:-1]) + [ns[-1]]
            if user.op == "call_method" and user.target == "view" and _static_shape(user) == tuple(want) \
                    and _val(a.args[0]).is_contiguous():
                x, out_view = a.args[0], user
        with g.inserting_before(n):
            new = g.call_function(linear, (x, b) if bias is None else (x, b, bias))
        new.meta = dict((out_view or n).meta)
        (out_view or n).replace_all_uses_with(new)
        for dead in ([out_view] if out_view is not None else []) + [n, bt, a]:
            if dead is not None and isinstance(dead, torch.fx.Node) and not dead.users and dead.op != "placeholder":
                g.erase_node(dead)
        count += 1
    return count


def fold_views(g: torch.fx.Graph) -> int:
    """Collapses chains of views on the torch side whose inner link nothing else reads: a
    permute of a permute becomes one permute (or the tensor itself: a weight gradient's
    ``mm(...).permute(1, 0).permute(1, 0)`` as AOTAutograd spells it), a view of a view one
    view. Each removed link is a Python-level torch call (a few µs of host time); the result
    is the same view of the same memory. Returns how many links went."""
    count = 0
    for n in list(g.nodes):
        if n.op != "call_method" or n.target not in ("permute", "view") or len(n.args) != 2 or n.kwargs:
            continue
        inner = n.args[0]
        if not (isinstance(inner, torch.fx.Node) and inner.op == "call_method" and inner.target == n.target
                and len(inner.args) == 2 and not inner.kwargs and len(inner.users) == 1):
            continue
        base = inner.args[0]
        if n.target == "view":
            n.args = (base, n.args[1])
        else:
            p, q = inner.args[1], n.args[1]
            if not (isinstance(p, (list, tuple)) and isinstance(q, (list, tuple)) and len(p) == len(q)
                    and all(isinstance(i, int) for i in (*p, *q))):
                continue
            dims = len(p)
            composed = [p[i % dims] for i in q]
            if composed == list(range(dims)):
                n.replace_all_uses_with(base)
                g.erase_node(n)
                g.erase_node(inner)
                count += 2
                continue
            n.args = (base, composed)
        g.erase_node(inner)
        count += 1
    return count


_reinterpret = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
_reinterpret = getattr(_reinterpret, "_reinterpret_tensor", None)


def reinterpreted_view(x: torch.Tensor, size: tuple[int, ...], stride: tuple[int, ...], delta: int,
                       in_stride: tuple[int, ...], method: str, args: tuple[Any, ...],
                       *more: tuple[str, tuple[Any, ...]]) -> torch.Tensor:
    """The view ``x.<method>(*args)`` of a static graph, made directly from its traced size,
    strides and storage offset (relative to ``x``'s): about 0.4 µs of host time against 1.1-1.3
    for the view op through the dispatcher. Only when ``x`` has the strides it was traced with;
    otherwise (a layout the trace did not foresee) the op itself runs. ``more``: further
    ``(method, args)`` views applied to that result, for a chain folded into one call
    (:func:`fold_reinterpret`); size, strides and delta are then the chain's last view's."""
    if x.stride() == in_stride:
        return _reinterpret(x, size, stride, delta)  # the offset is relative to x's
    # Another layout: the chain's own ops, ``view`` as ``reshape``. A kiln part may hand torch
    # a result in another layout than the trace's (contiguous), and an op after it may follow
    # its argument's layout (attention's output follows the query's), so a ``view`` the trace
    # allowed may not be one here; nothing writes to these views or returns them (see
    # :func:`fold_reinterpret`), so a copy where a view is impossible computes the same.
    x = _apply_view(x, method, args)
    for m, a in more:
        x = _apply_view(x, m, a)
    return x


def _apply_view(x: torch.Tensor, method: str, args: tuple[Any, ...]) -> torch.Tensor:
    return x.reshape(*args) if method == "view" else getattr(x, method)(*args)


_VIEW_METHODS = frozenset({"view", "permute", "expand", "t", "transpose", "unsqueeze", "squeeze", "select"})


def _mutates(n: torch.fx.Node) -> bool:
    """Whether a node may write to its arguments (an in-place op)."""
    t = n.target
    if isinstance(t, torch._ops.OpOverload):
        return bool(t._schema.is_mutable)
    return getattr(t, "__name__", str(t)).endswith("_")


def fold_reinterpret(g: torch.fx.Graph) -> int:
    """Rewrites the torch side's view calls of static shape into :func:`reinterpreted_view`
    calls (the size, strides and offset delta read from the trace); returns how many. A
    BERT-base step runs ~200 such views, a few hundred µs of host time in a host-bound step.
    Views whose result is a graph output keep their op (AOTAutograd regenerates outputs that
    alias inputs from real views), as do views read by an in-place op."""
    if _reinterpret is None:
        return 0
    count = 0
    for n in list(g.nodes):
        if n.op != "call_method" or n.target not in _VIEW_METHODS or n.kwargs or not n.args:
            continue
        x, v = n.args[0], _val(n)
        xv = _val(x)
        if not (isinstance(v, torch.Tensor) and isinstance(xv, torch.Tensor)):
            continue
        if any(not isinstance(d, int) for d in (*v.shape, *v.stride(), *xv.shape, *xv.stride())):
            continue  # symbolic sizes: the trace's numbers are not the run's
        if not isinstance(v.storage_offset(), int) or not isinstance(xv.storage_offset(), int):
            continue
        if any(u.op == "output" or _mutates(u) for u in n.users):
            continue
        args = tuple(n.args[1:])
        with g.inserting_before(n):
            new = g.call_function(reinterpreted_view, (x, tuple(v.shape), tuple(v.stride()),
                                                       v.storage_offset() - xv.storage_offset(), tuple(xv.stride()),
                                                       n.target, args))
        new.meta = dict(n.meta)
        n.replace_all_uses_with(new)
        g.erase_node(n)
        count += 1
    return count + _chain_reinterpreted(g)


def reshape_other_views(g: torch.fx.Graph) -> int:
    """The ``view`` calls left on the torch side (sizes known only at run time) become
    ``reshape``, which is the view wherever the strides allow one and a copy elsewhere: a kiln
    part hands torch contiguous results, and an op after one may follow its argument's layout
    (attention's output follows the query's), so a view the trace allowed may not exist at run
    time. As in :func:`fold_reinterpret`, views a graph output or an in-place op reads keep
    their op. Returns how many."""
    count = 0
    for n in g.nodes:
        if n.op == "call_method" and n.target == "view" and not n.kwargs and len(n.args) >= 2 \
                and not any(isinstance(a, torch.dtype) for a in n.args[1:]) \
                and not any(u.op == "output" or _mutates(u) for u in n.users):
            n.target = "reshape"
            count += 1
    return count


def _chain_reinterpreted(g: torch.fx.Graph) -> int:
    """Folds a reinterpreted view of a reinterpreted view that nothing else reads into one call
    (an attention head's ``view`` then ``permute``, and back: three calls become one): when the
    first view's input has its traced strides, the first view's result has its traced strides
    too, so one check on the chain's input covers the chain, and the offsets add up. Returns how
    many calls went."""
    count = 0
    for n in list(g.nodes):
        if n.op != "call_function" or n.target is not reinterpreted_view:
            continue
        inner = n.args[0]
        if not (isinstance(inner, torch.fx.Node) and inner.op == "call_function"
                and inner.target is reinterpreted_view and len(inner.users) == 1):
            continue
        x, _, _, d0, in_stride, m0, a0, *more0 = inner.args
        _, size, stride, d1, _, m1, a1, *more1 = n.args
        n.args = (x, size, stride, d0 + d1, in_stride, m0, a0, *more0, (m1, a1), *more1)
        g.erase_node(inner)
        count += 1
    return count


def _long_kernel(n: torch.fx.Node) -> bool:
    """Whether a torch-side node launches a long kernel: a matrix product, attention, or a
    convolution."""
    if n.op != "call_function":
        return False
    t = n.target
    if t in _LONG_TARGETS:
        return True
    name = str(getattr(t, "__name__", t))
    return "scaled_dot_product" in name or "convolution" in name


_LONG_TARGETS = frozenset({torch.nn.functional.linear, torch.mm, torch.bmm, torch.addmm, torch.matmul, torch.baddbmm,
                           torch.ops.aten.mm.default, torch.ops.aten.bmm.default, torch.ops.aten.addmm.default})


def launch_long_kernels_first(g: torch.fx.Graph) -> int:
    """Reorders the rewritten graph so that each long torch kernel (matrix products, attention,
    convolutions) is launched as soon as its inputs are, and the work nothing long waits for
    (an attention mask's preparation, say) right after it; returns how many nodes moved.

    A step timed or served from an idle GPU waits for the host until its first long kernel
    is queued; after that the host runs ahead. BERT-base's forward prepared the attention
    mask (an ``arange``, an advanced index, two copies) before its first linear layer, ~0.1 ms
    of host time at the start of every step that the GPU spent waiting. The order only changes
    between nodes that draw random numbers or write in place (those keep their place and
    their order), so results are the same."""
    from .cuda import draws_random

    nodes = list(g.nodes)
    moved = 0
    start = 0
    for end in range(len(nodes) + 1):
        if end < len(nodes):
            n = nodes[end]
            if not (n.op in ("placeholder", "output", "get_attr") or draws_random(n) or _mutates(n)):
                continue
        moved += _long_first(nodes[start:end], nodes[start - 1] if start > 0 else None)
        start = end + 1
    return moved


def _long_first(span: list[torch.fx.Node], before: Optional[torch.fx.Node]) -> int:
    """Orders ``span`` (consecutive nodes, ``before`` the node ahead of them): each long kernel
    with its not yet placed ancestors in the span, in their order, then the rest in theirs."""
    if before is None or not any(_long_kernel(n) for n in span):
        return 0
    members = set(span)
    placed: set[torch.fx.Node] = set()
    order: list[torch.fx.Node] = []

    def place(root: torch.fx.Node) -> None:
        stack = [(root, False)]
        while stack:
            n, ready = stack.pop()
            if n in placed:
                continue
            if ready:
                placed.add(n)
                order.append(n)
                continue
            stack.append((n, True))
            for a in reversed(n.all_input_nodes):
                if a in members and a not in placed:
                    stack.append((a, False))

    for n in span:
        if _long_kernel(n):
            place(n)
    order += [n for n in span if n not in placed]
    moved = sum(1 for a, b in zip(order, span) if a is not b)
    anchor = before
    for n in order:
        anchor.append(n)
        anchor = n
    return moved


def _contiguous(v: torch.Tensor) -> bool:
    try:
        return bool(v.is_contiguous())
    except Exception:  # a symbolic layout the trace cannot decide
        return False


def fold_clones(g: torch.fx.Graph) -> int:
    """Rewrites the torch side's contiguous clones into ``Tensor.contiguous`` calls, which copy
    only a tensor that is not contiguous already; returns how many. AOTAutograd's graphs are
    functional, so a copy of a contiguous tensor is needed only where something writes to one
    of the two: clones read by an in-place op, of a tensor an in-place op writes, or that are
    graph outputs (fresh storage AOTAutograd may hand out) keep their op. (The matrix products
    of an attention block clone their operands after an expand that broadcasts nothing: a
    device copy per product in a training step.)"""
    count = 0
    for n in list(g.nodes):
        if n.op != "call_method" or n.target != "clone" or len(n.args) != 1 or set(n.kwargs) - {"memory_format"}:
            continue
        x, v = n.args[0], _val(n)
        # Only where the traced result is contiguous, which contiguous() gives too (a clone
        # that preserves a transposed layout keeps its op).
        if not isinstance(x, torch.fx.Node) or not isinstance(v, torch.Tensor) or not _contiguous(v):
            continue
        if any(u.op == "output" or _mutates(u) for u in n.users) or any(_mutates(u) for u in x.users):
            continue
        n.target, n.kwargs = "contiguous", {}
        count += 1
    return count


def fold_fresh_index_add(g: torch.fx.Graph) -> int:
    """Rewrites the torch side's ``index_add(fresh, ...)`` into ``fresh.index_add_(...)`` where
    ``fresh`` is a tensor the graph just made (zeros, full) that nothing else reads; returns how
    many. The functional op copies its first argument before adding into the copy: for an
    embedding table's gradient (a zero table and an index_add) that was a 94 MB copy per
    BERT-base training step. Writing into the fresh tensor gives the same value and storage
    no one else sees."""
    aten = torch.ops.aten
    fresh = {aten.zeros.default, aten.full.default, aten.new_zeros.default, aten.zeros_like.default,
             aten.full_like.default}
    count = 0
    for n in list(g.nodes):
        if n.op != "call_function" or n.target is not aten.index_add.default or len(n.args) < 4:
            continue
        base = n.args[0]
        if not (isinstance(base, torch.fx.Node) and base.op == "call_function" and base.target in fresh
                and len(base.users) == 1):
            continue
        n.op, n.target = "call_method", "index_add_"
        count += 1
    return count


@functools.lru_cache(maxsize=2)
def decompositions(random_in_kiln: bool = True) -> Any:
    """The decomposition table AOTAutograd applies: torch's core ATen decompositions, which
    leave the ops kiln maps directly (softmax, layer_norm, gelu...) and break their backward
    ops into elementwise ops and reductions. ``random_in_kiln``: a dropout becomes a draw and
    a select that kiln fuses (kiln/torch/rng.py), else it stays torch's op."""
    from torch._decomp import core_aten_decompositions, get_decompositions

    table = core_aten_decompositions()
    # Attention stays one op, run by torch. Decomposing the CPU flash-attention forward into
    # matmuls and a softmax gives the right output, but AOTAutograd's backward is still the
    # fused op's, fed the logsumexp the decomposition computed: on torch 2.15 the gradients
    # of q, k and v come out wrong by orders of magnitude (tests/python/test_torch_backend.py,
    # ``test_attention_gradients_match_eager``). kiln fuses nothing across a matmul anyway.
    for name in ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention"):
        op = getattr(torch.ops.aten, name, None)
        if op is not None:
            table.pop(op.default, None)
    # An embedding's backward: torch's core decomposition is an index_put with accumulation,
    # which CUDA runs as a sort and a serial scatter per duplicate index (about 1 ms for
    # BERT-base's word embeddings at batch 16, sequence 128, on an H100/H200), and the op's own
    # kernel sorts too (0.23 ms per BERT-base step for its three tables, H200). On CUDA it is
    # a zero table and an index_add (atomic adds, as Inductor's kernel does: 0.03 ms),
    # unless deterministic algorithms are asked for; elsewhere the op stays torch's.
    table[torch.ops.aten.embedding_dense_backward.default] = _embedding_backward_by_atomic_adds
    # (index_add itself stays an op: the core table would make it an index_put, the sort.)
    table.pop(torch.ops.aten.index_add.default, None)
    # Splits become slices of the split tensor. Kept as one split_with_sizes, the partitioner
    # (min-cut) saves each piece's consumers for the backward rather than the tensor the
    # pieces view: the LLTM cell's forward then wrote its sigmoids and the elu's input, three
    # [batch, state] tensors, where saving the gates (already written by the matmul) costs no
    # write at all, the backward recomputing the sigmoids as it reads them.
    table[torch.ops.aten.split_with_sizes.default] = _split_as_slices
    # A training batch norm (batch statistics, running statistics updated) becomes its
    # arithmetic: a variance and mean over N, H, W, the normalisation, and the running-statistic
    # updates, which kiln fuses with the ReLU and residual add around it. Left as the op, it ran
    # in torch with a clone of each running statistic and a kernel of its own per output.
    table.update(get_decompositions([torch.ops.aten._native_batch_norm_legit_functional.default]))
    if random_in_kiln:
        table.update(dropout_decomposition())
    return table


def _embedding_backward_by_atomic_adds(grad_output: torch.Tensor, indices: torch.Tensor, num_weights: int,
                                       padding_idx: int, scale_grad_by_freq: bool) -> Any:
    """The gradient of an embedding table on CUDA: each row of ``grad_output`` added into the
    row its index names (``index_add``, atomic adds: the order of the additions, and so the
    last bits of a row read many times, may differ between runs, as Inductor's kernel does);
    rows at ``padding_idx`` contribute nothing. NotImplemented (torch's op) on other devices,
    with ``scale_grad_by_freq`` or under ``torch.use_deterministic_algorithms``."""
    if (grad_output.device.type != "cuda" or scale_grad_by_freq or torch.are_deterministic_algorithms_enabled()):
        return NotImplemented
    return embedding_grad(grad_output, indices, num_weights, padding_idx)


def embedding_grad(grad_output: torch.Tensor, indices: torch.Tensor, num_weights: int, padding_idx: int) -> torch.Tensor:
    """An embedding table's gradient as a zero table and an ``index_add`` (any device)."""
    aten = torch.ops.aten
    width = grad_output.shape[-1]
    ids = aten.reshape.default(indices, [-1])
    rows = aten.reshape.default(grad_output, [-1, width])
    if padding_idx >= 0:
        keep = aten.unsqueeze.default(aten.ne.Scalar(ids, padding_idx), 1)
        rows = aten.where.self(keep, rows, aten.scalar_tensor.default(0.0, dtype=rows.dtype, device=rows.device))
    table = aten.zeros.default([num_weights, width], dtype=grad_output.dtype, device=grad_output.device)
    return aten.index_add.default(table, 0, ids, rows)


def _split_as_slices(x: torch.Tensor, split_sizes: Sequence[Any], dim: int = 0) -> list[torch.Tensor]:
    """``split_with_sizes`` as slices along ``dim`` (views either way; kiln lowers slices)."""
    out, start = [], 0
    for size in split_sizes:
        out.append(torch.ops.aten.slice.Tensor(x, dim, start, start + size))
        start = start + size
    return out


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

    def compiler(kind: str, **fixed: Any) -> Callable[..., Any]:
        def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kw: Any) -> Any:
            fn = compile_aten_graph(gm, example_inputs, **fixed, kind=kind, **kw)
            return wrap(fn, kind) if wrap is not None else fn

        return compile_graph

    def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **_: Any) -> Callable[..., Any]:
        t0 = time.perf_counter()
        backend.compiler_fn = None  # type: ignore[attr-defined]
        try:
            from functorch.compile import min_cut_rematerialization_partition
            from torch._dynamo.backends.common import aot_autograd

            import torch.utils._pytree as pytree

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
            compiled = aot(gm, example_inputs)
            backend.compiler_fn = aot  # type: ignore[attr-defined]
            return compiled
        except Exception as e:
            _reraise_if_dynamo_control(e)
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


def backend(**options: Any) -> Callable[..., Any]:
    """A backend with fixed options, for ``torch.compile(fn, backend=kiln.torch.backend(...))``.

    Takes the same keys as torch.compile's ``options`` plus ``mode``.
    """
    mode = options.pop("mode", None)
    return make_backend(BackendConfig.from_args(mode, options))


__all__ = ["AsyncGraph", "BackendConfig", "SealedError", "backend", "check_sealed", "seal", "unseal", "compile_aten_graph", "decompositions",
           "eliminate_common_subexpressions", "fold_clones", "fold_reinterpret",
           "kiln_backend", "make_backend", "reinterpreted_view", "rewrite", "wait"]

