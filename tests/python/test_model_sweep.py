"""The model sweep (tests/models/sweep.py) in CI: its CPU sample of torchvision, timm and Hugging
Face families, chosen for op coverage (tests/models/zoo.py, ``SAMPLE``), must run every mode
without a crash, a result outside tolerance or a fallback; and the sweep must report each failure
its selftest plants (a crash, a hang, an exception, a wrong lowering, a refused part) for what it
is, and go on after it.

The sample takes about ten minutes on two cores (kilnd compiles every part of some sixty
graphs); the selftest about two.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import import_torch

torch = import_torch()
for _module in ("transformers", "timm", "torchvision"):
    try:
        __import__(_module)
    except ImportError as e:  # deploy/setup.sh installs them: a run without them must not pass
        if os.environ.get("KILN_SKIP_TORCH") == "1":
            pytest.skip(f"{_module} is not installed (KILN_SKIP_TORCH=1)", allow_module_level=True)
        raise ImportError(f"the model sweep needs {_module} (deploy/setup.sh installs it)") from e

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "tests" / "models"
sys.path.insert(0, str(MODELS))

import checks  # noqa: E402
import zoo  # noqa: E402


def run_sweep(env: dict[str, str], out: Path, *args: str, timeout: float) -> tuple[int, dict[str, Any], str]:
    """Runs the sweep against the session's kilnd; its exit status, JSON and output."""
    p = subprocess.run([sys.executable, str(MODELS / "sweep.py"), "--server", env["KILN_SERVER"], "--out", str(out),
                        *args], env=env, capture_output=True, text=True, timeout=timeout)
    assert out.exists(), f"the sweep wrote no results (exit {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p.returncode, json.loads(out.read_text()), p.stdout


def rows_by(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["model"], r["mode"]): r for r in doc["results"]}


def describe(rows: list[dict[str, Any]]) -> str:
    return "\n".join(f"{r['model']} {r['mode']}: {r['status']} {r['reason']} {'; '.join(r['fallbacks'])}"
                     for r in rows)


def sweep_env(server: str) -> dict[str, str]:
    env = dict(os.environ)
    env["KILN_SERVER"] = server
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "client" / "python"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


@pytest.fixture(scope="module")
def sample(server: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], str]:
    out = tmp_path_factory.mktemp("sweep") / "sample.json"
    return run_sweep(sweep_env(server), out, "--list", "sample", "--time-limit", "600", timeout=2400)


def test_sample_has_no_crash_or_mismatch(sample: tuple[int, dict[str, Any], str]) -> None:
    status, doc, stdout = sample
    bad = [r for r in doc["results"] if r["status"] in ("crash", "mismatch", "timeout")]
    assert not bad, f"the sample failed:\n{describe(bad)}\n\n{stdout[-6000:]}"
    assert status == 0, stdout[-6000:]


def test_sample_runs_every_mode_in_kiln_without_fallbacks(sample: tuple[int, dict[str, Any], str]) -> None:
    """Every (model, mode) the sample lists ran (none skipped), compiled kiln parts (or it
    compared eager with eager), and no part fell back to torch."""
    _, doc, _ = sample
    rows = rows_by(doc)
    every = zoo.all_specs()
    want = {(name, mode) for name in zoo.SAMPLE for mode in checks.modes_for(every[name], "cpu")}
    assert set(rows) == want, f"missing {sorted(want - set(rows))}, unexpected {sorted(set(rows) - want)}"
    skipped = [r for r in rows.values() if r["status"] == "skipped"]
    assert not skipped, describe(skipped)
    idle = [r for r in rows.values() if r["compiled"] == 0]
    assert not idle, f"no kiln part compiled in:\n{describe(idle)}"
    fell_back = [r for r in rows.values() if r["fallbacks"] or r["failed"]]
    assert not fell_back, f"kiln parts fell back to torch:\n{describe(fell_back)}"


def test_sample_covers_each_library_and_the_text_modes() -> None:
    every = zoo.all_specs()
    chosen = [every[name] for name in zoo.SAMPLE]
    assert {s.library for s in chosen} == {"torchvision", "timm", "transformers"}
    assert 15 <= len(chosen) <= 25
    assert any(s.is_text for s in chosen) and any(s.drop is not None for s in chosen)
    assert "dynamic" in checks.modes_for(every["hf/bert"], "cpu")
    assert "reduce-overhead" in checks.modes_for(every["hf/bert"], "cuda")
    assert "reduce-overhead" not in checks.modes_for(every["hf/bert"], "cpu")


def test_selftest_reports_each_planted_failure(server: str, tmp_path: Path) -> None:
    status, doc, stdout = run_sweep(sweep_env(server), tmp_path / "selftest.json", "--list", "selftest",
                                    "--time-limit", "300", timeout=900)
    rows = rows_by(doc)
    modes = ("infer", "train", "bf16")
    assert set(rows) == {(n, m) for n in zoo.SELFTEST for m in modes}, sorted(rows)
    for m in modes:
        assert rows["self/ok", m]["status"] == "ok", rows["self/ok", m]
        # A process that dies is a crash with the signal and the frames faulthandler printed;
        # the next mode runs in a fresh worker.
        crash = rows["self/crash", m]
        assert crash["status"] == "crash" and "SIGABRT" in crash["reason"], crash
        assert "zoo_selftest.py" in crash["reason"], crash
        raised = rows["self/raise", m]
        assert raised["status"] == "crash" and "planted: a kiln part raised" in raised["reason"], raised
        refused = rows["self/refused", m]
        assert refused["status"] == "ok" and refused["failed"] >= 1, refused
        assert any("unknown op 'planted_no_such_op'" in f for f in refused["fallbacks"]), refused
    hang = rows["self/hang", "infer"]
    assert hang["status"] == "timeout" and hang["seconds"] < 120, hang
    assert rows["self/hang", "train"]["status"] == "timeout"
    # GELU's tanh approximation in place of erf: about 3e-5 of the output's scale, float32
    # eager 5e-8 off float64. The tolerance must see it in inference and in training; bfloat16's
    # cannot.
    for m in ("infer", "train"):
        wrong = rows["self/wrong", m]
        assert wrong["status"] == "mismatch" and wrong["error"] > wrong["bound"], wrong
    assert rows["self/wrong", "bf16"]["status"] == "ok"
    assert status == 1, stdout[-4000:]
    assert sorted(doc["summary"]["models_failing"]) == ["self/crash", "self/hang", "self/raise", "self/wrong"]


def test_errors_and_tolerances() -> None:
    t = torch.tensor([1.0, -2.0, 4.0], dtype=torch.float64)
    assert checks.rel_error(t.float(), t) == 0.0
    assert checks.rel_error(t + 0.04, t) == pytest.approx(0.01)
    assert checks.rel_error(torch.tensor([1.0, float("nan"), 4.0]), t) == math.inf
    assert checks.rel_error(t[:2], t) == math.inf
    assert checks.rel_error(torch.zeros(3), torch.zeros(3, dtype=torch.float64)) == 0.0
    assert checks.within(9e-6, 1e-7, 8.0, 1e-5) == (True, 1e-5)  # the floor
    ok, bound = checks.within(1.5e-5, 2e-6, 8.0, 1e-5)
    assert ok and bound == pytest.approx(1.6e-5)
    assert checks.within(1e-3, 1e-4, 8.0, 1e-5)[0] is False  # eight times eager's is the bound
    assert checks.within(7e-4, 1e-4, 8.0, 1e-5)[0] is True
    with pytest.raises(checks.Mismatch):
        checks.worst_error([t.float()], [t, t])
    assert checks.grad_error({"a": torch.ones(4)}, {"a": torch.ones(4, dtype=torch.float64)}) == 0.0
