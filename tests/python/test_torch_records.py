"""Program records (kiln.torch.program): a warm process rebuilds a compiled model from one
lookup in kilnd, on the same machine or another one (an empty local artifact folder), with the
cold run's outputs; what must change the key does; a tampered record is refused; sealed mode.

Each run is a fresh Python process (records_child.py) against the session's real kilnd.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import kiln  # noqa: E402
import kiln.torch as kt  # noqa: E402
from kiln.errors import VerificationError  # noqa: E402
from kiln.torch import program  # noqa: E402
from conftest import find_kilnd  # noqa: E402
from test_shared_cache import redis, replicas_sharing  # noqa: E402,F401  (redis: the fixture)

CHILD = Path(__file__).resolve().parent / "records_child.py"


def run_child(env: dict[str, str], tmp: Path, name: str, mode: str, *settings: str,
              cache: str = "") -> dict[str, Any]:
    """Runs records_child.py in a fresh process; ``cache`` names its local artifact folder
    (default: one of its own, as on a machine that never ran kiln)."""
    out = tmp / name
    out.mkdir()
    child_env = dict(env)
    child_env["KILN_CACHE_DIR"] = str(tmp / (cache or f"cache-{name}"))
    child_env["KILN_TORCH_RECORDS"] = "1"
    child_env.pop("KILN_SEALED", None)
    proc = subprocess.run([sys.executable, str(CHILD), mode, str(out), *settings], env=child_env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((out / "result.json").read_text())
    result["stderr"] = proc.stderr
    tensors = out / "tensors.pt"
    result["tensors"] = torch.load(tensors) if tensors.exists() else None
    return result


def assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs between the cold and the warm run"


@pytest.mark.parametrize("mode", ["infer", "train", "conv"])
def test_warm_process_rebuilds_from_records(subprocess_env: dict[str, str], tmp_path: Path, mode: str) -> None:
    cold = run_child(subprocess_env, tmp_path, "cold", mode, "batch=3")
    s = cold["stats"]
    graphs = 2 if mode == "train" else 1
    assert s["graphs"] == graphs and s["records_stored"] == graphs, s
    assert s["record_hits"] == 0 and s["parts"] >= 1 and s["failed"] == 0, s

    # Another machine: an empty local folder. One lookup per graph, no partitioning, no
    # per-part compile or lookup, every artifact fetched in the batched call.
    warm = run_child(subprocess_env, tmp_path, "warm", mode, "batch=3")
    w = warm["stats"]
    assert w["record_hits"] == graphs and w["record_misses"] == 0, w
    assert w["parts"] == s["parts"] and w["compiled"] == s["parts"] and w["failed"] == 0, w
    assert w["partition_s"] == 0 and w["lookup_s"] == 0 and w["cache_hits"] == 0 and w["records_stored"] == 0, w
    assert w["kernel_calls"] >= s["parts"] and w["eager_calls"] == 0, w
    assert_same(cold["tensors"], warm["tensors"])

    # The same machine again (its local folder filled by the warm run).
    again = run_child(subprocess_env, tmp_path, "again", mode, "batch=3", cache="cache-warm")
    assert again["stats"]["record_hits"] == graphs, again["stats"]
    assert_same(cold["tensors"], again["tensors"])


def test_changed_shape_or_dtype_is_another_record(subprocess_env: dict[str, str], tmp_path: Path) -> None:
    run_child(subprocess_env, tmp_path, "a", "infer", "batch=5")
    for name, settings in (("shape", ["batch=6"]), ("dtype", ["batch=5", "dtype=float64"])):
        r = run_child(subprocess_env, tmp_path, name, "infer", *settings)
        assert r["stats"]["record_hits"] == 0 and r["stats"]["record_misses"] == 1, (name, r["stats"])
        assert r["stats"]["records_stored"] == 1, (name, r["stats"])
    # What those runs stored serves them, not the first shape.
    r = run_child(subprocess_env, tmp_path, "shape-again", "infer", "batch=6")
    assert r["stats"]["record_hits"] == 1, r["stats"]


def _traced(fn: Any, *args: Any) -> Any:
    gm = torch.fx.symbolic_trace(fn)
    return gm, list(args)


def test_record_key_covers_code_inputs_constants_and_settings() -> None:
    x = torch.randn(4, 8)

    def f(a):
        return torch.sin(a) + 1

    def g(a):
        return torch.cos(a) + 1

    gm_f, _ = _traced(f, x)
    base = program.model_key(gm_f, [x], ["kind=inference"])
    assert program.model_key(torch.fx.symbolic_trace(f), [x.clone()], ["kind=inference"]) == base  # values do not count
    assert program.model_key(torch.fx.symbolic_trace(g), [x], ["kind=inference"]) != base  # code
    assert program.model_key(gm_f, [x.double()], ["kind=inference"]) != base  # dtype
    assert program.model_key(gm_f, [torch.randn(5, 8)], ["kind=inference"]) != base  # shape
    assert program.model_key(gm_f, [x.t().contiguous().t()], ["kind=inference"]) != base  # strides
    assert program.model_key(gm_f, [x.requires_grad_()], ["kind=inference"]) != base  # autograd
    assert program.model_key(gm_f, [x.detach()], ["kind=forward"]) != base  # settings

    class WithConstant(torch.nn.Module):
        def __init__(self, c: torch.Tensor) -> None:
            super().__init__()
            self.c = c

        def forward(self, a):
            return a * self.c

    k1 = program.model_key(torch.fx.symbolic_trace(WithConstant(torch.ones(8))), [x.detach()], [])
    k2 = program.model_key(torch.fx.symbolic_trace(WithConstant(torch.full((8,), 2.0))), [x.detach()], [])
    assert k1 != k2  # a constant's value is part of the program


def test_record_names_only_what_it_may_call() -> None:
    g = torch.fx.Graph()
    a = g.placeholder("a")
    g.output(g.call_function(torch.ops.aten.sin.default, (a,)))
    nodes = program.encode_graph(g)
    assert nodes[1]["target"] == ["op", "aten", "sin", "default"]
    assert program.decode_graph(nodes).nodes  # round trip
    for bad in (["kiln", "os", "system"], ["torch", "load"], ["method", "__reduce__"], ["operator", "nope"]):
        nodes[1]["target"] = bad
        with pytest.raises(kiln.KilnError, match="outside what records may call"):
            program.decode_graph(nodes)
    g2 = torch.fx.Graph()
    b = g2.placeholder("b")
    g2.output(g2.call_function(os.getcwd, ()))
    with pytest.raises(program.NotRecordable):
        program.encode_graph(g2)
    del b


def test_tampered_record_is_refused(subprocess_env: dict[str, str], tmp_path: Path, client: Any,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    cold = run_child(subprocess_env, tmp_path, "cold", "infer", "batch=7")
    assert cold["stats"]["records_stored"] == 1
    # A record of our own naming the child's parts, read back, then altered on the way in.
    part_handles = [p["handle"] for g in cold["graphs"] for p in g["parts"] if p.get("handle")]
    assert part_handles
    record = b"KILNPRG1" + b"\0" * 8
    key = "ab" * 32
    client.put_model(key, program.FORMAT, record, part_handles)
    got = client.get_model(key, program.FORMAT)
    assert got is not None and got[0] == record and [r.handle for r in got[1]] == part_handles

    real_call = client._call

    def tampering(method: str, request: Any, timeout: Any) -> Any:
        resp = real_call(method, request, timeout)
        if method == "GetModel":
            resp.record = resp.record + b"x"
        return resp

    monkeypatch.setattr(client, "_call", tampering)
    with pytest.raises(VerificationError, match="does not match its signed digest"):
        client.get_model(key, program.FORMAT)


def test_put_model_rules(client: Any) -> None:
    with pytest.raises(kiln.RpcError, match="model key"):
        client.put_model("not-hex", program.FORMAT, b"x", [])
    with pytest.raises(kiln.RpcError, match="not a cached result"):
        client.put_model("cd" * 32, program.FORMAT, b"x", ["ef" * 32])
    with pytest.raises(kiln.RpcError, match="model format"):
        client.put_model("cd" * 32, "bad format!", b"x", [])
    assert client.get_model("cd" * 32, program.FORMAT) is None  # nothing half-stored


def test_sealed_mode(subprocess_env: dict[str, str], tmp_path: Path) -> None:
    run_child(subprocess_env, tmp_path, "warmup", "infer", "batch=9")
    ok = run_child(subprocess_env, tmp_path, "sealed-hit", "infer", "batch=9", "sealed=raise")
    assert ok["stats"]["sealed_misses"] == 0 and ok["stats"]["record_hits"] == 1, ok["stats"]
    assert "sealed_error" not in ok
    counted = run_child(subprocess_env, tmp_path, "sealed-count", "infer", "batch=10", "sealed=1")
    assert counted["stats"]["sealed_misses"] == 1, counted["stats"]
    assert "sealed miss" in counted["stderr"] and counted["tensors"] is not None
    refused = run_child(subprocess_env, tmp_path, "sealed-raise", "infer", "batch=11", "sealed=raise")
    assert "no program record" in refused.get("sealed_error", ""), refused
    assert refused["stats"]["parts"] == 0, refused["stats"]  # nothing was compiled


def test_seal_in_process_counts_misses() -> None:
    kt.reset_stats()
    kt.seal()
    try:
        with pytest.warns(kt.KilnFallbackWarning, match="sealed miss: why"):
            from kiln.torch.sealed import check_sealed

            check_sealed("why")
        assert kt.stats()["sealed_misses"] == 1
    finally:
        kt.unseal()


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_record_reaches_another_replica_through_redis(subprocess_env: dict[str, str], tmp_path: Path,
                                                      redis: Any) -> None:
    """Replica A compiles and records; a process on another machine asks replica B, whose own
    cache is empty: one lookup there rebuilds the model from what Redis holds."""
    with replicas_sharing(redis[0], tmp_path) as (a, b):
        cold = run_child(dict(subprocess_env, KILN_SERVER=a.address), tmp_path, "cold", "train", "batch=2")
        assert cold["stats"]["records_stored"] == 2, cold["stats"]
        warm = run_child(dict(subprocess_env, KILN_SERVER=b.address), tmp_path, "warm", "train", "batch=2")
        assert warm["stats"]["record_hits"] == 2 and warm["stats"]["partition_s"] == 0, warm["stats"]
        assert_same(cold["tensors"], warm["tensors"])
        with kiln.Client(b.address) as cb:
            s = cb.stats()
            assert s.compiles == 0 and s.shared.hits >= 2, s
