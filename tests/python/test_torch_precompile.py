"""Precompiled models (kiln.torch.precompile): a warm process loads a model compiled elsewhere
from kilnd without Dynamo or AOTAutograd tracing it, with the cold run's outputs and
gradients; what must change the key does and what must not does not; new weights are read
at each call; a changed source, a foreign or damaged record, a graph break and a sealed miss
are each handled as a user needs.

Processes are fresh (records_child.py with ``precompile=1``) against the session's real kilnd;
batch sizes are this file's own, so no other test's program records serve these graphs.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch._dynamo.aot_compile")

import kiln  # noqa: E402
import kiln.torch as kt  # noqa: E402
from kiln.torch import precompile  # noqa: E402
from kiln.torch.dynamo_backend import BackendConfig  # noqa: E402
from kiln.torch.records import RECORD_EVENTS  # noqa: E402
from test_shared_cache import redis, replicas_sharing  # noqa: E402,F401  (redis: the fixture)
from test_torch_records import assert_same, run_child  # noqa: E402


@pytest.mark.parametrize("mode", ["infer", "train", "conv"])
def test_warm_process_loads_without_tracing(subprocess_env: dict[str, str], tmp_path: Path, mode: str) -> None:
    cold = run_child(subprocess_env, tmp_path, "cold", mode, "batch=23", "precompile=1")
    s = cold["stats"]
    graphs = 2 if mode == "train" else 1
    assert s["precompile_misses"] == 1 and s["precompiles_stored"] == 1 and s["precompile_hits"] == 0, s
    assert s["graphs"] == graphs and s["failed"] == 0 and cold["max_err"] < 1e-4, (s, cold["max_err"])

    # Another machine (an empty local folder): no graph reaches the backend (Dynamo and
    # AOTAutograd traced nothing), no part is partitioned, compiled or looked up one by one.
    warm = run_child(subprocess_env, tmp_path, "warm", mode, "batch=23", "precompile=1")
    w = warm["stats"]
    assert w["precompile_hits"] == 1 and w["precompile_misses"] == 0 and w["precompiles_stored"] == 0, w
    assert w["graphs"] == 0 and w["partition_s"] == 0 and w["lookup_s"] == 0 and w["cache_hits"] == 0, w
    assert w["parts"] == s["parts"] and w["failed"] == 0 and w["eager_calls"] == 0, w
    assert w["kernel_calls"] >= s["parts"], w
    assert_same(cold["tensors"], warm["tensors"])


def test_new_weights_use_the_same_record(subprocess_env: dict[str, str], tmp_path: Path) -> None:
    """Weights are read at each call, not baked in: another seed's model loads the record and
    computes its own outputs."""
    run_child(subprocess_env, tmp_path, "seed0", "infer", "batch=24", "precompile=1", "seed=0")
    other = run_child(subprocess_env, tmp_path, "seed1", "infer", "batch=24", "precompile=1", "seed=1")
    assert other["stats"]["precompile_hits"] == 1, other["stats"]
    assert other["max_err"] < 1e-5, other["max_err"]


def test_changed_shape_dtype_or_attribute_is_another_record(subprocess_env: dict[str, str], tmp_path: Path) -> None:
    run_child(subprocess_env, tmp_path, "a", "infer", "batch=25", "precompile=1")
    for name, settings in (("shape", ["batch=26"]), ("dtype", ["batch=25", "dtype=float64"]),
                           ("eps", ["batch=25", "eps=0.5"])):
        r = run_child(subprocess_env, tmp_path, name, "infer", *settings, "precompile=1")
        assert r["stats"]["precompile_hits"] == 0 and r["stats"]["precompile_misses"] == 1, (name, r["stats"])
        assert r["stats"]["precompiles_stored"] == 1 and r["max_err"] < 1e-4, (name, r["stats"], r["max_err"])


def test_changed_source_is_compiled_again(subprocess_env: dict[str, str], tmp_path: Path) -> None:
    """A function the model calls, in a module that defines none of its classes, is not in the
    key: the load checks every source Dynamo traced and compiles again when one changed."""
    helper_dir = tmp_path / "helper"
    helper_dir.mkdir()
    module = helper_dir / "kiln_test_helper.py"
    module.write_text("def shift(y):\n    return y * 2.0\n")
    env = dict(subprocess_env, PYTHONPATH=os.pathsep.join([str(helper_dir), subprocess_env.get("PYTHONPATH", "")]))
    first = run_child(env, tmp_path, "first", "helper", "batch=27", "precompile=1")
    assert first["stats"]["precompiles_stored"] == 1 and first["max_err"] < 1e-5
    same = run_child(env, tmp_path, "same", "helper", "batch=27", "precompile=1")
    assert same["stats"]["precompile_hits"] == 1, same["stats"]

    module.write_text("def shift(y):\n    return y * 3.0\n")
    changed = run_child(env, tmp_path, "changed", "helper", "batch=27", "precompile=1")
    assert changed["stats"]["precompile_hits"] == 0 and changed["stats"]["precompiles_stored"] == 1, changed["stats"]
    assert any("source changed" in e and "kiln_test_helper" in e for e in changed["events"]), changed["events"]
    assert changed["max_err"] < 1e-5, changed["max_err"]  # the new code ran, not the record's
    assert torch.allclose(changed["tensors"]["y"], first["tensors"]["y"] * 1.5, atol=1e-6)


def test_sealed_miss_is_refused(subprocess_env: dict[str, str], tmp_path: Path) -> None:
    run_child(subprocess_env, tmp_path, "warmup", "infer", "batch=28", "precompile=1")
    ok = run_child(subprocess_env, tmp_path, "hit", "infer", "batch=28", "precompile=1", "sealed=raise")
    assert ok["stats"]["precompile_hits"] == 1 and ok["stats"]["sealed_misses"] == 0, ok["stats"]
    refused = run_child(subprocess_env, tmp_path, "miss", "infer", "batch=29", "precompile=1", "sealed=raise")
    assert "no precompiled record" in refused.get("sealed_error", ""), refused
    # The reason says what differs from the signature stored last: the argument's batch.
    why = refused["sealed_error"].split("differs from the signature stored last: ", 1)[-1]
    assert why.startswith("argument 0: ") and "28" in why and "29" in why, refused["sealed_error"]
    assert refused["stats"]["graphs"] == 0 and refused["stats"]["parts"] == 0, refused["stats"]


class _Mlp(torch.nn.Module):
    def __init__(self, act: Any = torch.nn.functional.gelu) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.norm(self.lin(x)))


def test_key_covers_what_the_code_depends_on() -> None:
    cfg = BackendConfig()
    torch.manual_seed(0)
    m, x = _Mlp(), torch.randn(4, 16)

    def key(model: torch.nn.Module = m, *args: Any, **kwargs: Any) -> str:
        return precompile.precompile_key(model, args or (x,), kwargs, cfg)

    base = key()
    assert key(_Mlp()) == base  # other weights: the same compiled code
    assert key(m, x.clone()) == base  # argument values do not count
    assert key(m, torch.randn(5, 16)) != base  # shape
    assert key(m, x.double()) != base  # dtype
    assert key(m, x.t().contiguous().t()) != base  # strides
    assert key(_Mlp(act=torch.relu)) != base  # a function the module holds
    m2 = _Mlp()
    m2.norm.eps = 0.1
    assert key(m2) != base  # an attribute the traced code reads
    assert key(_Mlp().eval()) != base  # training flag
    assert key(_Mlp().double()) != base  # parameter dtype
    with torch.no_grad():
        assert key() != base  # grad mode
    assert precompile.precompile_key(m, (x,), {}, BackendConfig(cudagraphs=True)) != base  # backend settings
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = not tf32
    try:
        assert key() != base  # cuDNN's TF32 setting: the layout pass's choice follows it
    finally:
        torch.backends.cudnn.allow_tf32 = tf32
    with pytest.raises(precompile.NotPrecompilable):
        precompile.precompile_key(m, (object(),), {}, cfg)


@pytest.fixture
def records_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_TORCH_RECORDS", "1")  # the suite turns them off; precompiling needs them


def test_foreign_or_damaged_record_is_not_used(client: Any, records_on: None) -> None:
    """A record under the model's key that is not one this torch can load (another torch's, or
    not a record at all) is reported and replaced; the call computes the right values."""
    torch.manual_seed(1)
    m, x = _Mlp(), torch.randn(3, 16)
    cfg = BackendConfig.from_args(None, {"client": client})
    with torch.no_grad():  # the key holds the grad mode of the call
        key = precompile.precompile_key(m, (x,), {}, cfg)
    bogus = precompile.encode(b"\x80\x04not torch", {}).replace(torch.__version__.encode(), b"0.0.0+other", 1)
    for record in (bogus, b"garbage"):
        client.put_model(key, precompile.FORMAT, record, [])
        RECORD_EVENTS.clear()
        f = kt.compile(m, options={"client": client, "precompile": True})
        with torch.no_grad():
            assert torch.allclose(f(x), m(x), atol=1e-5)
        assert any("not used" in e for e in RECORD_EVENTS), list(RECORD_EVENTS)
        assert any("stored" in e and e.startswith("precompiled") for e in RECORD_EVENTS), list(RECORD_EVENTS)


def test_signatures_dispatch_and_graph_breaks_fall_back(client: Any, records_on: None) -> None:
    torch.manual_seed(2)
    m = _Mlp()
    f = kt.compile(m, options={"client": client, "precompile": True})
    a, b = torch.randn(2, 16), torch.randn(7, 16)
    with torch.no_grad():
        for x in (a, b, a, b):  # each shape its own compiled function, chosen by its guards
            assert torch.allclose(f(x), m(x), atol=1e-5)
    assert len(f._entries) == 2

    class Breaks(_Mlp):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = super().forward(x)
            if float(y.sum()) > 0:  # data-dependent Python branch: a graph break
                return y + 1
            return y - 1

    g = kt.compile(Breaks(), options={"client": client, "precompile": True})
    with pytest.warns(kt.KilnFallbackWarning, match="cannot be precompiled"):
        with torch.no_grad():
            assert torch.allclose(g(a), g._model(a), atol=1e-5)
    assert g.fallback_reason is not None and "AOT compile" in g.fallback_reason


def test_records_off_falls_back(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_TORCH_RECORDS", "0")
    m, x = _Mlp(), torch.randn(2, 16)
    f = kt.compile(m, options={"client": client, "precompile": True})
    with pytest.warns(kt.KilnFallbackWarning, match="program records are off"):
        with torch.no_grad():
            assert torch.allclose(f(x), m(x), atol=1e-5)


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_precompiled_model_reaches_another_replica_through_redis(subprocess_env: dict[str, str], tmp_path: Path,
                                                                 redis: Any) -> None:
    """Replica A compiles a training step; a process on another machine asks replica B, whose
    own store is empty: it loads the whole model from what Redis holds, without tracing."""
    with replicas_sharing(redis[0], tmp_path) as (a, b):
        cold = run_child(dict(subprocess_env, KILN_SERVER=a.address), tmp_path, "cold", "train", "batch=30",
                         "precompile=1")
        assert cold["stats"]["precompiles_stored"] == 1, cold["stats"]
        warm = run_child(dict(subprocess_env, KILN_SERVER=b.address), tmp_path, "warm", "train", "batch=30",
                         "precompile=1")
        assert warm["stats"]["precompile_hits"] == 1 and warm["stats"]["graphs"] == 0, warm["stats"]
        assert_same(cold["tensors"], warm["tensors"])
        with kiln.Client(b.address) as cb:
            s = cb.stats()
            assert s.compiles == 0 and s.shared.hits >= 1, s


def test_miss_explained_against_the_last_stored_signature() -> None:
    """What a sealed miss reports: each differing component with both values, new and gone
    ones, and a cap on how many."""
    model = _Mlp()
    cfg = BackendConfig()
    x = torch.randn(4, 8)
    stored = precompile.explanation_record(precompile.key_components(model, (x,), {}, cfg))
    assert precompile.explain_miss(precompile.key_components(model, (x,), {}, cfg), stored).startswith(
        "the stored record of this signature is gone")
    why = precompile.explain_miss(precompile.key_components(model, (x.double(),), {}, cfg), stored)
    assert why.startswith("differs from the signature stored last: argument 0: ") and "float64" in why, why
    why = precompile.explain_miss(precompile.key_components(model, (x, None), {}, cfg), stored)
    assert "argument 1: new (NoneType None)" in why, why
    model.train(False)
    why = precompile.explain_miss(precompile.key_components(model, (x, None), {}, cfg), stored)
    assert "module (root): " in why and "training=True -> " in why and "(and 1 more)" in why, why


def test_load_shortcuts_are_undone() -> None:
    """While a record loads, the cyclic collector is off and torch's fake modes skip their
    stack walk; after it (also after a failure) both are as they were."""
    import gc
    import traceback

    from torch._subclasses import fake_tensor

    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        with precompile._collector_paused(), precompile._fake_modes_without_stacks():
            assert not gc.isenabled()
            assert len(fake_tensor.FakeTensorMode()._stack_trace) == 0
            assert fake_tensor.traceback.format_list is traceback.format_list
            raise RuntimeError("a failed load")
    assert gc.isenabled() and fake_tensor.traceback is traceback
    assert len(fake_tensor.FakeTensorMode()._stack_trace) > 0
