"""Compiled programs as records: a warm process skips partitioning, lowering and per-part lookups.

What :func:`~.dynamo_backend.compile_aten_graph` makes of an ATen graph (the rewritten graph
with its kiln parts, their compiled handles, the constants it reads, the strides it reported)
is stored in kilnd as a *program record* (``kiln.v1.PutModel``), under a key computed from
what the backend received: the graph's code, every input's metadata (dtype, shape, strides,
device, whether it needs a gradient), the values of the constants it reads, the graph's kind,
the backend's settings and the versions of torch and of this package (its sources' digest).
A later process, here or on any machine of the cluster, that traces the same model asks once
(``GetModel``: the record and every part's result, each signature checked as a result's),
brings the artifacts its local folder lacks in one more call (``GetBlobs``), and rebuilds the
graph from the record. Anything that differs (another shape, dtype, device, model, option,
torch or kiln) is another key, so a miss, never a wrong program.

The record is kiln's own format, never pickle: ``MAGIC``, the length of a JSON header, the
header, then the constants' bytes. The header lists the graph's nodes with their targets named
(an ATen operator ``aten::add.Tensor``, an ``operator`` function, one of the torch functions
and Tensor methods the backend calls directly, or a function of ``kiln.torch``) and their
arguments as tagged JSON values; loading resolves names only from those sets, so a record can
call nothing else. Each part carries its kiln graph, argument and result specs and handle, and
its nodes as a graph of their own (what it runs in torch if its kernels cannot load).

Trust: the record is signed by kilnd and verified like a result; its parts are kilnd-compiled
results with their own signatures. A record is *written* by a client holding role compile, so
its torch-side graph is as trustworthy as the clients allowed to compile: names outside the
sets above are refused, but a compile-role client could store a program that computes
something else under a key. Deployments that do not trust every compile-role client keep
records off (``KILN_TORCH_RECORDS=0`` on clients).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib
import json
import operator
import os
import struct
import threading
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
import torch.fx

from .._version import __version__
from ..errors import KilnError
from ..v1 import graph_pb2
from .nodes import get_attr
from .partition import PartGraph, TensorSpec
from .passes.philox_on_host import PHILOX_WRAPPERS, philox_on_host

FORMAT = "kiln.torch.program/2"
MAGIC = b"KILNPRG1"


class NotRecordable(KilnError):
    """The graph holds something a record cannot name (a symbolic size, an unknown target)."""


def enabled() -> bool:
    """Records are on unless ``$KILN_TORCH_RECORDS`` is ``0``."""
    return os.environ.get("KILN_TORCH_RECORDS", "1") != "0"


# ---------------------------------------------------------------------------------- the key

_SOURCES_DIGEST: Optional[str] = None
_sources_lock = threading.Lock()


def sources_digest() -> str:
    """The digest of this package's Python sources: a changed backend never reads records an
    older one wrote, even at the same version number."""
    global _SOURCES_DIGEST
    with _sources_lock:
        if _SOURCES_DIGEST is None:
            h = hashlib.sha256()
            root = Path(__file__).resolve().parent.parent
            for p in sorted(root.rglob("*.py")):
                if "_proto" in p.parts:
                    continue
                h.update(str(p.relative_to(root)).encode() + b"\0")
                h.update(p.read_bytes())
            _SOURCES_DIGEST = h.hexdigest()
        return _SOURCES_DIGEST


def _tensor_meta(t: torch.Tensor) -> str:
    return (f"{t.dtype}|{tuple(t.shape)}|{tuple(t.stride())}|{t.storage_offset()}|{t.device}|"
            f"{int(t.requires_grad)}")


def _device_facts(devices: set[str]) -> list[str]:
    out = []
    for d in sorted(devices):
        dev = torch.device(d)
        if dev.type == "cuda":
            major, minor = torch.cuda.get_device_capability(dev)
            out.append(f"{d}:sm_{major}{minor}")
        else:
            out.append(d)
    return out


def model_key(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], settings: Sequence[str]) -> str:
    """The record key of ``gm`` as the backend received it (before any pass changes it).

    ``settings``: the backend's settings that change what it makes, as text. Raises
    NotRecordable for a graph with symbolic sizes (their guards live in Dynamo's shape
    environment, which a record cannot replay)."""
    h = hashlib.sha256()
    debug = os.environ.get("KILN_TORCH_RECORD_DEBUG")  # a folder: each key's inputs, as text
    pieces: list[str] = []

    def put(s: str) -> None:
        b = s.encode()
        h.update(struct.pack("<Q", len(b)) + b)
        if debug:
            pieces.append(s)

    put(FORMAT)
    put(__version__)
    put(sources_digest())
    put(torch.__version__)
    put(str(torch.version.cuda))
    for s in settings:
        put(s)
    devices: set[str] = set()
    for a in example_inputs:
        if isinstance(a, torch.Tensor):
            if not all(isinstance(d, int) for d in (*a.shape, *a.stride())):
                raise NotRecordable("an input has symbolic sizes")
            put(_tensor_meta(a))
            devices.add(str(a.device))
        elif isinstance(a, (bool, int, float)):
            put(f"{type(a).__name__}:{a!r}")
        else:
            raise NotRecordable(f"an input of type {type(a).__name__}")
    for d in _device_facts(devices):
        put(d)
    put(gm.code)
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            v = get_attr(gm, n.target)
            if isinstance(v, torch.Tensor):
                data = _tensor_bytes(v)
                put(f"{n.target}:{_tensor_meta(v)}:{hashlib.sha256(data).hexdigest()}")
            else:
                raise NotRecordable(f"constant {n.target} of type {type(v).__name__}")
        elif n.op == "call_module":
            raise NotRecordable(f"a call of module {n.target}")
    key = h.hexdigest()
    if debug:
        Path(debug).mkdir(parents=True, exist_ok=True)
        (Path(debug) / f"{key}.txt").write_text("\n".join(pieces))
    return key


def _tensor_bytes(t: torch.Tensor) -> bytes:
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


# ---------------------------------------------------------------------------------- targets

def direct_calls() -> dict[Any, tuple[str, Any]]:
    """ATen ops the torch side of a rewritten graph calls as Tensor methods or ``torch``
    functions of the same schema instead of through ``torch.ops.aten.X.default``: the
    OpOverload's Python ``__call__`` costs about as much as the view itself (2.5 µs against
    0.8 µs for a view on a desktop CPU), and a BERT-base forward runs hundreds of such nodes."""
    aten = torch.ops.aten
    method = {
        aten.view.default: "view", aten._unsafe_view.default: "view", aten.permute.default: "permute",
        aten.expand.default: "expand", aten.t.default: "t", aten.transpose.int: "transpose",
        aten.unsqueeze.default: "unsqueeze", aten.squeeze.dim: "squeeze", aten.select.int: "select",
        aten.clone.default: "clone",
    }
    function = {aten.mm.default: torch.mm, aten.bmm.default: torch.bmm, aten.addmm.default: torch.addmm,
                aten.gather.default: torch.gather, aten.embedding.default: torch.embedding}
    # Attention: the OpOverload's Python call cost 29 µs of host time on an H200's host where
    # F.scaled_dot_product_attention, reaching the same kernel through torch's bindings, cost
    # 18 (tests/bench/gpu/host_calls.py); the bindings of the ATen ops themselves are called here.
    # Only calls that draw no random numbers (_direct_call), so the graph's random ops stay
    # recognisable.
    for name in ("_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_cudnn_attention"):
        op, fn = getattr(aten, name, None), getattr(torch, name, None)
        if op is not None and fn is not None:
            function[op.default] = fn
    table: dict[Any, tuple[str, Any]] = {k: ("call_method", v) for k, v in method.items()}
    table.update({k: ("call_function", v) for k, v in function.items()})
    return table



@functools.lru_cache(maxsize=1)
def _torch_functions() -> dict[str, Any]:
    """The torch functions the backend's passes put in a rewritten graph, by name."""
    fns = {v.__name__: v for kind, v in direct_calls().values() if kind == "call_function"}
    fns["linear"] = torch.nn.functional.linear  # fold_linear
    return fns


@functools.lru_cache(maxsize=1)
def _torch_methods() -> frozenset[str]:
    """The Tensor methods the backend's passes call, by name."""
    return frozenset({v for kind, v in direct_calls().values() if kind == "call_method"} | {"reshape", "index_add_"})


def _philox_wrapped(t: Any) -> Optional[Any]:
    """The ATen op that ``t`` calls with its Philox state on the host (:func:`.passes.philox_on_host.philox_state_on_host`)."""
    for op, wrapper in PHILOX_WRAPPERS.items():
        if wrapper is t:
            return op
    return None


def _name_target(n: torch.fx.Node) -> list[str]:
    t = n.target
    if n.op == "call_method":
        if t not in _torch_methods():
            raise NotRecordable(f"Tensor method {t}")
        return ["method", t]
    if isinstance(t, torch._ops.OpOverload):
        return ["op", *_op_name(t)]
    wrapped = _philox_wrapped(t)
    if wrapped is not None:
        return ["philox_on_host", *_op_name(wrapped)]
    if getattr(operator, getattr(t, "__name__", ""), None) is t:
        return ["operator", t.__name__]
    fns = _torch_functions()
    if fns.get(getattr(t, "__name__", "")) is t:
        return ["torch", t.__name__]
    mod = getattr(t, "__module__", "") or ""
    if mod.startswith("kiln.torch.") and "<" not in t.__qualname__:
        return ["kiln", mod, t.__qualname__]
    raise NotRecordable(f"target {t!r}")


def _op_name(op: Any) -> list[str]:
    ns, rest = op.name().split("::", 1)
    name, _, overload = rest.partition(".")
    return [ns, name, overload or "default"]


def _resolve_target(spec: list[str]) -> Any:
    kind = spec[0]
    if kind == "method" and spec[1] in _torch_methods():
        return spec[1]
    if kind in ("op", "philox_on_host") and len(spec) == 4:
        _, ns, name, overload = spec
        op = getattr(getattr(getattr(torch.ops, ns), name), overload)
        if kind == "op":
            return op
        return philox_on_host(op)
    if kind == "operator":
        fn = getattr(operator, spec[1], None)
        if callable(fn):
            return fn
    if kind == "torch":
        fn = _torch_functions().get(spec[1])
        if fn is not None:
            return fn
    if kind == "kiln" and spec[1].startswith("kiln.torch."):
        obj: Any = importlib.import_module(spec[1])
        for part in spec[2].split("."):
            obj = getattr(obj, part)
        if callable(obj) and getattr(obj, "__module__", "") == spec[1]:
            return obj
    raise KilnError(f"a program record names a target outside what records may call: {spec}")


# ---------------------------------------------------------------------------------- values

def _enc(v: Any) -> Any:
    if isinstance(v, torch.fx.Node):
        return {"@": "n", "v": v.name}
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return {"@": "f", "v": v.hex()}
    if isinstance(v, tuple):
        return {"@": "t", "v": [_enc(x) for x in v]}
    if isinstance(v, list):
        return [_enc(x) for x in v]
    if isinstance(v, dict):
        return {"@": "d", "v": [[k, _enc(x)] for k, x in v.items()]}
    if isinstance(v, torch.dtype):
        return {"@": "dtype", "v": str(v).replace("torch.", "")}
    if isinstance(v, torch.device):
        return {"@": "device", "v": str(v)}
    if isinstance(v, (torch.layout, torch.memory_format)):
        return {"@": type(v).__name__, "v": str(v).replace("torch.", "")}
    raise NotRecordable(f"an argument of type {type(v).__name__}")


def _dec(v: Any, env: dict[str, torch.fx.Node]) -> Any:
    if isinstance(v, list):
        return [_dec(x, env) for x in v]
    if not isinstance(v, dict):
        return v
    tag, x = v.get("@"), v.get("v")
    if tag == "n":
        return env[x]
    if tag == "f":
        return float.fromhex(x)
    if tag == "t":
        return tuple(_dec(y, env) for y in x)
    if tag == "d":
        return {k: _dec(y, env) for k, y in x}
    if tag in ("dtype", "layout", "memory_format"):
        obj = getattr(torch, x, None)
        want = {"dtype": torch.dtype, "layout": torch.layout, "memory_format": torch.memory_format}[tag]
        if isinstance(obj, want):
            return obj
    if tag == "device":
        return torch.device(x)
    raise KilnError(f"a program record holds a value kiln cannot read: {v!r:.80}")


def encode_graph(g: torch.fx.Graph) -> list[dict[str, Any]]:
    """The nodes of ``g`` as JSON-able dicts (NotRecordable for what a record cannot name)."""
    out = []
    for n in g.nodes:
        d: dict[str, Any] = {"op": n.op, "name": n.name}
        if n.op in ("call_function", "call_method"):
            d["target"] = _name_target(n)
        elif n.op in ("get_attr", "call_module", "placeholder"):
            d["target"] = str(n.target)
        d["args"] = _enc(n.args)
        d["kwargs"] = _enc(dict(n.kwargs))
        out.append(d)
    return out


def decode_graph(nodes: Sequence[dict[str, Any]]) -> torch.fx.Graph:
    g = torch.fx.Graph()
    env: dict[str, torch.fx.Node] = {}
    for d in nodes:
        op = d["op"]
        args, kwargs = _dec(d["args"], env), _dec(d["kwargs"], env)
        if op == "output":
            g.output(args[0])
            continue
        if op in ("call_function", "call_method"):
            target = _resolve_target(d["target"])
        elif op in ("get_attr", "call_module", "placeholder"):
            target = d["target"]
        else:
            raise KilnError(f"a program record holds a node of kind {op!r}")
        node = g.create_node(op, target, args, kwargs, name=d["name"])
        env[d["name"]] = node
    return g


def _spec(s: TensorSpec) -> dict[str, Any]:
    if s.exprs is not None:
        raise NotRecordable("a part with symbolic sizes")
    return {"dtype": str(s.dtype).replace("torch.", ""), "shape": list(s.shape),
            "strides": list(s.strides) if s.strides is not None else None}


def _unspec(d: dict[str, Any]) -> TensorSpec:
    dtype = getattr(torch, d["dtype"])
    if not isinstance(dtype, torch.dtype):
        raise KilnError(f"a program record names dtype {d['dtype']!r}")
    return TensorSpec(dtype, tuple(d["shape"]), tuple(d["strides"]) if d["strides"] is not None else None)


# ---------------------------------------------------------------------------------- records

def encode(outer: torch.fx.GraphModule, parts: Sequence[Any], *, output_strides: Optional[list[Any]],
           cudagraphs: bool) -> tuple[bytes, list[str]]:
    """The record of a rewritten graph whose parts are all compiled, and the parts' handles.
    NotRecordable when something in it cannot be named."""
    constants: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    offset = 0
    for n in outer.graph.nodes:
        if n.op == "get_attr":
            v = get_attr(outer, n.target)
            if not isinstance(v, torch.Tensor):
                raise NotRecordable(f"constant {n.target} of type {type(v).__name__}")
            b = _tensor_bytes(v)
            constants.append({"name": n.target, "dtype": str(v.dtype).replace("torch.", ""),
                              "shape": list(v.shape), "stride": list(v.stride()), "device": str(v.device),
                              "requires_grad": bool(v.requires_grad), "offset": offset, "size": len(b)})
            blobs.append(b)
            offset += len(b)
    part_records = []
    handles = []
    for p in parts:
        if p.compiled is None or p.part is None or p.part.symbolic:
            raise NotRecordable(f"part {p.part_name} has no compiled result")
        pg: PartGraph = p.part
        part_records.append({
            "name": p.part_name, "device": str(p.device), "handle": p.compiled.handle, "ops": p.ops,
            "graph": base64.b64encode(pg.graph.SerializeToString(deterministic=True)).decode(),
            "inputs": [_spec(s) for s in pg.inputs], "outputs": [_spec(s) for s in pg.outputs],
            "sources": [list(s) for s in pg.sources], "num_kiln_outputs": pg.num_kiln_outputs,
            "num_nodes": pg.num_nodes, "eager": encode_graph(p._eager_graph),
        })
        handles.append(p.compiled.handle)
    header = {
        "format": FORMAT, "graph": encode_graph(outer.graph), "parts": part_records, "constants": constants,
        "output_strides": output_strides, "cudagraphs": cudagraphs,
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    return MAGIC + struct.pack("<Q", len(head)) + head + b"".join(blobs), handles


def decode(record: bytes) -> tuple[dict[str, Any], memoryview]:
    """The header of a record and the bytes of its constants."""
    if not record.startswith(MAGIC) or len(record) < len(MAGIC) + 8:
        raise KilnError("not a kiln program record")
    (n,) = struct.unpack_from("<Q", record, len(MAGIC))
    start = len(MAGIC) + 8
    header = json.loads(record[start:start + n])
    if header.get("format") != FORMAT:
        raise KilnError(f"program record of format {header.get('format')!r}, expected {FORMAT}")
    return header, memoryview(record)[start + n:]


def _constant(c: dict[str, Any], data: memoryview) -> torch.Tensor:
    dtype = getattr(torch, c["dtype"])
    if not isinstance(dtype, torch.dtype):
        raise KilnError(f"a program record names dtype {c['dtype']!r}")
    raw = bytes(data[c["offset"]:c["offset"] + c["size"]])
    flat = (torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype) if raw
            else torch.empty(0, dtype=dtype))
    t = torch.empty_strided(tuple(c["shape"]), tuple(c["stride"]), dtype=dtype)
    t.copy_(flat.reshape(tuple(c["shape"])))
    t = t.to(torch.device(c["device"]))
    return t.requires_grad_(c["requires_grad"]) if c["requires_grad"] and t.is_floating_point() else t


def part_graphs(header: dict[str, Any]) -> list[Any]:
    """The kiln graph (kiln.v1.Graph) of each part a record names, in its order."""
    out = []
    for rec in header["parts"]:
        g = graph_pb2.Graph()
        g.ParseFromString(base64.b64decode(rec["graph"]))
        out.append(g)
    return out


def rebuild(header: dict[str, Any], data: memoryview, graphs: Sequence[Any], compiled: Sequence[Any],
            make_part: Callable[[dict[str, Any], PartGraph, torch.fx.Graph, Any], Any]) -> tuple[torch.fx.GraphModule, list[Any]]:
    """The rewritten graph of a record, its parts made by ``make_part(record, part graph,
    eager graph, compiled)`` from their kiln graphs ``graphs`` (:func:`part_graphs`) and the
    results ``compiled`` (in the record's order)."""
    if len(compiled) != len(header["parts"]):
        raise KilnError(f"the record names {len(header['parts'])} parts, the daemon sent {len(compiled)}")
    root = torch.nn.Module()
    parts = []
    for rec, g, c in zip(header["parts"], graphs, compiled):
        if c.handle != rec["handle"]:
            raise KilnError(f"part {rec['name']}: the daemon sent {c.handle[:12]}, the record names {rec['handle'][:12]}")
        pg = PartGraph(graph=g, inputs=[_unspec(s) for s in rec["inputs"]], outputs=[_unspec(s) for s in rec["outputs"]],
                       sources=[(str(k), int(i)) for k, i in rec["sources"]],
                       num_kiln_outputs=int(rec["num_kiln_outputs"]), num_nodes=int(rec["num_nodes"]))
        part = make_part(rec, pg, decode_graph(rec["eager"]), c)
        setattr(root, rec["name"], part)
        parts.append(part)
    for c in header["constants"]:
        owner, *path = [root, *c["name"].split(".")]
        for name in path[:-1]:
            if not hasattr(owner, name):
                owner.add_module(name, torch.nn.Module())
            owner = getattr(owner, name)
        owner.register_buffer(path[-1], _constant(c, data))
    graph = decode_graph(header["graph"])
    outer = torch.fx.GraphModule(root, graph, class_name="KilnGraphModule")
    for p in parts:
        outer.__dict__[p.part_name] = p
    return outer, parts


__all__ = ["FORMAT", "NotRecordable", "decode", "decode_graph", "direct_calls", "encode", "encode_graph", "enabled",
           "model_key", "part_graphs",
           "rebuild", "sources_digest"]
