"""Reading and writing graphs and recorded compile requests as files.

The format follows the extension:

=====================  ==================================================================
``.json``              protobuf JSON of a kiln.v1.Graph, or of a kiln.v1.CompileRequest
                       (recognised by its top-level ``"graph"`` key)
``.txtpb`` ``.pbtxt``  protobuf text format of a Graph or a CompileRequest
``.textproto``
``.pb`` ``.binpb``     binary kiln.v1.Graph
``.kreq``              binary kiln.v1.CompileRequest, as the recorder writes it
=====================  ==================================================================
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Union

from google.protobuf import json_format, text_format

from .v1 import graph_pb2, service_pb2

JSON_SUFFIXES = (".json",)
TEXT_SUFFIXES = (".txtpb", ".pbtxt", ".textproto")
BINARY_GRAPH_SUFFIXES = (".pb", ".binpb")
REQUEST_SUFFIXES = (".kreq",)
#: Every extension :func:`load_request` reads.
ALL_SUFFIXES = JSON_SUFFIXES + TEXT_SUFFIXES + BINARY_GRAPH_SUFFIXES + REQUEST_SUFFIXES

PathLike = Union[str, Path]


def load_request(path: PathLike) -> Any:
    """Reads a graph or compile-request file as a kiln.v1.CompileRequest.

    A plain graph file gives a request with only ``graph`` set. Raises ValueError for an
    unknown extension or a file that does not parse.
    """
    p = Path(path)
    suffix = p.suffix.lower()
    req = service_pb2.CompileRequest()
    try:
        if suffix in REQUEST_SUFFIXES:
            req.ParseFromString(p.read_bytes())
        elif suffix in BINARY_GRAPH_SUFFIXES:
            req.graph.ParseFromString(p.read_bytes())
        elif suffix in JSON_SUFFIXES:
            text = p.read_text()
            data = json.loads(text)
            if isinstance(data, dict) and "graph" in data:
                json_format.Parse(text, req)
            else:
                json_format.Parse(text, req.graph)
        elif suffix in TEXT_SUFFIXES:
            text = p.read_text()
            try:
                text_format.Parse(text, req.graph)
            except text_format.ParseError:
                req.Clear()
                text_format.Parse(text, req)
        else:
            raise ValueError(f"{p}: unknown graph file extension (use one of {', '.join(ALL_SUFFIXES)})")
    except (json_format.ParseError, text_format.ParseError, json.JSONDecodeError) as e:
        raise ValueError(f"{p}: cannot parse: {e}") from e
    except Exception as e:  # protobuf's binary decoder raises DecodeError
        if type(e).__name__ == "DecodeError":
            raise ValueError(f"{p}: cannot parse: {e}") from e
        raise
    return req


def load_graph(path: PathLike) -> Any:
    """Reads a graph file (or the graph of a compile-request file) as a kiln.v1.Graph."""
    return load_request(path).graph


def save_graph(graph: Any, path: PathLike) -> Path:
    """Writes a kiln.v1.Graph in the format the extension names; returns the path."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix in JSON_SUFFIXES:
        p.write_text(json_format.MessageToJson(graph, indent=2))
    elif suffix in TEXT_SUFFIXES:
        p.write_text(text_format.MessageToString(graph))
    elif suffix in BINARY_GRAPH_SUFFIXES:
        p.write_bytes(graph.SerializeToString(deterministic=True))
    elif suffix in REQUEST_SUFFIXES:
        req = service_pb2.CompileRequest()
        req.graph.CopyFrom(graph)
        p.write_bytes(req.SerializeToString(deterministic=True))
    else:
        raise ValueError(f"{p}: unknown graph file extension (use one of {', '.join(ALL_SUFFIXES)})")
    return p


__all__ = ["load_graph", "load_request", "save_graph", "ALL_SUFFIXES", "graph_pb2"]
