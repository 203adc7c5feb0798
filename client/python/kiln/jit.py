"""kiln.jit: trace a NumPy function into a kiln graph, compile it remotely, run it locally.

Example::

    @kiln.jit
    def kmeans(X, means):
        return np.argmin(np.linalg.norm(X - means[:, None], axis=2), axis=0)

    labels = kmeans(X, means)      # traced, compiled and run; later calls just run

The function is specialised on its arguments: NumPy arrays (and NumPy scalars) become graph
inputs, keyed by shape and dtype; everything else (Python numbers, strings, None, tuples of
them...) is a constant baked into the graph and part of the key. Lists, tuples and dicts of
arrays are walked. Each signature is traced and compiled once per process (the daemon's cache
makes a compile in a new process a lookup); after that a call validates its inputs and runs the
kernel. Outputs come back with the structure the function returned (a tensor, or tuples, lists
and dicts of them); 0-d results are NumPy scalars, as NumPy's reductions give.

On GPUs::

    @kiln.jit(target="cuda")       # or "cuda:sm_90"
    def kmeans(X, means): ...

    labels = kmeans(X_gpu, means_gpu)    # torch CUDA tensors in, a torch tensor out

The function is traced the same way (still as NumPy code: shapes and dtypes come from the
arguments), compiled to a cubin, and run through the CUDA driver on the arguments' device. The
array arguments are CUDA arrays: PyTorch tensors, CuPy arrays, or anything with
``__cuda_array_interface__`` or a CUDA ``__dlpack__`` (see :func:`kiln.cuda.as_cuda_array`);
NumPy arrays raise TypeError, and NumPy scalars are constants. Outputs are arrays of the
inputs' kind (0-d ones stay 0-d device arrays), computed asynchronously on that framework's
current stream. A plain ``"cuda"`` target compiles for the sm of the device the arguments live
on.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import time
import warnings
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from . import cuda
from . import dtypes as dt
from .autotune import autotune as tune
from .client import Client
from .errors import CompileError, KilnError, KilnFallbackWarning, RpcError
from .plan import eval_size
from .target import Target
from .tracer import IndexCheck, Trace, Tracer

_default_client: Any = None
_default_client_lock = threading.Lock()


def default_client() -> Any:
    """The process-wide :class:`kiln.Client` jitted functions use unless given one
    (``$KILN_SERVER``, else localhost:50051)."""
    global _default_client
    with _default_client_lock:
        if _default_client is None:
            _default_client = Client()
        return _default_client


# ---------------------------------------------------------------------- argument trees

class _Leaf:
    """An array argument: its position among the graph inputs."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


# How array arguments are taken: NumPy arrays (a CPU target); CUDA arrays (a CUDA target's
# call); CUDA arrays or NumPy arrays standing for them (a CUDA target's trace or compile only).
_HOST, _DEVICE, _EXAMPLE = "host", "device", "example"


class _Args:
    """The array arguments of one call, in graph input order."""

    __slots__ = ("arrays", "names", "types", "devices")

    def __init__(self) -> None:
        self.arrays: list[Any] = []
        self.names: list[str] = []
        self.types: list[tuple[str, tuple[int, ...]]] = []  # (kiln dtype, shape)
        self.devices: list[int] = []  # the device of each CUDA array (none for host examples)

    def add(self, arr: Any, path: str, dtype: str, shape: tuple[int, ...]) -> int:
        self.arrays.append(arr)
        self.names.append(path)
        self.types.append((dtype, shape))
        return len(self.arrays) - 1


def _torch_tensor_type() -> Any:
    """``torch.Tensor`` when this process has imported PyTorch, else None (never imports it)."""
    mod = sys.modules.get("torch")
    return getattr(mod, "Tensor", None) if mod is not None else None


def _is_device_array(obj: Any) -> bool:
    """Whether ``obj`` looks like an array of PyTorch, CuPy or another GPU framework (checked
    without importing any of them: a process that made such an array has imported it)."""
    for name, cls in (("torch", "Tensor"), ("cupy", "ndarray")):
        mod = sys.modules.get(name)
        if mod is not None and isinstance(obj, getattr(mod, cls)):
            return True
    return hasattr(obj, "__cuda_array_interface__") or hasattr(obj, "__dlpack__")


def _flatten_args(obj: Any, path: str, args: _Args, mode: str) -> Any:
    """Returns a hashable description of ``obj`` with arrays replaced by their input index.

    Appends the arrays (and their input names and types) to ``args`` in order. Raises TypeError
    for an argument that is neither an array nor a hashable constant, and for an array of the
    wrong kind for ``mode`` (host memory for a CUDA call, device memory for a CPU target).
    """
    if isinstance(obj, np.ndarray) or (mode == _HOST and isinstance(obj, np.generic)):
        arr = np.asarray(obj)
        name = dt.dtype_name(arr.dtype)  # rejects dtypes kiln lacks, naming them
        if mode == _HOST:
            return ("A", args.add(arr, path, name, arr.shape), arr.shape, arr.dtype.str)
        if mode == _DEVICE:
            raise TypeError(f"kiln.jit: argument {path} is a NumPy array in host memory, but the function is "
                            "compiled for CUDA: pass a CUDA array (a PyTorch CUDA tensor, a CuPy array, or an "
                            "object with __cuda_array_interface__ or a CUDA __dlpack__), e.g. "
                            "torch.as_tensor(x, device='cuda') or cupy.asarray(x)")
        return ("A", args.add(arr, path, name, arr.shape), arr.shape, name)
    if not isinstance(obj, (np.generic, list, tuple, dict)) and _is_device_array(obj):
        if mode == _HOST:
            raise TypeError(f"kiln.jit: argument {path} is a {type(obj).__module__}.{type(obj).__name__}, but the "
                            "function is compiled for a CPU target, which takes NumPy arrays; use "
                            "kiln.jit(target='cuda') for CUDA arrays")
        # A CPU tensor or another host array raises TypeError here, saying what to pass.
        arr, framework = cuda.as_cuda_array(obj, f"kiln.jit: argument {path}")
        dtype, shape, device = cuda.describe(arr, framework)
        args.devices.append(device)
        return ("A", args.add(arr, path, dtype, shape), shape, dtype)
    if isinstance(obj, (list, tuple)):
        kind = "L" if isinstance(obj, list) else "T"
        return (kind, tuple(_flatten_args(x, f"{path}[{i}]", args, mode) for i, x in enumerate(obj)))
    if isinstance(obj, dict):
        return ("D", tuple((k, _flatten_args(v, f"{path}.{k}", args, mode)) for k, v in obj.items()))
    try:
        hash(obj)
    except TypeError:
        raise TypeError(f"kiln.jit: argument {path} ({type(obj).__name__}) is neither an array nor a hashable constant") from None
    # The type is part of the key: 1, 1.0 and True are equal in Python but trace differently.
    return ("S", type(obj), obj)


def _rebuild_args(desc: Any, leaves: list[Any]) -> Any:
    kind = desc[0]
    if kind == "A":
        return leaves[desc[1]]
    if kind == "L":
        return [_rebuild_args(d, leaves) for d in desc[1]]
    if kind == "T":
        return tuple(_rebuild_args(d, leaves) for d in desc[1])
    if kind == "D":
        return {k: _rebuild_args(d, leaves) for k, d in desc[1]}
    return desc[2]


def _flatten_result(obj: Any, trace: Trace, outputs: list[Any]) -> Any:
    """Describes the traced function's result: tracers become graph outputs (deduplicated),
    anything else is kept as a constant."""
    if isinstance(obj, Tracer):
        if obj._trace is not trace:
            raise KilnError("the jitted function returned a tracer from another trace")
        v = obj.value
        for i, o in enumerate(outputs):
            if o is v:
                return ("O", i)
        if v.is_input:
            return ("I", v.ref[1])
        outputs.append(v)
        return ("O", len(outputs) - 1)
    if isinstance(obj, (list, tuple)) and type(obj) in (list, tuple):
        return ("L" if isinstance(obj, list) else "T", [_flatten_result(x, trace, outputs) for x in obj])
    if isinstance(obj, dict):
        return ("D", [(k, _flatten_result(v, trace, outputs)) for k, v in obj.items()])
    if isinstance(obj, np.ndarray):
        return ("N", obj.copy())
    return ("C", obj)


def _scalarize(a: Any) -> Any:
    # NumPy's 0-d results are scalars; device arrays stay arrays (reading one would wait for
    # the GPU).
    return a[()] if isinstance(a, np.ndarray) and a.ndim == 0 else a


def _rebuild_result(desc: Any, outs: tuple[Any, ...], inputs: list[Any]) -> Any:
    kind = desc[0]
    if kind == "O":
        return _scalarize(outs[desc[1]])
    if kind == "I":
        return _scalarize(inputs[desc[1]])
    if kind == "L":
        return [_rebuild_result(d, outs, inputs) for d in desc[1]]
    if kind == "T":
        return tuple(_rebuild_result(d, outs, inputs) for d in desc[1])
    if kind == "D":
        return {k: _rebuild_result(d, outs, inputs) for k, d in desc[1]}
    if kind == "N":
        return desc[1].copy()
    return desc[1]


# ---------------------------------------------------------------------- traced functions

class Traced:
    """The result of tracing a function for one signature.

    ``graph``: the kiln.v1.Graph (None when the function computes nothing). ``input_names``:
    the graph inputs' names (argument paths such as ``X`` or ``pair[1]``). ``output_types``:
    (dtype, shape) of each graph output as traced.
    """

    def __init__(self, graph: Any, input_names: list[str], output_types: list[tuple[str, tuple[int, ...]]], result_desc: Any,
                 index_checks: Sequence[IndexCheck] = ()) -> None:
        self.graph = graph
        self.input_names = input_names
        self.output_types = output_types
        self.result_desc = result_desc
        #: Index arguments checked against their axis before each run (NumPy's IndexError).
        self.index_checks = list(index_checks)


class _Entry:
    """One compiled signature."""

    def __init__(self, traced: Traced, compiled: Any, symbolic: bool = False) -> None:
        self.traced = traced
        self.compiled = compiled
        # With symbolic sizes, a bound read off the traced shapes holds only when the indexed
        # array is an argument (its size read at run time); other indices are clamped.
        self.index_checks = [c for c in traced.index_checks if c.source is not None or not symbolic]

    def accepts(self, shapes: list[tuple[int, ...]]) -> bool:
        """Whether a symbolic entry's kernel takes inputs of these shapes (its symbols bound
        from them, every input matching its shape expressions)."""
        c = self.compiled
        try:
            sizes = [shapes[sym.input][sym.axis] for sym in c.plan.symbols]
            return all(len(shape) == len(exprs) and all(eval_size(e, sizes) == d for e, d in zip(exprs, shape))
                       for shape, exprs in zip(shapes, c._in_exprs))
        except IndexError:
            return False

    def run(self, arrays: list[Any], num_threads: Optional[int]) -> Any:
        for check in self.index_checks:
            check.check(arrays)
        outs: tuple[Any, ...] = ()
        if self.compiled is not None:
            r = self.compiled(*arrays, num_threads=num_threads)
            outs = r if isinstance(r, tuple) else (r,)
        return _rebuild_result(self.traced.result_desc, outs, arrays)


def _axes_set(v: Any) -> frozenset[int]:
    return frozenset([int(v)] if isinstance(v, int) else (int(a) for a in v))


class _Dynamic:
    """Automatic dynamic shapes for one argument structure (see JitFunction._dynamic_entry)."""

    def __init__(self, first: list[tuple[int, ...]]) -> None:
        self.first = first
        self.dims: set[tuple[int, int]] = set()
        self.entry: Optional[_Entry] = None
        self.refused = False


def _strip_shapes(desc: Any) -> Any:
    """``desc`` with each array's shape replaced by its rank."""
    if isinstance(desc, tuple) and desc and desc[0] == "A":
        return ("A", desc[1], len(desc[2]), desc[3])
    if isinstance(desc, tuple):
        return tuple(_strip_shapes(d) for d in desc)
    return desc


class JitFunction:
    """A NumPy function compiled by kiln per input signature. Create with :func:`kiln.jit`.

    Calling it runs the function (tracing and compiling first for a new signature). Extra
    members: :meth:`trace` (the graph, without compiling), :meth:`compiled_for` (the
    :class:`kiln.Compiled` of a signature), ``signatures`` (how many are cached) and
    ``compile_count`` (how many compiles this object asked for). Thread-safe.

    ``target``: a :class:`kiln.Target`, or the string ``"cuda"`` for "the sm of the device
    the arguments are on" (resolved at each new signature). ``is_cuda`` says which kind of
    arrays calls take.
    """

    def __init__(self, fn: Callable[..., Any], target: Union[str, Target], client: Any = None, options: Any = None,
                 num_threads: Optional[int] = None, fallback: bool = False, mode: Optional[str] = None,
                 dynamic: Optional[bool] = None, static_dims: Optional[dict[str, Any]] = None,
                 dynamic_dims: Optional[dict[str, Any]] = None) -> None:
        if mode not in (None, "default", "max-autotune"):
            raise ValueError(f"kiln.jit: unknown mode {mode!r} (None, 'default' or 'max-autotune')")
        self.fn = fn
        self.dynamic = dynamic
        # Per argument path ("X", "pair[1]"): axes never made symbolic, and axes symbolic from
        # the first call (torch's mark_static / mark_dynamic, for NumPy arrays that cannot
        # carry a mark themselves).
        self.static_dims = {k: _axes_set(v) for k, v in (static_dims or {}).items()}
        self.dynamic_dims = {k: _axes_set(v) for k, v in (dynamic_dims or {}).items()}
        # Symbolic sizes (CPU targets): per argument structure (shapes reduced to ranks), the
        # shapes first seen, the (input, axis) pairs made symbolic so far and their entry.
        self._dyn: dict[Any, _Dynamic] = {}
        self._dyn_warned = False
        self.autotune = mode == "max-autotune"
        self.target: Union[Target, str] = _parse_target(target)
        # A plain "cuda" target: the sm is part of each signature's key.
        self._per_device = self.target == "cuda"
        self.is_cuda = self._per_device or (isinstance(self.target, Target) and self.target.is_cuda)
        self.options = options
        self.num_threads = num_threads
        if fallback and self.is_cuda:
            raise ValueError("kiln.jit(fallback=True) needs a CPU target: the NumPy function cannot run on CUDA arrays")
        self.fallback = fallback
        self._unreachable_until = 0.0  # while the daemon is deemed unreachable, calls run NumPy
        self._warned = False
        self._client = client
        self._cache: dict[Any, _Entry] = {}
        # Calls of plain arrays only, by (dtype, shape[, device]) per argument: the entry the
        # full binding found for them, so a repeated call skips the binding (see _fast_key).
        self._fast: dict[tuple[Any, ...], _Entry] = {}
        self._lock = threading.Lock()
        self.compile_count = 0
        self._signature: Optional[inspect.Signature]
        try:
            self._signature = inspect.signature(fn)
        except (TypeError, ValueError):
            self._signature = None
        # A function of plain positional parameters (no *args, **kwargs, keyword-only): calls
        # with positional arguments alone bind by position, without Signature.bind (a third
        # of a small call's host time).
        self._positional: Optional[tuple[tuple[str, ...], int]] = None
        if self._signature is not None:
            ps = list(self._signature.parameters.values())
            P = inspect.Parameter
            if all(p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD) for p in ps):
                self._positional = (tuple(p.name for p in ps), sum(1 for p in ps if p.default is P.empty))
        functools.update_wrapper(self, fn)

    @property
    def client(self) -> Any:
        return self._client if self._client is not None else default_client()

    @property
    def signatures(self) -> int:
        """How many input signatures have been compiled (a kernel with symbolic sizes counts
        once, whatever sizes it served)."""
        return len(self._cache) + sum(1 for d in self._dyn.values() if d.entry is not None)

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any], mode: str) -> tuple[Any, _Args]:
        found = _Args()
        descs: list[Any] = []
        positional = self._positional
        if positional is not None and not kwargs and positional[1] <= len(args) <= len(positional[0]):
            for name, value in zip(positional[0], args):  # what Signature.bind would give
                descs.append((name, "", _flatten_args(value, name, found, mode)))
        elif self._signature is not None:
            bound = self._signature.bind(*args, **kwargs)
            items = list(bound.arguments.items())
            params = self._signature.parameters
            for name, value in items:
                p = params[name]
                if p.kind is inspect.Parameter.VAR_POSITIONAL:
                    descs.append((name, "*", _flatten_args(tuple(value), name, found, mode)))
                elif p.kind is inspect.Parameter.VAR_KEYWORD:
                    descs.append((name, "**", _flatten_args(dict(value), name, found, mode)))
                else:
                    descs.append((name, "", _flatten_args(value, name, found, mode)))
        else:
            for i, value in enumerate(args):
                descs.append((f"arg{i}", "", _flatten_args(value, f"arg{i}", found, mode)))
            for k, value in kwargs.items():
                descs.append((k, "=", _flatten_args(value, k, found, mode)))
        return tuple(descs), found

    def _call_with(self, desc: Any, leaves: list[Any]) -> Any:
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        params = self._signature.parameters if self._signature is not None else {}
        # Parameters before a *args must go positionally; otherwise keywords avoid shifting
        # arguments when a defaulted parameter in between was not given.
        has_varargs = any(how == "*" for _, how, _ in desc)
        P = inspect.Parameter
        for name, how, d in desc:
            value = _rebuild_args(d, leaves)
            if how == "*":
                args.extend(value)
            elif how == "**":
                kwargs.update(value)
            elif how == "=":
                kwargs[name] = value
            elif name not in params:
                args.append(value)
            elif params[name].kind is P.POSITIONAL_ONLY or (has_varargs and params[name].kind is P.POSITIONAL_OR_KEYWORD):
                args.append(value)
            else:
                kwargs[name] = value
        return self.fn(*args, **kwargs)

    def _trace(self, desc: Any, found: _Args) -> Traced:
        trace = Trace()
        leaves = [trace.input(n, dtype, shape) for n, (dtype, shape) in zip(found.names, found.types)]
        result = self._call_with(desc, leaves)
        outputs: list[Any] = []
        rdesc = _flatten_result(result, trace, outputs)
        graph = trace.b.build(outputs) if outputs else None
        return Traced(graph, list(found.names), [(v.dtype, v.shape) for v in outputs], rdesc, trace.index_checks)

    def trace(self, *args: Any, **kwargs: Any) -> Traced:
        """Traces the function for these arguments without compiling; see :class:`Traced`.

        For a CUDA target, NumPy arrays may stand for CUDA arrays of their shape and dtype."""
        desc, found = self._bind(args, kwargs, _EXAMPLE if self.is_cuda else _HOST)
        return self._trace(desc, found)

    def _target_for(self, found: _Args) -> Target:
        """The target of this call: a plain ``"cuda"`` is the sm of the arguments' device (or
        of the current device when no argument is on one)."""
        if isinstance(self.target, Target):
            return self.target
        device = found.devices[0] if found.devices else cuda.current_device()
        return Target.cuda(cuda.device_sm(device))

    def _entry(self, args: tuple[Any, ...], kwargs: dict[str, Any], mode: str) -> tuple[_Entry, list[Any]]:
        desc, found = self._bind(args, kwargs, mode)
        target = self._target_for(found)
        key = (desc, target) if self._per_device else desc
        entry = self._cache.get(key)
        if entry is None and self.dynamic is not False and not self.autotune:
            entry = self._dynamic_entry(desc, found, target)
        if entry is None:
            with self._lock:
                entry = self._cache.get(key)
                if entry is None:
                    traced = self._trace(desc, found)
                    compiled = None
                    if traced.graph is not None and self.autotune and mode != _EXAMPLE:
                        # Time the kernel variants on these very arguments, keep the fastest.
                        compiled, _ = tune(self.client, traced.graph, found.arrays, target, options=self.options,
                                           num_threads=self.num_threads)
                        self.compile_count += 1
                        _check_plan(compiled, traced)
                    elif traced.graph is not None:
                        compiled = self.client.compile(traced.graph, target, self.options)
                        self.compile_count += 1
                        _check_plan(compiled, traced)
                    entry = _Entry(traced, compiled)
                    self._cache[key] = entry
        return entry, found.arrays

    def _dynamic_entry(self, desc: Any, found: _Args, target: Target) -> Optional[_Entry]:
        """The entry with symbolic sizes that serves this call, compiling it when needed; None
        to compile (or find) the exact signature instead.

        ``dynamic=True``: every dimension other than 0 and 1 is symbolic from the first call
        (sizes 0 and 1 stay specialised, as in torch). ``dynamic=None``: the first call compiles
        exact shapes; a later call whose shapes differ makes exactly the differing dimensions
        symbolic ("automatic dynamic"), so a function sees at most two compiles for any number
        of sizes. Dimensions of equal example size share a symbol ("duck sizing"); a call whose
        sizes break such an equality, or a graph kilnd cannot compile for every size, gets its
        exact signature compiled (with one KilnFallbackWarning for the latter)."""
        shapes = [shape for _, shape in found.types]
        # Per target: a plain "cuda" target compiles for the sm of each call's device.
        skeleton = (_strip_shapes(desc), target) if self._per_device else _strip_shapes(desc)
        with self._lock:
            state = self._dyn.get(skeleton)
            if state is None:
                state = _Dynamic(shapes)
                self._dyn[skeleton] = state
                state.dims = {(i, a % len(shapes[i])) for i, name in enumerate(found.names)
                              for a in self.dynamic_dims.get(name, ()) if shapes[i] and -len(shapes[i]) <= a < len(shapes[i])}
                if self.dynamic:
                    state.dims |= {(i, a) for i, shape in enumerate(shapes) for a, d in enumerate(shape) if d not in (0, 1)}
                if not state.dims:
                    return None
            if state.refused:
                return None
            grown = state.dims | {(i, a) for i, (s0, s1) in enumerate(zip(state.first, shapes))
                                  for a, (d0, d1) in enumerate(zip(s0, s1)) if d0 != d1}
            pinned = {(i, a % len(shapes[i])) for i, name in enumerate(found.names)
                      for a in self.static_dims.get(name, ()) if shapes[i] and -len(shapes[i]) <= a < len(shapes[i])}
            grown -= pinned
            if not grown:
                return None
            if grown == state.dims and state.entry is not None:
                entry = state.entry
            else:
                entry = self._compile_symbolic(desc, found, target, grown)
                if entry is None:
                    state.refused = True
                    return None
                state.dims, state.entry = grown, entry
        if not entry.accepts(shapes):
            return None
        return entry

    def _compile_symbolic(self, desc: Any, found: _Args, target: Target, dims: set[tuple[int, int]]) -> Optional[_Entry]:
        traced = self._trace(desc, found)
        if traced.graph is None:
            return None
        graph = traced.graph
        names: dict[int, str] = {}  # example size -> symbol (duck sizing)
        for i, inp in enumerate(graph.inputs):
            marks = []
            for a, d in enumerate(inp.type.shape):
                if (i, a) in dims and d not in (0, 1):
                    marks.append(names.setdefault(int(d), f"s{len(names)}"))
                else:
                    marks.append("")
            if any(marks):
                inp.type.ClearField("dim_symbols")
                inp.type.dim_symbols.extend(marks)
        if not names:
            return None
        try:
            compiled = self.client.compile(graph, target, self.options)
        except CompileError as e:
            if e.code != "INVALID_ARGUMENT":
                raise
            if not self._dyn_warned:
                self._dyn_warned = True
                warnings.warn(f"kiln.jit: {getattr(self.fn, '__qualname__', self.fn)} is compiled per shape: kilnd "
                              f"cannot compile it for every size ({e})", KilnFallbackWarning, stacklevel=4)
            return None
        self.compile_count += 1
        return _Entry(traced, compiled, symbolic=True)

    def compiled_for(self, *args: Any, **kwargs: Any) -> Any:
        """The :class:`kiln.Compiled` for these arguments' signature (compiling if needed);
        None when the function computes nothing. For a CUDA target, NumPy arrays may stand
        for CUDA arrays of their shape and dtype (nothing runs)."""
        return self._entry(args, kwargs, _EXAMPLE if self.is_cuda else _HOST)[0].compiled

    def _fast_key(self, args: tuple[Any, ...]) -> Optional[tuple[Any, ...]]:
        """For a call whose arguments are all NumPy arrays (a CPU target) or all PyTorch tensors
        (a CUDA target): their dtypes, shapes (and devices), which decide the entry the binding
        would find; None for any other call. The full binding costs a small call's host time
        several times over (argument inspection, per-array framework checks)."""
        key = []
        torch_tensor = _torch_tensor_type()
        for a in args:
            t = type(a)
            if t is np.ndarray and not self.is_cuda:
                key.append((a.dtype.str, a.shape))
            elif t is torch_tensor and self.is_cuda:
                key.append((a.dtype, a.shape, a.get_device()))
            else:
                return None
        return tuple(key)

    def _remember(self, key: Optional[tuple[Any, ...]], entry: _Entry) -> None:
        if key is not None:
            if len(self._fast) >= 4096:  # a workload of ever new shapes: start over
                self._fast.clear()
            self._fast[key] = entry

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = self._fast_key(args) if not kwargs else None
        if key is not None:
            entry = self._fast.get(key)
            if entry is not None:
                return entry.run(list(args), self.num_threads)
        if not self.fallback:
            entry, arrays = self._entry(args, kwargs, _DEVICE if self.is_cuda else _HOST)
            self._remember(key, entry)
            return entry.run(arrays, self.num_threads)
        if time.monotonic() < self._unreachable_until:
            return self.fn(*args, **kwargs)
        try:
            entry, arrays = self._entry(args, kwargs, _HOST)
        except RpcError as e:
            if e.code not in _UNREACHABLE_CODES:
                raise
            # Signatures already compiled keep running compiled; new ones run in NumPy until
            # the daemon is tried again.
            self._unreachable_until = time.monotonic() + _FALLBACK_RETRY_S
            if not self._warned:
                self._warned = True
                why = "cannot be reached" if e.unreachable else "ran past a time limit"
                warnings.warn(f"kiln.jit: {getattr(self.fn, '__qualname__', self.fn)} runs in NumPy: the kiln daemon at "
                              f"{self.client.address} {why} ({e.code}: {e.details}); trying again in "
                              f"{_FALLBACK_RETRY_S:.0f} s",
                              KilnFallbackWarning, stacklevel=2)
            return self.fn(*args, **kwargs)
        self._remember(key, entry)
        return entry.run(arrays, self.num_threads)

    def __repr__(self) -> str:
        return f"<kiln.jit {getattr(self.fn, '__qualname__', self.fn)} target={self.target} signatures={self.signatures}>"


def _check_plan(compiled: Any, traced: Traced) -> None:
    """The daemon's output types must be the ones the tracer inferred (else NumPy semantics
    would silently differ). Symbolic plans are checked at their example sizes."""
    got = [(s.dtype, tuple(s.shape)) for s in compiled.outputs]
    want = [(d, tuple(s)) for d, s in traced.output_types]
    if got != want:
        raise KilnError(f"the daemon's launch plan for {compiled.handle[:12]} gives outputs {got}, the trace expected {want}")


def _parse_target(target: Union[str, Target, Any]) -> Union[Target, str]:
    """A :class:`Target`, or ``"cuda"`` for a CUDA target whose sm comes from the device at
    call time (so that declaring a function needs no GPU). ValueError for a bad target."""
    if isinstance(target, str) and target.strip() == "cuda":
        return "cuda"
    return Target.parse(target)


# Codes after which kiln.jit(fallback=True) runs the function in NumPy (no daemon to talk to, or
# one whose compile ran past a time limit); and how long before the daemon is tried again.
_UNREACHABLE_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED"})
_FALLBACK_RETRY_S = 30.0


def jit(fn: Optional[Callable[..., Any]] = None, *, target: Union[str, Target] = "cpu", client: Any = None,
        options: Any = None, num_threads: Optional[int] = None, fallback: bool = False,
        mode: Optional[str] = None, dynamic: Optional[bool] = None, static_dims: Optional[dict[str, Any]] = None,
        dynamic_dims: Optional[dict[str, Any]] = None) -> Any:
    """Compiles a NumPy function with kiln; use as ``@kiln.jit`` or ``@kiln.jit(target=...)``.

    ``target``: a CPU target (``"cpu"``, the default, is this machine's best ISA level) or a
    CUDA one: ``"cuda:sm_90"``, or ``"cuda"`` for the compute capability of the device the
    arguments are on. A CUDA-targeted function takes CUDA arrays (PyTorch tensors, CuPy
    arrays...) and returns arrays of the same kind; see the module's documentation.
    ``client``: the :class:`kiln.Client` to compile with (default: a shared one for
    ``$KILN_SERVER``). ``options``: compile options (see :meth:`kiln.Client.compile`).
    ``num_threads``: threads a CPU kernel may use (default: ``$KILN_NUM_THREADS``, then
    ``$OMP_NUM_THREADS``, then the CPUs this process may use). ``fallback=True`` (CPU targets
    only): when the daemon cannot be reached, run the plain NumPy function instead, with one
    :class:`kiln.KilnFallbackWarning`, and try the daemon again 30 s later.
    ``mode="max-autotune"``: at each new signature, the kernel variants are compiled and timed
    on the call's own arguments, and the fastest serves this and later calls
    (:func:`kiln.autotune`).
    ``dynamic`` (CPU targets): None, the default, compiles exact shapes first and, when a
    later call's shapes differ, one kernel in which the differing dimensions are symbolic and
    that serves every size of them (torch's "automatic dynamic"); True makes every dimension
    but those of size 0 and 1 symbolic from the first call; False compiles each shape.
    ``static_dims`` / ``dynamic_dims`` (``{"X": 0, "means": (0, 1)}``, by argument path): axes
    that stay specialised whatever the sizes (a dimension of 1, a small inner reduction), and
    axes symbolic from the first call (torch's ``mark_static`` / ``mark_dynamic``).

    Raises ValueError at once for a bad target, and :class:`kiln.UnsupportedError` at the first
    call if the function does something kiln cannot express, naming the NumPy function.
    """
    t = _parse_target(target)

    def wrap(f: Callable[..., Any]) -> JitFunction:
        return JitFunction(f, t, client=client, options=options, num_threads=num_threads, fallback=fallback, mode=mode,
                           dynamic=dynamic, static_dims=static_dims, dynamic_dims=dynamic_dims)

    return wrap(fn) if fn is not None else wrap
