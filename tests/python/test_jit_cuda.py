"""kiln.jit and Compiled on CUDA targets.

Without a GPU: target parsing; CUDA compiles through the real kilnd (a cubin, PTX naming every
step's kernel, a plan with launch shapes); the TypeError host arrays get; the client core's
CUDA loader driven by the fake driver of the C++ tests, running the generated kernels in
emulation on host memory (fake_cuda_cases.py). With a CUDA device (and
PyTorch or CuPy), the acceptance functions run on device arrays and match NumPy.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kiln
import kiln.cuda as kcuda
from kiln import service_pb2
from helpers import assert_labels_match, import_torch
from sample_fns import kmeans, kmeans_inputs, numpy_fn, numpy_fn_inputs

SM = 90
TARGET = f"cuda:sm_{SM}"

needs_gpu = pytest.mark.skipif(not kcuda.cuda_available(), reason="no CUDA device")
_nvrtc: dict[str, str] = {}  # the daemon's answer to a CUDA compile: "" when it can build cubins


@pytest.fixture(autouse=True)
def _needs_nvrtc(request: pytest.FixtureRequest) -> None:
    """Tests that compile on the daemon need its CUDA toolchain (NVRTC). Without one they skip
    saying so, as the C++ CUDA tests do; with KILN_REQUIRE_NVRTC=1 they fail instead."""
    if "client" not in request.fixturenames:
        return
    if "why" not in _nvrtc:
        client = request.getfixturevalue("client")
        b = kiln.GraphBuilder()
        x = b.input("x", "f32", (4,))
        try:
            client.compile(b.build(b.exp(x)), TARGET)
            _nvrtc["why"] = ""
        except kiln.CompileError as e:
            if e.code != "FAILED_PRECONDITION":
                raise
            _nvrtc["why"] = e.details
    if _nvrtc["why"]:
        msg = f"kilnd cannot build CUDA code: {_nvrtc['why']}"
        if os.environ.get("KILN_REQUIRE_NVRTC"):
            pytest.fail(msg)
        pytest.skip(msg)


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def softmax_inputs(rng: np.random.Generator, rows: int = 64, cols: int = 1000) -> tuple[np.ndarray]:
    return (rng.standard_normal((rows, cols)).astype(np.float32),)


# ---------------------------------------------------------------------------------- targets

@pytest.mark.parametrize("spec", ["cuda:sm_90", "cuda:90", "cuda:sm90", kiln.Target.cuda(90)])
def test_cuda_targets_parse(spec):
    jf = kiln.jit(kmeans, target=spec)
    assert jf.is_cuda and jf.target == kiln.Target.cuda(90)
    assert "cuda:sm_90" in repr(jf)


def test_plain_cuda_needs_no_gpu_to_declare():
    jf = kiln.jit(target="cuda")(kmeans)
    assert jf.is_cuda and jf.target == "cuda"


@pytest.mark.parametrize("spec", ["cuda:", "cuda:sm_", "cuda:ampere", "gpu", "cuda:sm_90:x"])
def test_bad_targets_fail_at_once(spec):
    with pytest.raises(ValueError):
        kiln.jit(kmeans, target=spec)


def test_cpu_stays_the_default():
    jf = kiln.jit(kmeans)
    assert not jf.is_cuda and jf.target.is_cpu


# ---------------------------------------------------------------------------------- compiles

def _check_cuda_result(client: kiln.Client, compiled: Any) -> None:
    """A CUDA result as a loader needs it: a cubin and PTX for the target, and a plan whose
    steps name kernels the PTX defines, with launch shapes and in-range buffer arguments."""
    assert compiled.is_cuda and compiled.target == kiln.Target.cuda(SM)
    cubin = compiled.artifact(service_pb2.CUBIN)
    ptx = compiled.artifact(service_pb2.PTX)
    assert cubin is not None and cubin.size > 0 and ptx is not None
    assert client.fetch(cubin.digest).read_bytes()[:4] == b"\x7fELF"
    ptx_text = client.fetch(ptx.digest).read_text()
    assert f".target sm_{SM}" in ptx_text

    plan = compiled.plan
    assert plan.abi_version == 1
    roles = [b.role for b in plan.buffers]
    n_in = roles.count(service_pb2.INPUT)
    assert n_in == len(compiled.inputs) and roles.count(service_pb2.OUTPUT) == len(compiled.outputs)
    for b in plan.buffers:
        if b.role == service_pb2.TEMP:
            assert b.offset % kcuda.ALIGNMENT == 0 and b.offset + b.bytes <= plan.workspace_bytes
    assert len(plan.steps) >= 1
    for s in plan.steps:
        assert f".entry {s.kernel}(" in ptx_text, s.kernel
        assert len(s.grid) == 3 and len(s.block) == 3
        assert all(g >= 1 for g in s.grid) and all(b >= 1 for b in s.block)
        assert s.block[0] * s.block[1] * s.block[2] <= 1024
        assert s.args and all(0 <= a < len(plan.buffers) for a in s.args)
        assert any(plan.buffers[a].role == service_pb2.OUTPUT or plan.buffers[a].role == service_pb2.TEMP
                   for a in s.args), "a step that writes nothing"


@pytest.mark.parametrize("name", ["kmeans", "softmax", "numpy_fn"])
def test_cuda_compile_gives_cubin_and_plan(client, rng, name):
    fn, args = {
        "kmeans": (kmeans, kmeans_inputs(rng, n=100_000, k=8, dtype=np.float32)),
        "softmax": (softmax, softmax_inputs(rng)),
        "numpy_fn": (numpy_fn, numpy_fn_inputs(rng, n=500, d=8)),
    }[name]
    jf = kiln.jit(fn, target=TARGET, client=client)
    # NumPy arrays stand for device arrays of their shape and dtype: nothing runs.
    compiled = jf.compiled_for(*args)
    _check_cuda_result(client, compiled)
    assert [(s.dtype, s.shape) for s in compiled.inputs] == [(kiln.dtypes.dtype_name(a.dtype), a.shape) for a in args]
    want = fn(*[a.copy() for a in args])
    assert [(s.dtype, s.shape) for s in compiled.outputs] == [(kiln.dtypes.dtype_name(want.dtype), want.shape)]
    assert jf.compiled_for(*args) is compiled and jf.compile_count == 1


def test_numpy_fn_plan_uses_a_workspace(client, rng):
    compiled = kiln.jit(numpy_fn, target=TARGET, client=client).compiled_for(*numpy_fn_inputs(rng, n=500, d=8))
    assert compiled.plan.workspace_bytes > 0
    assert any(b.role == service_pb2.TEMP for b in compiled.plan.buffers)


def test_cuda_and_cpu_compiles_differ(client, rng):
    X, means = kmeans_inputs(rng, n=1000, k=4, dtype=np.float32)
    g = kiln.jit(kmeans, target=TARGET, client=client).compiled_for(X, means)
    c = kiln.jit(kmeans, client=client).compiled_for(X, means)
    assert g.handle != c.handle and not c.is_cuda


@pytest.mark.skipif(kcuda.cuda_available(), reason="needs a machine without a CUDA device")
def test_plain_cuda_without_a_device_says_so(client, rng):
    jf = kiln.jit(kmeans, target="cuda", client=client)
    with pytest.raises(kiln.KilnError):
        jf.compiled_for(*kmeans_inputs(rng, n=100, k=2))


# ---------------------------------------------------------------------------------- host arrays

def test_jit_rejects_numpy_arrays_on_cuda(client, rng):
    jf = kiln.jit(kmeans, target=TARGET, client=client)
    X, means = kmeans_inputs(rng, n=100, k=2)
    with pytest.raises(TypeError, match=r"argument X is a NumPy array in host memory.*CUDA array"):
        jf(X, means)
    assert jf.compile_count == 0  # rejected before tracing or compiling


def test_compiled_rejects_numpy_arrays_on_cuda(client, rng):
    X, means = kmeans_inputs(rng, n=100, k=2, dtype=np.float32)
    compiled = kiln.jit(kmeans, target=TARGET, client=client).compiled_for(X, means)
    with pytest.raises(TypeError, match=r"input 'X'.*NumPy array in host memory"):
        compiled(X, means)
    with pytest.raises(TypeError, match="takes 2 inputs"):
        compiled(X)
    with pytest.raises(kiln.KilnError, match="load_cuda"):
        compiled.load()


def test_torch_cpu_tensors_are_rejected(client, rng):
    torch = import_torch()
    X, means = kmeans_inputs(rng, n=100, k=2, dtype=np.float32)
    jf = kiln.jit(kmeans, target=TARGET, client=client)
    with pytest.raises(TypeError, match=r"argument X is a torch tensor on cpu"):
        jf(torch.from_numpy(X), torch.from_numpy(means))
    cpu = kiln.jit(kmeans, client=client)
    with pytest.raises(TypeError, match=r"target='cuda'"):
        cpu(torch.from_numpy(X), torch.from_numpy(means))


# ---------------------------------------------------------------------------------- a fake driver

def _fake_cuda(case: str, env: dict[str, str]) -> None:
    """Runs a case of fake_cuda_cases.py in a child process: the client core's CUDA loader on
    the fake driver, the generated kernels emulated on the CPU."""
    if not (Path(env["KILN_BINARY_DIR"]) / "tests/unit/kernels/libfake_cuda.so").is_file():
        pytest.fail("the fake CUDA driver is not built (tests/unit/kernels: fake_cuda)")
    r = subprocess.run([sys.executable, str(Path(__file__).with_name("fake_cuda_cases.py")), case], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and f"ok {case}" in r.stdout, r.stdout + r.stderr


@pytest.fixture
def fake_cuda_env(client: Any, subprocess_env: dict[str, str]) -> dict[str, str]:
    env = dict(subprocess_env)
    env.setdefault("KILN_BINARY_DIR", os.environ.get("KILN_BINARY_DIR", ""))
    return env


@pytest.mark.parametrize("case", ["runs_the_plan", "loads_ptx_when_the_cubin_is_refused",
                                  "refuses_an_older_device", "prepares_arguments",
                                  "runs_a_symbolic_plan_at_the_call_sizes"])
def test_cuda_path_on_the_fake_driver(case: str, fake_cuda_env: dict[str, str]) -> None:
    _fake_cuda(case, fake_cuda_env)


def safe_softmax_graph(rows: tuple, t: int):
    """torch's ``_safe_softmax`` of attention scores plus a padding mask, as the backend
    lowers it for a symbolic sequence length T: softmax over the row, and zero where every
    score of the row is -inf (three reductions over one row, fused in one kernel)."""
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (*rows, t, t), dims=(*[None] * len(rows), "T", "T"))
    m = b.input("m", "f32", (rows[0], 1, 1, t), dims=(None, None, None, "T"))
    y = b.binary("add", x, m)
    live = b.any(b.unary("logical_not", b.binary("eq", y, float("-inf"))), axes=[-1], keepdim=True)
    return b.build([b.where(b.unary("logical_not", live), 0.0, b.softmax(y, -1))])


def test_symbolic_safe_softmax_compiles_one_kernel(client):
    """The attention mask's part of BERT at a second sequence length: one kernel for every T,
    its index bound a polynomial of degree 2 in T (the scores' elements), not T^3 (the product
    of the three reductions' ranges, which no sampled polynomial fits)."""
    compiled = client.compile(safe_softmax_graph((16, 12), 128), TARGET)
    plan = compiled.plan
    assert plan.abi_version == 2 and [s.name for s in plan.symbols] == ["T"]
    assert compiled.stats.num_kernels == 1
    degree = max(sum(t.exponents) for t in plan.index_bound.terms)
    assert degree == 2, plan.index_bound


# ---------------------------------------------------------------------------------- on a GPU

def _frameworks() -> list[str]:
    out = []
    for name in ("torch", "cupy"):
        try:
            mod = __import__(name)
        except ImportError:
            continue
        if name == "torch" and not mod.cuda.is_available():
            continue
        out.append(name)
    return out


def _to_device(framework: str, a: np.ndarray) -> Any:
    if framework == "torch":
        import torch

        return torch.from_numpy(a).cuda()
    import cupy

    return cupy.asarray(a)


def _to_host(framework: str, a: Any) -> np.ndarray:
    if framework == "torch":
        return a.cpu().numpy()
    import cupy

    return cupy.asnumpy(a)


def _is_framework_array(framework: str, a: Any) -> bool:
    mod = __import__(framework)
    return isinstance(a, mod.Tensor if framework == "torch" else mod.ndarray)


@needs_gpu
@pytest.mark.parametrize("framework", _frameworks() or ["none"])
def test_gpu_kmeans(client, rng, framework):
    if framework == "none":
        pytest.skip("neither PyTorch with CUDA nor CuPy")
    X, means = kmeans_inputs(rng, n=200_000, k=8, dtype=np.float32)
    jf = kiln.jit(kmeans, target="cuda", client=client)
    labels = jf(_to_device(framework, X), _to_device(framework, means))
    assert _is_framework_array(framework, labels)
    assert_labels_match(_to_host(framework, labels), X, means, kmeans(X, means))
    assert jf.target == "cuda" and jf.compiled_for(X, means).target == kiln.Target.cuda(kcuda.current_device_sm())


@needs_gpu
@pytest.mark.parametrize("framework", _frameworks() or ["none"])
def test_gpu_numpy_fn_and_softmax(client, rng, framework):
    if framework == "none":
        pytest.skip("neither PyTorch with CUDA nor CuPy")
    X, Y = numpy_fn_inputs(rng, n=2000, d=8)
    got = kiln.jit(numpy_fn, target="cuda", client=client)(_to_device(framework, X), _to_device(framework, Y))
    np.testing.assert_allclose(_to_host(framework, got), numpy_fn(X.copy(), Y.copy()), rtol=1e-9, atol=1e-12)
    (x,) = softmax_inputs(rng)
    # A transposed view: made contiguous before the launch.
    xt = _to_device(framework, np.ascontiguousarray(x.T)).T
    got = kiln.jit(softmax, target="cuda", client=client)(xt)
    np.testing.assert_allclose(_to_host(framework, got), softmax(x), rtol=1e-5, atol=1e-7)


@needs_gpu
def test_gpu_compiled_call_on_torch(client, rng):
    torch = import_torch()
    if not torch.cuda.is_available():
        pytest.skip("PyTorch without CUDA")
    (x,) = softmax_inputs(rng)
    sm = kcuda.current_device_sm()
    graph = kiln.jit(softmax, target=f"cuda:sm_{sm}").trace(x).graph
    compiled = client.compile(graph, target=f"cuda:sm_{sm}")
    out = compiled(torch.from_numpy(x).cuda())
    assert isinstance(out, torch.Tensor) and out.is_cuda
    np.testing.assert_allclose(out.cpu().numpy(), softmax(x), rtol=1e-5, atol=1e-7)
