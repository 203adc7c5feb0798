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
"""

from __future__ import annotations

import functools
import inspect
import threading
from typing import Any, Callable, Optional, Union

import numpy as np

from . import dtypes as dt
from .errors import KilnError
from .target import Target
from .tracer import Trace, Tracer

_default_client: Any = None
_default_client_lock = threading.Lock()


def default_client() -> Any:
    """The process-wide :class:`kiln.Client` jitted functions use unless given one
    (``$KILN_SERVER``, else localhost:50051)."""
    global _default_client
    with _default_client_lock:
        if _default_client is None:
            from .client import Client

            _default_client = Client()
        return _default_client


# ---------------------------------------------------------------------- argument trees

class _Leaf:
    """An array argument: its position among the graph inputs."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def _flatten_args(obj: Any, path: str, arrays: list[np.ndarray], names: list[str]) -> Any:
    """Returns a hashable description of ``obj`` with arrays replaced by their input index.

    Appends the arrays (and their input names) in order. Raises TypeError for an argument that
    is neither an array nor a hashable constant.
    """
    if isinstance(obj, (np.ndarray, np.generic)):
        arr = np.asarray(obj)
        dt.dtype_name(arr.dtype)  # rejects dtypes kiln lacks, naming them
        arrays.append(arr)
        names.append(path)
        return ("A", len(arrays) - 1, arr.shape, arr.dtype.str)
    if isinstance(obj, (list, tuple)):
        kind = "L" if isinstance(obj, list) else "T"
        return (kind, tuple(_flatten_args(x, f"{path}[{i}]", arrays, names) for i, x in enumerate(obj)))
    if isinstance(obj, dict):
        return ("D", tuple((k, _flatten_args(v, f"{path}.{k}", arrays, names)) for k, v in obj.items()))
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


def _scalarize(a: np.ndarray) -> Any:
    return a[()] if a.ndim == 0 else a


def _rebuild_result(desc: Any, outs: tuple[np.ndarray, ...], inputs: list[np.ndarray]) -> Any:
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

    def __init__(self, graph: Any, input_names: list[str], output_types: list[tuple[str, tuple[int, ...]]], result_desc: Any) -> None:
        self.graph = graph
        self.input_names = input_names
        self.output_types = output_types
        self.result_desc = result_desc


class _Entry:
    """One compiled signature."""

    def __init__(self, traced: Traced, compiled: Any) -> None:
        self.traced = traced
        self.compiled = compiled

    def run(self, arrays: list[np.ndarray], num_threads: Optional[int]) -> Any:
        outs: tuple[np.ndarray, ...] = ()
        if self.compiled is not None:
            r = self.compiled(*arrays, num_threads=num_threads)
            outs = r if isinstance(r, tuple) else (r,)
        return _rebuild_result(self.traced.result_desc, outs, arrays)


class JitFunction:
    """A NumPy function compiled by kiln per input signature. Create with :func:`kiln.jit`.

    Calling it runs the function (tracing and compiling first for a new signature). Extra
    members: :meth:`trace` (the graph, without compiling), :meth:`compiled_for` (the
    :class:`kiln.Compiled` of a signature), ``signatures`` (how many are cached) and
    ``compile_count`` (how many compiles this object asked for). Thread-safe.
    """

    def __init__(self, fn: Callable[..., Any], target: Union[str, Target], client: Any = None, options: Any = None, num_threads: Optional[int] = None) -> None:
        self.fn = fn
        self.target = target
        self.options = options
        self.num_threads = num_threads
        self._client = client
        self._cache: dict[Any, _Entry] = {}
        self._lock = threading.Lock()
        self.compile_count = 0
        self._signature: Optional[inspect.Signature]
        try:
            self._signature = inspect.signature(fn)
        except (TypeError, ValueError):
            self._signature = None
        functools.update_wrapper(self, fn)

    @property
    def client(self) -> Any:
        return self._client if self._client is not None else default_client()

    @property
    def signatures(self) -> int:
        """How many input signatures have been compiled."""
        return len(self._cache)

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, list[np.ndarray], list[str]]:
        arrays: list[np.ndarray] = []
        names: list[str] = []
        descs: list[Any] = []
        if self._signature is not None:
            bound = self._signature.bind(*args, **kwargs)
            items = list(bound.arguments.items())
            params = self._signature.parameters
            for name, value in items:
                p = params[name]
                if p.kind is inspect.Parameter.VAR_POSITIONAL:
                    descs.append((name, "*", _flatten_args(tuple(value), name, arrays, names)))
                elif p.kind is inspect.Parameter.VAR_KEYWORD:
                    descs.append((name, "**", _flatten_args(dict(value), name, arrays, names)))
                else:
                    descs.append((name, "", _flatten_args(value, name, arrays, names)))
        else:
            for i, value in enumerate(args):
                descs.append((f"arg{i}", "", _flatten_args(value, f"arg{i}", arrays, names)))
            for k, value in kwargs.items():
                descs.append((k, "=", _flatten_args(value, k, arrays, names)))
        return tuple(descs), arrays, names

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

    def _trace(self, desc: Any, arrays: list[np.ndarray], names: list[str]) -> Traced:
        trace = Trace()
        leaves = [trace.input(n, a.dtype, a.shape) for n, a in zip(names, arrays)]
        result = self._call_with(desc, leaves)
        outputs: list[Any] = []
        rdesc = _flatten_result(result, trace, outputs)
        graph = trace.b.build(outputs) if outputs else None
        return Traced(graph, names, [(v.dtype, v.shape) for v in outputs], rdesc)

    def trace(self, *args: Any, **kwargs: Any) -> Traced:
        """Traces the function for these arguments without compiling; see :class:`Traced`."""
        desc, arrays, names = self._bind(args, kwargs)
        return self._trace(desc, arrays, names)

    def _entry(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[_Entry, list[np.ndarray]]:
        desc, arrays, names = self._bind(args, kwargs)
        entry = self._cache.get(desc)
        if entry is None:
            with self._lock:
                entry = self._cache.get(desc)
                if entry is None:
                    traced = self._trace(desc, arrays, names)
                    compiled = None
                    if traced.graph is not None:
                        compiled = self.client.compile(traced.graph, self.target, self.options)
                        self.compile_count += 1
                        _check_plan(compiled, traced)
                    entry = _Entry(traced, compiled)
                    self._cache[desc] = entry
        return entry, arrays

    def compiled_for(self, *args: Any, **kwargs: Any) -> Any:
        """The :class:`kiln.Compiled` for these arguments' signature (compiling if needed);
        None when the function computes nothing."""
        return self._entry(args, kwargs)[0].compiled

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        entry, arrays = self._entry(args, kwargs)
        return entry.run(arrays, self.num_threads)

    def __repr__(self) -> str:
        return f"<kiln.jit {getattr(self.fn, '__qualname__', self.fn)} target={self.target} signatures={self.signatures}>"


def _check_plan(compiled: Any, traced: Traced) -> None:
    """The daemon's output types must be the ones the tracer inferred (else NumPy semantics
    would silently differ)."""
    got = [(s.dtype, tuple(s.shape)) for s in compiled.outputs]
    want = [(d, tuple(s)) for d, s in traced.output_types]
    if got != want:
        raise KilnError(f"the daemon's launch plan for {compiled.handle[:12]} gives outputs {got}, the trace expected {want}")


def jit(fn: Optional[Callable[..., Any]] = None, *, target: Union[str, Target] = "cpu", client: Any = None,
        options: Any = None, num_threads: Optional[int] = None) -> Any:
    """Compiles a NumPy function with kiln; use as ``@kiln.jit`` or ``@kiln.jit(target=...)``.

    ``target``: a CPU target (``"cpu"``, the default, is this machine's best ISA level).
    ``client``: the :class:`kiln.Client` to compile with (default: a shared one for
    ``$KILN_SERVER``). ``options``: compile options (see :meth:`kiln.Client.compile`).
    ``num_threads``: threads the kernel may use (default: all this process may use).

    Raises :class:`kiln.UnsupportedError` at the first call if the function does something kiln
    cannot express, naming the NumPy function. CUDA targets are not implemented yet.
    """
    t = Target.parse(target) if not (isinstance(target, str) and target.startswith("cuda")) else None
    if t is None or t.is_cuda:
        raise NotImplementedError("kiln.jit(target='cuda') is not implemented yet; use a CPU target")

    def wrap(f: Callable[..., Any]) -> JitFunction:
        return JitFunction(f, t, client=client, options=options, num_threads=num_threads)

    return wrap(fn) if fn is not None else wrap
