"""kiln: the Python client of the kiln compile server for fused tensor kernels.

- :class:`Client`: compile graphs on a kilnd daemon, fetch artifacts, run CPU kernels on NumPy
  arrays; :class:`Compiled` is what a compile gives back.
- :class:`GraphBuilder`: write graphs op by op.
- :func:`jit`: trace a NumPy function into a graph and run it compiled.
- The recorder (``KILN_RECORD_DIR``) and the ``kiln`` command line (``kiln --help``).

The protocol's generated modules are importable as ``kiln.v1.graph_pb2``,
``kiln.v1.service_pb2`` and ``kiln.v1.service_pb2_grpc``.
"""

from __future__ import annotations

import os as _os

from . import _protogen
from ._version import __version__

# The generated modules live under <root>/kiln/v1; making <root>/kiln part of this package's
# search path lets them be imported as kiln.v1.*, which is also how they import each other.
_proto_root = _protogen.locate()
_proto_pkg = _os.path.join(str(_proto_root), "kiln")
if _proto_pkg not in __path__:
    __path__.append(_proto_pkg)

from .v1 import graph_pb2, service_pb2, service_pb2_grpc  # noqa: E402

from . import dtypes  # noqa: E402
from . import local  # noqa: E402
from .builder import GraphBuilder, Value  # noqa: E402
from .client import Client, Compiled, TensorSpec, make_options  # noqa: E402
from .autotune import VariantTiming, autotune  # noqa: E402
from .errors import (  # noqa: E402
    ArtifactError,
    CompileError,
    KilnError,
    KilnFallbackWarning,
    NotFoundError,
    RpcError,
    UnsupportedError,
)
from .graphio import load_graph, load_request, save_graph  # noqa: E402
from .jit import JitFunction, Traced, default_client, jit  # noqa: E402
from .recorder import Recorder  # noqa: E402
from .retry import RetryPolicy  # noqa: E402
from .target import Target, host_isa  # noqa: E402


__all__ = [
    "ArtifactError",
    "Client",
    "CompileError",
    "Compiled",
    "GraphBuilder",
    "JitFunction",
    "KilnError",
    "KilnFallbackWarning",
    "RetryPolicy",
    "NotFoundError",
    "Recorder",
    "RpcError",
    "Target",
    "TensorSpec",
    "Traced",
    "UnsupportedError",
    "Value",
    "default_client",
    "dtypes",
    "graph_pb2",
    "host_isa",
    "jit",
    "load_graph",
    "load_request",
    "make_options",
    "autotune",
    "VariantTiming",
    "save_graph",
    "service_pb2",
    "service_pb2_grpc",
]
