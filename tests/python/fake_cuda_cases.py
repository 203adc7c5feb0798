"""kiln's CUDA path from Python without a GPU, in a process of its own: the client core's CUDA
loader (libkiln_core.so) talks to the fake driver of the C++ loader tests
(tests/unit/kernels/fake_libcuda.cc, soname libcuda.so.1, loaded here before anything opens a
driver), which runs each launch of the generated CUDA source compiled as host C++ against the
software model of CUDA's built-ins (tests/unit/kernels/cuda_emulation.h). "Device memory" is
host memory, so a compiled graph runs on NumPy arrays (through :class:`HostFramework`) and its
outputs are checked against NumPy.

test_jit_cuda.py runs each case as ``python fake_cuda_cases.py CASE`` with ``KILN_SERVER``,
``KILN_BINARY_DIR`` and ``KILN_CORE_LIBRARY`` set; a case fails by raising.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
FAKE = ctypes.CDLL(str(Path(os.environ["KILN_BINARY_DIR"]) / "tests/unit/kernels/libfake_cuda.so"))
FAKE.fake_cuda_launched.restype = ctypes.c_char_p
FAKE.fake_cuda_launch_stream.restype = ctypes.c_void_p
FAKE.fake_cuda_use_library.argtypes = [ctypes.c_void_p]

import kiln  # noqa: E402  (after the fake driver: nothing may open another first)
import kiln.cuda as kcuda  # noqa: E402
from kiln import service_pb2  # noqa: E402
from kiln.loader import aligned_empty  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import assert_labels_match  # noqa: E402
from sample_fns import kmeans, kmeans_inputs, numpy_fn, numpy_fn_inputs  # noqa: E402

TARGET = "cuda:sm_90"
_WORK = tempfile.mkdtemp(prefix="kiln-fake-cuda-")
_units: list[ctypes.CDLL] = []  # emulated kernel libraries stay loaded for the process


def emulate(compiled: Any) -> None:
    """Builds the result's CUDA source as host C++ and makes the fake driver run it."""
    art = compiled.artifact(service_pb2.SOURCE)
    assert art is not None, "a CUDA result carries its source"
    src = Path(_WORK) / f"{compiled.handle[:16]}.cu"
    src.write_bytes(compiled.client.read_verified(art.digest))
    lib = src.with_suffix(".so")
    subprocess.run(["g++", "-std=c++20", "-O1", "-fPIC", "-shared", "-w", "-DKILN_CUDA_EMULATION", "-include",
                    str(ROOT / "tests/unit/kernels/cuda_emulation.h"), "-I", str(ROOT / "kernels/runtime"),
                    "-x", "c++", str(src), "-o", str(lib)], check=True)
    unit = ctypes.CDLL(str(lib))
    _units.append(unit)
    FAKE.fake_cuda_use_library(unit._handle)


def launches(since: int = 0) -> list[str]:
    return [FAKE.fake_cuda_launched(i).decode() for i in range(since, FAKE.fake_cuda_launch_count())]


def aligned_copy(a: np.ndarray) -> np.ndarray:
    o = aligned_empty(a.nbytes).view(a.dtype).reshape(a.shape)
    o[...] = a
    return o


class HostFramework:
    """An array framework over NumPy arrays on "device 0": the fake driver's device memory is
    host memory, so :func:`kiln.cuda.run_compiled` runs its real argument handling on them."""

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
        return aligned_copy(a)

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


def use_host_arrays() -> HostFramework:
    fw = HostFramework()
    kcuda._frameworks["host"] = fw
    kcuda.as_cuda_array = lambda obj, what: (obj, "host")
    return fw


def expect_error(kind: type, text: str, fn: Callable[[], Any]) -> None:
    try:
        fn()
    except kind as e:
        assert text in str(e), f"{kind.__name__} without {text!r}: {e}"
        return
    raise AssertionError(f"no {kind.__name__} ({text!r})")


# ---------------------------------------------------------------------------------- cases

def case_runs_the_plan(client: Any) -> None:
    """A multi-kernel result loaded once per device from its cubin, run on the framework's
    stream, its outputs NumPy's; a launch with too few pointers is refused."""
    fw = use_host_arrays()
    rng = np.random.default_rng(3)
    X, Y = numpy_fn_inputs(rng, n=500, d=8)
    compiled = kiln.jit(numpy_fn, target=TARGET, client=client).compiled_for(X, Y)
    emulate(compiled)
    kernel = compiled.load_cuda(0)
    assert kernel.image_kind == "CUBIN", kernel.image_kind
    assert compiled.load_cuda(0) is kernel  # loaded once per device
    for run in range(2):  # a second call: new outputs, same module
        before = FAKE.fake_cuda_launch_count()
        got = compiled(aligned_copy(X), aligned_copy(Y))
        np.testing.assert_allclose(got, numpy_fn(X.copy(), Y.copy()), rtol=1e-9, atol=1e-12)
        assert launches(before) == [s.kernel for s in compiled.plan.steps], launches(before)
        assert all(FAKE.fake_cuda_launch_stream(i) == 0x55 for i in range(before, FAKE.fake_cuda_launch_count()))
    assert fw.allocated
    expect_error(kiln.KilnError, "takes 3 buffer pointers", lambda: kernel.launch([16, 32], 64, stream=0))


def case_loads_ptx_when_the_cubin_is_refused(client: Any) -> None:
    use_host_arrays()
    FAKE.fake_cuda_refuse_cubin(1)
    FAKE.fake_cuda_set_sm(100)
    x = np.random.default_rng(4).standard_normal((37, 300)).astype(np.float32)
    compiled = kiln.jit(lambda a: np.exp(a) / np.exp(a).sum(axis=-1, keepdims=True), target=TARGET,
                        client=client).compiled_for(x)
    emulate(compiled)
    assert compiled.load_cuda(0).image_kind == "PTX"
    e = np.exp(x.astype(np.float64))
    np.testing.assert_allclose(compiled(aligned_copy(x)), e / e.sum(axis=-1, keepdims=True), rtol=2e-5, atol=1e-7)


def case_refuses_an_older_device(client: Any) -> None:
    FAKE.fake_cuda_set_sm(80)
    x = np.ones((4, 8), np.float32)
    compiled = kiln.jit(lambda a: a * 2, target=TARGET, client=client).compiled_for(x)
    expect_error(kiln.KilnError, "compiled for cuda:sm_90, but device 0 is sm_80", lambda: compiled.load_cuda(0))


def case_prepares_arguments(client: Any) -> None:
    """Inputs that are not contiguous or not 16-byte aligned are copied first; dtypes and
    shapes are checked; the kernels see the copies and compute the right labels."""
    use_host_arrays()
    X, means = kmeans_inputs(np.random.default_rng(5), n=1024, k=4, dtype=np.float32)
    compiled = kiln.jit(kmeans, target=TARGET, client=client).compiled_for(X, means)
    emulate(compiled)
    want = kmeans(X, means)
    labels = compiled(aligned_copy(X), aligned_copy(means))
    assert labels.dtype == np.int64 and labels.shape == (1024,)
    assert_labels_match(labels, X, means, want)
    Xt = np.ascontiguousarray(X.T).T  # a transposed view
    raw = aligned_empty(means.nbytes + 4)
    mis = raw[4:].view(np.float32).reshape(means.shape)  # 4 bytes past alignment
    mis[...] = means
    assert_labels_match(compiled(Xt, mis), X, means, want)
    expect_error(TypeError, "dtype f64, expected f32", lambda: compiled(X.astype(np.float64), aligned_copy(means)))
    expect_error(ValueError, "shape", lambda: compiled(aligned_copy(X[:10]), aligned_copy(means)))


def case_runs_a_symbolic_plan_at_the_call_sizes(client: Any) -> None:
    """One load, run at several sizes: outputs allocated from the shape expressions, the
    workspace sized at the sizes, the launch-time choice among the softmax's kernels made by
    the row length; an empty tensor launches nothing; sizes past the kernels' 32-bit indices
    are refused."""
    fw = use_host_arrays()
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (5, 7), dims=("B", "T"))
    compiled = client.compile(b.build([b.softmax(x, axis=-1), b.sum(x)]), TARGET)
    plan = compiled.plan
    assert plan.abi_version == 2 and [s.name for s in plan.symbols] == ["B", "T"]
    guarded = [s for s in plan.steps if s.guard_min > 0 or s.guard_max > 0]
    assert len(guarded) >= 2, "the softmax chooses its kernel by row length"
    emulate(compiled)
    kernel = compiled.load_cuda(0)
    assert kernel.symbolic and kernel.num_symbols == 2
    rng = np.random.default_rng(6)
    for B, T in ((3, 5), (17, 300), (1, 1), (2, 3000)):
        a = rng.standard_normal((B, T)).astype(np.float32)
        before = FAKE.fake_cuda_launch_count()
        y, t = compiled(aligned_copy(a))
        assert y.shape == (B, T) and t.shape == ()
        e = np.exp(a.astype(np.float64) - a.max(axis=-1, keepdims=True))
        np.testing.assert_allclose(y, e / e.sum(axis=-1, keepdims=True), rtol=2e-5, atol=1e-7)
        np.testing.assert_allclose(t, a.astype(np.float64).sum(), rtol=1e-4, atol=1e-3)
        chosen = [s.kernel for s in guarded if s.guard_min <= T and (s.guard_max == 0 or T <= s.guard_max)]
        assert len(chosen) == 1 and chosen[0] in launches(before), (B, T, launches(before))
        assert not set(launches(before)) & ({s.kernel for s in guarded} - set(chosen))
        assert fw.allocated[-1].nbytes == kernel.workspace_bytes([B, T]) > 0
    before = FAKE.fake_cuda_launch_count()
    y, t = compiled(aligned_copy(np.zeros((0, 4), np.float32)))
    assert y.shape == (0, 4) and float(t) == 0.0
    expect_error(kiln.KilnError, "32-bit indices", lambda: kernel.workspace_bytes([1 << 20, 1 << 20]))


CASES = {name[len("case_"):]: fn for name, fn in globals().items() if name.startswith("case_")}

if __name__ == "__main__":
    with kiln.Client(os.environ["KILN_SERVER"]) as c:
        CASES[sys.argv[1]](c)
    print("ok", sys.argv[1])
