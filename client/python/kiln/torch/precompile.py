"""Precompiled models: a process of a warm cluster runs a model's compiled code without tracing it.

``kiln.torch.compile(model, options={"precompile": True})`` returns a :class:`Precompiled`
model. Its first call with a new input signature computes a key from what the compiled code
depends on (below) and asks kilnd for a precompiled model under that key (one GetModel: the
record and every part's signed result, then one GetBlobs for the artifacts the local folder
lacks):

- **hit**: torch's AOT-compiled function is rebuilt from the record (PyTorch's own precompile
  format: Dynamo's guards and bytecode, AOTAutograd's runtime wrappers and its forward/backward
  split) and each ATen graph inside it from kiln's program record (:mod:`.program`), its parts
  adopting their results without any lookup. Neither Dynamo nor AOTAutograd traces anything.
  The guards Dynamo built when the model was compiled are checked against this call's
  arguments and the model, and every source file Dynamo traced is checked against its recorded
  hash: a changed model, shape, dtype, device, mode or source is a miss, never wrong code.
- **miss**: the model is compiled with torch's AOT compile (Dynamo with ``fullgraph``, then
  AOTAutograd and kiln's backend as ``torch.compile`` would) and stored in kilnd for the next
  process; kiln's program records of its graphs are stored as usual.

A model Dynamo cannot capture as one graph (a graph break), or whose graphs kiln could not
record, runs through ``torch.compile`` with the kiln backend instead, after one warning.

The key: the model's class and the source files of every module class it is made of, each
submodule's training flag, each parameter's and buffer's name, dtype, shape, strides and
device, the arguments' structure and tensor metadata, the grad / inference-mode / autocast
state, the backend's settings, GPU capability, and the torch, Python and kiln versions (with
the digest of kiln's sources). Parameter *values* are not in it: the compiled code reads them
from the model at each call, as torch.compile's does.

Trust: the record holds torch's serialized function, which torch loads with ``pickle``; it is
checked exactly like a kernel the client loads (kilnd's signature against the client's
trusted keys when it has any, the digest always) before a byte of it is read, so a client
that trusts kilnd's kernels trusts its precompiled models for the same reason. Records carry
a header of their own (format, torch and Python versions) checked before torch sees them.

Each input signature is compiled (or loaded) once and kept; calls check the kept functions'
guards in order, as torch.compile checks its cache entries. Shapes are static (one record per
shape).
"""

from __future__ import annotations

import builtins
import contextlib
import contextvars
import dataclasses
import functools
import gc
import hashlib
import importlib
import inspect
import json
import logging
import struct
import sys
import threading
import time
import traceback
import types
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
import torch.utils._pytree as pytree

from .._version import __version__
from ..errors import KilnError, KilnFallbackWarning
from . import program
from .counters import bump
from .dynamo_backend import BackendConfig, make_backend
from .records import RECORD_EVENTS, StoredRecord, fetch_loadables, rebuild_record, record_not_used
from .runtime import CompileSettings
from .sealed import check_sealed, sealed

log = logging.getLogger("kiln.torch")

FORMAT = "kiln.torch.aot/1"
MAGIC = b"KILNAOT1"


class NotPrecompilable(KilnError):
    """The model or its arguments hold something a precompiled model cannot be keyed by or
    stored as (an argument of an unknown type, a graph without a program record)."""


# --------------------------------------------------------------------------- the output code

@dataclass
class _Loading:
    config: BackendConfig
    settings: CompileSettings
    responses: dict[str, Any]  # part handle -> kiln.v1.CompileResponse, from GetModel


_LOADING: contextvars.ContextVar[Optional[_Loading]] = contextvars.ContextVar("kiln_precompile_loading",
                                                                               default=None)


@functools.lru_cache(maxsize=None)
def _output_code_class() -> type:
    """:class:`KilnOutputCode`, made on first use: its base class is Inductor's, whose import
    costs over a second (all of Dynamo), which ``import kiln.torch`` should not pay."""
    from torch._inductor.output_code import OutputCode

    @dataclasses.dataclass
    class KilnOutputCode(OutputCode):
        """What one ATen graph compiled to, in the form AOTAutograd bundles into torch's AOT-compiled
        function: the live compiled graph, and, to serialize, only the program record kilnd holds
        for it. Loading rebuilds the graph from that record (:func:`.records.rebuild_record`)
        with the part results the precompiled model's GetModel brought."""

        kind: str = ""
        record: Optional[StoredRecord] = None

        def __post_init__(self) -> None:
            self._fn: Optional[Callable[[list[Any]], Any]] = None
            self._boxed_call = True  # called with one list of arguments

        @staticmethod
        def of(fn: Callable[[list[Any]], Any], kind: str) -> "KilnOutputCode":
            code = KilnOutputCode(kind=kind, record=getattr(fn, "kiln_record", None))
            code._fn = fn
            return code

        def __call__(self, inputs: Sequence[Any]) -> Any:
            fn = self._fn
            if fn is None:
                raise KilnError(f"kiln: a precompiled {self.kind} graph was called before it was loaded")
            return fn(inputs)  # type: ignore[arg-type]

        def prepare_for_serialization(self) -> None:
            if self.record is None:
                raise NotPrecompilable(f"the {self.kind} graph has no program record in kilnd "
                                       "(a part did not compile, or the graph cannot be recorded)")
            self._fn = None

        def post_compile(self, example_inputs: Sequence[Any], constants: Any, graph_kwargs: Any) -> None:
            loading = _LOADING.get()
            if loading is None:
                raise KilnError("kiln: a precompiled model is loaded through kiln.torch.precompile only")
            assert self.record is not None
            missing = [h for h in self.record.handles if h not in loading.responses]
            if missing:
                raise KilnError(f"kiln: the daemon sent no result for part {missing[0][:12]} of a {self.kind} graph")
            responses = [loading.responses[h] for h in self.record.handles]
            self._fn = rebuild_record(self.record, responses, loading.config, loading.settings, self.kind)

        def set_triton_bundle(self, triton_bundle: Any) -> None:
            pass

        def __getstate__(self) -> dict[str, Any]:
            state = dict(self.__dict__)
            state["_fn"] = None
            return state

    KilnOutputCode.__qualname__ = "KilnOutputCode"  # what pickling names it by
    return KilnOutputCode


def __getattr__(name: str) -> Any:
    if name == "KilnOutputCode":
        return _output_code_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ------------------------------------------------------------------------------------ the key

def precompile_key(model: torch.nn.Module, args: Sequence[Any], kwargs: dict[str, Any],
                   config: BackendConfig) -> str:
    """The key of ``model`` called with ``args``/``kwargs`` under this thread's torch state
    (module docstring). Raises NotPrecompilable for an argument it cannot describe."""
    return _digest(key_components(model, args, kwargs, config))


def key_components(model: torch.nn.Module, args: Sequence[Any], kwargs: dict[str, Any],
                   config: BackendConfig) -> list[str]:
    """What :func:`precompile_key` digests, one labelled line per thing the compiled code
    depends on (``label: value``), in a fixed order."""
    out: list[str] = [f"format: {FORMAT}", f"kiln: {__version__} sources {program.sources_digest()}",
                      f"torch: {torch.__version__} cuda {torch.version.cuda}", f"python: {sys.version}"]
    opts = config.compile_options
    out.append(f"backend: cpu_target={config.cpu_target} cudagraphs={config.cudagraphs} layout={config.layout} "
               f"random={config.random} native={config.native} records={config.records} "
               f"autotune={config.autotune} torch_threads={torch.get_num_threads()}")
    out.append("compile options: " + (opts.SerializeToString(deterministic=True).hex() if opts is not None else ""))
    autocast = [(d, str(torch.get_autocast_dtype(d))) for d in ("cpu", "cuda") if torch.is_autocast_enabled(d)]
    out.append(f"torch state: grad={torch.is_grad_enabled()} inference={torch.is_inference_mode_enabled()} "
               f"autocast={autocast} cudnn_tf32={torch.backends.cudnn.allow_tf32}")
    out.append(f"model class: {type(model).__module__}.{type(model).__qualname__}")
    out.extend(f"source: {digest}" for digest in _class_sources(model))
    for name, m in model.named_modules():
        out.append(f"module {name or '(root)'}: {type(m).__module__}.{type(m).__qualname__} training={m.training}")
        out.append(f"module {name or '(root)'} attributes: "
                   + _describe({k: v for k, v in vars(m).items() if k not in _MODULE_INTERNALS}))
    devices: set[str] = set()
    for name, t in (*model.named_parameters(), *model.named_buffers()):
        out.append(f"tensor {name}: {program._tensor_meta(t)}")
        devices.add(str(t.device))
    leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
    out.append("arguments: " + " ".join(str(spec).split()))
    for i, a in enumerate(leaves):
        if isinstance(a, torch.Tensor):
            out.append(f"argument {i}: {program._tensor_meta(a)}")
            devices.add(str(a.device))
        elif a is None or isinstance(a, (bool, int, float, str)):
            out.append(f"argument {i}: {type(a).__name__} {a!r}")
        else:
            raise NotPrecompilable(f"an argument of type {type(a).__name__}")
    out.extend(f"device: {d}" for d in program._device_facts(devices))
    return out


def _digest(lines: Sequence[str]) -> str:
    h = hashlib.sha256()
    for line in lines:
        b = line.encode()
        h.update(struct.pack("<Q", len(b)) + b)
    return h.hexdigest()


# ------------------------------------------------------------ why a model missed (sealed mode)

#: The format of the record that keeps, per model class, the key components of the signature
#: last stored, so that a miss can say what differs from it.
EXPLAIN_FORMAT = "kiln.torch.aot-explain/1"
_EXPLAIN_TEXT = 240  # characters of each component kept for the message


def _explain_key(model: torch.nn.Module) -> str:
    return _digest([EXPLAIN_FORMAT, f"{type(model).__module__}.{type(model).__qualname__}"])


def explanation_record(components: Sequence[str]) -> bytes:
    """The components, each as its label and digest with its text cut short (a BERT's is about
    100 KB)."""
    return json.dumps([[c.split(": ", 1)[0], hashlib.sha256(c.encode()).hexdigest()[:16], c[:_EXPLAIN_TEXT]]
                       for c in components]).encode()


def explain_miss(components: Sequence[str], stored: bytes) -> str:
    """What differs between this call's key components and those of the signature stored last
    for the same model class: the first few labels that differ, with both values."""
    then = {label: (digest, text) for label, digest, text in json.loads(stored)}
    now = {c.split(": ", 1)[0]: c for c in components}
    diffs = []
    for label, text in now.items():
        was = then.get(label)
        if was is None:
            diffs.append(f"{label}: new ({text[len(label) + 2:][:120]})")
        elif was[0] != hashlib.sha256(text.encode()).hexdigest()[:16]:
            diffs.append(f"{label}: {was[1][len(label) + 2:][:120]} -> {text[len(label) + 2:][:120]}")
    diffs += [f"{label}: gone" for label in then if label not in now]
    if not diffs:
        return "the stored record of this signature is gone from kilnd"
    more = f" (and {len(diffs) - 4} more)" if len(diffs) > 4 else ""
    return "differs from the signature stored last: " + "; ".join(diffs[:4]) + more


# nn.Module's own bookkeeping: tensors and submodules are keyed on their own, hooks by count.
_MODULE_INTERNALS = frozenset({"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set",
                               "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
                               "_load_state_dict_post_hooks", "_compiled_call_impl", "training"})


def _describe(v: Any, depth: int = 0) -> str:
    """A module attribute as text for the key: values by ``repr``, functions and classes by
    qualified name, containers and plain objects (a model's config) by their contents, a few
    levels deep. Whatever the traced code branches on (an activation chosen by the config, an
    epsilon, a flag) changes the key, where torch's guards on object identity cannot be kept
    across processes."""
    if v is None or isinstance(v, (bool, int, float, str, bytes, torch.dtype, torch.device)):
        return repr(v)
    if isinstance(v, torch.Tensor):
        return f"tensor({program._tensor_meta(v)})"
    if isinstance(v, types.ModuleType):
        return f"module {v.__name__}"
    if callable(v) and hasattr(v, "__qualname__"):
        return f"{getattr(v, '__module__', '?')}.{v.__qualname__}"
    if depth >= 4:
        return type(v).__qualname__
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k!r}: {_describe(x, depth + 1)}" for k, x in sorted(v.items(), key=lambda kv: repr(kv[0]))) + "}"
    if isinstance(v, (list, tuple, set, frozenset)):
        items = sorted(v, key=repr) if isinstance(v, (set, frozenset)) else v
        return f"{type(v).__name__}[" + ", ".join(_describe(x, depth + 1) for x in items) + "]"
    if isinstance(v, torch.nn.Module):
        return f"module {type(v).__qualname__}"  # keyed where named_modules meets it
    if hasattr(v, "__dict__"):
        return f"{type(v).__module__}.{type(v).__qualname__}" + _describe(vars(v), depth + 1)
    return f"{type(v).__qualname__}:{v!r}"[:200]


def _class_sources(model: torch.nn.Module) -> list[str]:
    """Digests of the source files that define the model's module classes (torch's own are
    covered by its version)."""
    files: set[str] = set()
    for m in model.modules():
        for cls in type(m).__mro__:
            mod = sys.modules.get(cls.__module__)
            path = getattr(mod, "__file__", None)
            if path and not cls.__module__.startswith("torch."):
                files.add(path)
    out = []
    for path in sorted(files):
        try:
            with open(path, "rb") as f:
                out.append(f"{path.rsplit('/', 1)[-1]}:{hashlib.sha256(f.read()).hexdigest()}")
        except OSError:
            out.append(f"{path}:unreadable")
    return out


# ------------------------------------------------------------------------ the record's format

def encode(torch_bytes: bytes, installed: dict[str, list[str]]) -> bytes:
    """A precompiled model's record: MAGIC, a JSON header's length and bytes, torch's bytes.
    ``installed``: the globals Dynamo installed for the compiled bytecode, by name (see
    :func:`_installed_globals`)."""
    header = json.dumps({"format": FORMAT, "torch": torch.__version__, "python": sys.version,
                         "kiln": __version__, "installed": installed}, sort_keys=True).encode()
    return MAGIC + struct.pack("<I", len(header)) + header + torch_bytes


def decode(record: bytes) -> tuple[dict[str, Any], bytes]:
    """The header and torch's bytes of a record written by :func:`encode` for this torch and
    Python; raises KilnError for anything else."""
    if record[:8] != MAGIC or len(record) < 12:
        raise KilnError("not a kiln precompiled-model record")
    (n,) = struct.unpack_from("<I", record, 8)
    header = json.loads(record[12:12 + n])
    if header.get("format") != FORMAT or header.get("torch") != torch.__version__ or header.get("python") != sys.version:
        raise KilnError(f"a precompiled model for {header.get('format')}, torch {header.get('torch')}")
    return header, record[12 + n:]


def _installed_globals(entry: Any) -> dict[str, list[str]]:
    """What the names Dynamo installed in the traced function's globals for its bytecode
    (``___module_collections_<id>_c0``: a module or builtin its output code rebuilds values
    with) stand for, as ``[module, qualified name]``: they exist only in the compiling
    process, and torch's loader does not bring them back."""
    out: dict[str, list[str]] = {}
    scope = entry._extra_globals or {}
    for name in sorted(entry._artifacts.runtime_env.external_refs):
        if not name.startswith("___") or name not in scope:
            continue
        v = scope[name]
        if isinstance(v, types.ModuleType):
            out[name] = [v.__name__, ""]
        elif getattr(v, "__module__", None) and getattr(v, "__qualname__", None):
            out[name] = [v.__module__, v.__qualname__]
        else:
            raise NotPrecompilable(f"Dynamo installed a global {name} of type {type(v).__name__}")
    return out


def _resolve(module: str, qualname: str) -> Any:
    """A module, or an attribute path inside one, imported by name."""
    v: Any = importlib.import_module(module)
    for part in filter(None, qualname.split(".")):
        v = getattr(v, part)
    return v


# ------------------------------------------------------------------------- the compiled model

class Precompiled:
    """``model`` compiled per input signature through kilnd's precompiled models (module
    docstring). Attributes not its own are the model's (``eval()``, ``parameters()``, ...)."""

    def __init__(self, model: torch.nn.Module, config: BackendConfig,
                 fallback: Callable[[], Callable[..., Any]]) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"kiln: precompile takes an nn.Module, not {type(model).__name__}")
        self._model = model
        self._config = dataclasses.replace(config, async_compile=False)
        self._make_fallback = fallback
        self._fallback: Optional[Callable[..., Any]] = None
        self._entries: list[Any] = []  # torch's AOTCompiledFunction, one per input signature
        self._lock = threading.Lock()
        #: Why the model runs through torch.compile instead, if it does (diagnostics).
        self.fallback_reason: Optional[str] = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        for entry in self._entries:
            if entry.guard_check(self._model, *args, **kwargs):
                return entry.fn(self._model, *args, **kwargs)
        if self._fallback is None:
            with self._lock:
                entry = self._entry_for(args, kwargs)
            if entry is not None:
                return entry.fn(self._model, *args, **kwargs)
        assert self._fallback is not None
        return self._fallback(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._model, name)

    # ------------------------------------------------------------------ one input signature

    def _entry_for(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Optional[Any]:
        """The compiled function for these arguments: another thread's, kilnd's, or compiled now.
        None (and the fallback set) when the model cannot be precompiled."""
        for entry in self._entries:  # compiled by another thread meanwhile
            if entry.guard_check(self._model, *args, **kwargs):
                return entry
        if not (self._config.records and program.enabled()) or self._config.autotune:
            # The graphs inside a precompiled model are kept as their program records.
            return self._give_up("program records are off (records=False, $KILN_TORCH_RECORDS=0 or autotune)")
        try:
            components = key_components(self._model, args, kwargs, self._config)
        except NotPrecompilable as e:
            return self._give_up(f"no key: {e}")
        key = _digest(components)
        settings = self._config.settings()
        entry = self._load(key, settings, args, kwargs)
        if entry is None:
            if sealed():
                check_sealed(f"model {type(self._model).__name__} has no precompiled record in kilnd (key {key[:12]}): "
                             + self._why_missed(settings, components))
            entry = self._compile(key, components, settings, args, kwargs)
        if entry is not None:
            self._entries.append(entry)
        return entry

    def _load(self, key: str, settings: CompileSettings, args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> Optional[Any]:
        t0 = time.perf_counter()
        try:
            got = settings.client.get_model(key, FORMAT)
            if got is None:
                RECORD_EVENTS.append(f"precompiled {key[:12]} missed")
                bump(precompile_misses=1)
                return None
            record, responses = got
            header, data = decode(record)
            scope = {**vars(builtins), **self._globals()}
            scope.update({name: _resolve(*where) for name, where in header.get("installed", {}).items()})
            fetch_loadables(settings.client, responses)  # all graphs' artifacts in one call
            token = _LOADING.set(_Loading(self._config, settings, {r.handle: r for r in responses}))
            try:
                with _libraries_warmed(self._model, args, kwargs):
                    entry = _deserialize(data, scope, self._closure())
            finally:
                _LOADING.reset(token)
            changed = _changed_source(entry)
            if changed is not None:
                raise KilnError(f"source changed since it was compiled: {changed}")
            if not entry.guard_check(self._model, *args, **kwargs):
                raise KilnError("its guards do not hold for these arguments: "
                                + str(entry._artifacts.guard_manager.check_verbose(
                                    entry.prepare_f_locals(self._model, *args, **kwargs))))
            RECORD_EVENTS.append(f"precompiled {key[:12]} loaded: {len(responses)} parts")
            bump(precompile_hits=1)
            return entry
        except Exception as e:  # any failure costs the time it took: the model is compiled instead
            record_not_used(f"precompiled {key[:12]}", e, "precompile_misses")
            return None
        finally:
            bump(precompile_s=time.perf_counter() - t0)

    def _why_missed(self, settings: CompileSettings, components: list[str]) -> str:
        """A sealed miss's reason: what differs from the last signature stored for this model
        class (:func:`explain_miss`), or why that cannot be said."""
        try:
            got = settings.client.get_model(_explain_key(self._model), EXPLAIN_FORMAT)
            if got is None:
                return "kilnd holds no precompiled signature of this model class"
            return explain_miss(components, got[0])
        except Exception as e:  # only the message suffers
            return f"no explanation ({type(e).__name__}: {e})"

    def _compile(self, key: str, components: list[str], settings: CompileSettings, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> Optional[Any]:
        from torch._dynamo.aot_compile import AOTCompiledFunction, aot_compile_fullgraph
        from torch._dynamo.hooks import Hooks

        import torch._inductor.config

        made: list[Any] = []

        def wrap(fn: Callable[[list[Any]], Any], kind: str) -> Any:
            made.append(_output_code_class().of(fn, kind))
            return made[-1]

        backend = make_backend(self._config, wrap=wrap)
        try:
            # Static shapes: each signature its own record (a second shape would otherwise turn
            # the sizes Dynamo saw change into symbols, which program records do not hold).
            # With Inductor's FX graph cache off, AOTAutograd gives each graph a fresh nonce as its
            # cache key (the AOT compile's own fallback): a graph kiln compiled is never served
            # from torch's local AOTAutograd cache, where no kiln settings are part of the key.
            with torch._inductor.config.patch(fx_graph_cache=False), _grads_set_aside(self._model), \
                    _builtins_visible(self._globals()):
                entry = aot_compile_fullgraph(self._model.forward, (args, kwargs),
                                              Hooks(guard_filter_fn=_guard_filter), backend, dynamic=False)
        except Exception as e:
            return self._give_up(f"torch's AOT compile failed: {type(e).__name__}: {str(e)[:400]}")
        try:
            data = AOTCompiledFunction.serialize(entry, self._closure()).serialized_data
            handles = list(dict.fromkeys(h for code in made if code.record is not None for h in code.record.handles))
            settings.client.put_model(key, FORMAT, encode(data, _installed_globals(entry)), handles)
            bump(precompiles_stored=1)
            settings.client.put_model(_explain_key(self._model), EXPLAIN_FORMAT,
                                      explanation_record(components), [])
            RECORD_EVENTS.append(f"precompiled {key[:12]} stored: {len(data)} bytes, {len(made)} graphs, "
                                 f"{len(handles)} parts")
        except Exception as e:  # this process runs it anyway; the next one compiles it again
            log.warning("kiln.torch: precompiled model %s not stored: %s: %s", key[:12], type(e).__name__, e)
            RECORD_EVENTS.append(f"precompiled {key[:12]} not stored: {type(e).__name__}: {e}")
        return entry

    def _globals(self) -> dict[str, Any]:
        """The globals of the model's forward, where its compiled bytecode runs."""
        forward = self._model.forward
        return getattr(forward, "__func__", forward).__globals__

    def _closure(self) -> dict[str, Any]:
        """What the model's forward closes over, by position: a decorated forward (transformers
        wraps its models' in a few) holds the undecorated function in its closure, which
        pickle cannot name (the module attribute is the wrapper). Stored as references
        (torch's ``external_data``) and given back from this process's forward on load."""
        forward = self._model.forward
        cells = getattr(getattr(forward, "__func__", forward), "__closure__", None) or ()
        out = {}
        for i, cell in enumerate(cells):
            try:
                out[f"kiln.closure.{i}"] = cell.cell_contents
            except ValueError:  # an empty cell
                pass
        return out

    def _give_up(self, reason: str) -> None:
        self.fallback_reason = reason
        warnings.warn(f"kiln: {type(self._model).__name__} cannot be precompiled ({reason}); "
                      "running it through torch.compile", KilnFallbackWarning, stacklevel=4)
        RECORD_EVENTS.append(f"precompile given up: {reason}")
        self._fallback = self._make_fallback()
        return None


@contextlib.contextmanager
def _grads_set_aside(model: torch.nn.Module) -> Any:
    """Parameters without their ``.grad`` while the model is traced: torch 2.11 stores a
    parameter's gradient in the guards' state in a form its own loader refuses (a model
    compiled after a backward pass could not be loaded). The compiled code does not read them."""
    saved = [(p, p.grad) for p in model.parameters() if p.grad is not None]
    for p, _ in saved:
        p.grad = None
    try:
        yield
    finally:
        for p, g in saved:
            p.grad = g


def _guard_filter(entries: Sequence[Any]) -> list[bool]:
    """Which of Dynamo's guards a precompiled model keeps: torch's own choice for its AOT
    compile (no guards on globals, none of the kinds it cannot serialize), less two kinds of
    identity guard that cannot hold in another process either: a function's code object (the
    traced sources are hashed and checked on load instead) and a builtin function held by a
    module (module attributes are part of the key, by qualified name)."""
    from torch._dynamo.guards import CheckFunctionManager

    unsupported = set(CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES)
    return [not (g.is_global or g.guard_type in unsupported or g.guard_type == "BUILTIN_MATCH"
                 or (g.guard_type == "CONSTANT_MATCH" and g.name.endswith(".__code__")))
            for g in entries]


@contextlib.contextmanager
def _builtins_visible(scope: dict[str, Any]) -> Any:
    """The builtins a module's globals lack, added to them while the model is AOT-compiled
    and removed after: torch 2.11 checks that every global its bytecode loads is a key of the
    function's globals, builtins (``type``, ``isinstance``) included, and refuses the model
    otherwise. The added names are the very objects the lookup falls back to, so code running
    meanwhile sees no difference."""
    added = [name for name in vars(builtins) if name not in scope and not name.startswith("__")]
    for name in added:
        scope[name] = vars(builtins)[name]
    try:
        yield
    finally:
        for name in added:
            if scope.get(name) is vars(builtins)[name]:
                del scope[name]


def _deserialize(data: bytes, scope: dict[str, Any], closure: dict[str, Any]) -> Any:
    """torch's AOT-compiled function from its bytes (as torch's own AOTCompiledModel loads it),
    its bytecode's globals ``scope``, the forward's closure values ``closure``."""
    from torch._dynamo import convert_frame
    from torch._dynamo.aot_compile import AOTCompiledFunction
    from torch._dynamo.utils import get_metrics_context
    from torch._guards import CompileContext, compile_context

    with compile_context(CompileContext(convert_frame.get_compile_id({}))), get_metrics_context(), \
            _collector_paused(), _fake_modes_without_stacks():
        return AOTCompiledFunction.deserialize(data, scope, closure)


@contextlib.contextmanager
def _libraries_warmed(model: torch.nn.Module, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """The GPU libraries the model's first call needs, started on a thread of their own while
    the record loads (which is Python work; torch lets go of the interpreter lock inside its
    ops): cuBLAS for each floating dtype of the model's parameters, cuDNN when it has
    convolutions. Their first use costs a handle, a workspace and loading their kernels, 0.1 to
    0.3 s that the first call would otherwise wait for. The thread works on a stream of its own
    and is joined before the body's result is used, so nothing of it runs under a later CUDA
    graph capture. Any failure is left for the first call to meet."""
    devices = {t.device for t in pytree.tree_leaves((tuple(args), kwargs))
               if isinstance(t, torch.Tensor) and t.is_cuda}
    if len(devices) != 1:
        yield
        return
    device = devices.pop()
    dtypes = sorted({p.dtype for p in model.parameters() if p.is_floating_point() and p.device == device}, key=str)
    convs = sorted({m.__class__.__name__[-2:] for m in model.modules()
                    if isinstance(m, torch.nn.modules.conv._ConvNd)})

    def warm() -> None:
        try:
            with torch.cuda.device(device), torch.cuda.stream(torch.cuda.Stream(device)), torch.no_grad():
                for dtype in dtypes:
                    a = torch.zeros(16, 16, device=device, dtype=dtype)
                    torch.mm(a, a)
                    for dims in convs:  # "1d", "2d", "3d"
                        n = int(dims[0])
                        x = torch.zeros((1, 8) + (4,) * n, device=device, dtype=dtype)
                        getattr(torch.nn.functional, f"conv{n}d")(x, torch.zeros((8, 8) + (3,) * n, device=device,
                                                                                 dtype=dtype), padding=1)
                torch.cuda.current_stream(device).synchronize()
        except Exception as e:  # the first call meets it, with torch's own message
            log.debug("kiln.torch: warming GPU libraries failed: %s", e)

    thread = threading.Thread(target=warm, name="kiln-warm-libraries", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()


class _NoStacks(types.ModuleType):
    """``traceback`` as torch's fake-tensor module sees it while a record loads: the real
    module in every attribute but ``extract_stack``, which returns an empty stack."""

    def __getattr__(self, name: str) -> Any:
        return getattr(traceback, name)

    @staticmethod
    def extract_stack(*_: Any, **__: Any) -> traceback.StackSummary:
        return traceback.StackSummary()


@contextlib.contextmanager
def _fake_modes_without_stacks() -> Any:
    """Fake-tensor modes created without recording where: torch's guard loader makes one per
    tensor guard (a BERT has about 200) and each walks the interpreter stack with
    ``traceback.extract_stack``, which stats every source file on it: 0.125 s of a BERT
    record's load on an H200 host (18 ms on a host with a quicker file system). torch shows
    that stack only in its error about mixing two fake modes, which loading guards never
    raises. Another thread making a fake mode meanwhile gets an empty stack as well."""
    from torch._subclasses import fake_tensor

    if getattr(fake_tensor, "traceback", None) is not traceback:  # a torch that does this differently
        yield
        return
    fake_tensor.traceback = _NoStacks("traceback")  # type: ignore[attr-defined]
    try:
        yield
    finally:
        fake_tensor.traceback = traceback  # type: ignore[attr-defined]


@contextlib.contextmanager
def _collector_paused() -> Any:
    """Python's cyclic garbage collector held off while a record loads. Loading allocates
    some hundred thousand objects that all stay alive (guards, fake tensors, wrappers), and
    each allocation threshold crossed ran a collection over a heap that torch and the model's
    libraries already made large: on a BERT record that was ~0.2 s of collections that freed
    nothing. One collection of the young generation runs after, as the allocations would
    have triggered anyway."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect(0)


def _changed_source(entry: Any) -> Optional[str]:
    """The first source Dynamo traced whose current text no longer matches its recorded hash
    (``module:line``), or None."""
    for src in sorted(entry.source_info().inlined_sources, key=lambda s: (s.module, s.firstlineno)):
        try:
            m = importlib.import_module(src.module)
            lines = inspect.getsourcelines(m)[0][src.firstlineno - 1:src.lastlineno - 1]
        except Exception:
            return f"{src.module} (unreadable)"
        if hashlib.sha256("".join(lines).encode()).hexdigest() != src.checksum:
            return f"{src.module}:{src.firstlineno}"
    return None


__all__ = ["FORMAT", "KilnOutputCode", "NotPrecompilable", "Precompiled", "precompile_key"]
