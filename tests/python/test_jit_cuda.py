"""kiln.jit and Compiled on CUDA targets.

Without a GPU: target parsing; CUDA compiles through the real kilnd (a cubin, PTX naming every
step's kernel, a plan with launch shapes); the TypeError host arrays get; the plan launcher
driven by a fake driver, checking the pointers each launch receives. With a CUDA device (and
PyTorch or CuPy), the acceptance functions run on device arrays and match NumPy.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from typing import Any, Iterator

import numpy as np
import pytest

import kiln
import kiln.cuda as kcuda
from kiln import service_pb2
from kiln.loader import aligned_empty
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

class FakeDriver:
    """Stands for :class:`kiln.cuda.Driver`: records module loads and launches, decoding each
    launch's parameter block into the pointer values the kernel would receive."""

    def __init__(self, sm: tuple[int, int] = (9, 0), refuse_cubin: bool = False) -> None:
        self.sm = sm
        self.refuse_cubin = refuse_cubin
        self.loaded: list[bytes] = []
        self.launches: list[dict[str, Any]] = []
        self._names: dict[int, str] = {}

    def compute_capability(self, index: int) -> tuple[int, int]:
        return self.sm

    def primary_context(self, index: int) -> int:
        return 0x1000 + index

    @contextlib.contextmanager
    def context(self, ctx: int) -> Iterator[None]:
        yield

    # The calling thread's current context (these tests launch from one thread).
    current = 0

    def cuCtxGetCurrent(self, ref: Any) -> int:
        ctypes.cast(ref, ctypes.POINTER(ctypes.c_void_p)).contents.value = self.current or None
        return 0

    def cuCtxSetCurrent(self, ctx: Any) -> int:
        self.current = ctx.value or 0
        return 0

    def check(self, rc: int, what: str) -> None:
        if rc:
            raise kiln.KilnError(f"{what} failed: {rc}")

    def error_text(self, rc: int) -> str:
        return f"fake error {rc}"

    def cuModuleLoadData(self, module: Any, image: bytes) -> int:
        self.loaded.append(image)
        return 209 if self.refuse_cubin and image[:4] == b"\x7fELF" else 0

    def cuModuleGetFunction(self, fn_ref: Any, module: Any, name: bytes) -> int:
        fn = ctypes.cast(fn_ref, ctypes.POINTER(ctypes.c_void_p)).contents
        fn.value = 0x2000 + len(self._names)
        self._names[fn.value] = name.decode()
        return 0

    def cuFuncSetAttribute(self, fn: Any, attr: int, value: int) -> int:
        return 0

    def cuLaunchKernel(self, fn: Any, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, shared: int,
                       stream: Any, params: Any, extra: Any) -> int:
        n = len(params)
        ptrs = [ctypes.c_void_p.from_address(params[i]).value or 0 for i in range(n)]
        # The same parameters read as ints (symbolic plans pass their sizes after the pointers).
        ints = [ctypes.c_int.from_address(params[i]).value for i in range(n)]
        self.launches.append(dict(kernel=self._names[fn.value], grid=(gx, gy, gz), block=(bx, by, bz),
                                  shared=shared, stream=stream.value or 0, ptrs=ptrs, ints=ints))
        return 0


@pytest.fixture
def fake_driver(monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    drv = FakeDriver()
    monkeypatch.setattr(kcuda.Driver, "get", classmethod(lambda cls: drv))
    monkeypatch.setattr(kcuda, "_kernels", kcuda.OncePerKey())
    return drv


def _expected_pointers(plan: Any, ptrs: list[int], ws: int) -> list[list[int]]:
    n_in = sum(1 for b in plan.buffers if b.role == service_pb2.INPUT)
    out = []
    for s in plan.steps:
        row = []
        for a in s.args:
            b = plan.buffers[a]
            if b.role == service_pb2.INPUT:
                row.append(ptrs[b.index])
            elif b.role == service_pb2.OUTPUT:
                row.append(ptrs[n_in + b.index])
            else:
                row.append(ws + b.offset)
        out.append(row)
    return out


def test_launch_follows_the_plan(client, rng, fake_driver):
    compiled = kiln.jit(numpy_fn, target=TARGET, client=client).compiled_for(*numpy_fn_inputs(rng, n=500, d=8))
    kernel = compiled.load_cuda(0)
    assert kernel.image_kind == "CUBIN" and fake_driver.loaded[0][:4] == b"\x7fELF"
    assert compiled.load_cuda(0) is kernel  # loaded once per device
    ptrs = [0x10000, 0x20000, 0x30000]
    for run in range(2):  # the argument blocks are reused: a second launch must see new values
        shifted = [p + run * 0x100000 for p in ptrs]
        fake_driver.launches.clear()
        kernel.launch(shifted, 0x900000, stream=0x77)
        plan = compiled.plan
        assert [l["kernel"] for l in fake_driver.launches] == [s.kernel for s in plan.steps]
        assert [l["grid"] for l in fake_driver.launches] == [tuple(s.grid) for s in plan.steps]
        assert [l["block"] for l in fake_driver.launches] == [tuple(s.block) for s in plan.steps]
        assert all(l["stream"] == 0x77 for l in fake_driver.launches)
        assert [l["ptrs"] for l in fake_driver.launches] == _expected_pointers(plan, shifted, 0x900000)
    with pytest.raises(kiln.KilnError, match="takes 3 buffer pointers"):
        kernel.launch(ptrs[:2], 0x900000, stream=0)


def test_ptx_is_loaded_when_the_cubin_is_refused(client, rng, fake_driver):
    fake_driver.refuse_cubin = True
    fake_driver.sm = (10, 0)
    compiled = kiln.jit(softmax, target=TARGET, client=client).compiled_for(*softmax_inputs(rng))
    kernel = compiled.load_cuda(0)
    assert kernel.image_kind == "PTX" and fake_driver.loaded[-1].endswith(b"\0")


def test_an_older_device_is_refused(client, rng, fake_driver):
    fake_driver.sm = (8, 0)
    compiled = kiln.jit(softmax, target=TARGET, client=client).compiled_for(*softmax_inputs(rng))
    with pytest.raises(kiln.KilnError, match=r"compiled for cuda:sm_90, but device 0 is sm_80"):
        compiled.load_cuda(0)


def _aligned_copy(a: np.ndarray) -> np.ndarray:
    o = aligned_empty(a.nbytes).view(a.dtype).reshape(a.shape)
    o[...] = a
    return o


class HostFramework:
    """A stand-in array framework over NumPy arrays (device 0), so that the argument handling
    of :func:`kiln.cuda.run_compiled` can be checked without a GPU."""

    name = "host"

    def __init__(self) -> None:
        self.allocated: list[np.ndarray] = []

    def owns(self, a: Any) -> bool:
        return isinstance(a, np.ndarray)

    def dtype(self, a: np.ndarray) -> str:
        return kiln.dtypes.dtype_name(a.dtype)

    def shape(self, a: np.ndarray) -> tuple[int, ...]:
        return a.shape

    def device(self, a: np.ndarray) -> int:
        return 0

    def ptr(self, a: np.ndarray) -> int:
        return a.ctypes.data

    def strides(self, a: np.ndarray) -> tuple[int, ...]:
        return tuple(s // a.itemsize for s in a.strides)

    def is_contiguous(self, a: np.ndarray) -> bool:
        return a.flags.c_contiguous

    def contiguous_copy(self, a: np.ndarray) -> np.ndarray:
        return _aligned_copy(a)

    def empty(self, shape: Any, dtype: str, device: int) -> np.ndarray:
        o = aligned_empty(int(np.prod(shape)) * kiln.dtypes.itemsize(dtype)).view(kiln.dtypes.to_numpy(dtype)).reshape(shape)
        self.allocated.append(o)
        return o

    def empty_bytes(self, nbytes: int, device: int) -> np.ndarray:
        o = aligned_empty(nbytes)
        self.allocated.append(o)
        return o

    def stream(self, device: int) -> int:
        return 0x55

    def on_device(self, device: int) -> Any:
        return contextlib.nullcontext()

    def wrap(self, a: Any) -> Any:
        return a


def test_run_compiled_prepares_arguments(client, rng, fake_driver, monkeypatch):
    fw = HostFramework()
    monkeypatch.setitem(kcuda._frameworks, "host", fw)
    monkeypatch.setattr(kcuda, "as_cuda_array", lambda obj, what: (obj, "host"))
    X, means = kmeans_inputs(rng, n=1024, k=4, dtype=np.float32)
    compiled = kiln.jit(kmeans, target=TARGET, client=client).compiled_for(X, means)

    Xa, ma = _aligned_copy(X), _aligned_copy(means)
    labels = compiled(Xa, ma)
    (launch,) = fake_driver.launches
    assert isinstance(labels, np.ndarray) and labels.dtype == np.int64 and labels.shape == (1024,)
    assert launch["stream"] == 0x55
    assert launch["ptrs"] == _expected_pointers(compiled.plan, [Xa.ctypes.data, ma.ctypes.data, labels.ctypes.data], 0)[0]

    # A transposed view is made contiguous; a view 4 bytes into a buffer is copied to alignment.
    fake_driver.launches.clear()
    Xt = np.ascontiguousarray(X.T).T
    raw = aligned_empty(means.nbytes + 4)
    mis = raw[4:].view(np.float32).reshape(means.shape)
    mis[...] = means
    labels = compiled(Xt, mis)
    (launch,) = fake_driver.launches
    x_ptr, m_ptr, o_ptr = launch["ptrs"]
    assert x_ptr != Xt.ctypes.data and m_ptr != mis.ctypes.data and m_ptr % kcuda.ALIGNMENT == 0
    assert o_ptr == labels.ctypes.data

    with pytest.raises(TypeError, match="dtype f64, expected f32"):
        compiled(Xa.astype(np.float64), ma)
    with pytest.raises(ValueError, match="shape"):
        compiled(Xa[:10], ma)


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


def test_symbolic_plan_launches_at_the_call_sizes(client, rng, fake_driver, monkeypatch):
    """A symbolic CUDA plan (ABI 2): grids evaluated at the sizes, sizes passed after the
    pointers, temps laid out by the launcher, outputs allocated from the shape expressions."""
    fw = HostFramework()
    monkeypatch.setitem(kcuda._frameworks, "host", fw)
    monkeypatch.setattr(kcuda, "as_cuda_array", lambda obj, what: (obj, "host"))
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (5, 7), dims=("B", "T"))
    sm = b.softmax(x, axis=-1)
    total = b.sum(x)  # a whole-tensor sum: partials in the workspace
    compiled = client.compile(b.build([sm, total]), TARGET)
    plan = compiled.plan
    assert plan.abi_version == 2 and [s.name for s in plan.symbols] == ["B", "T"]
    assert all(s.grid_per_block > 0 for s in plan.steps)
    kernel = compiled.load_cuda(0)
    assert kernel.symbolic and kernel.num_symbols == 2
    # The softmax's rows vary in length: one kernel per band of lengths, chosen at launch.
    guarded = [s for s in plan.steps if s.guard_min > 0 or s.guard_max > 0]
    assert len(guarded) >= 2 and guarded[0].guard_min == 0 and guarded[-1].guard_max == 0
    assert all(a.guard_max + 1 == b.guard_min for a, b in zip(guarded, guarded[1:]))
    for B, T in ((3, 5), (17, 300), (1, 1), (2, 3000)):
        fake_driver.launches.clear()
        a = _aligned_copy(rng.standard_normal((B, T)).astype(np.float32))
        y, t = compiled(a)
        assert y.shape == (B, T) and t.shape == ()
        launches = fake_driver.launches
        chosen = [s for s in guarded if s.guard_min <= T and (s.guard_max == 0 or T <= s.guard_max)]
        assert len(chosen) == 1
        ran = [s for s in plan.steps if s in chosen or not (s.guard_min > 0 or s.guard_max > 0)]
        assert [l["kernel"] for l in launches] == [s.kernel for s in ran]
        for l, s in zip(launches, ran):
            work = sum(int(term.coeff) * B ** int((list(term.exponents) + [0, 0])[0]) *
                       T ** int((list(term.exponents) + [0, 0])[1]) for term in s.grid_work.terms)
            assert l["grid"] == ((work + s.grid_per_block - 1) // s.grid_per_block, 1, 1)
            assert l["ints"][len(s.args):] == [B, T]
        # Temps at multiples of 256 bytes, in plan order, inside the workspace allocated.
        ws_array = fw.allocated[-1]
        offsets, end = {}, 0
        for i, buf in enumerate(plan.buffers):
            if buf.role == service_pb2.TEMP:
                end = (end + 255) // 256 * 256
                offsets[i] = end
                end += sum(int(term.coeff) * B ** int((list(term.exponents) + [0, 0])[0]) *
                           T ** int((list(term.exponents) + [0, 0])[1]) for term in buf.bytes_expr.terms)
        assert offsets and kernel.workspace_bytes([B, T]) == end == ws_array.nbytes
        for l, s in zip(launches, ran):
            for k, arg in enumerate(s.args):
                if arg in offsets:
                    assert l["ptrs"][k] == ws_array.ctypes.data + offsets[arg]
    # No launch at all for an empty tensor; a size past the 32-bit index range is refused.
    fake_driver.launches.clear()
    compiled(_aligned_copy(np.zeros((0, 4), np.float32)))
    assert all(l["grid"][0] > 0 for l in fake_driver.launches)
    with pytest.raises(kiln.KilnError, match="32-bit indices"):
        kernel.workspace_bytes([1 << 20, 1 << 20])


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
