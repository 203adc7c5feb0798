"""Frontend limits through the real kilnd: long dependent chains are answered within seconds
(compiled as several kernels, or RESOURCE_EXHAUSTED naming the limit), and kilnd stays up.

The chain is the one that used to overflow the stack in lowering: ``y = exp(x)``, then
``y = y + x`` repeated, one output.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import kiln
from conftest import private_kilnd
from kiln.v1 import graph_pb2


def chain(nodes: int, n: int = 64) -> graph_pb2.Graph:
    g = graph_pb2.Graph()
    x = g.inputs.add()
    x.name = "x"
    x.type.dtype = kiln.dtypes.to_wire("f32")
    x.type.shape.append(n)
    first = g.nodes.add()
    first.op = "exp"
    first.inputs.append(0)
    for i in range(1, nodes):
        node = g.nodes.add()
        node.op = "add"
        node.inputs.extend([i, 0])  # value i is node i-1 (one input comes first)
    g.outputs.append(nodes)
    return g


def chain_reference(nodes: int, x: np.ndarray) -> np.ndarray:
    y = np.exp(x)
    for _ in range(nodes - 1):
        y = y + x
    return y


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    """A private kilnd with a small frontend time limit and node limit."""
    yield from private_kilnd(tmp_path_factory, "kilnd-limits",
                             ["--max-frontend-ms", "1", "--max-nodes", "5000", "--negative-cache-s", "0"])


def test_chain_of_20000_compiles_and_runs(client):
    t0 = time.monotonic()
    c = client.compile(chain(20000), "cpu", timeout=300)
    took = time.monotonic() - t0
    # Deeper than one kernel may inline: split into several kernels through stored temporaries.
    assert c.stats.num_kernels > 1
    assert "max_expr_depth" in c.fusion_report()
    x = np.linspace(-0.5, 0.5, 64, dtype=np.float32)
    # The same float32 additions in the same order (19999 roundings, not one multiplication).
    np.testing.assert_allclose(c(x), chain_reference(20000, x), rtol=1e-5, atol=1e-4)
    print(f"20000-node chain: compiled in {took:.1f} s as {c.stats.num_kernels} kernels, "
          f"frontend {c.stats.frontend_ms:.0f} ms")
    assert c.stats.frontend_ms < 5000


def test_chain_of_200000_is_refused_naming_the_limit(client):
    t0 = time.monotonic()
    with pytest.raises(kiln.errors.RpcError) as e:
        client.compile(chain(200000), "cpu", timeout=120)
    assert e.value.code == "RESOURCE_EXHAUSTED"
    assert "max_nodes" in e.value.details and "200000" in e.value.details
    assert time.monotonic() - t0 < 60
    assert client.health() == "SERVING"


def test_frontend_time_and_node_limits_are_flags(limited):
    c = kiln.Client(limited.address)
    try:
        with pytest.raises(kiln.errors.RpcError) as e:
            c.compile(chain(4000), "cpu", timeout=120)
        assert e.value.code == "RESOURCE_EXHAUSTED"
        assert "max_frontend_ms" in e.value.details
        with pytest.raises(kiln.errors.RpcError) as e:
            c.compile(chain(5001), "cpu", timeout=120)
        assert e.value.code == "RESOURCE_EXHAUSTED"
        assert "max_nodes" in e.value.details and "5000" in e.value.details
        assert limited.proc.poll() is None
        assert c.health() == "SERVING"
    finally:
        c.close()
