"""The native client core through its C ABI (kiln.core over libkiln_core.so): the artifact
store's rules, the answers folder's (client/core/FORMAT.md) and the CPU library loader's errors,
without a daemon. The C++ client's tests (tests/unit/client) cover the same code through its C++
interface."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from kiln import core
from kiln.cache import ArtifactCache


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_store_puts_finds_and_counts(tmp_path):
    store = core.Store(tmp_path)
    data = os.urandom(100_000)
    d = _digest(data)
    assert store.find(d) is None
    path = store.put(d, data)
    assert path == tmp_path / "artifacts" / d[:2] / d and path.read_bytes() == data
    assert store.find(d) == path
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    assert not list(path.parent.glob(".*"))  # no temporary left behind
    assert core.sha256_hex(data) == d
    assert store.counters() == {"hits": 1, "corruptions": 0, "puts": 1}


def test_store_says_where_an_artifact_lives(tmp_path):
    """The layout is the core's: callers ask it for a path rather than composing one."""
    store = core.Store(tmp_path)
    d = _digest(b"somewhere")
    assert store.path_for(d) == tmp_path / "artifacts" / d[:2] / d
    assert not store.path_for(d).exists()  # only where it would be
    assert store.put(d, b"somewhere") == store.path_for(d)
    for bad in ("../../etc/passwd", d.upper(), d[:-1], ""):
        with pytest.raises(core.CoreError) as e:
            store.path_for(bad)
        assert e.value.code == core.INVALID_ARGUMENT and "not a SHA-256 digest" in str(e.value)


def test_store_refuses_bytes_that_do_not_hash_to_the_digest(tmp_path):
    store = core.Store(tmp_path)
    with pytest.raises(core.CoreError) as e:
        store.put(_digest(b"one"), b"two")
    assert e.value.code == core.DATA_LOSS and "hash to" in str(e.value)
    assert not any(p.is_file() for p in (tmp_path / "artifacts").rglob("*"))
    with pytest.raises(core.CoreError) as e:
        store.find("ABC")
    assert e.value.code == core.INVALID_ARGUMENT and "not a SHA-256 digest" in str(e.value)


@pytest.mark.parametrize("damage", ["flip", "truncate", "same-size-same-mtime"])
def test_store_deletes_a_damaged_file(tmp_path, damage):
    data = os.urandom(4096)
    d = _digest(data)
    path = core.Store(tmp_path).put(d, data)
    st = path.stat()
    if damage == "flip":
        path.write_bytes(bytes([data[0] ^ 1]) + data[1:])
    elif damage == "truncate":
        path.write_bytes(data[:-1])
    else:  # the same size and modification time: only a fresh process's hash can tell
        path.write_bytes(bytes([data[0] ^ 1]) + data[1:])
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    fresh = core.Store(tmp_path)  # a new store: nothing verified yet
    assert fresh.find(d) is None
    assert not path.exists()
    assert fresh.counters()["corruptions"] == 1


def test_store_rehashes_a_file_changed_under_it_in_the_same_process(tmp_path):
    """A write with the modification time set back is still seen: the status-change time moves
    with any write and cannot be set back."""
    store = core.Store(tmp_path)
    data = os.urandom(4096)
    d = _digest(data)
    path = store.put(d, data)
    assert store.find(d) == path
    st = path.stat()
    path.write_bytes(bytes([data[0] ^ 1]) + data[1:])
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert store.find(d) is None and not path.exists()
    assert store.counters()["corruptions"] == 1


def test_store_adopts_the_old_python_layout(tmp_path):
    data = b"legacy artifact"
    d = _digest(data)
    legacy = tmp_path / "cas" / d[:2] / d
    legacy.parent.mkdir(parents=True)
    legacy.write_bytes(data)
    assert core.Store(tmp_path).find(d) == tmp_path / "artifacts" / d[:2] / d
    assert not legacy.exists()


def test_store_adds_bytes_under_the_digest_it_computes(tmp_path):
    store = core.Store(tmp_path)
    data = os.urandom(10_000)
    d, path = store.add(data)
    assert d == _digest(data) and path == tmp_path / "artifacts" / d[:2] / d and path.read_bytes() == data
    assert store.add(data) == (d, path)  # there already: nothing written again
    assert store.counters() == {"hits": 0, "corruptions": 0, "puts": 1}
    assert store.add(b"") == (_digest(b""), tmp_path / "artifacts" / _digest(b"")[:2] / _digest(b""))


def test_python_cache_is_the_core_store(tmp_path, monkeypatch):
    cache = ArtifactCache(tmp_path)
    # The core names the bytes (they are hashed once, there): Python hashes nothing.
    monkeypatch.setattr(hashlib, "sha256", None)
    d, path = cache.put_bytes(b"shared")
    monkeypatch.undo()
    assert d == _digest(b"shared") and cache.store.counters()["puts"] == 1
    assert core.Store(tmp_path).find(d) == path == cache.path_for(d) == cache.store.path_for(d)
    with pytest.raises(ValueError):
        cache.path_for("../" + d[3:])
    with pytest.raises(ValueError, match="expected 3"):
        cache.put_chunks(_digest(b"ab"), [b"a", b"b"], 3)


_ANSWER_MAGIC = b"kiln-answer-v1\n"


def test_answers_keep_the_names_and_files_python_clients_wrote(tmp_path):
    """The core reads an answers folder that the Python client of before filled (its name rule
    and file format, written here by hand), and writes the same bytes."""
    address, key = "kilnd.example:50051", _digest(b"a request")
    name = core.answer_name(address, key)
    assert name == hashlib.sha256(f"{address}\0{key}".encode()).hexdigest()
    response = b"a serialized CompileResponse\0"
    path = tmp_path / "answers" / name[:2] / name
    path.parent.mkdir(parents=True)
    path.write_bytes(_ANSWER_MAGIC + hashlib.sha256(response).digest() + response)
    path.chmod(0o644)
    cache = ArtifactCache(tmp_path)
    assert cache.load_answer(name, 60) == (response, True)
    assert cache._answer_path(name) == str(path)
    cache.save_answer(name, b"another")
    assert path.read_bytes() == _ANSWER_MAGIC + hashlib.sha256(b"another").digest() + b"another"
    assert oct(path.stat().st_mode & 0o777) == "0o644" and not list(path.parent.glob(".*"))
    path.chmod(0o664)
    assert cache.load_answer(name, 60) == (b"another", False)
    assert cache.load_answer(name, 0) is None
    cache.drop_answer(name)
    cache.drop_answer(name)
    assert not path.exists() and cache.load_answer(name, 60) is None


@pytest.mark.parametrize("damage", ["flip", "magic", "short", "empty"])
def test_a_damaged_answer_is_removed_and_missed(tmp_path, damage):
    cache = ArtifactCache(tmp_path)
    name = core.answer_name("localhost:50051", _digest(b"damaged"))
    cache.save_answer(name, b"x" * 100)
    path = Path(cache._answer_path(name))
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-3] ^= 0x40
    elif damage == "magic":
        data[0] ^= 0x20
    path.write_bytes({"short": bytes(data[:20]), "empty": b""}.get(damage, bytes(data)))
    assert cache.load_answer(name, 60) is None
    assert not path.exists()


def test_answer_names_are_checked_before_they_become_paths(tmp_path):
    cache = ArtifactCache(tmp_path)
    for bad in ("../../etc/passwd", "A" * 64, ""):
        with pytest.raises(ValueError, match="not a SHA-256 digest"):
            cache.load_answer(bad, 60)
        cache.save_answer(bad, b"ignored")  # best effort: nothing written, nothing raised
        with pytest.raises(core.CoreError) as e:
            cache.store.drop_answer(bad)
        assert e.value.code == core.INVALID_ARGUMENT
    assert not (tmp_path / "answers").exists()


def test_store_is_shared_by_processes(tmp_path):
    """Eight processes store the same artifact at once: one whole file, every one finds it."""
    data = os.urandom(1 << 20)
    d = _digest(data)
    blob = tmp_path / "blob"
    blob.write_bytes(data)
    child = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from kiln import core
        store = core.Store({str(tmp_path / "store")!r})
        data = Path({str(blob)!r}).read_bytes()
        store.put({d!r}, data)
        assert store.find({d!r}).read_bytes() == data
    """)
    procs = [subprocess.Popen([sys.executable, "-c", child]) for _ in range(8)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 8
    folder = tmp_path / "store" / "artifacts" / d[:2]
    assert sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock")) == [d]


def test_cpu_loader_errors_name_the_file(tmp_path):
    with pytest.raises(core.CoreError) as e:
        core.CpuLibrary.open(tmp_path / "missing.so")
    assert e.value.code == core.NOT_FOUND and "missing.so" in str(e.value)
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"not an ELF file")
    with pytest.raises(core.CoreError) as e:
        core.CpuLibrary.open(junk)
    assert e.value.code == core.FAILED_PRECONDITION and "junk.so" in str(e.value)
    # A real shared object without kiln's entry points.
    src = tmp_path / "other.c"
    src.write_text("int unrelated(void) { return 1; }\n")
    other = tmp_path / "other.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(other), str(src)], check=True)
    with pytest.raises(core.CoreError) as e:
        core.CpuLibrary.open_image(other.read_bytes(), "f" * 64)
    assert e.value.code == core.FAILED_PRECONDITION and "not a kiln kernel library" in str(e.value)


def test_cpu_image_is_opened_once_per_name(tmp_path):
    src = tmp_path / "k.c"
    src.write_text(textwrap.dedent("""
        #include <stdint.h>
        uint32_t kiln_abi_version(void) { return 1; }
        int kiln_run(void* const* args, void* workspace, int threads) {
          *(float*)args[1] = *(const float*)args[0] * 2.0f; return 0; }
    """))
    so = tmp_path / "k.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    image = so.read_bytes()
    before = core.cpu_library_count()
    a = core.CpuLibrary.open_image(image, _digest(image))
    b = core.CpuLibrary.open_image(image, _digest(image))
    assert core.cpu_library_count() == before + 1
    assert a.abi_version == 1 and a.run_address == b.run_address != 0 and a.workspace_address == 0


def test_missing_core_is_a_clear_error(tmp_path):
    env = dict(os.environ, KILN_CORE_LIBRARY=str(tmp_path / "nowhere.so"))
    run = subprocess.run([sys.executable, "-c", "from kiln import core; core.Store()"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "kiln's native core is missing" in run.stderr and "KILN_CORE_LIBRARY" in run.stderr


def test_core_of_another_abi_is_a_clear_error(tmp_path):
    """An older core lacks functions this package binds: its ABI version is what is reported."""
    src = tmp_path / "old.c"
    src.write_text("unsigned kiln_core_abi_version(void) { return 2; }\n")
    old = tmp_path / "libkiln_core.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(old), str(src)], check=True)
    env = dict(os.environ, KILN_CORE_LIBRARY=str(old))
    run = subprocess.run([sys.executable, "-c", "from kiln import core; core.Store()"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and f"speaks ABI 2; this package needs {core.ABI_VERSION}" in run.stderr, run.stderr


def test_core_is_the_one_the_tests_built():
    """The suite loads the build's core (conftest), so a rebuilt core is what it tests."""
    if os.environ.get("KILN_BINARY_DIR"):
        assert Path(os.environ["KILN_CORE_LIBRARY"]) == Path(os.environ["KILN_BINARY_DIR"]) / "client/core/libkiln_core.so"


# ---------------------------------------------------------------- signed bytes, request keys, trust
# kiln.trust and kiln.connection.request_key compute nothing themselves: the core runs wire/'s
# code, the code kilnd and the C++ client run (tests/unit/wire covers it from C++).

HANDLE = "0123456789abcdef" * 4


def _cpu_result() -> Any:
    """tests/unit/wire/result_bytes_test.cc's CpuResult, whose signed bytes it pins."""
    from kiln.v1 import service_pb2 as pb

    r = pb.ActionResult(key_debug="graph=...\ntarget=cpu:x86-64-v3\n", compile_log="g++ said nothing")
    r.artifacts.add(kind=pb.SHARED_OBJECT, digest="a" * 64, size=12345)
    r.artifacts.add(kind=pb.SOURCE, digest="b" * 64, size=678)
    r.plan.buffers.add(role=pb.INPUT, dtype=3, shape=[4, 8], bytes=128)
    r.plan.buffers.add(role=pb.TEMP, index=-1, bytes=64, offset=64)
    r.plan.steps.add(kernel="k0", grid=[4000000000], block=[128], shared_bytes=512, args=[0, 1])
    r.plan.workspace_bytes, r.plan.abi_version = 128, 1
    r.target.cpu.isa = "x86-64-v3"
    r.target.cpu.features.extend(["avx2", "fma"])
    r.key_fields.add(label="graph", value="abc")
    r.stats.total_ms = 12.5
    return r


def test_signed_bytes_are_the_cores_and_the_cpp_tests_golden():
    from kiln.trust import canonical_result_bytes

    r = _cpu_result()
    signed = canonical_result_bytes(HANDLE, r)
    assert hashlib.sha256(signed).hexdigest() == "c2991c984319a35599bd7d10425b95762221c2e52c2fb78feaaf396eec288f9b"
    assert signed == core.result_signed_bytes(HANDLE, r.SerializeToString())
    with pytest.raises(core.CoreError) as e:
        core.result_signed_bytes(HANDLE, b"\x0a\x09")  # a length past the end
    assert e.value.code == core.INVALID_ARGUMENT and "not a serialized kiln.v1.ActionResult" in str(e.value)


def test_request_keys_are_the_cores(rng, monkeypatch):
    import kiln
    from kiln.connection import make_options, request_key
    from kiln.v1 import service_pb2

    b = kiln.GraphBuilder()
    x = b.input("x", "f32", tuple(int(n) for n in rng.integers(1, 64, size=int(rng.integers(1, 4)))))
    graph = b.build(b.exp(x) * float(rng.standard_normal()) + 1.0)
    target = service_pb2.Target()
    target.cuda.sm = 90
    options = make_options(opt_level=int(rng.integers(0, 4)), variant=int(rng.integers(0, 3)))
    parts = [m.SerializeToString(deterministic=True) for m in (graph, target, options)]
    spelled = hashlib.sha256(b"kiln-request-key-v1\n" + b"".join(len(p).to_bytes(8, "little") + p for p in parts))
    assert request_key(graph, target, options) == core.request_key(*parts) == spelled.hexdigest()
    monkeypatch.setattr(core, "request_key", lambda *parts: "from the core")
    assert request_key(graph, target, options) == "from the core"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_trust_policy_checks_signatures_in_the_core(tmp_path):
    """A key pair and a signature made by the openssl command, checked without a daemon."""
    from kiln.errors import VerificationError
    from kiln.trust import TrustPolicy, canonical_result_bytes

    key, pub = tmp_path / "k.pem", tmp_path / "k.pub"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(key)], check=True, capture_output=True)
    subprocess.run(["openssl", "pkey", "-in", str(key), "-pubout", "-out", str(pub)], check=True, capture_output=True)
    der = subprocess.run(["openssl", "pkey", "-pubin", "-in", str(pub), "-outform", "DER"], check=True,
                         capture_output=True).stdout
    r = _cpu_result()
    (tmp_path / "signed").write_bytes(canonical_result_bytes(HANDLE, r))
    # A key id is the first 16 hex digits of the raw key's SHA-256 (wire/FORMAT.md), computed here
    # apart from the core so the check below compares two implementations.
    r.signature.algorithm, r.signature.key_id = "ed25519", hashlib.sha256(der[-32:]).hexdigest()[:16]
    r.signature.signature = subprocess.run(
        ["openssl", "pkeyutl", "-sign", "-rawin", "-inkey", str(key), "-in", str(tmp_path / "signed")], check=True,
        capture_output=True).stdout
    policy = TrustPolicy([pub])
    assert policy.key_ids == [r.signature.key_id]
    policy.check(HANDLE, r)
    r.plan.steps[0].block[0] = 64
    with pytest.raises(VerificationError, match="does not match its contents"):
        policy.check(HANDLE, r)
    subprocess.run(["openssl", "genpkey", "-algorithm", "x25519", "-out", str(tmp_path / "x.pem")], check=True,
                   capture_output=True)
    subprocess.run(["openssl", "pkey", "-in", str(tmp_path / "x.pem"), "-pubout", "-out", str(tmp_path / "x.pub")],
                   check=True, capture_output=True)
    with pytest.raises(ValueError, match="not an Ed25519 public key"):
        TrustPolicy([tmp_path / "x.pub"])
    with pytest.raises(ValueError, match="not a readable PEM public key"):
        TrustPolicy([key])  # the private key
