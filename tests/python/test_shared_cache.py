"""Cluster mode from the Python side: two real kilnd replicas on a real redis-server.

``kiln stats`` shows the shared tier of the replica that was served from it, and the third
README command (``deploy/cluster-local.sh``) brings up Redis and two replicas that share
compiles, and takes them all down again on SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import re
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

import kiln
from conftest import find_kilnd, no_kilnd
from helpers import kiln_cli

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.05)
    return False


def _graph(c: float):
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (64,))
    return b.build([b.exp(x) * c])


@pytest.fixture
def redis(tmp_path):
    """A redis-server on a free loopback port: (url, process)."""
    port = _free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert _wait_port(port, 10), "redis-server did not start"
        yield f"redis://127.0.0.1:{port}", proc
    finally:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def replicas_sharing(redis_url: str,
                     tmp_path: Path) -> Iterator[tuple[kiln.local.LocalDaemon, kiln.local.LocalDaemon]]:
    """Two kilnd replicas, A and B, each with its own store, sharing ``redis_url``."""
    binary = find_kilnd()
    if binary is None:
        no_kilnd()
    args = ["--shared-cache", redis_url]
    with kiln.local.LocalDaemon(binary, tmp_path / "a", args=args) as a, \
            kiln.local.LocalDaemon(binary, tmp_path / "b", args=args) as b:
        yield a, b


def _probe(address: str, *service: str) -> subprocess.CompletedProcess:
    probe = Path(os.environ.get("KILN_BINARY_DIR", REPO / "build")) / "server" / "kiln_health_probe"
    if not probe.exists():
        pytest.skip("kiln_health_probe is not built")
    return subprocess.run([str(probe), address, *service], capture_output=True, text=True, timeout=30)


def test_kiln_stats_shows_the_shared_tier(tmp_path, redis):
    redis_url, redis_proc = redis
    with replicas_sharing(redis_url, tmp_path) as (a, b):
        g = _graph(3.0)
        with kiln.Client(a.address) as ca:
            assert not ca.compile(g, "cpu").cache_hit
        with kiln.Client(b.address) as cb:
            assert cb.compile(g, "cpu").cache_hit
        env = dict(os.environ, KILN_SERVER=b.address)
        stats = json.loads(kiln_cli(env, "stats", "--json").stdout)
        shared = stats["shared"]
        assert shared["enabled"] and shared["available"]
        assert shared["address"] == redis_url
        assert int(shared["hits"]) == 1 and int(stats["compiles"]) == 0
        text = kiln_cli(env, "stats").stdout
        assert re.search(rf"^shared +{re.escape(redis_url)} \(up\)$", text, re.M), text
        assert re.search(r"^shared\.hits +1$", text, re.M), text
        assert "shared.latency_p50" in text
        with kiln.Client(b.address) as cb:
            assert cb.health("kiln.SharedCache") == "SERVING"
        p = _probe(b.address)
        assert p.returncode == 0 and p.stdout.strip() == "SERVING", p.stdout + p.stderr

        # Redis gone: the shared tier's health turns NOT_SERVING by itself, kilnd's stays SERVING.
        redis_proc.kill()
        redis_proc.wait()
        with kiln.Client(b.address) as cb:
            end = time.monotonic() + 15
            while cb.health("kiln.SharedCache") != "NOT_SERVING" and time.monotonic() < end:
                time.sleep(0.1)
            assert cb.health("kiln.SharedCache") == "NOT_SERVING"
            assert cb.health() == "SERVING"
        assert _probe(b.address, "kiln.SharedCache").returncode == 1
        assert _probe(b.address).returncode == 0
    assert _probe(f"127.0.0.1:{_free_port()}", "--timeout-s=1").returncode == 2


def test_explain_sees_what_a_replica_stored(tmp_path, redis):
    """kiln explain on a replica with a shared tier reads that replica's own store: the entry it
    compiled, and the one it was served from Redis, are explained, not reported missing."""
    redis_url, _ = redis
    with replicas_sharing(redis_url, tmp_path) as (a, b):
        g = _graph(7.0)
        with kiln.Client(a.address) as ca, kiln.Client(b.address) as cb:
            compiled = ca.compile(g, "cpu")
            assert cb.compile(g, "cpu").cache_hit
            for c in (ca, cb):
                r = c.explain(g, "cpu")
                assert r.cached and r.handle == compiled.handle
                other = c.explain(g, "cpu", {"opt_level": 1})
                assert not other.cached
                assert [e.handle for e in other.nearest] == [compiled.handle]


def test_local_cluster_script_shares_compiles(tmp_path):
    if find_kilnd() is None:
        no_kilnd()
    redis_port, p1, p2 = _free_port(), _free_port(), _free_port()
    env = dict(os.environ, KILN_REDIS_PORT=str(redis_port), KILN_PORTS=f"{p1} {p2}", KILN_CLUSTER_DIR=str(tmp_path / "state"))
    binary_dir = os.environ.get("KILN_BINARY_DIR")
    if binary_dir:
        env["KILN_BUILD_DIR"] = os.path.relpath(binary_dir, REPO)
    script = subprocess.Popen(["bash", str(REPO / "deploy" / "cluster-local.sh")], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        assert _wait_port(p1, 240) and _wait_port(p2, 60), "the replicas did not come up"
        g = _graph(5.0)
        with kiln.Client(f"127.0.0.1:{p1}") as c1, kiln.Client(f"127.0.0.1:{p2}") as c2:
            for c in (c1, c2):  # listening is not yet serving: wait for health
                end = time.monotonic() + 30
                while time.monotonic() < end:
                    try:
                        if c.health() == "SERVING":
                            break
                    except kiln.errors.RpcError:
                        pass
                    time.sleep(0.1)
            assert not c1.compile(g, "cpu").cache_hit
            assert c2.compile(g, "cpu").cache_hit
            assert c2.stats().compiles == 0
    finally:
        script.send_signal(signal.SIGTERM)
        try:
            out, _ = script.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(script.pid, signal.SIGKILL)
            out, _ = script.communicate()
    for port in (redis_port, p1, p2):
        assert not _wait_port(port, 0.2), f"port {port} still open after SIGTERM\n{out}"


def _b_reads_what_a_compiled(a, b, graph, address: str) -> None:
    """Replica A compiles ``graph``; replica B serves it from the shared tier, whose address it
    reports as ``address`` (the password as ***), and the tier is SERVING."""
    with kiln.Client(a.address) as ca:
        assert not ca.compile(graph, "cpu").cache_hit
    with kiln.Client(b.address) as cb:
        assert cb.compile(graph, "cpu").cache_hit, "B reads A's compile from Redis"
        s = cb.stats()
        assert s.shared.available and s.shared.hits == 1 and s.compiles == 0
        assert s.shared.address == address
        assert cb.health("kiln.SharedCache") == "SERVING"


def test_password_protected_redis(tmp_path, redis, monkeypatch):
    """A Redis that requires a password: without it kilnd reports the shared tier down with
    the reason (it used to report SERVING and silently write nothing); with it, given in the
    URL or through $KILN_REDIS_PASSWORD, replicas share compiles, and the password appears in
    no log line and no stats answer."""
    redis_url, _ = redis
    port = redis_url.rsplit(":", 1)[1]
    secret = "hunter2-s3cret"
    subprocess.run(["redis-cli", "-p", port, "CONFIG", "SET", "requirepass", secret], check=True,
                   capture_output=True, timeout=10)
    binary = find_kilnd()
    if binary is None:
        no_kilnd()
    with kiln.local.LocalDaemon(binary, tmp_path / "none", args=["--shared-cache", redis_url]) as d:
        with kiln.Client(d.address) as c:
            assert not c.compile(_graph(5.0), "cpu").cache_hit  # served, from the local tier
            end = time.monotonic() + 10
            while c.health("kiln.SharedCache") == "SERVING" and time.monotonic() < end:
                time.sleep(0.1)
            assert c.health("kiln.SharedCache") == "NOT_SERVING"
            assert not c.stats().shared.available
        assert "NOAUTH" in d.log(), d.log(2000)

    with_password = f"redis://:{secret}@127.0.0.1:{port}"
    monkeypatch.setenv("KILN_REDIS_PASSWORD", secret)
    with kiln.local.LocalDaemon(binary, tmp_path / "a", args=["--shared-cache", with_password]) as a, \
            kiln.local.LocalDaemon(binary, tmp_path / "b", args=["--shared-cache", redis_url]) as b:
        # B has the password from the environment.
        _b_reads_what_a_compiled(a, b, _graph(5.5), f"redis://:***@127.0.0.1:{port}")
        for daemon in (a, b):
            assert secret not in daemon.log(), "the password reached kilnd's log"


def test_tls_redis_with_client_certificates_and_a_password_file(tmp_path, monkeypatch):
    """A Redis reachable only over TLS that also asks for a client certificate and a password,
    as managed services run it: two replicas with rediss://, the test CA, a client certificate
    and the password from a file (or the environment) share compiles; a replica that cannot
    trust the server reports the tier NOT_SERVING and logs why; TLS files that cannot be used,
    or TLS files with a plaintext URL, stop kilnd at start naming the problem."""
    from pki import make_ca, make_leaf

    ca = make_ca(tmp_path, "redis-ca")
    server = make_leaf(tmp_path, "redis-server", ca)
    client_cert = make_leaf(tmp_path, "kilnd-client", ca)
    other_ca = make_ca(tmp_path, "other-ca")
    port = _free_port()
    secret = "tls-s3cret-pw"
    proc = subprocess.Popen(["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
                             "--tls-cert-file", str(server[0]), "--tls-key-file", str(server[1]),
                             "--tls-ca-cert-file", str(ca[0]), "--tls-auth-clients", "yes",
                             "--requirepass", secret, "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    binary = find_kilnd()
    if binary is None:
        no_kilnd()
    try:
        assert _wait_port(port, 10), "redis-server did not start"
        password_file = tmp_path / "redis-password"
        password_file.write_text(secret + "\n")
        password_file.chmod(0o600)
        url = f"rediss://127.0.0.1:{port}"
        tls = ["--shared-cache-tls-ca", str(ca[0]), "--shared-cache-tls-cert", str(client_cert[0]),
               "--shared-cache-tls-key", str(client_cert[1])]
        with kiln.local.LocalDaemon(binary, tmp_path / "a",
                                    args=["--shared-cache", url, "--shared-cache-password-file",
                                          str(password_file), *tls]) as a:
            monkeypatch.setenv("KILN_REDIS_PASSWORD", secret)  # B's password: from the environment
            b = kiln.local.LocalDaemon(binary, tmp_path / "b", args=["--shared-cache", url, *tls])
            monkeypatch.delenv("KILN_REDIS_PASSWORD")
            with b:
                _b_reads_what_a_compiled(a, b, _graph(7.5), f"rediss://:***@127.0.0.1:{port}")
                for daemon in (a, b):
                    assert secret not in daemon.log(), "the password reached kilnd's log"
                    assert "--shared-cache without --signing-key" in daemon.log()

        # A CA that did not sign the server's certificate: the tier is down, and the log says why.
        wrong = ["--shared-cache-tls-ca", str(other_ca[0]), "--shared-cache-tls-cert", str(client_cert[0]),
                 "--shared-cache-tls-key", str(client_cert[1])]
        with kiln.local.LocalDaemon(binary, tmp_path / "c",
                                    args=["--shared-cache", url, "--shared-cache-password-file",
                                          str(password_file), *wrong]) as c:
            with kiln.Client(c.address) as cc:
                assert not cc.compile(_graph(7.75), "cpu").cache_hit  # served from the local tier
                end = time.monotonic() + 10
                while cc.health("kiln.SharedCache") == "SERVING" and time.monotonic() < end:
                    time.sleep(0.1)
                assert cc.health("kiln.SharedCache") == "NOT_SERVING"
            log = c.log()
            assert "TLS handshake" in log and "not trusted" in log, log[-2000:]
    finally:
        proc.kill()
        proc.wait()

    for args, message in [
        (["--shared-cache", url, "--shared-cache-tls-ca", str(tmp_path / "missing.crt")], "missing.crt"),
        (["--shared-cache", f"redis://127.0.0.1:{port}", "--shared-cache-tls-ca", str(ca[0])], "not rediss://"),
        (["--shared-cache", url, "--shared-cache-password-file", str(tmp_path / "no-password")],
         "--shared-cache-password-file"),
    ]:
        p = subprocess.run([str(binary), "--listen=127.0.0.1:0", f"--cache-dir={tmp_path / 'never'}", *args],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode != 0 and message in p.stderr, (args, p.returncode, p.stderr[-2000:])



def _redis_call(port: int, *args: bytes | str) -> bytes | None:
    """One command to the Redis on ``port`` with binary-safe arguments; a bulk reply's bytes,
    None for nil, b"OK"-style for a status reply."""
    parts = [a.encode() if isinstance(a, str) else a for a in args]
    request = b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        data = b""
        while b"\r\n" not in data:
            data += s.recv(65536)
        head, rest = data.split(b"\r\n", 1)
        if head[:1] in (b"+", b":"):
            return head[1:]
        assert head[:1] == b"$", head
        size = int(head[1:])
        if size < 0:
            return None
        while len(rest) < size + 2:
            rest += s.recv(65536)
        return rest[:size]


def _action_record(key: str, payload: bytes, secret: bytes | None = None) -> bytes:
    """An action record as server/shared/FORMAT.md lays it out, with a MAC when given a secret."""
    import hashlib
    import hmac
    import struct

    digest = hashlib.sha256(key.encode() + payload).digest()
    mac = b"" if secret is None else hmac.new(secret, b"kiln:v1:action-record-mac\n" + digest,
                                              hashlib.sha256).digest()
    header = struct.pack("<BBHIQ", 1, 1 if mac else 0, 48 + len(mac), 0, len(payload))
    return header + digest + mac + payload


def test_a_shared_secret_keeps_redis_writers_from_choosing_results(tmp_path, redis):
    """Without a signing key, whoever can write to Redis can put any compiled code under any
    key, its digest recomputed: a replica without a secret serves it. Replicas that share
    --shared-cache-secret-file refuse it (counted as a corruption, compiled afresh), refuse a
    MAC made with another secret, and still share what each other wrote."""
    import numpy as np

    redis_url, _ = redis
    port = int(redis_url.rsplit(":", 1)[1])
    secret = b"c2VjcmV0LXNoYXJlZC1ieS10aGUtcmVwbGljYXM="
    secret_file = tmp_path / "l2-secret"
    secret_file.write_bytes(secret + b"\n")
    secret_file.chmod(0o600)
    binary = find_kilnd()
    if binary is None:
        no_kilnd()
    with_secret = ["--shared-cache", redis_url, "--shared-cache-secret-file", str(secret_file)]
    x = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    with kiln.local.LocalDaemon(binary, tmp_path / "a", args=with_secret) as a, \
            kiln.local.LocalDaemon(binary, tmp_path / "b", args=with_secret) as b, \
            kiln.local.LocalDaemon(binary, tmp_path / "c", args=["--shared-cache", redis_url]) as c:
        assert "--shared-cache without" not in a.log() and "--shared-cache without" in c.log()
        _b_reads_what_a_compiled(a, b, _graph(1.25), redis_url)
        with kiln.Client(a.address) as ca, kiln.Client(b.address) as cb, kiln.Client(c.address) as cc:
            wanted, other = ca.compile(_graph(2.0), "cpu"), ca.compile(_graph(-3.0), "cpu")
            stored = _redis_call(port, "GET", f"kiln:v1:ac:{{{other.handle}}}")
            assert stored is not None and stored[1] == 1, "A's record carries a MAC"
            payload = stored[int.from_bytes(stored[2:4], "little"):]

            # The attack: other's code under wanted's key. C (no secret) serves it.
            assert _redis_call(port, "SET", f"kiln:v1:ac:{{{wanted.handle}}}",
                               _action_record(wanted.handle, payload)) == b"OK"
            fooled = cc.compile(_graph(2.0), "cpu")
            assert fooled.cache_hit
            np.testing.assert_allclose(fooled(x), np.exp(x) * -3.0, rtol=1e-5)

            # B refuses it, compiles the graph itself, and counts the record as a corruption.
            served = cb.compile(_graph(2.0), "cpu")
            np.testing.assert_allclose(served(x), np.exp(x) * 2.0, rtol=1e-5)
            assert cb.stats().shared.corruptions == 1
            assert "carries no MAC" in b.log()

            # A MAC under another secret is refused too; one under the cluster's is served.
            forged = _graph(4.0)
            handle = ca.compile(forged, "cpu").handle
            key = f"kiln:v1:ac:{{{handle}}}"
            _redis_call(port, "SET", key, _action_record(handle, payload, b"not-the-cluster-secret"))
            with kiln.local.LocalDaemon(binary, tmp_path / "d", args=with_secret) as d, \
                    kiln.Client(d.address) as cd:
                again = cd.compile(forged, "cpu")
                np.testing.assert_allclose(again(x), np.exp(x) * 4.0, rtol=1e-5)
                assert cd.stats().shared.corruptions == 1 and "fails its MAC" in d.log()
                assert _redis_call(port, "GET", key)[1] == 1, "D wrote its own record back"

    for args, message in [
        (["--shared-cache-secret-file", str(tmp_path / "none")], "--shared-cache-secret-file"),
        (["--shared-cache-accept-unauthenticated"], "needs --shared-cache-secret-file"),
    ]:
        p = subprocess.run([str(binary), "--listen=127.0.0.1:0", f"--cache-dir={tmp_path / 'never'}",
                            "--shared-cache", redis_url, *args], capture_output=True, text=True, timeout=60)
        assert p.returncode != 0 and message in p.stderr, (args, p.returncode, p.stderr[-2000:])
    short = tmp_path / "short-secret"
    short.write_text("too short\n")
    p = subprocess.run([str(binary), "--listen=127.0.0.1:0", f"--cache-dir={tmp_path / 'never'}",
                        "--shared-cache", redis_url, "--shared-cache-secret-file", str(short)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "at least 16" in p.stderr, p.stderr[-2000:]


def test_build_inputs_uploaded_to_one_replica_serve_a_build_on_another(tmp_path, redis):
    """A client uploads a custom build's inputs to replica A; replica B, which never saw them,
    finds them in the shared tier: nothing is uploaded again, B builds, and the module runs."""
    import ctypes

    from kiln import ext
    from kiln.v1 import service_pb2

    tree = ext.Tree.from_bytes({
        "inc/scale.h": b"#define KILN_SCALE 5\n",
        "scaled.cc": b'#include "inc/scale.h"\nextern "C" int kiln_scaled(int x) { return KILN_SCALE * x; }\n',
    })
    request = service_pb2.BuildExtensionRequest(name="scaled", source_tree=tree.digest, compile=["scaled.cc"],
                                                python_tag="shared-inputs-test")
    redis_url, _ = redis
    with replicas_sharing(redis_url, tmp_path) as (a, b):
        with kiln.Client(a.address) as ca, kiln.Client(b.address, cache_dir=tmp_path / "client-b") as cb:
            assert ext.ensure_uploaded(ca, [tree]) > 0
            assert ext.ensure_uploaded(cb, [tree]) == 0, "B reports the inputs A holds as present"
            built = ext.build_extension(cb, request, [tree])
            assert not built.cache_hit and built.uploaded_bytes == 0, built
            module = ctypes.CDLL(str(cb.fetch(built.result.artifacts[0].digest)))
            assert module.kiln_scaled(4) == 20
            assert (ca.stats().ext_builds, cb.stats().ext_builds) == (0, 1)
