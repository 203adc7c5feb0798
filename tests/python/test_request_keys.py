"""The hit path by request key (wire/FORMAT.md, "Request keys"): the client computes the key of a
(graph, target, options) request as kilnd does, asks kilnd by key before it sends a graph, and
answers a request it has answered before from its own memory.

Against the real kilnd: the keys agree for random graphs of every op and dtype, symbolic and
strided inputs and other options; a fresh client gets each result by key (and the right one:
its kernel is run against NumPy); a kilnd that has not seen the request (restarted) is sent
the whole request; a malformed or unknown key is refused naming the rule; a client answers
from memory with kilnd gone. Answers kilnd gave this machine are used again by a fresh client
from the local folder (no request to kilnd, kilnd gone too) within their TTL, asked again past
it, dropped when damaged, and verified again when their file is not private; an answer signed
by a key no longer trusted is not used. The C++ Session shares them: each client runs what the
other was answered, with kilnd gone.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

import kiln
from conftest import find_kilnd, no_kilnd
from kiln.connection import request_key
from kiln.errors import CompileError, NotFoundError
from kiln.v1 import graph_pb2, service_pb2
from random_graphs import make_graph


def _scaled_exp(c: float, n: int = 256):
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (n,))
    return b.build(b.exp(x) * c)


def _key_of(client: kiln.Client, graph, target="cpu", options=None) -> str:
    req = client._request(graph, target, options)
    return request_key(req.graph, req.target, req.options)


def test_client_and_kilnd_compute_the_same_request_key(client):
    cases = [(make_graph(seed).graph, "cpu", None) for seed in range(12)]
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (64, 32), dims=("N", None))
    t = b.input("t", "f64", (8, 4), strides=(1, 8))
    cases.append((b.build([b.exp(x) * -0.0, b.sum(t * 1e-300, axes=[1])]), "cpu", None))
    cases.append((_scaled_exp(2.5), "cpu", {"opt_level": 1, "vector_math": False}))
    cases.append((_scaled_exp(2.5), "cpu", {"variant": 1}))
    cases.append((_scaled_exp(2.5), "cpu:x86-64-v2", None))
    keys = set()
    for graph, target, options in cases:
        # The whole request, always (Client.compile could be answered by key: an earlier test
        # may have compiled the same graph), so that kilnd computes the key itself.
        req = client._request(graph, target, options)
        response = client._call("Compile", req, 600)
        mine = _key_of(client, graph, target, options)
        assert response.request_key == mine, (target, options)
        keys.add(mine)
    assert len(keys) == len(cases), "two different requests got one key"


def test_a_fresh_client_gets_each_result_by_key(server, rng):
    graphs = {c: _scaled_exp(c) for c in (1.5, -0.75, 3.25)}
    with kiln.Client(server) as first:
        handles = {c: first.compile(g, "cpu").handle for c, g in graphs.items()}
    x = rng.standard_normal(256).astype(np.float32)
    with kiln.Client(server, answer_ttl=0) as fresh:  # kilnd asked, not this machine's answers
        for c, g in graphs.items():
            compiled = fresh.compile(g, "cpu")
            assert compiled.cache_hit and compiled.handle == handles[c]
            np.testing.assert_allclose(compiled(x), np.exp(x) * np.float32(c), rtol=2e-6)
        assert fresh.key_hits == len(graphs) and fresh.local_hits == 0
        # Lookup takes the same path.
        assert fresh.lookup(_scaled_exp(-0.75), "cpu").handle == handles[-0.75]
        assert fresh.local_hits == 1


def test_a_kilnd_that_has_not_seen_the_request_is_sent_the_graph(tmp_path):
    binary = find_kilnd()
    if binary is None:
        no_kilnd()
    graph = _scaled_exp(4.5)
    cache = tmp_path / "cache"
    with kiln.local.LocalDaemon(binary, tmp_path / "one", cache_dir=cache) as d:
        with kiln.Client(d.address, answer_ttl=0) as c:
            handle = c.compile(graph, "cpu").handle
            assert c.key_hits == 0
    with kiln.local.LocalDaemon(binary, tmp_path / "two", cache_dir=cache) as d:  # memory empty
        with kiln.Client(d.address, answer_ttl=0) as c:
            compiled = c.compile(graph, "cpu")
            assert compiled.cache_hit and compiled.handle == handle, "from the store, by the whole request"
            assert c.key_hits == 0
            assert c.stats().compiles == 0
        with kiln.Client(d.address, answer_ttl=0) as c:
            assert c.compile(graph, "cpu").cache_hit and c.key_hits == 1, "now kilnd knows the key"


def test_malformed_and_unknown_keys_are_refused_with_the_rule(client):
    with pytest.raises(CompileError) as bad:
        client._call("Lookup", service_pb2.LookupRequest(request_key="zz" * 32), 10)
    assert bad.value.code == "INVALID_ARGUMENT" and "64-digit lowercase hex" in str(bad.value)
    with pytest.raises(NotFoundError) as unknown:
        client._call("Lookup", service_pb2.LookupRequest(request_key="0" * 64), 10)
    assert "send the graph" in str(unknown.value)


def test_a_client_answers_what_it_answered_before_without_kilnd(tmp_path, rng):
    binary = find_kilnd()
    if binary is None:
        no_kilnd()
    graph = _scaled_exp(0.5)
    x = rng.standard_normal(256).astype(np.float32)
    with kiln.local.LocalDaemon(binary, tmp_path / "d") as d:
        c = kiln.Client(d.address, max_attempts=1, timeout=2.0)
        first = c.compile(graph, "cpu")
        assert not first.cache_hit
        first(x)  # its artifacts are fetched into the local cache
    # kilnd has stopped: the same request is still answered, from this client's memory.
    again = c.compile(graph, "cpu")
    assert again.cache_hit and again.handle == first.handle and c.local_hits == 1
    np.testing.assert_allclose(again(x), np.exp(x) * np.float32(0.5), rtol=2e-6)
    with pytest.raises(kiln.errors.RpcError):  # anything new needs kilnd
        c.compile(_scaled_exp(0.25), "cpu")
    c.close()


def _answer_file(client: kiln.Client, graph) -> Path:
    return Path(client.cache._answer_path(client._answer_name(_key_of(client, graph))))


def test_a_fresh_client_gets_this_machines_answers_without_asking_kilnd(tmp_path, rng):
    binary = find_kilnd()
    if binary is None:
        no_kilnd()
    graphs = {c: _scaled_exp(c) for c in (1.25, -2.0)}
    x = rng.standard_normal(256).astype(np.float32)
    with kiln.local.LocalDaemon(binary, tmp_path / "d") as d:
        with kiln.Client(d.address) as first:
            handles = {c: first.compile(g, "cpu").handle for c, g in graphs.items()}
            assert first.machine_hits == 0
            asked = first.stats().requests
        with kiln.Client(d.address, max_attempts=1) as fresh:
            for c, g in graphs.items():
                compiled = fresh.compile(g, "cpu")
                assert compiled.cache_hit and compiled.handle == handles[c]
                np.testing.assert_allclose(compiled(x), np.exp(x) * np.float32(c), rtol=2e-6)
            assert fresh.machine_hits == len(graphs) and fresh.key_hits == 0
            assert fresh.stats().requests == asked, "kilnd was asked"
        # Another daemon at another address: this machine's answers are per address.
        with kiln.local.LocalDaemon(binary, tmp_path / "e") as other, kiln.Client(other.address) as c:
            c.compile(graphs[1.25], "cpu")
            assert c.machine_hits == 0
        address = d.address
    # kilnd gone: a fresh process still runs what this machine compiled.
    with kiln.Client(address, max_attempts=1, timeout=2.0) as offline:
        np.testing.assert_allclose(offline.compile(graphs[-2.0], "cpu")(x), np.exp(x) * np.float32(-2.0), rtol=2e-6)
        assert offline.machine_hits == 1
        with pytest.raises(kiln.errors.RpcError):  # anything new needs kilnd
            offline.compile(_scaled_exp(0.125), "cpu")


def test_answers_past_their_ttl_or_damaged_are_asked_of_kilnd_again(server):
    graph = _scaled_exp(6.5)
    with kiln.Client(server) as first:
        handle = first.compile(graph, "cpu").handle
        path = _answer_file(first, graph)
    assert path.is_file()
    stale = time.time() - 120
    os.utime(path, (stale, stale))
    with kiln.Client(server, answer_ttl=60) as c:
        assert c.compile(graph, "cpu").handle == handle
        assert (c.machine_hits, c.key_hits) == (0, 1), "a stale answer was used"
    assert path.stat().st_mtime > stale + 60, "kilnd's fresh answer was not written back"
    with kiln.Client(server, answer_ttl=60) as c:
        assert c.compile(graph, "cpu").handle == handle and c.machine_hits == 1
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x40
    path.write_bytes(bytes(data))
    with kiln.Client(server) as c:
        assert c.compile(graph, "cpu").handle == handle
        assert (c.machine_hits, c.key_hits) == (0, 1), "a damaged answer was used"
    with kiln.Client(server) as c:
        assert c.compile(graph, "cpu").handle == handle and c.machine_hits == 1, "not written again"


def test_a_malformed_answer_ttl_is_refused_naming_the_variable(server, monkeypatch):
    for bad in ("five minutes", "1_000"):  # refused by the C++ client alike
        monkeypatch.setenv("KILN_ANSWER_TTL", bad)
        with pytest.raises(ValueError, match=f"KILN_ANSWER_TTL='{bad}': expected seconds"):
            kiln.Client(server)
    monkeypatch.setenv("KILN_ANSWER_TTL", "0")
    with kiln.Client(server) as c:
        assert c.answer_ttl == 0


def _example_softmax(rows: int, cols: int):
    """The graph kiln_example (client/examples/session_example.cc) builds, message for message,
    so that both clients compute one request key for it."""
    g = graph_pb2.Graph()
    x = g.inputs.add(name="x")
    x.type.dtype = graph_pb2.F32
    x.type.shape.extend([rows, cols])
    node = g.nodes.add(op="softmax", name="probs", inputs=[0])
    node.attrs["axis"].i = -1
    g.outputs.append(1)
    return g


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_the_cpp_session_and_python_share_this_machines_answers(tmp_path, rng):
    binary = find_kilnd()
    if binary is None:
        no_kilnd()
    example = binary.parent.parent / "client" / "cpp" / "kiln_example"
    if not example.is_file():
        pytest.skip(f"kiln_example is not built (looked for {example})")
    target = "cpu:x86-64-v2"
    env = {**os.environ, "KILN_CACHE_DIR": str(tmp_path / "local"), "KILN_ANSWER_TTL": "60"}

    def cpp(address: str, rows: int, cols: int) -> str:
        run = subprocess.run([str(example), "--server", address, "--target", target, "--rows", str(rows),
                              "--cols", str(cols)], env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stdout + run.stderr
        assert run.stdout.count("PASS") == 3, run.stdout
        return run.stdout

    by_python, by_cpp = _example_softmax(33, 70), _example_softmax(40, 50)
    with kiln.local.LocalDaemon(binary, tmp_path / "d") as d:
        with kiln.Client(d.address, cache_dir=tmp_path / "local", answer_ttl=60) as c:
            x = rng.standard_normal((33, 70)).astype(np.float32)
            np.testing.assert_allclose(c.compile(by_python, target)(x), _softmax(x), rtol=1e-5, atol=1e-7)
            cpp_name = c._answer_name(_key_of(c, by_cpp, target))
        assert "compiled" in cpp(d.address, 40, 50)
        assert Path(c.cache._answer_path(cpp_name)).is_file(), "C++ saved its answer under another name"
        address = d.address
    # kilnd gone: each client runs what the other was answered (its artifact is here too).
    assert "cache hit (this machine's answer)" in cpp(address, 33, 70)
    with kiln.Client(address, cache_dir=tmp_path / "local", answer_ttl=60, max_attempts=1, timeout=2.0) as c:
        x = rng.standard_normal((40, 50)).astype(np.float32)
        np.testing.assert_allclose(c.compile(by_cpp, target)(x), _softmax(x), rtol=1e-5, atol=1e-7)
        assert c.machine_hits == 1
