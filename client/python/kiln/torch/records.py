"""Program records (:mod:`.program`) as the backend uses them: the key of a graph, the record
kilnd holds for it rebuilt into a compiled graph, and a freshly compiled graph stored as one.
Any failure here costs only the record: the graph is then compiled as usual.
"""

from __future__ import annotations

import collections
import logging
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
import torch.fx

from .. import native
from ..client import Compiled
from ..errors import KilnError
from ..v1 import service_pb2
from . import program
from .counters import RECENT, bump
from .cudagraphs import CudaGraphRunner, replay_wins
from .runtime import CompileSettings, KilnPart, boxed, describe, graph_call, reraise_if_dynamo_control, run_parts

log = logging.getLogger("kiln.torch")


# What happened to this process's program records, newest last (diagnostics, benchmarks).
RECORD_EVENTS: collections.deque[str] = collections.deque(maxlen=64)


def record_key(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: BackendConfig, kind: str,
                user_outputs: Optional[int]) -> Optional[str]:
    """The program record key of ``gm`` (:mod:`.program`), or None when records are off or the
    graph cannot have one (symbolic sizes, autotuning, a target a record cannot name)."""
    if not (config.records and program.enabled()) or config.autotune:
        return None
    opts = config.compile_options
    settings = [f"kind={kind}", f"user_outputs={user_outputs}", f"cpu_target={config.cpu_target}",
                f"cudagraphs={config.cudagraphs}", f"layout={config.layout}", f"random={config.random}",
                f"native={config.native}", f"torch_threads={torch.get_num_threads()}",
                # The layout pass's choice on CUDA follows it (passes/channels_last.py).
                f"cudnn_tf32={torch.backends.cudnn.allow_tf32}",
                "options=" + (opts.SerializeToString(deterministic=True).hex() if opts is not None else "")]
    try:
        with real_tensors():
            return program.model_key(gm, example_inputs, settings)
    except program.NotRecordable:
        return None
    except Exception as e:  # a key that cannot be computed costs the record, nothing else
        log.debug("kiln.torch: no record key: %s: %s", type(e).__name__, e)
        return None


def reported_strides() -> Optional[list[Any]]:
    tc = torch._guards.TracingContext.try_get()
    return list(tc.output_strides) if tc is not None and tc.output_strides is not None else None


def from_record(key: str, config: BackendConfig, settings: Optional[CompileSettings],
                 kind: str) -> Optional[Callable[[list[Any]], Any]]:
    """The compiled graph rebuilt from kilnd's record under ``key``, or None on a miss (or any
    failure, which costs only the time it took: the graph is then compiled as usual)."""
    t0 = time.perf_counter()
    try:
        with real_tensors():
            return _rebuild_from_record(key, config, settings, kind)
    except Exception as e:
        reraise_if_dynamo_control(e)
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


def real_tensors() -> Any:
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


def with_record(fn: Callable[[list[Any]], Any], stored: Optional[StoredRecord]) -> Callable[[list[Any]], Any]:
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
    fn: Callable[[list[Any]], Any] = boxed(graph_call(outer))
    bump(record_hits=1, parts=len(parts))
    RECORD_EVENTS.append(f"{key[:12]} rebuilt: {len(parts)} parts")
    RECENT.append({"kind": kind, "parts": describe(parts), "segments": None, "record": key,
                   "_refs": [weakref.ref(p) for p in parts]})
    if header.get("cudagraphs") and replay_wins(outer, parts):
        fn = CudaGraphRunner(fn, name=f"{kind} graph")
    return with_record(fn, stored)


def store_record(key: str, settings: CompileSettings, outer: torch.fx.GraphModule, parts: Sequence[KilnPart],
                  output_strides: Optional[list[Any]], cudagraphs: bool) -> Optional[StoredRecord]:
    """Writes the program record of a freshly compiled graph to kilnd; only when every part
    compiled (a part left to torch by a passing failure must not be frozen into the record).
    Returns what was stored, or None."""
    failed = [p.part_name for p in parts if p.compiled is None or p.error]
    if failed:
        RECORD_EVENTS.append(f"{key[:12]} not stored: parts {failed[:4]} did not compile")
        return None
    try:
        with real_tensors():
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


__all__ = ["RECORD_EVENTS", "StoredRecord", "fetch_loadables", "from_record", "real_tensors", "rebuild_record", "record_key", "record_not_used", "reported_strides", "store_record", "with_record"]
