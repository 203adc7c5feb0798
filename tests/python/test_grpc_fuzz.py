"""gRPC-level fuzz: mutated CompileRequests against a real kilnd.

Seeds are valid requests (random valid graphs, CPU and CUDA targets). Each fuzzed request is a
seed mutated at the byte level (bit flips, truncation, inserted or overwritten bytes) or at
the field level (node inputs, shapes, dtypes, attributes and targets set to random values),
sent as raw bytes, so the daemon also sees messages no client library would write. Bounded:
a fixed number of requests from a fixed seed (``KILN_GRPC_FUZZ_REQUESTS`` to change it).

Checked: no answer is INTERNAL (a kiln bug) or UNKNOWN, kilnd stays up and SERVING, and a
valid request afterwards still compiles. (Bytes that do not parse as a CompileRequest are
answered by gRPC itself, UNIMPLEMENTED with no details; they count as handled.) The daemon has one compile worker and a short queue,
so mutants that stay valid do not pile up compiles: a full queue answers RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import collections
import os
import time

import grpc
import numpy as np
import pytest

import kiln
from conftest import private_kilnd
from kiln.v1 import graph_pb2, service_pb2
from random_graphs import make_graph

REQUESTS = int(os.environ.get("KILN_GRPC_FUZZ_REQUESTS", "2000"))
ALLOWED = {
    grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.NOT_FOUND,
}


def _seeds() -> list[bytes]:
    out = []
    for seed in range(24):
        g = make_graph(1000 + seed)
        req = service_pb2.CompileRequest()
        req.graph.CopyFrom(g.graph)
        if seed % 3 == 2:
            req.target.cuda.sm = 80
        else:
            req.target.cpu.isa = "x86-64-v3"
        out.append(req.SerializeToString())
    return out


def _mutate_fields(r: np.random.Generator, data: bytes) -> bytes:
    req = service_pb2.CompileRequest()
    req.ParseFromString(data)
    g = req.graph
    big = [0, 1, -1, 2, 3, 7, 255, 2**31 - 1, -2**31, 2**40, 2**62, -2**63, 2**63 - 1]
    for _ in range(int(r.integers(1, 4))):
        what = int(r.integers(0, 8))
        if what == 0 and g.nodes:
            n = g.nodes[int(r.integers(len(g.nodes)))]
            if n.inputs:
                n.inputs[int(r.integers(len(n.inputs)))] = int(r.choice([-1, 0, 1, 5, 10**6, len(g.inputs) + len(g.nodes)]))
        elif what == 1 and g.inputs:
            t = g.inputs[int(r.integers(len(g.inputs)))].type
            if t.shape:
                t.shape[int(r.integers(len(t.shape)))] = int(r.choice(big))
            else:
                t.shape.append(int(r.choice(big)))
        elif what == 2 and g.inputs:
            g.inputs[int(r.integers(len(g.inputs)))].type.dtype = int(r.integers(-1, 14))
        elif what == 3 and g.nodes:
            n = g.nodes[int(r.integers(len(g.nodes)))]
            name = str(r.choice(["axes", "axis", "shape", "dims", "dtype", "value", "keepdim", "starts", "stops",
                                 "steps", "min", "max", "bogus", "correction", "ord", "eps", "approximate"]))
            a = n.attrs[name]
            kind = int(r.integers(0, 6))
            if kind == 0:
                a.i = int(r.choice(big))
            elif kind == 1:
                a.f = float(r.choice([np.nan, np.inf, -np.inf, 1e300, -0.0, 1e-320, 0.5]))
            elif kind == 2:
                a.ints.values[:] = [int(r.choice(big)) for _ in range(int(r.integers(0, 5)))]
            elif kind == 3:
                a.s = str(r.choice(["", "tanh", "none", "x" * 300]))
            elif kind == 4:
                a.tensor.dtype = int(r.integers(0, 12))
                a.tensor.shape[:] = [int(r.choice([0, 1, 2, 3, 2**20]))]
                a.tensor.float_values[:] = [float(r.choice([1e300, np.nan, -1.5, 300.0]))] * int(r.integers(0, 4))
            else:
                a.dtype = int(r.integers(-1, 14))
        elif what == 4 and g.nodes:
            g.nodes[int(r.integers(len(g.nodes)))].op = str(r.choice(["softmax", "matmul", "bogus", "", "concat",
                                                                       "sum", "cast", "slice", "reshape"]))
        elif what == 5:
            g.outputs.append(int(r.choice([-1, 0, len(g.inputs) + len(g.nodes), 2**31 - 1])))
        elif what == 6:
            if r.random() < 0.5:
                req.target.cuda.sm = int(r.choice([0, 1, 75, 80, 90, 1000, -5]))
            else:
                req.target.cpu.isa = str(r.choice(["", "x86-64-v4", "bogus"]))
                if r.random() < 0.3:
                    req.target.cpu.features.append(str(r.choice(["avx2", "bogus"])))
        else:
            if g.nodes and r.random() < 0.5:
                del g.nodes[int(r.integers(len(g.nodes)))]
            elif g.nodes:
                g.nodes.append(g.nodes[int(r.integers(len(g.nodes)))])
    return req.SerializeToString()


def _mutate_bytes(r: np.random.Generator, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(int(r.integers(1, 6))):
        what = int(r.integers(0, 4))
        if not b:
            b.extend(r.bytes(4))
        elif what == 0:
            i = int(r.integers(len(b)))
            b[i] ^= 1 << int(r.integers(8))
        elif what == 1:
            del b[int(r.integers(len(b))):]
        elif what == 2:
            i = int(r.integers(len(b) + 1))
            b[i:i] = r.bytes(int(r.integers(1, 8)))
        else:
            i = int(r.integers(len(b)))
            b[i] = int(r.integers(256))
    return bytes(b)


def _parses(data: bytes) -> bool:
    try:
        service_pb2.CompileRequest().ParseFromString(data)
        return True
    except Exception:  # google.protobuf.message.DecodeError and friends
        return False


@pytest.fixture(scope="module")
def fuzz_daemon(tmp_path_factory):
    yield from private_kilnd(tmp_path_factory, "kilnd-fuzz",
                             ["--workers", "1", "--queue-size", "2", "--negative-cache-s", "0"])


def test_mutated_requests_never_get_internal_and_kilnd_keeps_serving(fuzz_daemon):
    r = np.random.default_rng(20261123)
    seeds = _seeds()
    channel = grpc.insecure_channel(fuzz_daemon.address)
    compile_raw = channel.unary_unary("/kiln.v1.Kiln/Compile", request_serializer=lambda b: b,
                                      response_deserializer=lambda b: b)
    codes: collections.Counter = collections.Counter()
    bad = []
    started = time.monotonic()
    for i in range(REQUESTS):
        seed = seeds[int(r.integers(len(seeds)))]
        data = _mutate_fields(r, seed) if r.random() < 0.5 else _mutate_bytes(r, seed)
        try:
            compile_raw(data, timeout=5)
            code = grpc.StatusCode.OK
            details = ""
        except grpc.RpcError as e:
            code, details = e.code(), e.details()
        codes[code.name] += 1
        # gRPC itself answers UNIMPLEMENTED (no details) for bytes that are no CompileRequest;
        # kiln never sees those. A request that parses must get one of kiln's codes.
        if code == grpc.StatusCode.UNIMPLEMENTED and not details and not _parses(data):
            continue
        if code not in ALLOWED:
            bad.append((i, code.name, details[:400], data.hex()[:2000]))
        assert fuzz_daemon.proc.poll() is None, f"kilnd exited after request {i}:\n{fuzz_daemon.log(tail=40)}"
    elapsed = time.monotonic() - started
    print(f"grpc fuzz: {REQUESTS} requests in {elapsed:.1f} s: {dict(codes)}")
    assert not bad, f"{len(bad)} requests got a code reserved for kiln bugs; first: {bad[:3]}"
    # Still serving: a valid request compiles once the queue has drained.
    client = kiln.Client(fuzz_daemon.address)
    try:
        assert client.health() == "SERVING"
        b = kiln.GraphBuilder()
        x = b.input("x", "f32", (8,))
        g = b.build([b.exp(x) * 2 + 1])
        deadline = time.monotonic() + 120
        while True:
            try:
                c = client.compile(g, "cpu", timeout=60)
                break
            except kiln.errors.RpcError as e:
                if e.code != "RESOURCE_EXHAUSTED" or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        a = np.linspace(-1, 1, 8, dtype=np.float32)
        np.testing.assert_allclose(c(a), np.exp(a) * 2 + 1, rtol=1e-5)
    finally:
        client.close()
    channel.close()
