"""Bundles against real daemons: ``kiln export`` from one kilnd, ``kiln import`` into a fresh one,
which then serves every result, model record and tuning without compiling; damaged files and
forged entries are refused whole; signatures decide what a signing kilnd takes."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest

import kiln
from kiln.bundle import BundleError, export_bundle, import_bundle, read_bundle
from kiln.errors import RpcError, VerificationError
from kiln.v1 import service_pb2

from conftest import find_kilnd
from pki import keygen

FAST = {"opt_level": 0}
DEVICE = "test device (bundle)"


def graph(scale: float, n: int = 32):
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (n,))
    return b.build(b.tanh(x) * scale + 0.5)


def expected(x: np.ndarray, scale: float) -> np.ndarray:
    return (np.tanh(x.astype(np.float64)) * scale + 0.5).astype(np.float32)


@pytest.fixture(scope="module")
def binary():
    b = find_kilnd()
    if b is None:
        pytest.skip("kilnd is not built")
    return b


@pytest.fixture(scope="module")
def keys(tmp_path_factory, binary):
    folder = tmp_path_factory.mktemp("bundle-keys")
    return {"k1": keygen(binary, folder / "k1.key"), "k2": keygen(binary, folder / "k2.key")}


def daemon(tmp_path_factory, binary, name: str, *args: str) -> kiln.local.LocalDaemon:
    return kiln.local.LocalDaemon(binary, tmp_path_factory.mktemp(name), args=list(args))


def entries_of(c: kiln.Client) -> int:
    return c.stats().store.entries


def fill(c: kiln.Client) -> dict:
    """Two compiled graphs, a tuning and a model record naming both: one of each kind of entry."""
    a, b = c.compile(graph(2.0), "cpu", FAST), c.compile(graph(-3.0), "cpu", FAST)
    c.record_tuning(graph(2.0), "cpu", DEVICE, 1, [(0, 2.0), (1, 1.0)], FAST)
    record = os.urandom(5000)
    model_key = hashlib.sha256(b"bundle test model").hexdigest()
    c.put_model(model_key, "kiln.test/1", record, [a.handle, b.handle])
    return {"handles": {a.handle, b.handle}, "model_key": model_key, "record": record}


@pytest.fixture(scope="module")
def source(tmp_path_factory, binary):
    """An unsigned kilnd holding one entry of each kind, and its bundle."""
    d = daemon(tmp_path_factory, binary, "bundle-source")
    with kiln.Client(d.address, timeout=60) as c:
        made = fill(c)
        made["entries"] = entries_of(c)
        path = tmp_path_factory.mktemp("bundle-file") / "cache.kbundle"
        made["stats"] = export_bundle(c, path)
    made["path"] = path
    yield made
    d.stop()


def test_a_fresh_daemon_serves_everything_it_imported(tmp_path_factory, binary, source, tmp_path, rng):
    assert source["stats"].entries == source["entries"] == 4, "2 results, a tuning and a model record"
    d = daemon(tmp_path_factory, binary, "bundle-target")
    try:
        with kiln.Client(d.address, timeout=60, cache_dir=tmp_path / "client") as c:
            assert c.lookup(graph(2.0), "cpu", FAST) is None
            st = import_bundle(c, source["path"])
            assert (st.entries, st.stored, st.present) == (4, 4, 0)
            for scale in (2.0, -3.0):
                hit = c.lookup(graph(scale), "cpu", FAST)
                assert hit is not None and hit.handle in source["handles"]
                x = rng.standard_normal(32).astype(np.float32)
                np.testing.assert_allclose(hit(x), expected(x, scale), rtol=1e-5, atol=1e-6)
            tuned = c.lookup_tuning(graph(2.0), "cpu", DEVICE, FAST)
            assert tuned.found and tuned.variant == 1
            record, parts = c.get_model(source["model_key"], "kiln.test/1")
            assert record == source["record"] and {p.handle for p in parts} == source["handles"]
            assert c.stats().compiles == 0, "everything came from the bundle"
            assert entries_of(c) == 4
            again = import_bundle(c, source["path"])
            assert (again.stored, again.present) == (0, 4), "a second import writes nothing"
    finally:
        d.stop()


def test_damaged_or_truncated_bundles_are_refused_before_anything_is_sent(tmp_path_factory, binary, source,
                                                                            tmp_path):
    data = source["path"].read_bytes()
    damaged, truncated, foreign = tmp_path / "damaged", tmp_path / "truncated", tmp_path / "foreign"
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x40
    damaged.write_bytes(bytes(flipped))
    truncated.write_bytes(data[: len(data) - 100])
    foreign.write_bytes(b"PK\x03\x04" + data[4:])
    d = daemon(tmp_path_factory, binary, "bundle-refuse")
    try:
        with kiln.Client(d.address, timeout=30) as c:
            for path, why in ((damaged, "damaged"), (truncated, "truncated"), (foreign, "not a kiln bundle")):
                with pytest.raises(BundleError, match=why):
                    import_bundle(c, path)
            with pytest.raises(BundleError):
                next(read_bundle(damaged))
            assert entries_of(c) == 0
    finally:
        d.stop()


def test_a_forged_entry_refuses_its_whole_batch(tmp_path_factory, binary, source):
    good, victim = [e for e in read_bundle(source["path"]) if len(e.blobs) > 0][:2]
    forged = service_pb2.BundleEntry()
    forged.CopyFrom(victim)
    forged.blobs[0] = forged.blobs[0][:-1] + bytes([forged.blobs[0][-1] ^ 1])
    short = service_pb2.BundleEntry()
    short.CopyFrom(victim)
    del short.blobs[:]
    bad_key = service_pb2.BundleEntry()
    bad_key.CopyFrom(victim)
    bad_key.key = "../" + victim.key[3:]
    d = daemon(tmp_path_factory, binary, "bundle-forged")
    try:
        with kiln.Client(d.address, timeout=30, max_attempts=1) as c:
            for bad, rule in ((forged, "does not hash to its artifact's digest"),
                              (short, "one blob per artifact"), (bad_key, "64-digit lowercase hex key")):
                with pytest.raises(RpcError, match=rule) as e:
                    c.import_entries([good, bad])
                assert e.value.code == "INVALID_ARGUMENT" and "bundle entry 1" in str(e.value)
            assert entries_of(c) == 0, "the good entry of a refused batch is not stored either"
            assert c.stats().store.entries == 0
            assert c.import_entries([good]) == (1, 0), "the daemon keeps serving"
    finally:
        d.stop()


def test_a_signing_daemon_takes_only_entries_it_trusts(tmp_path_factory, binary, keys, tmp_path, rng):
    k1, k2 = keys["k1"], keys["k2"]
    src = daemon(tmp_path_factory, binary, "bundle-signed-src", "--signing-key", str(k1[0]))
    same = daemon(tmp_path_factory, binary, "bundle-signed-same", "--signing-key", str(k1[0]))
    other = daemon(tmp_path_factory, binary, "bundle-signed-other", "--signing-key", str(k2[0]))
    path = tmp_path / "signed.kbundle"
    try:
        with kiln.Client(src.address, timeout=60) as c:
            fill(c)
            assert export_bundle(c, path).entries == 4
        with kiln.Client(same.address, timeout=30, trusted_keys=[k1[1]], cache_dir=tmp_path / "c1") as c:
            assert import_bundle(c, path).stored == 4
            x = rng.standard_normal(32).astype(np.float32)
            np.testing.assert_allclose(c.lookup(graph(2.0), "cpu", FAST)(x), expected(x, 2.0), rtol=1e-5, atol=1e-6)
        with kiln.Client(other.address, timeout=30, max_attempts=1, trusted_keys=[k2[1]],
                         cache_dir=tmp_path / "c2") as c:
            with pytest.raises(RpcError, match="INVALID_ARGUMENT.*signature is not one this kilnd trusts"):
                import_bundle(c, path)
            assert entries_of(c) == 0
            assert import_bundle(c, path, resign=True).stored == 4
            hit = c.lookup(graph(-3.0), "cpu", FAST)
            x = rng.standard_normal(32).astype(np.float32)
            np.testing.assert_allclose(hit(x), expected(x, -3.0), rtol=1e-5, atol=1e-6)
        with kiln.Client(other.address, timeout=30, trusted_keys=[k1[1]], cache_dir=tmp_path / "c3") as c:
            with pytest.raises(VerificationError):
                c.lookup(graph(-3.0), "cpu", FAST)
    finally:
        for d in (src, same, other):
            d.stop()


def test_cli_exports_and_imports(tmp_path_factory, binary, source, tmp_path, subprocess_env):
    d = daemon(tmp_path_factory, binary, "bundle-cli")
    out = tmp_path / "again.kbundle"
    try:
        def cli(*args: str) -> str:
            r = subprocess.run([sys.executable, "-m", "kiln", *args, "--server", d.address, "--quiet"],
                               env=subprocess_env, capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stderr
            return r.stdout

        assert "4 entries, 4 stored, 0 already present" in cli("import", str(source["path"]))
        assert "4 entries" in cli("export", str(out))
        # The same entries in the same key order: the daemon's export is deterministic.
        assert [e.SerializeToString() for e in read_bundle(out)] == \
            [e.SerializeToString() for e in read_bundle(source["path"])]
        bad = tmp_path / "bad.kbundle"
        bad.write_bytes(out.read_bytes()[:-1])
        r = subprocess.run([sys.executable, "-m", "kiln", "import", str(bad), "--server", d.address],
                           env=subprocess_env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and "damaged" in r.stderr
    finally:
        d.stop()
