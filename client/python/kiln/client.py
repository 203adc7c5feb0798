"""kiln.Client: compile graphs on a kilnd daemon, fetch the artifacts, run them locally.

Example::

    client = kiln.Client()                      # $KILN_SERVER or localhost:50051
    compiled = client.compile(graph, target="cpu")
    (out,) = compiled(x, y)                     # or a single array for a one-output graph

A CPU result runs on NumPy arrays; a CUDA result (``target="cuda:sm_90"``) on CUDA arrays
(PyTorch tensors, CuPy arrays), through :mod:`kiln.cuda`.

The connection itself (calls, retries, TLS and tokens, trust, artifact fetches) is
:class:`kiln.connection.Connection`, which :class:`Client` extends with the calls whose answers
run here: :meth:`Client.compile`, :meth:`Client.lookup` and :meth:`Client.get` give a
:class:`Compiled`, whose shared object is opened once per process (:mod:`kiln.loader`) and whose
CUDA kernels load once per device (:mod:`kiln.cuda`), each from bytes hashed against the signed
digest right before they are loaded.
"""

from __future__ import annotations

import copy
import os
import threading
from collections import OrderedDict
from typing import Any, Optional, Sequence, Union

import numpy as np

from . import core, cuda
from . import dtypes as dt
from .connection import DEFAULT_ADDRESS, Connection, TargetLike, make_options, request_key
from .errors import ArtifactError, CompileError, KilnError, NotFoundError, VerificationError
from .loader import CpuKernel, aligned_empty, default_num_threads, load_cpu_kernel
from .plan import eval_size, size_name
from .target import Target, host_isa, host_runs
from .v1 import service_pb2

# Results one client keeps for requests it already answered (each is a few KB of metadata).
_KNOWN_RESULTS = 4096
# How long an answer kilnd gave this machine is used again without asking kilnd (seconds).
DEFAULT_ANSWER_TTL = 300.0


class Client(Connection):
    """A connection to a kilnd daemon (:class:`kiln.connection.Connection`: its arguments,
    retries, TLS, tokens and trust policy) whose compiles give results that run here.

    ``address`` defaults to ``$KILN_SERVER``, then ``localhost:50051``; ``cache_dir`` to
    ``$KILN_CACHE_DIR``, then ``~/.cache/kiln``. Thread-safe; close it (or use ``with``) to
    free the channel.

    ``answer_ttl`` (default ``$KILN_ANSWER_TTL``, else 300 seconds; 0 turns it off): how long
    an answer kilnd gave any process of this machine is used again, from the local folder,
    without asking kilnd. Answers are kept per daemon address and request key; a signed one is
    used again only while its key is trusted. Past the TTL kilnd is asked again (by request
    key), so a result kilnd no longer gives (a new compiler, a purged entry) stops being used
    within that time.
    """

    def __init__(self, address: Optional[str] = None, *, answer_ttl: Optional[float] = None,
                 **kwargs: Any) -> None:
        super().__init__(address, **kwargs)
        if answer_ttl is None:
            raw = os.environ.get("KILN_ANSWER_TTL", "")
            try:
                if "_" in raw:  # Python's digit separators: the C++ client reads plain numbers only
                    raise ValueError(raw)
                answer_ttl = float(raw) if raw.strip() else DEFAULT_ANSWER_TTL
            except ValueError:
                raise ValueError(f"KILN_ANSWER_TTL={raw!r}: expected seconds (0 turns the answer tier off)") from None
        self.answer_ttl = max(0.0, answer_ttl)
        # The hit path, fastest first: results this client already has, by request key (a
        # result never changes under its key); then answers kilnd gave this machine, from the
        # local folder (for answer_ttl seconds); then kilnd's memory, asked by request key
        # alone; then the whole request. Counted in local_hits, machine_hits and key_hits.
        self._known: OrderedDict[str, Compiled] = OrderedDict()
        self._known_lock = threading.Lock()
        self._by_key = True  # off after a kilnd that does not know lookups by key
        self.local_hits = 0
        self.machine_hits = 0
        self.key_hits = 0

    def compile(self, graph: Any, target: TargetLike = "cpu", options: Any = None, *, timeout: Optional[float] = None) -> "Compiled":
        """Gets or compiles ``graph`` (a kiln.v1.Graph) for ``target``.

        ``target``: ``"cpu"`` (this machine's ISA level), ``"cpu:x86-64-v3"``,
        ``"cuda:sm_90"``, a :class:`kiln.Target` or a kiln.v1.Target. ``options``: a
        kiln.v1.CompileOptions or a dict for :func:`make_options`. Raises CompileError for a
        graph the daemon rejects (the message names the node and the rule) or fails to build.

        A request this client answered before is answered again from memory; otherwise the
        daemon is asked by request key first (a small message) and sent the graph only when
        it has not seen the request.
        """
        req = self._request(graph, target, options)
        key = request_key(req.graph, req.target, req.options)
        compiled = (self._known_result(key) or self._machine_answer(key, graph)
                    or self._lookup_by_key(key, graph, timeout))
        if compiled is None:
            resp = self._call("Compile", req, timeout if timeout is not None else self.compile_timeout)
            compiled = self._remember(key, Compiled(self, resp, graph=graph))
        if self.recorder is not None:
            # Only graphs the daemon accepted: a replay of a rejected one would fail again.
            self.recorder.record(req)
        return compiled

    def lookup(self, graph: Any, target: TargetLike = "cpu", options: Any = None, *, timeout: Optional[float] = None) -> Optional["Compiled"]:
        """The cached result for ``graph`` on ``target``, or None when the daemon has none."""
        full = self._request(graph, target, options)
        key = request_key(full.graph, full.target, full.options)
        compiled = (self._known_result(key) or self._machine_answer(key, graph)
                    or self._lookup_by_key(key, graph, timeout))
        if compiled is not None:
            return compiled
        req = service_pb2.LookupRequest()
        req.graph.CopyFrom(full.graph)
        req.target.CopyFrom(full.target)
        req.options.CopyFrom(full.options)
        try:
            resp = self._call("Lookup", req, timeout)
        except NotFoundError:
            return None
        return self._remember(key, Compiled(self, resp, graph=graph))

    def _known_result(self, key: str) -> Optional["Compiled"]:
        with self._known_lock:
            known = self._known.get(key)
            if known is None:
                return None
            self._known.move_to_end(key)
            self.local_hits += 1
        return known.again()

    def _answer_name(self, key: str) -> str:
        return core.answer_name(self.address, key)

    def _machine_answer(self, key: str, graph: Any) -> Optional["Compiled"]:
        """The answer kilnd gave this machine for the request with ``key``, from the local
        folder, when it is at most answer_ttl old; None otherwise. A private file (this user's,
        writable by no one else) signed by a still-trusted key is not verified again; any other
        goes through the trust policy like an answer from kilnd, and is forgotten if refused."""
        if not self.answer_ttl:
            return None
        name = self._answer_name(key)
        got = self.cache.load_answer(name, self.answer_ttl)
        if got is None:
            return None
        body, private = got
        resp = service_pb2.CompileResponse()
        try:
            resp.ParseFromString(body)
        except Exception:  # protobuf's DecodeError: an intact file of another format
            self.cache.drop_answer(name)
            return None
        if not resp.handle:
            return None
        resp.cache_hit = True
        resp.server_ms = 0.0
        try:
            compiled = Compiled(self, resp, graph=graph, vouched=private and self.trust.vouched(resp.result))
        except VerificationError:
            self.cache.drop_answer(name)
            return None
        with self._known_lock:
            self.machine_hits += 1
        return self._remember(key, compiled, from_kilnd=False)

    def _lookup_by_key(self, key: str, graph: Any, timeout: Optional[float]) -> Optional["Compiled"]:
        """The daemon's cached result for the request with ``key``, asked by key alone; None
        when it has not seen the request (or the result is gone)."""
        if not self._by_key:
            return None
        try:
            resp = self._call("Lookup", service_pb2.LookupRequest(request_key=key), timeout)
        except NotFoundError:
            return None
        except CompileError as e:
            if e.code != "INVALID_ARGUMENT":
                raise
            # A kilnd from before lookups by key reads the request as an empty graph.
            self._by_key = False
            return None
        with self._known_lock:
            self.key_hits += 1
        return self._remember(key, Compiled(self, resp, graph=graph))

    def _remember(self, key: str, compiled: "Compiled", from_kilnd: bool = True) -> "Compiled":
        compiled._save_manifest()
        if from_kilnd and self.answer_ttl:
            self.cache.save_answer(self._answer_name(key), compiled.response.SerializeToString())
        with self._known_lock:
            self._known[key] = compiled
            if len(self._known) > _KNOWN_RESULTS:
                self._known.popitem(last=False)
        return compiled

    def get(self, handle: str, *, timeout: Optional[float] = None) -> "Compiled":
        """The compiled result stored under ``handle``; NotFoundError when it is not cached."""
        resp = self._call("GetResult", service_pb2.GetResultRequest(handle=handle), timeout)
        if not resp.handle:
            resp.handle = handle
        return Compiled(self, resp)


class TensorSpec:
    """The dtype, shape and (for inputs) declared strides of one kernel argument."""

    __slots__ = ("name", "dtype", "shape", "strides")

    def __init__(self, name: str, dtype: str, shape: tuple[int, ...], strides: Optional[tuple[int, ...]] = None) -> None:
        self.name = name
        self.dtype = dtype
        self.shape = shape
        self.strides = strides

    def __repr__(self) -> str:
        s = f", strides={list(self.strides)}" if self.strides else ""
        return f"TensorSpec({self.name!r}, {self.dtype}, {list(self.shape)}{s})"


class Compiled:
    """A compiled graph: its handle, the daemon's result, and a callable kernel.

    ``handle``: the action key (hex). ``cache_hit``: whether the daemon answered from its cache.
    ``result``: the kiln.v1.ActionResult; ``plan`` its launch plan; ``stats`` its compile stats;
    ``target``: the :class:`kiln.Target`. ``inputs``/``outputs``: :class:`TensorSpec` lists.
    Calling it runs the kernel: on NumPy arrays for a CPU target, on CUDA arrays (PyTorch
    tensors, CuPy arrays...) for a CUDA target.
    """

    def __init__(self, client: Client, response: Any, graph: Any = None, *, vouched: bool = False) -> None:
        # Before anything of the result is used: a refused result raises VerificationError.
        # ``vouched``: the client checked this very response before (Client._machine_answer).
        if not vouched:
            client.trust.check(response.handle, response.result)
        self.client = client
        self.response = response
        self.handle: str = response.handle
        self.cache_hit: bool = response.cache_hit
        self.server_ms: float = response.server_ms
        self.result = response.result
        self.plan = response.result.plan
        self.stats = response.result.stats
        self.target = Target.from_proto(response.result.target) if response.result.HasField("target") else None
        self._kernel: Optional[CpuKernel] = None
        self._kernel_lock = threading.Lock()
        self._source: Optional[Any] = None
        self.inputs, self.outputs = self._specs(graph)
        # Symbolic plans (ABI 2): the symbols' names and where each is read, and every input's
        # and output's shape as polynomials of them (kernels/codegen/ABI.md).
        self.symbols: list[str] = [sym.name for sym in self.plan.symbols]
        self._in_exprs: list[list[Any]] = []
        self._out_exprs: list[list[Any]] = []
        if self.symbols:
            by_role: dict[tuple[int, int], Any] = {(b.role, b.index): b for b in self.plan.buffers}
            self._in_exprs = [list(by_role[(service_pb2.INPUT, i)].shape_exprs) for i in range(len(self.inputs))]
            self._out_exprs = [list(by_role[(service_pb2.OUTPUT, i)].shape_exprs) for i in range(len(self.outputs))]

    def again(self) -> "Compiled":
        """This result, answered again without asking the daemon: a copy marked as a cache
        hit that shares the loaded kernel."""
        c = copy.copy(self)
        c.cache_hit = True
        c.server_ms = 0.0
        return c

    def __repr__(self) -> str:
        return (f"<kiln.Compiled {self.handle[:12]} target={self.target} kernels={self.stats.num_kernels} "
                f"cache_hit={self.cache_hit}>")

    def _specs(self, graph: Any) -> tuple[list[TensorSpec], list[TensorSpec]]:
        ins: dict[int, TensorSpec] = {}
        outs: dict[int, TensorSpec] = {}
        for b in self.plan.buffers:
            if b.role == service_pb2.INPUT:
                ins[b.index] = TensorSpec(f"input{b.index}", dt.from_wire(b.dtype), tuple(b.shape))
            elif b.role == service_pb2.OUTPUT:
                outs[b.index] = TensorSpec(f"output{b.index}", dt.from_wire(b.dtype), tuple(b.shape))
        names: list[dict[str, Any]] = []
        if graph is not None:
            names = [{"name": i.name, "dtype": dt.from_wire(i.type.dtype), "shape": list(i.type.shape),
                      "strides": list(i.type.strides) or None} for i in graph.inputs]
        elif self.handle:
            m = self.client.cache.load_manifest(self.handle) if _is_hex64(self.handle) else None
            names = (m or {}).get("inputs", [])
        if not ins and names:  # a plan without input buffers: take the graph's word
            ins = {i: TensorSpec(n["name"], n["dtype"], tuple(n["shape"])) for i, n in enumerate(names)}
        for i, n in enumerate(names):
            if i in ins:
                ins[i].name = n.get("name") or ins[i].name
                st = n.get("strides")
                ins[i].strides = tuple(st) if st else None
        return [ins[i] for i in sorted(ins)], [outs[i] for i in sorted(outs)]

    def _save_manifest(self) -> None:
        if _is_hex64(self.handle) and not self.client.cache.manifest_saved(self.handle):
            self.client.cache.save_manifest(self.handle, {
                "inputs": [{"name": s.name, "dtype": s.dtype, "shape": list(s.shape),
                            "strides": list(s.strides) if s.strides else None} for s in self.inputs],
                "outputs": [{"dtype": s.dtype, "shape": list(s.shape)} for s in self.outputs],
                "target": str(self.target) if self.target else "",
            })

    def artifact(self, kind: Union[int, str]) -> Optional[Any]:
        """The first artifact of ``kind`` (a kiln.v1.ArtifactKind number or name), or None."""
        k = service_pb2.ArtifactKind.Value(kind) if isinstance(kind, str) else kind
        return next((a for a in self.result.artifacts if a.kind == k), None)

    def _get_source(self) -> Any:
        if self._source is None:
            self._source = self.client.source(self.handle)
        return self._source

    def source(self) -> str:
        """The generated translation unit (C++ or CUDA C++)."""
        return self._get_source().source

    def fusion_report(self) -> str:
        """The daemon's fusion report: kernels, their nodes, and why pairs were not fused."""
        return self._get_source().fusion_report

    @property
    def is_cuda(self) -> bool:
        """Whether this result runs on CUDA devices (its target, else its artifacts, say so)."""
        if self.target is not None:
            return self.target.is_cuda
        return self.artifact(service_pb2.CUBIN) is not None or self.artifact(service_pb2.PTX) is not None

    def load_cuda(self, device: Any = None) -> Any:
        """The :class:`kiln.cuda.CudaKernel` of a CUDA result on ``device`` (an index, a
        ``torch.device``, or None for the current device): fetched and loaded once per process
        per device. Needs the CUDA driver."""
        if not self.is_cuda:
            raise KilnError(f"{self.handle[:12]} was compiled for {self.target}, not a CUDA target")
        return cuda.load_kernel(self, device)

    def load(self) -> CpuKernel:
        """Fetches (once, verified) and opens (once per process) the CPU shared object; for a
        CUDA result see :meth:`load_cuda`."""
        if self._kernel is not None:
            return self._kernel
        with self._kernel_lock:
            if self._kernel is None:
                if self.is_cuda:
                    raise KilnError(f"{self.handle[:12]} was compiled for {self.target}: load it with load_cuda()")
                if self.target is not None and not host_runs(self.target):
                    raise KilnError(f"{self.handle[:12]} was compiled for {self.target}, which this CPU ({host_isa()}) cannot run")
                art = self.artifact(service_pb2.SHARED_OBJECT)
                if art is None:
                    raise ArtifactError(f"{self.handle[:12]} has no shared object artifact")
                image = self.client.read_verified(art.digest, size=art.size or None)
                self._kernel = load_cpu_kernel(image, art.digest, int(self.plan.abi_version or 1))
        return self._kernel

    def __call__(self, *arrays: Any, num_threads: Optional[int] = None, out: Optional[Sequence[Any]] = None) -> Any:
        """Runs the kernel: inputs in graph order; returns the outputs (a tuple, or the array
        itself for a one-output graph), freshly allocated unless ``out`` gives C-contiguous
        arrays of the right dtypes and shapes.

        Inputs must have the graph's dtypes and shapes (TypeError/ValueError otherwise);
        non-contiguous arrays are copied unless the graph declared their strides, in which case
        they must have exactly those strides.

        CPU targets take NumPy arrays; ``num_threads`` defaults to ``$KILN_NUM_THREADS`` or the
        CPUs this process may use. CUDA targets take CUDA arrays and return arrays of the same
        kind, computed asynchronously on that framework's current stream (see
        :func:`kiln.cuda.run_compiled`); host arrays raise TypeError there.
        """
        if self.is_cuda:
            return cuda.run_compiled(self, arrays, out=out)
        kernel = self.load()
        if len(arrays) != len(self.inputs):
            raise TypeError(f"{self.handle[:12]} takes {len(self.inputs)} inputs, got {len(arrays)}")
        keep: list[np.ndarray] = []
        ptrs: list[int] = []
        sizes: Optional[list[int]] = None
        in_shapes = [spec.shape for spec in self.inputs]
        out_shapes = [spec.shape for spec in self.outputs]
        if self.symbols:
            sizes = self._bind_sizes(arrays)
            in_shapes = [tuple(eval_size(e, sizes) for e in exprs) for exprs in self._in_exprs]
            out_shapes = [tuple(eval_size(e, sizes) for e in exprs) for exprs in self._out_exprs]
        for spec, a, shape in zip(self.inputs, arrays, in_shapes):
            want = dt.to_numpy(spec.dtype)
            if not isinstance(a, np.ndarray):
                a = np.asarray(a, dtype=want)
            if a.dtype != want:
                raise TypeError(f"input {spec.name!r}: dtype {a.dtype}, expected {want}")
            if a.shape != shape:
                raise ValueError(f"input {spec.name!r}: shape {a.shape}, expected {self._shape_text(spec, shape)}")
            if spec.strides:
                elem = tuple(s // a.itemsize for s in a.strides)
                if elem != spec.strides or any(s % a.itemsize for s in a.strides):
                    raise ValueError(f"input {spec.name!r}: strides {elem} (elements), the graph declared {spec.strides}")
            elif not a.flags.c_contiguous:
                a = np.ascontiguousarray(a)
            keep.append(a)
            ptrs.append(a.ctypes.data)
        results: list[np.ndarray] = []
        for i, (spec, shape) in enumerate(zip(self.outputs, out_shapes)):
            want = dt.to_numpy(spec.dtype)
            if out is not None:
                o = out[i]
                if o.dtype != want or o.shape != shape or not o.flags.c_contiguous or not o.flags.writeable:
                    raise ValueError(f"out[{i}] must be a writeable C-contiguous {want} array of shape {shape}")
            else:
                o = np.empty(shape, dtype=want)
            results.append(o)
            ptrs.append(o.ctypes.data)
        ws = None
        ws_ptr = None
        ws_bytes = kernel.workspace_bytes(sizes) if sizes is not None else int(self.plan.workspace_bytes)
        if ws_bytes > 0:
            ws = aligned_empty(ws_bytes)
            ws_ptr = ws.ctypes.data
        rc = kernel.run(ptrs, ws_ptr, num_threads if num_threads else default_num_threads(), sizes)
        del keep, ws
        if rc != 0:
            raise KilnError(f"kiln_run of {self.handle[:12]} returned {rc}")
        return results[0] if len(results) == 1 else tuple(results)


    def _bind_sizes(self, arrays: Sequence[Any]) -> list[int]:
        """The symbols' values, each read from the input dimension the plan names."""
        sizes: list[int] = []
        for sym in self.plan.symbols:
            a = arrays[sym.input]
            shape = np.shape(a)
            if sym.axis >= len(shape):
                spec = self.inputs[sym.input]
                raise ValueError(f"input {spec.name!r}: rank {len(shape)}, expected {len(spec.shape)}")
            sizes.append(int(shape[sym.axis]))
        return sizes

    def _shape_text(self, spec: TensorSpec, shape: tuple[int, ...]) -> str:
        """An expected shape with its symbolic dimensions named: "(N=7, 2)"."""
        if not self.symbols:
            return str(shape)
        idx = self.inputs.index(spec)
        dims = []
        for d, e in zip(shape, self._in_exprs[idx]):
            name = size_name(e, self.symbols)
            dims.append(f"{name}={d}" if name else str(d))
        return "(" + ", ".join(dims) + ")"


def _is_hex64(s: str) -> bool:
    return len(s) == 64 and not s.strip("0123456789abcdef")


__all__ = ["Client", "Compiled", "TensorSpec", "make_options", "DEFAULT_ADDRESS"]
