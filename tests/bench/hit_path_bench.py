"""A cache hit through the Python client beside a Redis GET, on the same machine in one run.

Starts a private redis-server and kilnd (plaintext; then TLS + bearer token + signed results with
the client verifying them), compiles a few small graphs once, and times, with 1 client:

- ``redis-benchmark -t get -c 1`` and a GET from Python over a raw socket (the language's floor);
- a gRPC health check (the floor of any kilnd call from Python);
- ``Client.compile`` of a request this client answered before (answered in the process);
- ``Client.compile`` of a request this machine asked before (the client's memory of results
  cleared each time, as for each graph a fresh process meets): kilnd's answer read back from
  the local folder, kilnd not asked;
- ``Client.compile`` asked by request key (memory cleared, this machine's answers off): one
  small Lookup answered from kilnd's memory;
- the whole request (``Compile`` with the graph), as clients sent it before request keys;

and with 16 client processes, hits per second (by key, and from this machine's answers) against
``redis-benchmark -t get -c 16``. The
C++ client's figures for the same kilnd come from ``hit_bench`` (built with the project) when
it is there: one C++ process with 1 and 16 connections, the whole request and by key.

    KILN_BINARY_DIR=build PYTHONPATH=client/python python3 tests/bench/hit_path_bench.py

A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import csv
import io
import multiprocessing
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))  # the test PKI helper
sys.path.insert(0, str(HERE))

import kiln  # noqa: E402
from kiln.v1 import service_pb2  # noqa: E402
from kilnd_proc import redis_server  # noqa: E402
from pki import make_pki  # noqa: E402

GRAPHS = 8


def graphs() -> list[Any]:
    out = []
    for i in range(GRAPHS):
        b = kiln.GraphBuilder()
        x = b.input("x", "f32", (1024,))
        out.append(b.build(b.exp(x) * (1.0 + i)))
    return out


def big_graph(nodes: int = 2000) -> Any:
    """A chain of ``nodes`` elementwise ops: a graph as large as a model's fused part can be."""
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (1024,))
    y = x
    for i in range(nodes // 2):
        y = b.exp(y) * (1.0 + i * 1e-4) if i % 2 else b.sin(y) + (i * 1e-4)
    return b.build(y)


def p50_ms(fn: Callable[[int], Any], seconds: float) -> tuple[float, int]:
    for i in range(50):
        fn(i)
    ts = []
    end = time.perf_counter() + seconds
    i = 0
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        fn(i)
        ts.append(time.perf_counter() - t0)
        i += 1
    return statistics.median(ts) * 1e3, len(ts)


def p50_interleaved(fns: dict[str, Callable[[int], Any]], seconds: float) -> dict[str, float]:
    """p50 ms of each function, called in turn so that load changes on the machine reach all."""
    for i in range(50):
        for fn in fns.values():
            fn(i)
    ts: dict[str, list[float]] = {name: [] for name in fns}
    end = time.perf_counter() + seconds * len(fns)
    i = 0
    while time.perf_counter() < end:
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn(i)
            ts[name].append(time.perf_counter() - t0)
        i += 1
    return {name: statistics.median(t) * 1e3 for name, t in ts.items()}


def redis_benchmark(port: int, clients: int, requests: int) -> tuple[float, float]:
    """(p50 ms, GETs/s) from redis-benchmark."""
    out = subprocess.run(["redis-benchmark", "-p", str(port), "-t", "get", "-n", str(requests), "-c", str(clients),
                          "--csv"], capture_output=True, text=True, timeout=300, check=True).stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    return float(rows[0]["p50_latency_ms"]), float(rows[0]["rps"])


def raw_get_ms(port: int, seconds: float) -> float:
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    cmd = b"*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n"

    def get(_: int) -> None:
        s.sendall(cmd)
        s.recv(4096)

    try:
        return p50_ms(get, seconds)[0]
    finally:
        s.close()


def cxx_rows(address: str, seconds: float) -> list[str]:
    """hit_bench's table rows for a running kilnd (plaintext), or [] when it is not built."""
    binary = Path(kiln.local.find_kilnd() or "").parent.parent / "tests" / "bench" / "hit_bench"
    if not binary.exists():
        return []
    out = subprocess.run([str(binary), f"--address={address}", f"--seconds={seconds}", "--cold-runs=0"],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    return [line for line in out.splitlines() if line.startswith(("Compile (graph", "Lookup by"))]


def client_for(address: str, opts: dict[str, Any]) -> kiln.Client:
    return kiln.Client(address, **opts)


def by_key_worker(address: str, opts: dict[str, Any], seconds: float, start: Any, out: Any) -> None:
    gs = graphs()
    with client_for(address, opts) as c:
        for g in gs:
            c.compile(g, "cpu")
        start.wait()
        n = 0
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            c._known.clear()  # ask kilnd by key (or this machine's answers) every time
            r = c.compile(gs[n % GRAPHS], "cpu")
            assert r.cache_hit
            n += 1
        out.put(n)


def hits_per_second(address: str, opts: dict[str, Any], procs: int, seconds: float) -> float:
    """Hits per second of ``procs`` client processes; ``opts["answer_ttl"]`` 0: asked of kilnd."""
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    ps = [ctx.Process(target=by_key_worker, args=(address, opts, seconds, start, out)) for _ in range(procs)]
    for p in ps:
        p.start()
    time.sleep(3.0)  # every process connected and warm
    start.set()
    total = sum(out.get(timeout=seconds + 120) for _ in ps)
    for p in ps:
        p.join(30)
    return total / seconds


def one_client_rows(c: kiln.Client, seconds: float) -> dict[str, float]:
    gs = graphs()
    for g in gs:
        assert c.compile(g, "cpu") is not None
    reqs = [c._request(g, "cpu", None) for g in gs]
    rows: dict[str, float] = {}
    rows["gRPC health check"] = p50_ms(lambda i: c.health(), seconds)[0]

    def known(i: int) -> None:
        assert c.compile(gs[i % GRAPHS], "cpu").cache_hit

    def by_key(i: int) -> None:
        c._known.clear()
        c.answer_ttl = 0.0  # kilnd asked, not this machine's answers
        try:
            assert c.compile(gs[i % GRAPHS], "cpu").cache_hit
        finally:
            c.answer_ttl = ttl

    def machine(i: int) -> None:
        c._known.clear()
        assert c.compile(gs[i % GRAPHS], "cpu").cache_hit

    def whole(i: int) -> None:  # the client before request keys: Compile, result, manifest
        resp = c._call("Compile", reqs[i % GRAPHS], 60)
        compiled = kiln.client.Compiled(c, resp, graph=gs[i % GRAPHS])
        compiled._save_manifest()
        assert compiled.cache_hit

    ttl = c.answer_ttl
    before, answers = c.key_hits, c.machine_hits
    rows.update(p50_interleaved({"hit: the whole request (graph sent)": whole,
                                 "hit: by request key (kilnd's memory)": by_key,
                                 "hit: this machine's answer (local folder)": machine,
                                 "hit: known to this client": known}, seconds))
    assert c.key_hits > before, "no lookup by key was answered"
    assert c.machine_hits > answers, "no answer of this machine's was used"

    big = big_graph()
    c.compile(big, "cpu")
    big_req = c._request(big, "cpu", None)

    def big_whole(i: int) -> None:
        resp = c._call("Compile", big_req, 60)
        compiled = kiln.client.Compiled(c, resp, graph=big)
        compiled._save_manifest()
        assert compiled.cache_hit

    def big_by_key(i: int) -> None:
        c._known.clear()
        c.answer_ttl = 0.0
        try:
            assert c.compile(big, "cpu").cache_hit
        finally:
            c.answer_ttl = ttl

    n = len(big.nodes)
    rows.update(p50_interleaved({f"{n}-node graph: the whole request": big_whole,
                                 f"{n}-node graph: by request key": big_by_key}, seconds))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0, help="per timed row")
    ap.add_argument("--procs", type=int, default=16)
    args = ap.parse_args()
    binary = kiln.local.find_kilnd()
    if binary is None or shutil.which("redis-benchmark") is None:
        print("needs kilnd (deploy/build.sh) and redis-benchmark (redis-tools)", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp, redis_server() as redis_url:
        os.environ["KILN_CACHE_DIR"] = str(Path(tmp) / "local")  # this run's clients' folder, workers' too
        port = int(redis_url.rsplit(":", 1)[1])
        subprocess.run(["redis-cli", "-p", str(port), "SET", "key", "x" * 64], check=True, capture_output=True)
        r1 = redis_benchmark(port, 1, 100_000)
        r16 = redis_benchmark(port, 16, 400_000)
        raw = raw_get_ms(port, args.seconds)
        print(f"redis-benchmark GET, 1 client:   p50 {r1[0]:.3f} ms, {r1[1]:.0f}/s")
        print(f"redis-benchmark GET, 16 clients: p50 {r16[0]:.3f} ms, {r16[1]:.0f}/s")
        print(f"Python raw-socket GET, 1 client: p50 {raw:.3f} ms")
        pki = make_pki(Path(tmp) / "pki", binary)
        setups: list[tuple[str, list[str], dict[str, Any]]] = [
            ("plaintext, no token, unsigned", [], {}),
            ("TLS + token + signed, verified", pki.server_args(mtls=False),
             {**pki.client_options("compiler", mtls=False), "trusted_keys": [pki.signing[1]]}),
        ]
        for name, server_args, opts in setups:
            with kiln.local.LocalDaemon(binary, Path(tmp) / name.split(",")[0], args=[*server_args, "--log-level", "warn"],
                                        probe_options=pki.client_options(mtls=False) if server_args else None) as d:
                with client_for(d.address, opts) as c:
                    rows = one_client_rows(c, args.seconds)
                rate = hits_per_second(d.address, {**opts, "answer_ttl": 0}, args.procs, args.seconds)
                machine_rate = hits_per_second(d.address, opts, args.procs, args.seconds)
                cxx = [] if server_args else cxx_rows(d.address, args.seconds)
            print(f"\nkilnd {name}, Python client:")
            for row, ms in rows.items():
                print(f"  {row:40s} p50 {ms:.3f} ms  ({ms / r1[0]:.1f}x redis-benchmark, {ms / raw:.1f}x Python GET)")
            print(f"  {args.procs} processes, by request key: {rate:.0f} hits/s ({rate / r16[1]:.0%} of redis-benchmark's GETs/s)")
            print(f"  {args.procs} processes, this machine's answers: {machine_rate:.0f} hits/s "
                  f"({machine_rate / r16[1]:.0%} of redis-benchmark's GETs/s)")
            if cxx:
                print("C++ (hit_bench), columns: clients requests p50 p99 mean hits/s errors:")
                for line in cxx:
                    print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
