"""GraphBuilder, dtypes, targets, graph files, the recorder and the artifact cache, offline."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln import dtypes as dt
from kiln.cache import ArtifactCache
from kiln.recorder import Recorder, iter_graph_files
from kiln.target import Target, isa_level_from_flags
from graph_eval import evaluate


def test_value_ids_follow_ssa_numbering_even_with_late_inputs():
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (2, 3))
    e = b.exp(x)
    y = b.input("y", np.float32, (3,))  # added after a node: still value 1
    out = b.add(e, y)
    g = b.build(out)
    assert [i.name for i in g.inputs] == ["x", "y"]
    assert [(n.op, list(n.inputs)) for n in g.nodes] == [("exp", [0]), ("add", [2, 1])]
    assert list(g.outputs) == [3]


def test_build_prunes_dead_nodes_but_keeps_inputs():
    b = kiln.GraphBuilder()
    x = b.input("x", "f64", (4,))
    b.input("unused", "i32", (2,))
    b.sin(x)  # dead
    out = b.cos(x)
    g = b.build([out])
    assert [n.op for n in g.nodes] == ["cos"]
    assert len(g.inputs) == 2
    assert [n.op for n in b.build([out], prune=False).nodes] == ["sin", "cos"]


def test_attributes_follow_the_op_reference():
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (4, 5))
    s = b.sum(x, axes=[-1], keepdim=True)
    v = b.var(x, axes=[0], correction=1)
    c = b.cast(x, "f16")
    m = b.argmin(x, axis=1)
    n = b.norm(x, ord=1, axes=[1])
    cl = b.clamp(x, min=-1.0)
    g = b.build([s, v, c, m, n, cl])
    nodes = {n.op: n for n in g.nodes}
    assert list(nodes["sum"].attrs["axes"].ints.values) == [1]
    assert nodes["sum"].attrs["keepdim"].b is True
    assert nodes["var"].attrs["correction"].f == 1.0
    assert nodes["cast"].attrs["dtype"].dtype == kiln.graph_pb2.F16
    assert nodes["argmin"].attrs["axis"].i == 1
    assert nodes["norm"].attrs["ord"].f == 1.0
    assert "max" not in nodes["clamp"].attrs and nodes["clamp"].attrs["min"].f == -1.0
    assert (s.shape, v.dtype, c.dtype, m.dtype, m.shape, n.shape) == ((4, 1), "f32", "f16", "i64", (4,), (4,))


def test_type_inference():
    b = kiln.GraphBuilder()
    i8 = b.input("a", "i8", (3,))
    u8 = b.input("b", "u8", (3,))
    i32 = b.input("c", "i32", (2, 1))
    f16 = b.input("d", "f16", (3,))
    bl = b.input("e", "bool", (3,))
    assert (i8 + u8).dtype == "i16"
    assert (i32 + f16).dtype == "f64"
    assert (i8 + f16).dtype == "f16"
    assert b.exp(i8).dtype == "f16"
    assert b.exp(b.input("g", "i16", (1,))).dtype == "f32"
    assert (i32 / i32).dtype == "f64"
    assert (i32 + i8).shape == (2, 3)
    assert b.sum(bl).dtype == "i64" and b.mean(i32).dtype == "f64"
    assert (bl + 1).dtype == "i64"
    assert (f16 * 2.5).dtype == "f16"
    assert (i32 * 2.5).dtype == "f64"
    assert (bl & bl).dtype == "bool"
    assert b.where(bl, i8, 0).dtype == "i8"
    assert b.concat([i8, u8]).dtype == "i16"
    assert dt.promote("bf16", "f16") == "f32" and dt.promote("bf16", "i8") == "bf16"
    with pytest.raises(OverflowError):
        i8 + 1000
    with pytest.raises(ValueError, match="broadcast"):
        i32 + b.input("h", "f32", (4, 5))
    with pytest.raises(TypeError):
        b.bitwise_and(f16, f16)
    with pytest.raises(TypeError, match="truth value"):
        bool(i8)


ROOT = Path(__file__).resolve().parents[2]


def test_op_table_module_is_generated_from_the_def():
    """kiln/op_table.py is kernels/ir/op_table.def's table as the generator writes it today."""
    run = subprocess.run([sys.executable, str(ROOT / "client/python/gen_op_table.py"), "--check"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_builder_types_every_table_op_as_the_daemon_does():
    """Every op of the typing table on every dtype (pair): the builder's result type, or its
    refusal, is the daemon registry's, recorded in tests/golden/op_typing.txt by kernels_test."""
    lines = (ROOT / "tests/golden/op_typing.txt").read_text().splitlines()
    cases = [line.split(" -> ") for line in lines if line and not line.startswith("#")]
    assert len(cases) > 2000
    mismatches = []
    for lhs, want in cases:
        op, *dtypes = lhs.split()
        b = kiln.GraphBuilder()
        xs = [b.input(f"x{i}", d, (2, 3)) for i, d in enumerate(dtypes)]
        try:
            if op in kiln.op_table.UNARY_RULES:
                got = b.unary(op, xs[0]).dtype
            elif op in kiln.op_table.BINARY_RULES:
                got = b.binary(op, xs[0], xs[1]).dtype
            else:
                got = b.reduce(op, xs[0]).dtype
        except (TypeError, ValueError):
            got = "error"
        if got != want:
            mismatches.append(f"{lhs}: builder {got}, daemon {want}")
    assert not mismatches, "\n".join(mismatches[:20])
    # Every op of the table is in the golden file, and nothing else.
    table = {**kiln.op_table.UNARY_RULES, **kiln.op_table.BINARY_RULES, **kiln.op_table.REDUCTION_RULES}
    assert {lhs.split()[0] for lhs, _ in cases} == set(table)


def test_layout_shapes():
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (2, 3, 4))
    assert b.reshape(x, (6, -1)).shape == (6, 4)
    assert b.permute(x, [2, 0, 1]).shape == (4, 2, 3)
    assert b.unsqueeze(x, [0, -1]).shape == (1, 2, 3, 4, 1)
    assert b.squeeze(b.unsqueeze(x, [1])).shape == (2, 3, 4)
    assert b.broadcast_to(b.input("y", "f32", (3, 1)), (2, 3, 5)).shape == (2, 3, 5)
    assert b.slice(x, [2], [-1], [-5], [-2]).shape == (2, 3, 2)
    assert b.concat([x, x], axis=-1).shape == (2, 3, 8)
    assert x[1, :, None, ::-1].shape == (3, 1, 4)
    assert x.T.shape == (4, 3, 2)
    with pytest.raises(ValueError):
        b.reshape(x, (5, -1))
    with pytest.raises(IndexError):
        x[0, 0, 0, 0]
    with pytest.raises(IndexError):
        x[2]


KEYS = [
    np.s_[1:], np.s_[::-1], np.s_[-1], np.s_[:, None], np.s_[..., 0], np.s_[2:1], np.s_[1, 3],
    np.s_[::-2, 1:-1], np.s_[-100:100], np.s_[None, ..., None], np.s_[4:-100:-1], np.s_[-10::-1, 0],
    np.s_[3::-1], np.s_[:0:-1], np.s_[..., ::3], np.s_[-2:, -1:-4:-1],
]


@pytest.mark.parametrize("key", KEYS, ids=[repr(k) for k in KEYS])
def test_indexing_matches_numpy(key, rng):
    x = rng.standard_normal((5, 6))
    b = kiln.GraphBuilder()
    v = b.input("x", "f64", x.shape)
    out = v[key]
    if out is v:
        assert x[key].shape == x.shape
        return
    (got,) = evaluate(b.build(out), [x])
    np.testing.assert_array_equal(got, x[key])
    assert out.shape == x[key].shape


def test_builder_graph_evaluates_like_numpy(rng):
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (8, 16))
    w = b.input("w", "f32", (16,))
    z = b.exp(x * w - b.max(x, axes=[1], keepdim=True))
    out = z / b.sum(z, axes=[1], keepdim=True)
    idx = b.argmax(out, axis=1)
    xv, wv = rng.standard_normal((8, 16)).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    got_sm, got_idx = evaluate(b.build([out, idx]), [xv, wv])
    y = xv * wv - xv.max(axis=1, keepdims=True)
    want = np.exp(y) / np.exp(y).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(got_sm, want, rtol=1e-6)
    assert got_sm.dtype == np.float32
    np.testing.assert_array_equal(got_idx, want.argmax(axis=1))


def test_scalar_constants_are_shared():
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (3,))
    g = b.build([x * 2 + 2, x - 2])
    consts = [n for n in g.nodes if n.op == "constant"]
    assert len(consts) == 1 and list(consts[0].attrs["value"].tensor.float_values) == [2.0]


def test_graph_files_round_trip(tmp_path):
    b = kiln.GraphBuilder()
    x = b.input("x", "i32", (2, 2), strides=(1, 2))
    g = b.build(b.sum(x * 3, axes=[0]))
    for ext in (".json", ".txtpb", ".pbtxt", ".pb", ".kreq"):
        p = kiln.save_graph(g, tmp_path / f"g{ext}")
        assert kiln.load_graph(p) == g, ext
    # a CompileRequest in JSON is read too
    req = kiln.service_pb2.CompileRequest(graph=g)
    req.options.opt_level = 1
    from google.protobuf import json_format

    (tmp_path / "r.json").write_text(json_format.MessageToJson(req))
    assert kiln.load_request(tmp_path / "r.json").options.opt_level == 1
    with pytest.raises(ValueError):
        kiln.load_graph(tmp_path / "g.unknown")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError):
        kiln.load_graph(tmp_path / "bad.json")


def test_targets():
    assert str(Target.parse("cpu:x86-64-v3")) == "cpu:x86-64-v3"
    assert Target.parse("cpu").isa in ("x86-64-v2", "x86-64-v3", "x86-64-v4")
    assert Target.parse("cpu").isa == kiln.host_isa()
    assert Target.parse("cpu:+fma+avx2").features == ("avx2", "fma")
    assert Target.parse("cuda:sm_90").sm == 90 and str(Target.parse("cuda:80")) == "cuda:sm_80"
    t = Target.parse("cpu:x86-64-v4")
    assert Target.from_proto(t.to_proto()) == t
    for bad in ("gpu", "cpu:x86-64-v9", "cuda:sm_x", "cpu:+"):
        with pytest.raises(ValueError):
            Target.parse(bad)
    assert isa_level_from_flags({"avx2", "fma", "bmi2"}) == "x86-64-v3"
    assert isa_level_from_flags({"avx2", "fma", "bmi2", "avx512f", "avx512bw", "avx512dq", "avx512vl"}) == "x86-64-v4"
    assert isa_level_from_flags({"avx2", "fma", "avx512f"}) == "x86-64-v2"


def test_recorder_one_file_per_request_across_targets(tmp_path):
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (4,))
    g = b.build(b.exp(x))
    rec = Recorder(tmp_path)
    paths = set()
    for target in ("cpu:x86-64-v2", "cpu:x86-64-v3", "cuda:sm_90"):
        req = kiln.service_pb2.CompileRequest(graph=g, target=Target.parse(target).to_proto())
        paths.add(rec.record(req))
    assert len(paths) == 1
    (p,) = paths
    data = p.read_bytes()
    assert p.name == hashlib.sha256(data).hexdigest() + ".kreq"
    req = kiln.load_request(p)
    assert req.graph == g and not req.HasField("target")
    assert list(iter_graph_files([tmp_path])) == [p]


def test_artifact_cache_verifies_digests(tmp_path):
    cache = ArtifactCache(tmp_path)
    digest, path = cache.put_bytes(b"hello")
    assert digest == hashlib.sha256(b"hello").hexdigest()
    assert cache.get(digest) == path and path.read_bytes() == b"hello"
    # corrupt it: the next process (a new cache object) sees a miss and the file is gone
    os.chmod(path, 0o644)
    path.write_bytes(b"hellO")
    assert ArtifactCache(tmp_path).get(digest) is None and not path.exists()
    with pytest.raises(ValueError):
        cache.put_chunks(digest, [b"nope"])
    assert not any(p.name.startswith(".tmp") for p in path.parent.iterdir())
    with pytest.raises(ValueError):
        cache.path_for("../../etc/passwd")


def test_artifact_cache_shares_the_cpp_layout_and_adopts_the_old_one(tmp_path, monkeypatch):
    """Artifacts live where the C++ client keeps them (client/cpp/artifact_cache.h:
    artifacts/<d0d1>/<digest> under $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln), and one an
    older Python client stored under cas/ is moved there when first asked for, verified."""
    cache = ArtifactCache(tmp_path)
    digest, path = cache.put_bytes(b"shared")
    assert path == tmp_path / "artifacts" / digest[:2] / digest
    old = hashlib.sha256(b"from before").hexdigest()
    legacy = tmp_path / "cas" / old[:2] / old
    legacy.parent.mkdir(parents=True)
    legacy.write_bytes(b"from before")
    assert cache.get(old) == tmp_path / "artifacts" / old[:2] / old and not legacy.exists()
    bad = hashlib.sha256(b"right").hexdigest()
    (tmp_path / "cas" / bad[:2]).mkdir(parents=True, exist_ok=True)
    (tmp_path / "cas" / bad[:2] / bad).write_bytes(b"wrong")
    assert cache.get(bad) is None, "an adopted file is verified like any other"
    monkeypatch.delenv("KILN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    from kiln.cache import default_cache_dir

    assert default_cache_dir() == tmp_path / "xdg" / "kiln"


def test_cli_help_for_every_subcommand(capsys):
    from kiln.cli import main

    for cmd in ("compile", "lookup", "fetch", "source", "run", "prewarm", "stats"):
        with pytest.raises(SystemExit) as e:
            main([cmd, "--help"])
        assert e.value.code == 0
        assert "--server" in capsys.readouterr().out
