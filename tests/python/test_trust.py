"""Trust against the real kilnd: TLS and mTLS, bearer tokens with roles and compile limits,
signed results that the client verifies before loading anything, tampering, and SIGHUP reload
under load. Certificates come from the real ``openssl``, signing keys from ``kilnd keygen``."""

from __future__ import annotations

import os
import random
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest

import kiln
from kiln import loader
from kiln.connection import request_key
from kiln.errors import VerificationError
from kiln.v1 import service_pb2
from conftest import find_kilnd, no_kilnd
from helpers import kiln_cli
from pki import Pki, make_leaf, make_pki, write_tokens

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


def graph(scale: float, n: int = 16):
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (n,))
    return b.build(b.exp(x) * scale + 1.0)


def expected(x: np.ndarray, scale: float) -> np.ndarray:
    return (np.exp(x) * np.float32(scale) + np.float32(1.0)).astype(np.float32)


FAST = {"opt_level": 0}


@pytest.fixture(scope="module")
def kilnd_binary() -> Path:
    b = find_kilnd()
    if b is None:
        no_kilnd()
    return b


@pytest.fixture(scope="module")
def pki(tmp_path_factory, kilnd_binary) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"), kilnd_binary)


@pytest.fixture(scope="module")
def secure(tmp_path_factory, kilnd_binary, pki):
    """kilnd with mTLS, tokens, signing and an HTTPS metrics endpoint (and the hang fault, for
    the per-token limit's deterministic in-flight compile)."""
    d = kiln.local.LocalDaemon(kilnd_binary, tmp_path_factory.mktemp("secure-kilnd"),
                               args=[*pki.server_args(), "--metrics-listen", "127.0.0.1:0", "--workers", "2",
                                     "--fault-injection", "hang"],
                               probe_options=pki.client_options())
    yield d
    d.stop()


def client(d, pki: Pki, token: str = "", mtls: bool = True, **kw) -> kiln.Client:
    kw.setdefault("trusted_keys", [pki.signing[1]])
    kw.setdefault("timeout", 20)
    return kiln.Client(d.address, **pki.client_options(token, mtls), **kw)


def rpc_code(excinfo) -> str:
    return excinfo.value.code


def wait_for_log(d, *needles: str, timeout: float = 5.0) -> str:
    """The daemon's log once it holds every needle (kilnd writes its log in batches, at least
    once a second); fails naming the missing ones after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        log = d.log()
        missing = [n for n in needles if n not in log]
        if not missing:
            return log
        assert time.monotonic() < deadline, f"not in the log: {missing}"
        time.sleep(0.1)


# ---------------------------------------------------------------------------- transport


# Each transport failure is UNAVAILABLE, its message naming the likely cause from the client's
# side (gRPC reports a server's TLS refusal only as a closed socket).

def test_plaintext_client_against_tls_server_fails_cleanly(secure, pki):
    with kiln.Client(secure.address, timeout=3, max_attempts=1) as c:
        with pytest.raises(kiln.RpcError) as e:
            c.stats()
    assert rpc_code(e) == "UNAVAILABLE"
    assert "if it serves TLS, pass tls_ca" in str(e.value), e.value


def test_tls_client_against_plaintext_server_fails_cleanly(server, pki):
    with kiln.Client(server, tls_ca=pki.ca[0], timeout=3, max_attempts=1) as c:
        with pytest.raises(kiln.RpcError) as e:
            c.stats()
    assert rpc_code(e) == "UNAVAILABLE" or rpc_code(e) == "UNKNOWN"
    assert "connect without tls_ca" in str(e.value), e.value


def test_wrong_ca_fails(secure, pki):
    with kiln.Client(secure.address, tls_ca=pki.other_ca[0], tls_cert=pki.client[0], tls_key=pki.client[1],
                     token=pki.tokens["admin"], timeout=3, max_attempts=1) as c:
        with pytest.raises(kiln.RpcError) as e:
            c.stats()
    assert rpc_code(e) == "UNAVAILABLE"
    assert "does not verify against the CA this client trusts" in str(e.value), e.value


def test_mtls_without_client_certificate_fails(secure, pki):
    with client(secure, pki, "admin", mtls=False, timeout=3, max_attempts=1) as c:
        with pytest.raises(kiln.RpcError) as e:
            c.stats()
    assert rpc_code(e) == "UNAVAILABLE"
    assert "it may require a client certificate" in str(e.value), e.value


def test_client_certificate_from_another_ca_fails(secure, pki, tmp_path):
    stranger = make_leaf(tmp_path, "stranger", pki.other_ca)
    with kiln.Client(secure.address, tls_ca=pki.ca[0], tls_cert=stranger[0], tls_key=stranger[1],
                     token=pki.tokens["admin"], timeout=3, max_attempts=1) as c:
        with pytest.raises(kiln.RpcError) as e:
            c.stats()
    assert rpc_code(e) == "UNAVAILABLE"
    assert "it may not trust this client certificate" in str(e.value), e.value


def test_tls_without_client_certificates(tmp_path, kilnd_binary, pki):
    """Server-authenticated TLS alone: a client with the CA gets in, a plaintext one does not."""
    args = ["--tls-cert", str(pki.server[0]), "--tls-key", str(pki.server[1])]
    with kiln.local.LocalDaemon(kilnd_binary, tmp_path, args=args, probe_options={"tls_ca": pki.ca[0]}) as d:
        with kiln.Client(d.address, tls_ca=pki.ca[0], timeout=10) as c:
            assert c.stats().uptime_s >= 0
        with kiln.Client(d.address, timeout=3, max_attempts=1) as plain:
            with pytest.raises(kiln.RpcError) as e:
                plain.stats()
        assert rpc_code(e) == "UNAVAILABLE"


def test_tokens_an_observer_could_read_are_warned_about(tmp_path, kilnd_binary):
    """Tokens served without TLS to the network, or kept in a file others may read: kilnd
    starts, and says so; a private file on a loopback address draws no warning."""
    tokens = tmp_path / "tokens"
    tokens.write_text("ci compile s3cret-token-value\n")
    tokens.chmod(0o644)
    with kiln.local.LocalDaemon(kilnd_binary, tmp_path / "open", listen="0.0.0.0:0",
                                args=["--auth-tokens", str(tokens)]) as d:
        log = d.log()
    assert "bearer tokens cross the network in clear text" in log, log
    assert f"token file {tokens} is readable by others on this machine (mode 644)" in log, log
    assert "s3cret-token-value" not in log
    tokens.chmod(0o600)
    with kiln.local.LocalDaemon(kilnd_binary, tmp_path / "closed", args=["--auth-tokens", str(tokens)]) as d:
        log = d.log()
    assert "clear text" not in log and "readable by others" not in log, log


def test_metrics_endpoint_speaks_https_with_client_certificates(secure, pki, tmp_path):
    port = int(secure.log().split("kilnd metrics on ")[1].split()[0].rsplit(":", 1)[1])
    # Plain HTTP gets no page.
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3).read()
    # HTTPS without a client certificate is refused by the mTLS handshake.
    bare = ssl.create_default_context(cafile=str(pki.ca[0]))
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError, OSError)):
        urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", timeout=3, context=bare).read()
    # A client certificate that no trusted CA signed is refused too.
    stranger = make_leaf(tmp_path, "stranger", pki.other_ca)
    foreign = ssl.create_default_context(cafile=str(pki.ca[0]))
    foreign.load_cert_chain(str(stranger[0]), str(stranger[1]))
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError, OSError)):
        urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", timeout=3, context=foreign).read()
    ctx = ssl.create_default_context(cafile=str(pki.ca[0]))
    ctx.load_cert_chain(str(pki.client[0]), str(pki.client[1]))
    with client(secure, pki, "reader") as c:
        c.stats()
    page = urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", timeout=5, context=ctx).read().decode()
    assert "kiln_requests_total" in page
    assert 'kiln_token_requests_total{token="reader",role="read"}' in page
    for token in pki.tokens.values():
        assert token not in page


# ---------------------------------------------------------------------------- identity


def test_health_stays_open_without_a_token(secure, pki):
    with client(secure, pki) as c:
        assert c.health() == "SERVING"


def test_no_token_is_unauthenticated(secure, pki):
    with client(secure, pki) as c:
        with pytest.raises(kiln.RpcError) as e:
            c.stats()
    assert rpc_code(e) == "UNAUTHENTICATED"
    with client(secure, pki, max_attempts=1) as c:
        c_token = kiln.Client(secure.address, **pki.client_options(), token="not-a-known-token-0123")
        with pytest.raises(kiln.RpcError) as e:
            c_token.stats()
        c_token.close()
    assert rpc_code(e) == "UNAUTHENTICATED"


def test_each_role_gets_its_calls_and_no_more(secure, pki, rng):
    g = graph(1.5)
    with client(secure, pki, "reader") as reader, client(secure, pki, "compiler") as compiler, \
            client(secure, pki, "admin") as admin:
        # read: stats, lookups; not compiles or prewarm.
        reader.stats()
        assert reader.lookup(g, "cpu", FAST) is None
        with pytest.raises(kiln.RpcError) as e:
            reader.compile(g, "cpu", FAST)
        assert rpc_code(e) == "PERMISSION_DENIED" and "needs role 'compile'" in e.value.details
        assert "reader" in e.value.details and pki.tokens["reader"] not in e.value.details
        with pytest.raises(kiln.RpcError) as e:
            reader.prewarm([(g, "cpu")])
        assert rpc_code(e) == "PERMISSION_DENIED"
        # compile: compiles; then read calls work for everyone.
        c = compiler.compile(g, "cpu", FAST)
        x = rng.standard_normal(16).astype(np.float32)
        np.testing.assert_allclose(c(x), expected(x, 1.5), rtol=1e-5)
        got = reader.get(c.handle)
        np.testing.assert_allclose(got(x), expected(x, 1.5), rtol=1e-5)
        src = reader.source(c.handle)  # GetSource, a read call, answers the reader
        assert src.language == "c++" and "kiln" in src.source and src.fusion_report, src
        assert reader.lookup(g, "cpu", FAST).handle == c.handle
        assert compiler.prewarm([(graph(1.75), "cpu", FAST)])[0].code == 0
        # admin: everything.
        assert admin.compile(g, "cpu", FAST).cache_hit
        stats = {t.name: t for t in admin.stats().tokens}
    assert stats["reader"].denied >= 2 and stats["reader"].requests >= 4
    assert stats["compiler"].requests >= 2
    log = wait_for_log(secure, "Compile compiler", "Compile refused: PERMISSION_DENIED")
    for token in pki.tokens.values():
        assert token not in log, "the log names tokens, never the token itself"


# Every RPC of kiln.v1.Kiln and the least role that may call it (the roles table in docs/trust.md).
REQUIRED_ROLE = {
    "Compile": "compile", "Prewarm": "compile", "FindMissingBlobs": "compile", "UploadBlobs": "compile",
    "BuildExtension": "compile", "CompileRawKernel": "compile", "RecordTuning": "compile", "PutModel": "compile",
    "Lookup": "read", "GetResult": "read", "FetchArtifact": "read", "GetSource": "read", "GetStats": "read",
    "Explain": "read", "LookupTuning": "read", "GetModel": "read", "GetBlobs": "read",
    "ExportEntries": "admin", "ImportEntries": "admin",
}
ROLE_RANK = {"read": 0, "compile": 1, "admin": 2}


def call_with_empty_request(c: kiln.Client, method) -> str:
    """Calls ``method`` (a method descriptor) with an empty request through ``c``'s channel (its
    TLS and token); the status code's name."""
    from google.protobuf import message_factory

    request = message_factory.GetMessageClass(method.input_type)()
    reply = message_factory.GetMessageClass(method.output_type)
    path = f"/{method.containing_service.full_name}/{method.name}"
    kind = {(False, False): "unary_unary", (False, True): "unary_stream", (True, False): "stream_unary",
            (True, True): "stream_stream"}[(method.client_streaming, method.server_streaming)]
    stub = getattr(c._channel, kind)(path, request_serializer=type(request).SerializeToString,
                                     response_deserializer=reply.FromString)
    try:
        out = stub(iter([request]) if method.client_streaming else request, timeout=20)
        if method.server_streaming:
            list(out)
    except grpc.RpcError as e:
        return e.code().name
    return "OK"


def test_every_rpc_needs_its_role(secure, pki):
    """Every RPC called with every role: refused below its role, not refused at or above it
    (an empty request then fails its own validation, or succeeds). A new RPC fails this test
    until it is in the table."""
    methods = service_pb2.DESCRIPTOR.services_by_name["Kiln"].methods
    assert {m.name for m in methods} == set(REQUIRED_ROLE)
    seen = {}
    for token, role in (("reader", "read"), ("compiler", "compile"), ("admin", "admin")):
        with client(secure, pki, token, max_attempts=1) as c:
            for m in methods:
                code = call_with_empty_request(c, m)
                seen[token, m.name] = code
                if ROLE_RANK[role] >= ROLE_RANK[REQUIRED_ROLE[m.name]]:
                    assert code not in ("PERMISSION_DENIED", "UNAUTHENTICATED"), (token, m.name, code)
                else:
                    assert code == "PERMISSION_DENIED", (token, m.name, code)
    # The reader once per compile or admin RPC, the compiler once per admin RPC.
    below = sum(ROLE_RANK[role] < ROLE_RANK[REQUIRED_ROLE[m]] for role in ("read", "compile") for m in REQUIRED_ROLE)
    assert below == 12 and sum(code == "PERMISSION_DENIED" for code in seen.values()) == below


def test_per_token_compile_limit_refuses_misses_but_serves_hits(secure, pki, rng):
    # A compile that hangs in its worker (kilnd --fault-injection=hang) holds the limited
    # token's one slot for as long as its caller waits: the limit is seen every time.
    hanging = graph(2.0625)  # a scale no other test compiles: a cached result would not hang
    hanging.nodes[-1].name = "kiln-fault:hang"
    with client(secure, pki, "limited") as limited, client(secure, pki, "admin") as admin, \
            client(secure, pki, "compiler") as other:
        warm = limited.compile(graph(2.5), "cpu", FAST)  # cached before the limit is taken
        done: dict = {}

        def hang() -> None:
            try:
                limited.compile(hanging, "cpu", timeout=6)
            except kiln.RpcError as e:
                done["code"] = e.code

        t = threading.Thread(target=hang)
        t.start()
        deadline = time.monotonic() + 5
        in_flight = 0
        while time.monotonic() < deadline and not in_flight:
            in_flight = {s.name: s for s in admin.stats().tokens}["limited"].compiles_in_flight
            time.sleep(0.005)
        assert in_flight == 1, "the hanging compile never counted against its token"
        with pytest.raises(kiln.CompileError) as e:
            limited.compile(graph(2.75), "cpu", FAST)
        assert e.value.code == "RESOURCE_EXHAUSTED" and "'limited'" in e.value.details
        # A hit still gets through at the limit; another token is not limited by this one.
        assert limited.compile(graph(2.5), "cpu", FAST).handle == warm.handle
        other.compile(graph(3.25), "cpu", FAST)
        t.join(30)
        assert done.get("code") == "DEADLINE_EXCEEDED", done
        assert {s.name: s for s in admin.stats().tokens}["limited"].limited >= 1


# ---------------------------------------------------------------------------- integrity


def test_signed_result_is_verified_and_runs(secure, pki, rng):
    with client(secure, pki, "compiler") as c:
        compiled = c.compile(graph(3.5), "cpu", FAST)
        sig = compiled.result.signature
        assert sig.algorithm == "ed25519" and len(sig.signature) == 64
        assert sig.key_id in c.trust.key_ids
        x = rng.standard_normal(16).astype(np.float32)
        np.testing.assert_allclose(compiled(x), expected(x, 3.5), rtol=1e-5)


def test_untrusted_key_is_refused_before_anything_loads(secure, pki):
    before = loader.loaded_kernel_count()
    with client(secure, pki, "compiler", trusted_keys=[pki.other_signing[1]]) as c:
        with pytest.raises(VerificationError, match="not trusted"):
            c.compile(graph(3.5), "cpu", FAST)
    assert loader.loaded_kernel_count() == before


def test_custom_builds_are_verified_like_graphs(secure, pki, tmp_path):
    """An extension module and a raw CUDA kernel built by kilnd come back signed; a client that
    trusts another key refuses both before it fetches or loads anything."""
    import ctypes

    import kiln.cuda
    import kiln.torch_extension

    from kiln import ext

    tree = ext.Tree.from_bytes({"triple.cc": b'extern "C" int kiln_triple(int x) { return 3 * x; }\n'})
    request = service_pb2.BuildExtensionRequest(name="tripled", source_tree=tree.digest, compile=["triple.cc"],
                                                python_tag="verified-test")
    raw = service_pb2.CompileRawKernelRequest(
        source='extern "C" __global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }', name="twice", sm=90)
    with client(secure, pki, "compiler") as c:
        built = ext.build_extension(c, request, [tree])
        assert built.result.signature.key_id in c.trust.key_ids and len(built.result.signature.signature) == 64
        module = ctypes.CDLL(str(c.fetch(built.result.artifacts[0].digest)))
        assert module.kiln_triple(7) == 21
        try:
            kernel = ext.compile_raw_kernel(c, raw)
        except kiln.errors.RpcError as e:
            if "NVRTC" not in str(e) or os.environ.get("KILN_REQUIRE_NVRTC"):
                raise
            kernel = None  # this kilnd has no NVRTC: the extension alone is checked
        if kernel is not None:
            assert kernel.result.signature.key_id in c.trust.key_ids
    with client(secure, pki, "compiler", trusted_keys=[pki.other_signing[1]], cache_dir=tmp_path) as c:
        with pytest.raises(VerificationError, match="not trusted"):
            kiln.torch_extension.build_prepared(kiln.torch_extension.Prepared(request, tree, [], []), c)
        if kernel is not None:
            with pytest.raises(VerificationError, match="not trusted"):
                kiln.cuda.RawKernel(raw.source, raw.name, client=c).compile(90)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()], "nothing of a refused build was fetched"


def _mutations(resp):
    """Copies of a signed response, each with one signed part changed."""
    def copy():
        r = service_pb2.CompileResponse()
        r.CopyFrom(resp)
        return r

    out = {}
    r = copy()
    so = next(a for a in r.result.artifacts if a.kind == service_pb2.SHARED_OBJECT)
    so.digest = ("0" if so.digest[0] != "0" else "1") + so.digest[1:]
    out["artifact digest"] = r
    r = copy()
    r.result.artifacts[0].size += 1
    out["artifact size"] = r
    r = copy()
    r.result.plan.workspace_bytes += 64
    out["plan workspace"] = r
    r = copy()
    r.result.plan.buffers[0].shape[0] += 1
    out["plan shape"] = r
    r = copy()
    sig = bytearray(r.result.signature.signature)
    sig[7] ^= 0x10
    r.result.signature.signature = bytes(sig)
    out["signature bit"] = r
    r = copy()
    r.handle = "f" * 64
    out["handle"] = r
    r = copy()
    r.result.target.cpu.isa = "x86-64-v2" if r.result.target.cpu.isa != "x86-64-v2" else "x86-64-v3"
    out["target"] = r
    r = copy()
    r.result.ClearField("signature")
    out["signature stripped"] = r
    return out


def test_tampered_records_are_refused(secure, pki):
    with client(secure, pki, "compiler") as c:
        compiled = c.compile(graph(4.5), "cpu", FAST)
        before = loader.loaded_kernel_count()
        mutations = _mutations(compiled.response)
        refused = []
        for what, bad in mutations.items():
            with pytest.raises(VerificationError):
                kiln.Compiled(c, bad)
            refused.append(what)
        assert refused == list(mutations) and len(refused) == 8
        # Unsigned fields (compile log, stats) are not part of the signature.
        ok = service_pb2.CompileResponse()
        ok.CopyFrom(compiled.response)
        ok.result.compile_log = "edited"
        kiln.Compiled(c, ok)
        assert loader.loaded_kernel_count() == before


def test_launch_time_choices_are_signed(secure, pki):
    """A symbolic CUDA plan whose rows vary in length chooses its kernel at launch (step
    guards): the guards are signed like the grids, so editing one is refused."""
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (8, 64), dims=("B", "T"))
    with client(secure, pki, "compiler") as c:
        compiled = c.compile(b.build([b.softmax(x, axis=-1)]), "cuda:sm_90", FAST)
        steps = compiled.response.result.plan.steps
        assert sum(1 for s in steps if s.guard_min > 0 or s.guard_max > 0) >= 2
        first = next(i for i, s in enumerate(steps) if s.guard_max > 0)
        for edit in ("max", "min", "expr"):
            bad = service_pb2.CompileResponse()
            bad.CopyFrom(compiled.response)
            step = bad.result.plan.steps[first]
            if edit == "max":
                step.guard_max += 1
            elif edit == "min":
                step.guard_min += 1
            else:
                step.guard.terms[0].coeff += 1
            with pytest.raises(VerificationError):
                kiln.Compiled(c, bad)
        kiln.Compiled(c, compiled.response)  # the unedited response verifies


def test_ten_thousand_random_single_byte_mutations_are_all_refused(secure, pki):
    with client(secure, pki, "compiler") as c:
        compiled = c.compile(graph(5.5), "cpu", FAST)
    result = service_pb2.ActionResult()
    result.CopyFrom(compiled.result)
    result.ClearField("compile_log")  # unsigned: a change there is not tampering
    result.ClearField("stats")
    c.trust.check(compiled.handle, result)
    record = result.SerializeToString()
    rnd = random.Random(11)
    accepted = unparsable = 0
    for _ in range(10_000):
        b = bytearray(record)
        i = rnd.randrange(len(b))
        b[i] = (b[i] + rnd.randrange(1, 256)) % 256
        parsed = service_pb2.ActionResult()
        try:
            parsed.ParseFromString(bytes(b))
        except Exception:  # a DecodeError: refused before verification
            unparsable += 1
            continue
        try:
            c.trust.check(compiled.handle, parsed)
            accepted += 1
        except VerificationError:
            pass
    assert accepted == 0
    assert unparsable < 10_000


def test_local_artifact_directory_is_reverified_at_load(secure, pki, tmp_path, rng):
    with client(secure, pki, "compiler", cache_dir=tmp_path / "cache") as c:
        compiled = c.compile(graph(6.5), "cpu", FAST)
        art = compiled.artifact("SHARED_OBJECT")
        path = c.fetch(art.digest)
        st = path.stat()
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        os.chmod(path, 0o644)
        path.write_bytes(bytes(data))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # hide the change from stat checks
        before = loader.loaded_kernel_count()
        with pytest.raises(VerificationError, match="does not match its digest"):
            compiled.load()
        assert loader.loaded_kernel_count() == before
        assert not path.exists(), "the damaged copy is deleted"
        # The next load fetches a good copy and runs.
        x = rng.standard_normal(16).astype(np.float32)
        np.testing.assert_allclose(compiled(x), expected(x, 6.5), rtol=1e-5)


def test_unsigned_results_policy(tmp_path_factory, kilnd_binary, pki, rng):
    """A daemon without --signing-key: refused by a client with trusted keys, unless it allows
    unsigned results; accepted by a client with no keys (the documented default)."""
    with kiln.local.LocalDaemon(kilnd_binary, tmp_path_factory.mktemp("unsigned")) as d:
        with kiln.Client(d.address, trusted_keys=[pki.signing[1]]) as strict:
            with pytest.raises(VerificationError, match="not signed"):
                strict.compile(graph(7.5), "cpu", FAST)
        with kiln.Client(d.address, trusted_keys=[pki.signing[1]], allow_unsigned=True) as lax:
            lax.compile(graph(7.5), "cpu", FAST)
        with kiln.Client(d.address, trusted_keys=[]) as default:
            assert default.trust.allow_unsigned and not default.trust.verifying
            x = rng.standard_normal(16).astype(np.float32)
            np.testing.assert_allclose(default.compile(graph(7.5), "cpu", FAST)(x), expected(x, 7.5), rtol=1e-5)
        with pytest.raises(ValueError, match="trusted key"):
            kiln.Client(d.address, trusted_keys=[], allow_unsigned=False)


def test_cli_speaks_tls_tokens_and_verification(secure, pki, tmp_path, subprocess_env):
    g = tmp_path / "g.json"
    kiln.save_graph(graph(8.5), g)
    env = dict(subprocess_env)
    for k in ("KILN_TOKEN", "KILN_TLS_CA", "KILN_TLS_CERT", "KILN_TLS_KEY", "KILN_TRUSTED_KEYS"):
        env.pop(k, None)
    common = ["--server", secure.address, "--tls-ca", pki.ca[0], "--tls-cert", pki.client[0],
              "--tls-key", pki.client[1]]
    ok = kiln_cli(env, "compile", g, *common, "--token", pki.tokens["compiler"], "--trusted-key",
                  pki.signing[1], "--trusted-key", pki.other_signing[1], "--opt-level", "0", "--json")
    assert '"handle"' in ok.stdout
    bad = kiln_cli(env, "compile", g, *common, "--token", pki.tokens["compiler"], "--trusted-key",
                   pki.other_signing[1], "--opt-level", "0", check=False)
    assert bad.returncode == 1 and "not trusted" in bad.stderr
    denied = kiln_cli(env, "compile", g, *common, "--token", pki.tokens["reader"], check=False)
    assert denied.returncode == 1 and "PERMISSION_DENIED" in denied.stderr
    # The same through the environment.
    env.update(KILN_TOKEN=pki.tokens["reader"], KILN_TLS_CA=str(pki.ca[0]), KILN_TLS_CERT=str(pki.client[0]),
               KILN_TLS_KEY=str(pki.client[1]), KILN_TRUSTED_KEYS=str(pki.signing[1]))
    assert kiln_cli(env, "stats", "--server", secure.address).returncode == 0


# ---------------------------------------------------------------------------- reload


def _peer_certificate(port: int, pki: Pki) -> bytes:
    ctx = ssl.create_default_context(cafile=str(pki.ca[0]))
    ctx.load_cert_chain(str(pki.client[0]), str(pki.client[1]))
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as s:
            return s.getpeercert(binary_form=True)


def _der(pem_path: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem_path.read_text())


def test_sighup_reloads_tokens_and_certificates_under_load(tmp_path, kilnd_binary, pki):
    folder = tmp_path / "live"
    folder.mkdir()
    cert, key, tokens_file = folder / "server.crt", folder / "server.key", folder / "tokens.txt"
    shutil.copy(pki.server[0], cert)
    shutil.copy(pki.server[1], key)
    write_tokens(tokens_file, {"reader": ("read", pki.tokens["reader"])})
    args = ["--tls-cert", str(cert), "--tls-key", str(key), "--tls-client-ca", str(pki.ca[0]),
            "--auth-tokens", str(tokens_file)]
    with kiln.local.LocalDaemon(kilnd_binary, tmp_path / "d", args=args, probe_options=pki.client_options()) as d:
        port = int(d.address.rsplit(":", 1)[1])
        assert _peer_certificate(port, pki) == _der(pki.server[0])
        stop = threading.Event()
        counts = {"ok": 0, "failed": 0}
        errors: list[str] = []
        lock = threading.Lock()

        def hammer(i: int) -> None:
            # A long-lived connection, plus a fresh one (a new handshake) every few calls.
            steady = kiln.Client(d.address, **pki.client_options("reader"), timeout=10, max_attempts=1)
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    if n % 5 == 0:
                        with kiln.Client(d.address, **pki.client_options("reader"), timeout=10, max_attempts=1) as fresh:
                            fresh.stats()
                    else:
                        steady.stats()
                    with lock:
                        counts["ok"] += 1
                except Exception as e:  # any failure is what this test is about
                    with lock:
                        counts["failed"] += 1
                        errors.append(repr(e))
            steady.close()

        threads = [threading.Thread(target=hammer, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        # 1: a new certificate and a new token. 2: a broken certificate (kept out). 3: again.
        new_cert, new_key = make_leaf(tmp_path, "server2", pki.ca)
        shutil.copy(new_cert, cert)
        shutil.copy(new_key, key)
        write_tokens(tokens_file, {"reader": ("read", pki.tokens["reader"]),
                                   "admin": ("admin", pki.tokens["admin"])})
        d.reload()
        time.sleep(0.7)
        cert.write_text("garbage\n")
        d.reload()
        time.sleep(0.7)
        shutil.copy(new_cert, cert)
        d.reload()
        time.sleep(0.7)
        stop.set()
        for t in threads:
            t.join(30)
        assert counts["failed"] == 0, errors[:5]
        assert counts["ok"] > 20
        assert _peer_certificate(port, pki) == _der(new_cert)
        with kiln.Client(d.address, **pki.client_options("admin")) as admin:
            assert admin.stats().requests >= 0
        wait_for_log(d, "SIGHUP: reloaded TLS certificates", "SIGHUP: kept the current TLS certificates",
                     "SIGHUP: reloaded token file")


def test_a_client_needs_no_cryptography_package(pki):
    # Machines with a preinstalled Python stack (a GPU image, say) may lack the package: keys are
    # read and signatures checked by the native core, so even a client with keys does without.
    code = ("import sys; sys.modules['cryptography'] = None\n"
            "from kiln.trust import TrustPolicy\n"
            "p = TrustPolicy([], None); assert p.allow_unsigned\n"
            f"p = TrustPolicy([{str(pki.signing[1])!r}], None); assert len(p.key_ids) == 1 and p.verifying\n"
            "try:\n    TrustPolicy(['missing.pem'], None)\nexcept ValueError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, KILN_TRUSTED_KEYS=""))
    assert r.returncode == 0, r.stderr
    assert "trusted key missing.pem: not a readable PEM public key" in r.stdout, r.stdout


def test_model_records_are_signed_and_need_their_roles(secure, pki, tmp_path):
    """A compiled-model record (kiln.torch's warm start) is written with role compile, read with
    role read, signed by kilnd and refused by a client when its signed fields or bytes change."""
    with client(secure, pki, "compiler") as compiler, \
            client(secure, pki, "reader", cache_dir=tmp_path / "empty") as reader:
        part = compiler.compile(graph(4.5), "cpu", FAST).handle
        key, fmt = "9" * 64, "test.records/1"
        with pytest.raises(kiln.RpcError) as e:
            reader.put_model(key, fmt, b"record", [part])
        assert rpc_code(e) == "PERMISSION_DENIED"
        compiler.put_model(key, fmt, b"record", [part])
        record, parts = reader.get_model(key, fmt)
        assert record == b"record" and [p.handle for p in parts] == [part]
        resp = reader._call("GetModel", kiln.v1.service_pb2.GetModelRequest(model_key=key, format=fmt), 20)
        assert resp.record_result.signature.key_id in reader.trust.key_ids
        resp.record_result.key_fields[0].value = "8" * 64  # another model's key
        with pytest.raises(VerificationError):
            reader.trust.check(resp.handle, resp.record_result)
        digests = [a.digest for a in parts[0].result.artifacts]
        assert digests and all(reader.cache.get(d) is None for d in digests)
        reader.fetch_many(digests)  # one GetBlobs call, each blob verified before it is kept
        assert all(reader.cache.get(d) is not None for d in digests)
    with client(secure, pki, "compiler", trusted_keys=[pki.other_signing[1]]) as untrusting:
        with pytest.raises(VerificationError, match="not trusted"):
            untrusting.get_model(key, fmt)


def test_this_machines_answers_are_trusted_only_as_far_as_their_file_and_key(secure, pki, tmp_path, rng):
    """Answers kilnd gave this machine (kiln.Client's answer tier): a forged one in a file
    others may write is verified like an answer from kilnd, refused and forgotten; one signed
    by a key the client no longer trusts is not used at all."""
    g, x = graph(2.75), rng.standard_normal(16).astype(np.float32)
    with client(secure, pki, "compiler", cache_dir=tmp_path) as c:
        handle = c.compile(g, "cpu", FAST).handle
        req = c._request(g, "cpu", FAST)
        name = c._answer_name(request_key(req.graph, req.target, req.options))
        path = Path(c.cache._answer_path(name))
        body, private = c.cache.load_answer(name, 60)
    assert private, oct(path.stat().st_mode)
    resp = service_pb2.CompileResponse.FromString(body)
    with client(secure, pki, "compiler", cache_dir=tmp_path) as c:
        assert c.compile(g, "cpu", FAST).handle == handle and c.machine_hits == 1
    for what, forged in _mutations(resp).items():
        if what == "handle":
            continue  # another handle is another answer, not a forgery of this one
        c.cache.save_answer(name, forged.SerializeToString())
        path.chmod(0o666)  # a file another user could have written
        with client(secure, pki, "compiler", cache_dir=tmp_path) as c:
            compiled = c.compile(g, "cpu", FAST)
            assert compiled.handle == handle and (c.machine_hits, c.key_hits) == (0, 1), what
            np.testing.assert_allclose(compiled(x), expected(x, 2.75), rtol=1e-5)
        assert path.stat().st_mode & 0o777 == 0o644, f"{what}: kilnd's answer was not written back"
    # The signing key is no longer trusted: the answer is not used, and kilnd's is refused.
    with client(secure, pki, "compiler", cache_dir=tmp_path, trusted_keys=[pki.other_signing[1]]) as c:
        with pytest.raises(VerificationError, match="not trusted"):
            c.compile(g, "cpu", FAST)
        assert c.machine_hits == 0
    assert not path.exists(), "the revoked answer was kept"
