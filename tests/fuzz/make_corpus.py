"""Writes the fuzz seed corpus: binary kiln.v1.Graph messages from the golden cases, the GPU
test graphs, the checked-in regressions and a few hundred random valid graphs.

Usage: python3 tests/fuzz/make_corpus.py OUT_DIR [RANDOM_GRAPHS]
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "client" / "python"))
sys.path.insert(0, str(REPO / "tests" / "python"))

from google.protobuf import text_format  # noqa: E402

import kiln  # noqa: E402,F401
from kiln.v1 import graph_pb2  # noqa: E402
from random_graphs import make_graph  # noqa: E402


def main() -> int:
    out = Path(sys.argv[1])
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    out.mkdir(parents=True, exist_ok=True)
    blobs = []
    for txt in sorted(REPO.glob("tests/golden/*/*/graph.txtpb")) + sorted(REPO.glob("tests/gpu/graphs/*.txtpb")):
        g = graph_pb2.Graph()
        text_format.Parse(txt.read_text(), g)
        blobs.append(g.SerializeToString())
    blobs += [p.read_bytes() for p in sorted((REPO / "tests/fuzz/regressions").iterdir())]
    graphs = [make_graph(seed).graph for seed in range(count)]
    blobs += [g.SerializeToString() for g in graphs]
    # Symbolic variants (TensorType.dim_symbols): the leading dimension of every input named,
    # one symbol for all or one per input, so the fuzzer starts from graphs that take the
    # sample-and-generalise path as well.
    for k, g in enumerate(graphs[: count // 3]):
        sym = graph_pb2.Graph()
        sym.CopyFrom(g)
        for i, inp in enumerate(sym.inputs):
            if len(inp.type.shape) and not len(inp.type.strides):
                inp.type.dim_symbols.extend(["N" if k % 2 else f"S{i % 3}"] + [""] * (len(inp.type.shape) - 1))
        blobs.append(sym.SerializeToString())
    for b in blobs:
        (out / hashlib.sha1(b).hexdigest()).write_bytes(b)
    print(f"corpus: {len(blobs)} seeds in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
