"""Kiln parts at run time: compiling them on the daemon, loading their kernels, calling them on
torch tensors, and falling back to torch when anything goes wrong.

A :class:`KilnPart` is a ``torch.nn.Module`` standing in the rewritten FX graph where a run of
supported nodes was. Calling it with torch tensors (in the order of the part's inputs) returns
a tuple of tensors (in the order of its outputs):

- CPU: output tensors come from ``torch.empty``, the workspace too (torch's CPU allocator aligns
  to 64 bytes, which the kernel ABI asks for); ``kiln_run`` gets the tensors' ``data_ptr``s
  and ``torch.get_num_threads()`` threads.
- CUDA: the same, with the kernels launched on torch's current stream by :mod:`kiln.cuda`.

A part whose compile fails warns once (:class:`KilnFallbackWarning`) and runs its nodes in
torch from then on. An argument whose layout differs from the one the part was compiled for is
copied into that layout first; a call whose arguments differ otherwise (shape, dtype, device)
runs in torch for that call only. Nothing kiln does makes the user's program fail.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import operator
import random
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
import torch.fx

from .. import cuda as kcuda
from .. import native
from ..autotune import autotune
from ..errors import KilnError, KilnFallbackWarning, RpcError
from ..plan import eval_size
from ..strides import effective_strides, inverse_order, memory_order
from ..v1 import service_pb2
from .counters import STATS, bump
from .partition import PartGraph, Segment, eager_graph

log = logging.getLogger("kiln.torch")


def load_kernel(compiled: Any, device: torch.device) -> kcuda.CudaKernel:
    """The kernels of ``compiled`` on ``device``: loaded once per process per device (the
    cache is :mod:`kiln.cuda`'s, shared with ``kiln.jit``)."""
    torch.cuda.init()
    index = device.index if device.index is not None else torch.cuda.current_device()
    return kcuda.load_kernel(compiled, int(index))


def reraise_if_dynamo_control(e: BaseException) -> None:
    """Dynamo steers itself with exceptions (restart analysis...); those must pass through."""
    if type(e).__module__.startswith("torch._dynamo.exc") and "Restart" in type(e).__name__:
        raise e


def boxed(fn: Callable[..., Any]) -> Callable[[list[Any]], Any]:
    """``fn`` called AOTAutograd's boxed way, with one list of arguments (functorch's
    ``make_boxed_func``, without importing functorch.compile and its partitioners: a warm start
    loading a precompiled model pays for nothing it does not use)."""
    def call(args: list[Any]) -> Any:
        return fn(*args)

    call._boxed_call = True  # type: ignore[attr-defined]
    return call


def graph_call(outer: torch.fx.GraphModule) -> Callable[..., Any]:
    """What runs a stitched graph: ``outer.forward``, or the part's own ``forward`` where the
    graph is one kiln part called on every argument in order and returning all its results in
    order (a graph that fused whole: two Python frames less per call, ~0.4 µs of a small
    graph's few microseconds on the host)."""
    nodes = list(outer.graph.nodes)
    args = [n for n in nodes if n.op == "placeholder"]
    rest = nodes[len(args):]
    if len(rest) < 3 or rest[0].op != "call_module" or rest[-1].op != "output":
        return outer.forward
    call, items, out = rest[0], rest[1:-1], rest[-1]
    part = getattr(outer, str(call.target), None)
    if (not isinstance(part, KilnPart) or part.part is None or list(call.args) != args or call.kwargs
            or len(items) != len(part.part.outputs)
            or any(i.op != "call_function" or i.target is not operator.getitem or i.args != (call, j)
                   for j, i in enumerate(items))
            or not isinstance(out.args[0], (tuple, list)) or list(out.args[0]) != items):
        return outer.forward
    return part.forward


# Compiled results by (daemon, target, options, graph bytes): a graph seen again in this process
# (a recompile, the same block in another frame) needs no round trip.
_memo: dict[tuple[str, str, bytes, bytes], Any] = {}
_memo_lock = threading.Lock()


def clear_memo() -> None:
    """Forgets the compiled results this process remembers, and which daemons were
    unreachable."""
    with _memo_lock:
        _memo.clear()
    _unreachable.clear()


def target_for(device: torch.device, cpu_target: str = "cpu") -> str:
    """The kiln target of a device: ``cpu_target`` for CPU, ``cuda:sm_XY`` for a CUDA device."""
    if device.type == "cpu":
        return cpu_target
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"cuda:sm_{major}{minor}"
    raise KilnError(f"kiln has no target for device {device}")


# Daemons that could not be reached, by address, with the time until which none is asked again:
# without this, every new graph would wait out the client's retries before falling back.
_unreachable: dict[str, float] = {}
UNREACHABLE_BACKOFF_S = 30.0


def _compile_remote(settings: "CompileSettings", graph: Any, target: str, options: Any) -> Any:
    client = settings.client
    now = time.monotonic()
    if _unreachable.get(client.address, 0.0) > now:
        raise KilnError(f"the kiln daemon at {client.address} was unreachable moments ago")
    try:
        return client.compile(graph, target=target, options=options, timeout=settings.timeout)
    except RpcError as e:
        # A limit the daemon reported (a compiler past its time) fails this part only.
        if e.unreachable:
            _unreachable[client.address] = time.monotonic() + UNREACHABLE_BACKOFF_S
        raise


@dataclass
class CompileSettings:
    """What a part needs to compile: the client, the CPU target, the daemon's options."""

    client: Any
    cpu_target: str = "cpu"
    options: Any = None
    timeout: Optional[float] = None
    autotune: bool = False  # time the kernel variants on the first call (kiln.autotune)


class KilnPart(torch.nn.Module):
    """One kiln part of a rewritten graph (see the module docstring).

    ``name`` labels it in warnings; ``segment`` is the run of FX nodes it replaces (kept, as a
    small GraphModule, to run in torch when kiln cannot); ``part`` is its kiln graph, or None
    when building one failed; ``device`` the device it runs on.
    """

    def __init__(self, name: str, segment: Optional[Segment], part: Optional[PartGraph], device: torch.device,
                 build_error: Optional[str] = None, *, eager: Optional[torch.fx.Graph] = None,
                 ops: Optional[list[str]] = None) -> None:
        super().__init__()
        self.part_name = name
        # A part rebuilt from a program record (.program) has no segment: its nodes come as
        # ``eager`` and their names as ``ops``.
        self._eager_graph: Optional[torch.fx.Graph] = eager_graph(segment) if segment is not None else eager
        self._eager: Any = None  # the GraphModule of _eager_graph, made on the first torch run
        self.part = part
        self.device = device
        self.ops = (sorted({str(n.target).replace("aten.", "") for n in segment.nodes if n.op == "call_function"})
                    if segment is not None else list(ops or []))
        self.kernel: Any = None
        self.compiled: Any = None
        self.error: Optional[str] = build_error
        self.workspace_bytes = 0
        self._warned = False
        self._is_cuda = device.type == "cuda"
        self._in_fast: Optional[list[list[Any]]] = None  # built on the first call (_prepare_run)
        self._native: Any = None  # the native runner's Part, once attached (_attach_native)
        self._copies = 0  # inputs the Python path copied into the layout the kernels read
        self.use_native = True  # whether to hand the part to the native runner once it is loaded
        self._native_pending = True
        self._tune_with: Optional[CompileSettings] = None  # set while a first-call tuning is due
        if part is not None:
            self._kiln_specs = [None] * part.num_kiln_outputs
            for spec, (kind, k) in zip(part.outputs, part.sources):
                if kind == "kiln" and self._kiln_specs[k] is None:
                    self._kiln_specs[k] = spec

    def extra_repr(self) -> str:
        state = "kiln" if self.kernel is not None else f"torch ({self.error})" if self.error else "pending"
        return f"{self.part_name}: {state}; ops: {', '.join(self.ops)}"

    # ------------------------------------------------------------------ compile

    def compile(self, settings: CompileSettings) -> Optional[str]:
        """Gets the part's kernels (memo, then daemon) and loads them; returns None on success,
        else the reason (the part then runs in torch). Never raises."""
        if self.part is None:
            return self.error or "no kiln graph"
        try:
            target = target_for(self.device, settings.cpu_target)
            opts = settings.options
            opts_bytes = opts.SerializeToString(deterministic=True) if opts is not None else b""
            key = (settings.client.address, target, opts_bytes, self.part.graph.SerializeToString(deterministic=True))
            with _memo_lock:
                compiled = _memo.get(key)
            if compiled is not None:
                bump(memo_hits=1)
            else:
                t0 = time.perf_counter()
                compiled = _compile_remote(settings, self.part.graph, target, opts)
                with _memo_lock:
                    _memo[key] = compiled
                bump(cache_hits=int(compiled.cache_hit), lookup_s=time.perf_counter() - t0)
            return self.adopt(compiled, settings)
        except Exception as e:  # compile errors, daemon down, load failures: all fall back
            self.kernel = None
            self.error = f"{type(e).__name__}: {e}"
            return self.error

    def adopt(self, compiled: Any, settings: CompileSettings) -> Optional[str]:
        """Loads ``compiled`` (this part's result, from the daemon or a program record) as the
        part's kernels; returns None on success, else the reason. Never raises."""
        assert self.part is not None
        try:
            t0 = time.perf_counter()
            self._load(compiled)
            bump(load_s=time.perf_counter() - t0)
            # Parts with symbolic sizes keep the default: a variant is chosen at one size and would
            # serve every size (a block per row that wins on 4096-long rows is 10x slower on
            # 128-long ones), and the variants' timings at other sizes are unknown.
            if settings.autotune and not self.part.symbolic:
                self._tune_with = settings
            return None
        except Exception as e:  # load failures fall back
            self.kernel = None
            self.error = f"{type(e).__name__}: {e}"
            return self.error

    def _load(self, compiled: Any) -> None:
        """Loads ``compiled``'s kernels as the part's (checking its plan first); the call path's
        prepared state is rebuilt on the next call."""
        self._check_plan(compiled)
        if self._is_cuda:
            runner = native.RUNNER if self.use_native else None
            assert self.part is not None
            if runner is not None and all(kind == "kiln" for kind, _ in self.part.sources):
                # The native runner will run the part: its C++ loader's module is loaded here, in
                # the compiling thread, rather than on the first call; the Python loader's only
                # if the Python path is ever taken (one module load per part, not two).
                index = self.device.index if self.device.index is not None else torch.cuda.current_device()
                native.cuda_module(runner, compiled, index)
                kernel: Any = _Deferred(lambda: load_kernel(compiled, self.device))
            else:
                kernel = load_kernel(compiled, self.device)
        else:
            kernel = compiled.load()
        self._in_fast = None
        self._native = None
        self._native_pending = self.use_native
        self.compiled = compiled
        self.workspace_bytes = int(compiled.plan.workspace_bytes)
        # Last: with async compiles, a call on another thread takes the kernel path as soon
        # as it sees a kernel, and everything that path reads must be set by then.
        self.kernel = kernel

    def _tune(self, args: Sequence[torch.Tensor]) -> None:
        """``mode="max-autotune"``: on a static part's first call, its kernel variants are timed on
        these arguments (:func:`kiln.autotune`: checked against the default variant, the
        winner recorded in kilnd for this device model, so a later process compiles it without
        timing) and the winner replaces the default's kernels. Not while a CUDA graph is being
        captured (the next call tunes); any failure keeps the default (one log line)."""
        settings = self._tune_with
        if self._is_cuda and torch.cuda.is_current_stream_capturing():
            return
        self._tune_with = None
        assert self.part is not None and self.compiled is not None
        try:
            if self._in_fast is None:
                self._prepare_run()
            assert self._in_fast is not None
            inputs = []
            for i, t in enumerate(args):
                t = t.detach()
                # The layout the part was compiled for, as its calls pass it (_fit_layout).
                if t.stride() != self._in_fast[i][2]:
                    fitted = self._fit_layout(i, t, t.stride())
                    if fitted is None:
                        raise KilnError(f"argument {i} does not fit the compiled layout")
                    t = fitted
                inputs.append(t if self._is_cuda else t.numpy())
            threads = None if self._is_cuda else torch.get_num_threads()
            target = target_for(self.device, settings.cpu_target)
            with torch.cuda.device(self.device) if self._is_cuda else contextlib.nullcontext():
                best, _ = autotune(settings.client, self.part.graph, inputs, target, options=settings.options,
                                   num_threads=threads)
            bump(tuned=1)
            if best.handle != self.compiled.handle:
                self._load(best)
                bump(retuned=1)
        except Exception as e:  # the default variant stays
            log.warning("kiln.torch: %s: tuning failed, keeping the default kernels: %s: %s", self.part_name,
                        type(e).__name__, e)

    def _check_plan(self, compiled: Any) -> None:
        """The plan's arguments must be what this part passes: a mismatch would corrupt memory."""
        plan = compiled.plan
        ins = sorted((b for b in plan.buffers if b.role == service_pb2.INPUT), key=lambda b: b.index)
        outs = sorted((b for b in plan.buffers if b.role == service_pb2.OUTPUT), key=lambda b: b.index)
        assert self.part is not None
        if ins and len(ins) != len(self.part.inputs):
            raise KilnError(f"the plan has {len(ins)} inputs, the part {len(self.part.inputs)}")
        if len(outs) != len(self._kiln_specs):
            raise KilnError(f"the plan has {len(outs)} outputs, the part {len(self._kiln_specs)}")
        if self.part.symbolic:
            _check_symbolic_plan(compiled, self.part, outs, self._kiln_specs)
            return
        for b, spec in zip(outs, self._kiln_specs):
            # A result in a layout of its own is stored as its dimensions in memory order.
            order = memory_order(spec.shape, spec.strides) if spec.strides is not None else None
            want = spec.shape if order is None else tuple(spec.shape[d] for d in order)
            if tuple(b.shape) != want:
                raise KilnError(f"plan output {b.index} has shape {tuple(b.shape)}, torch expects {want}")

    def warn_fallback(self, why: str, when: str = "compile") -> None:
        """Warns once for this part."""
        if self._warned:
            return
        self._warned = True
        msg = why if len(why) <= 600 else why[:600] + "..."
        warnings.warn(
            f"kiln: part {self.part_name} ({', '.join(self.ops[:8])}{', ...' if len(self.ops) > 8 else ''}) "
            f"failed to {when}; running it in torch: {msg}",
            KilnFallbackWarning,
            stacklevel=3,
        )

    # ------------------------------------------------------------------ run

    def forward(self, *args: torch.Tensor) -> tuple[Any, ...]:
        fast = self._native
        if fast is not None:
            # The native runner (kiln.native): the whole call in C++; None when these
            # arguments need the Python path below.
            try:
                out = fast(*args)
            except Exception as e:
                out = self._kernels_failed(e)
            if out is not None:
                STATS.kernel_calls += 1
                STATS.native_calls += 1
                return out
        if self.kernel is not None:
            try:
                out = self._run(args)
            except Exception as e:
                out = self._kernels_failed(e)
            if out is not None:
                # A plain increment: this is the hot path, and the counter is for diagnostics.
                STATS.kernel_calls += 1
                return out
        bump(eager_calls=1)
        return self.eager(*args)

    @property
    def eager(self) -> torch.fx.GraphModule:
        """The part's nodes run by torch (a GraphModule, made on first use)."""
        if self._eager is None:
            self._eager = torch.fx.GraphModule(torch.nn.Module(), self._eager_graph)
        return self._eager

    def _kernels_failed(self, e: Exception) -> None:
        """A kernel call raised: the part runs in torch from now on (one warning)."""
        self.kernel = None
        self._native = None
        self.error = f"{type(e).__name__}: {e}"
        bump(failed=1)
        self.warn_fallback(self.error, when="run")
        return None

    # The rewritten graph calls parts as modules (``self.kiln_part_0(...)``): calling forward
    # directly skips nn.Module's hook dispatch, a few microseconds per call on the hot path
    # (parts never have hooks).
    __call__ = forward

    def _prepare_run(self) -> None:
        """What every call needs and no call changes, computed once after loading: the call
        path then costs a few comparisons per argument and one allocation per output."""
        t0 = time.perf_counter()
        part = self.part
        assert part is not None
        dev = self.device
        if dev.type == "cuda":
            self._dev_index = dev.index if dev.index is not None else torch.cuda.current_device()
        else:
            self._dev_index = -1  # what Tensor.get_device() answers for CPU tensors
        # Per input: dtype, shape, and the raw strides last accepted without a copy (a stride
        # tuple equal to it needs no further check).
        self._in_fast = []
        for spec in part.inputs:
            shape = torch.Size(spec.shape)
            accepted = spec.strides if spec.strides is not None else _contiguous(spec.shape)
            self._in_fast.append([spec.dtype, shape, accepted])
        self._out_alloc = [(torch.Size(s.shape), s.dtype, s.strides) for s in self._kiln_specs]
        # Symbolic parts: a result stored in a layout of its own (its strides are a dense
        # layout's, at the example sizes) is allocated as the plan's permuted shape and viewed
        # back through the inverse permutation.
        orders = [memory_order(tuple(shape), strides) if strides is not None else None
                  for shape, _, strides in self._out_alloc]
        self._out_unpermute = [inverse_order(o) if o is not None else None for o in orders]
        self._results = [(kind == "kiln", k) for kind, k in part.sources]
        if part.symbolic:
            self._sym_where = [(sym.input, sym.axis) for sym in self.compiled.plan.symbols]
            self._sized: dict[tuple[int, ...], Any] = {}
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        idx = self._dev_index
        if self._is_cuda:
            self._stream = (lambda: raw(idx)) if raw is not None else (
                lambda: torch.cuda.current_stream(dev).cuda_stream)
        bump(prepare_s=time.perf_counter() - t0)

    def _attach_native(self) -> None:
        """Hands the part to the native runner (once; the runner is loaded). Parts whose
        results are not all kernel outputs (an argument returned as it is) stay on the Python
        path."""
        self._native_pending = False
        part, compiled = self.part, self.compiled
        assert part is not None and compiled is not None
        if any(kind != "kiln" for kind, _ in part.sources):
            return
        t0 = time.perf_counter()
        try:
            # Static parts: the strides last accepted where the graph declared a layout, else
            # any layout (contiguous copies where needed, as the Python path makes).
            strides = [fast[2] if spec.strides is not None and not part.symbolic else None
                       for spec, fast in zip(part.inputs, self._in_fast)]
            if self._is_cuda and getattr(torch._C, "_cuda_getCurrentRawStream", None) is None:
                return
            self._native = native.part_for(compiled, self._dev_index if self._is_cuda else -1,
                                           [spec.dtype for spec in part.inputs],
                                           [spec.dtype for spec in self._kiln_specs], strides,
                                           [(spec.shape, spec.strides) if spec.strides is not None else None
                                            for spec in self._kiln_specs],
                                           [k for _, k in part.sources], cpu_kernel=self.kernel)
        except Exception as e:  # the Python path stays; nothing is lost
            log.warning("kiln.torch: %s: the native runner cannot take this part: %s: %s", self.part_name,
                        type(e).__name__, e)
        bump(prepare_s=time.perf_counter() - t0)

    def _attach_and_call(self, args: Sequence[torch.Tensor]) -> Optional[tuple[torch.Tensor, ...]]:
        """Hands the part to the native runner and, when it takes the part, calls it there: the
        results, or None for the Python path."""
        self._attach_native()
        fast = self._native
        if fast is None:
            return None
        out = fast(*args)
        if out is not None:
            STATS.native_calls += 1
        return out

    def _run_symbolic(self, args: Sequence[torch.Tensor]) -> Optional[tuple[torch.Tensor, ...]]:
        """A part with symbolic sizes: the sizes are read from the arguments, every argument is
        checked against its shape expressions, outputs are allocated from theirs; None when
        the arguments do not fit (the caller runs torch)."""
        if self._in_fast is None:
            self._prepare_run()
        if self._native_pending and native.RUNNER is not None:
            out = self._attach_and_call(args)
            if out is not None:
                return out
        compiled = self.compiled
        dev, idx = self.device, self._dev_index
        sizes = tuple([int(args[i].shape[a]) for i, a in self._sym_where])
        # Shapes and workspace per distinct sizes, evaluated once (a serving loop sees a few).
        sized = self._sized.get(sizes)
        if sized is None:
            sized = (
                [torch.Size([eval_size(e, sizes) for e in exprs]) for exprs in compiled._in_exprs],
                [(torch.Size([eval_size(e, sizes) for e in exprs]), spec.dtype)
                 for exprs, spec in zip(compiled._out_exprs, self._kiln_specs)],
                self.kernel.workspace_bytes(list(sizes)),
            )
            if len(self._sized) < 1024:
                self._sized[sizes] = sized
        in_shapes, out_alloc, ws_bytes = sized
        keep: list[torch.Tensor] = []
        ptrs: list[int] = []
        for t, fast, want in zip(args, self._in_fast, in_shapes):
            if t.dtype != fast[0] or t.shape != want or t.get_device() != idx:
                return None
            if not t.is_contiguous() or (self._is_cuda and t.data_ptr() % 16):  # CUDA: 16-byte vector loads
                t = t.clone(memory_format=torch.contiguous_format)
                keep.append(t)
            ptrs.append(t.data_ptr())
        outs = [torch.empty(shape, dtype=dtype, device=dev) for shape, dtype in out_alloc]
        ptrs.extend(o.data_ptr() for o in outs)
        outs = [o if back is None else o.permute(back) for o, back in zip(outs, self._out_unpermute)]
        ws = torch.empty(ws_bytes, dtype=torch.uint8, device=dev) if ws_bytes else None
        if self._is_cuda:
            self.kernel.launch(ptrs, ws.data_ptr() if ws is not None else None, self._stream(), sizes)
        else:
            rc = self.kernel.run(ptrs, ws.data_ptr() if ws is not None else None, torch.get_num_threads(), sizes)
            if rc != 0:
                raise KilnError(f"kiln_run returned {rc}")
        del keep, ws
        return tuple(outs[k] if kind == "kiln" else args[k].clone() for kind, k in self.part.sources)

    def _run(self, args: Sequence[torch.Tensor]) -> Optional[tuple[torch.Tensor, ...]]:
        """Runs the kernels; None when the arguments do not fit (the caller runs torch)."""
        if self._tune_with is not None:
            self._tune(args)
        if self.part.symbolic:
            return self._run_symbolic(args)
        if self._in_fast is None:
            self._prepare_run()
        if self._native_pending and native.RUNNER is not None:
            out = self._attach_and_call(args)
            if out is not None:
                return out
        dev, idx = self.device, self._dev_index
        ptrs: list[int] = []
        keep: list[torch.Tensor] = []
        for i, (t, fast) in enumerate(zip(args, self._in_fast)):
            if t.dtype != fast[0] or t.shape != fast[1] or t.get_device() != idx:
                spec = self.part.inputs[i]
                log.debug("kiln.torch: %s: argument %d is %s %s on %s, compiled for %s %s; running torch",
                          self.part_name, i, t.dtype, tuple(t.shape), t.device, spec.dtype, spec.shape)
                return None
            stride = t.stride()
            if stride != fast[2]:
                t = self._fit_layout(i, t, stride)
                if t is None:
                    return None
                keep.append(t)
            ptrs.append(t.data_ptr())
        outs = [torch.empty(shape, dtype=dtype, device=dev) if st is None else
                torch.empty_strided(shape, st, dtype=dtype, device=dev) for shape, dtype, st in self._out_alloc]
        ptrs.extend(o.data_ptr() for o in outs)
        ws = torch.empty(self.workspace_bytes, dtype=torch.uint8, device=dev) if self.workspace_bytes else None
        ws_ptr = ws.data_ptr() if ws is not None else None
        if self._is_cuda:
            self.kernel.launch(ptrs, ws_ptr, self._stream())
        else:
            rc = self.kernel.run(ptrs, ws_ptr, torch.get_num_threads())
            if rc != 0:
                raise KilnError(f"kiln_run returned {rc}")
        del keep
        results = [outs[k] if is_kiln else args[k].clone() for is_kiln, k in self._results]
        # The workspace goes back to torch's allocator here; on CUDA the caching allocator
        # reuses it only for work ordered after these kernels on this stream.
        del ws
        return tuple(results)

    def _fit_layout(self, i: int, t: torch.Tensor, stride: tuple[int, ...]) -> Optional[torch.Tensor]:
        """Argument ``i`` whose raw strides differ from the last accepted ones: the tensor to
        pass (``t`` itself when its layout is equivalent, which is then remembered, else a copy
        in the declared layout), or None when it cannot be passed (the call runs in torch)."""
        spec = self.part.inputs[i]
        if spec.strides is None:
            if t.is_contiguous():
                self._in_fast[i][2] = stride
                return t
            self._copies += 1
            return t.contiguous()
        if effective_strides(spec.shape, stride) == spec.strides:
            self._in_fast[i][2] = stride
            if self._native is not None:
                self._native.accept_strides(i, stride)
            return t
        # The graph declared the layout torch traced (a slice of a wider tensor, say) but this
        # tensor has another: copy it into the declared layout. Broadcast layouts (stride 0)
        # cannot be written; those run in torch.
        if any(st == 0 and d > 1 for st, d in zip(spec.strides, spec.shape)):
            log.debug("kiln.torch: %s: argument %d has strides %s, compiled for %s; running torch",
                      self.part_name, i, stride, spec.strides)
            return None
        self._copies += 1
        return torch.empty_strided(spec.shape, spec.strides, dtype=t.dtype, device=t.device).copy_(t)

    @property
    def input_copies(self) -> int:
        """Inputs copied so far into the layout the kernels read (a transposed or misaligned
        view, a layout other than the traced one), by the Python path and the native runner:
        each copy is a kernel launch and a round trip through memory the graph did not ask for."""
        native_copies = self._native.input_copies() if self._native is not None else 0
        return self._copies + native_copies


class _Deferred:
    """A kernel object made on first use (an attribute read): the Python loader's kernels of a
    part the native runner runs, needed only if the part ever takes the Python path."""

    def __init__(self, make: Any) -> None:
        self._make = make
        self._made: Any = None

    def __getattr__(self, name: str) -> Any:
        made = self._made
        if made is None:
            made = self._made = self._make()
        return getattr(made, name)


def _check_symbolic_plan(compiled: Any, part: PartGraph, outs: Sequence[Any], specs: Sequence[Any]) -> None:
    """The plan's output shapes, as expressions of the part's symbols, must be torch's at every
    size: both sides are evaluated at a few assignments of torch's size symbols (a lowering that
    baked an example size into the graph shows up here, and the part runs in torch)."""
    import sympy

    names = [sym.name for sym in compiled.plan.symbols]
    exprs_of: dict[str, Any] = {}
    for sym in compiled.plan.symbols:
        exprs_of[sym.name] = part.inputs[sym.input].exprs[sym.axis]
    free = sorted({f for e in exprs_of.values() for f in e.free_symbols}, key=str)
    rng = random.Random(7)
    for _ in range(3):
        point = {f: rng.randint(2, 97) for f in free}
        sizes = [int(exprs_of[n].subs(point)) for n in names]
        for b, spec in zip(outs, specs):
            want = [int(sympy.sympify(e).subs(point)) for e in (spec.exprs or spec.shape)]
            order = memory_order(spec.shape, spec.strides) if spec.strides is not None else None
            if order is not None:  # stored as its dimensions in memory order
                want = [want[d] for d in order]
            got = [eval_size(e, sizes) for e in b.shape_exprs]
            if got != want:
                raise KilnError(f"plan output {b.index} has shape {got} at {point}, torch expects {want}")


def _contiguous(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides of ``shape``, as torch reports them for a contiguous tensor."""
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(out))


def compile_parts(parts: Sequence[KilnPart], settings: CompileSettings) -> None:
    """Compiles the parts concurrently (the daemon builds them in parallel), then warns, in
    the calling thread, once for each part that falls back to torch."""
    if not parts:
        return
    run_parts(parts, settings, lambda p: p.compile(settings))


def run_parts(parts: Sequence[KilnPart], settings: CompileSettings, job: Any) -> None:
    """Runs ``job(part)`` (a compile or a load, returning None or the reason it failed) on the
    parts concurrently, then warns once for each part that falls back to torch."""
    if not parts:
        return
    t0 = time.perf_counter()
    workers = max(1, min(8, len(parts)))
    if workers == 1:
        errors = [job(p) for p in parts]
    else:
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kiln-compile") as ex:
            errors = list(ex.map(job, parts))
    bump(compile_s=time.perf_counter() - t0)
    for p, err in zip(parts, errors):
        if err is None:
            bump(compiled=1)
        else:
            bump(failed=1)
            p.warn_fallback(err)


def describe(parts: Sequence[KilnPart]) -> list[dict[str, Any]]:
    """One dict per part: name, device, ops, whether kiln runs it (and through the native
    runner), the handle or the error, and its input copies so far (:attr:`KilnPart.input_copies`)."""
    out = []
    for p in parts:
        out.append({
            "name": p.part_name,
            "device": str(p.device),
            "ops": list(p.ops),
            "kiln": p.kernel is not None,
            "native": p._native is not None,
            "handle": p.compiled.handle if p.compiled is not None else None,
            "cache_hit": bool(p.compiled.cache_hit) if p.compiled is not None else None,
            "nodes": p.part.num_nodes if p.part is not None else 0,
            "error": p.error,
            "input_copies": p.input_copies,
        })
    return out


__all__ = [
    "CompileSettings",
    "KilnFallbackWarning",
    "KilnPart",
    "boxed",
    "clear_memo",
    "compile_parts",
    "describe",
    "graph_call",
    "load_kernel",
    "reraise_if_dynamo_control",
    "run_parts",
    "target_for",
]

