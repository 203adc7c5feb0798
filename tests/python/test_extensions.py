"""Custom kernels built by kilnd: PyTorch extensions (kiln.torch.load / load_inline), raw CUDA
kernels (kiln.cuda.RawKernel), their sandbox, and prewarm of recorded builds. CUDA extensions:
TORCH_CUDA_ARCH_LIST read as cpp_extension reads it, and a .cu built for sm_90a by an nvcc whose
toolkit is named through a chain of symlinks (compiled and linked only: no GPU is needed).

A private kilnd with tight build limits serves the module. The LLTM extension (tests/ext/lltm)
is built once (about 20 s of g++ on torch/extension.h) and reused; a second process with an
empty local cache must get it without a build.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

import kiln
import kiln.cuda
from kiln.errors import KilnError, RpcError
from kiln.recorder import Recorder

from conftest import CLIENT_DIR, private_kilnd
from helpers import import_torch

torch = import_torch()
import kiln.torch  # noqa: E402  (after torch, which it needs)

REPO = Path(__file__).resolve().parents[2]
LLTM = REPO / "tests" / "ext" / "lltm"
sys.path.insert(0, str(LLTM))
from reference import lltm_reference, make_function, random_inputs  # noqa: E402

LIMITS = ["--build-timeout-s=90", "--build-memory=4GiB", "--build-max-processes=64", "--negative-cache-s=120"]


@pytest.fixture(scope="module")
def ext_kilnd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    yield from private_kilnd(tmp_path_factory, "kilnd-ext", LIMITS)


@pytest.fixture(scope="module")
def record_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ext-recordings")


@pytest.fixture(scope="module")
def ext_client(ext_kilnd: Any, record_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[kiln.Client]:
    c = kiln.Client(ext_kilnd.address, cache_dir=tmp_path_factory.mktemp("ext-client-cache"),
                    recorder=Recorder(record_dir))
    from kiln.v1 import service_pb2

    # A host where the sandbox cannot run refuses every build, saying why: fail on that at once.
    probe = _try(lambda: c._call("BuildExtension", service_pb2.BuildExtensionRequest(name="x"), 10))
    assert probe is not None and "sandbox" not in str(probe), f"custom builds are off: {probe}"
    yield c
    c.close()


def _try(fn: Any) -> Any:
    try:
        fn()
    except RpcError as e:
        return e
    return None


@pytest.fixture(scope="module")
def lltm(ext_client: kiln.Client) -> Any:
    return kiln.torch.load("lltm_cpp", [LLTM / "lltm.cpp"], client=ext_client)


def _run_both(module: Any, *shape: int, seed: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Outputs and input gradients of the extension and of the reference, same inputs."""
    results = []
    for impl in (make_function(module).apply, lltm_reference):
        xs = random_inputs(*shape, seed=seed)
        h, c = impl(*xs)
        (h * torch.linspace(-1, 1, h.shape[1], dtype=h.dtype) + 0.5 * c).sum().backward()
        results.append([h.detach(), c.detach()] + [x.grad for x in xs])
    return results[0], results[1]


@pytest.mark.parametrize("shape", [(4, 5, 6), (1, 3, 2), (17, 32, 8)])
def test_lltm_extension_matches_python(lltm: Any, shape: tuple[int, int, int]) -> None:
    got, want = _run_both(lltm, *shape, seed=sum(shape))
    for g, w, what in zip(got, want, ["new_h", "new_cell", "d_input", "d_weights", "d_bias", "d_old_h", "d_old_cell"]):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12, msg=what)


def test_lltm_extension_passes_gradcheck(lltm: Any) -> None:
    fn = make_function(lltm)
    assert torch.autograd.gradcheck(fn.apply, random_inputs(3, 4, 5, seed=7))


def test_second_process_gets_the_module_without_building(lltm: Any, ext_kilnd: Any, tmp_path: Path) -> None:
    before = kiln.Client(ext_kilnd.address).stats()
    script = textwrap.dedent(f"""
        import json, sys, time
        t0 = time.perf_counter()
        import torch
        sys.path.insert(0, {str(LLTM)!r})
        import kiln, kiln.torch
        from reference import lltm_reference, make_function, random_inputs
        c = kiln.Client({ext_kilnd.address!r}, cache_dir={str(tmp_path / 'fresh-cache')!r})
        t1 = time.perf_counter()
        m = kiln.torch.load("lltm_cpp", [{str(LLTM / 'lltm.cpp')!r}], client=c)
        t2 = time.perf_counter()
        xs = random_inputs(5, 6, 7, seed=3)
        h, cell = make_function(m).apply(*xs)
        rh, rc = lltm_reference(*xs)
        print(json.dumps({{"ok": bool(torch.allclose(h, rh) and torch.allclose(cell, rc)), "load_s": t2 - t1}}))
    """)
    env = {"PYTHONPATH": str(CLIENT_DIR), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["ok"]
    after = kiln.Client(ext_kilnd.address).stats()
    assert after.ext_builds == before.ext_builds, "the second process built the module again"
    assert after.ext_cache_hits == before.ext_cache_hits + 1


def test_tree_digests_are_remembered_and_a_changed_file_is_hashed_again(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    import kiln.ext as kext

    root, cache = tmp_path / "inc", tmp_path / "cache"
    for rel, text in {"a.h": "int a;", "sub/b.h": "int b;", "sub/deep/c.h": "int c;", "tab\tname.h": "int t;",
                      ".hidden/x.h": "int x;", "__pycache__/y.h": "int y;"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    opened: list[str] = []

    def counting_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(os.path.basename(str(path)))
        return builtins.open(path, *args, **kwargs)

    monkeypatch.setattr(kext, "open", counting_open, raising=False)
    first = kext.tree_of_folder(root, cache_dir=cache)
    assert [f.path for f in first.files] == ["a.h", "sub/b.h", "sub/deep/c.h", "tab\tname.h"]
    assert sorted(opened) == ["a.h", "b.h", "c.h", "tab\tname.h"]
    # A later process: every digest but the unrememberable name's comes from the memo.
    opened.clear()
    again = kext.tree_of_folder(root, cache_dir=cache)
    assert again.digest == first.digest and opened == ["tab\tname.h"]
    # A changed file (same size, new bytes) is read again, and only it.
    opened.clear()
    (root / "sub" / "b.h").write_text("int B;")
    changed = kext.tree_of_folder(root, cache_dir=cache)
    assert sorted(opened) == ["b.h", "tab\tname.h"] and changed.digest != first.digest
    assert changed.files[1].digest == kext.hashlib.sha256(b"int B;").hexdigest()


def test_upload_over_many_calls_holds_every_file_before_a_manifest(ext_client: kiln.Client, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Several UploadBlobs calls are in flight at once; still no manifest reaches kilnd before
    the files it names (a second client that finds the tree would skip the files)."""
    import kiln.ext as kext
    from kiln.v1 import service_pb2

    root = tmp_path / "many"
    for i in range(40):
        (root / f"d{i % 4}").mkdir(parents=True, exist_ok=True)
        (root / f"d{i % 4}" / f"h{i}.h").write_text(f"// {tmp_path.name} {i}\n" + "x" * (100 + i))
    trees = [kext.tree_of_folder(root), kext.Tree.from_bytes({"only.h": f"// {tmp_path.name}".encode()})]
    manifests = {t.digest for t in trees}
    monkeypatch.setattr(kext, "UPLOAD_BATCH_BYTES", 300)
    events: list[tuple[str, bool]] = []
    real_call = ext_client._call

    def call(method: str, request: Any, timeout: Any) -> Any:
        if method != "UploadBlobs":
            return real_call(method, request, timeout)
        has_manifest = any(kext.hashlib.sha256(b).hexdigest() in manifests for b in request.blobs)
        events.append(("start", has_manifest))
        time.sleep(0.02)  # calls overlap
        try:
            return real_call(method, request, timeout)
        finally:
            events.append(("end", has_manifest))

    monkeypatch.setattr(ext_client, "_call", call)
    sent = kext.ensure_uploaded(ext_client, trees)
    assert sent == sum(f.size for t in trees for f in t.files) + sum(len(t.manifest) for t in trees)
    starts = [i for i, (what, _) in enumerate(events) if what == "start"]
    assert len(starts) >= 10
    first_manifest = next(i for i, e in enumerate(events) if e == ("start", True))
    file_ends = [i for i, e in enumerate(events) if e == ("end", False)]
    assert len(file_ends) == sum(e == ("start", False) for e in events) and max(file_ends) < first_manifest
    # Some file calls overlapped (a second started before the first ended).
    assert events[1][0] == "start"
    all_digests = [d for t in trees for d in [t.digest] + [f.digest for f in t.files]]
    left = real_call("FindMissingBlobs", service_pb2.FindMissingBlobsRequest(digests=all_digests), 10).missing
    assert list(left) == []
    assert kext.ensure_uploaded(ext_client, trees) == 0


def test_load_inline(ext_client: kiln.Client) -> None:
    source = textwrap.dedent("""
        torch::Tensor scaled_sum(torch::Tensor a, torch::Tensor b, double s) {
          TORCH_CHECK(a.sizes() == b.sizes(), "shapes differ");
          return a + s * b;
        }
    """)
    m = kiln.torch.load_inline("kiln_inline_test", source, functions=["scaled_sum"], client=ext_client)
    a, b = torch.randn(7, 3, dtype=torch.float64), torch.randn(7, 3, dtype=torch.float64)
    torch.testing.assert_close(m.scaled_sum(a, b, 2.5), a + 2.5 * b)
    with pytest.raises(RuntimeError, match="shapes differ"):
        m.scaled_sum(a, b[:2], 1.0)


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def _build_error(ext_client: kiln.Client, sources: list[Path], **kw: Any) -> RpcError:
    with pytest.raises(RpcError) as info:
        kiln.torch.build("kiln_bad_ext", sources, client=ext_client, **kw)
    return info.value


def test_pytorch_headers_are_system_headers_and_the_callers_are_not(ext_client: kiln.Client, tmp_path: Path) -> None:
    """PyTorch's and Python's include trees go up as system headers (-isystem, as cpp_extension
    names them: their warnings are not the build's); an extra_include_paths folder stays -I, and
    kilnd honours the difference: a warning in a header of the caller's shows in the build log,
    the same header as a system header warns of nothing."""
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "noisy.h").write_text("static int kiln_unused_helper() { return 0; }\n")
    src = _write(tmp_path, "m.cpp", """
        #include "noisy.h"
        int kiln_answer() { return 42; }
    """)
    prepared = kiln.torch.extension.prepare("kiln_noisy", [src], extra_cflags=["-Wall"], extra_include_paths=[inc],
                                            cache_dir=tmp_path / "cache")
    system = [d.system for d in prepared.request.include_dirs]
    assert system[0] is False and len(system) > 1 and all(system[1:]), prepared.request.include_dirs
    _, plain = kiln.torch.extension.build_prepared(prepared, ext_client)
    assert "kiln_unused_helper" in plain.log, plain.log
    prepared.request.include_dirs[0].system = True
    _, quiet = kiln.torch.extension.build_prepared(prepared, ext_client)
    assert quiet.handle != plain.handle and "kiln_unused_helper" not in quiet.log, quiet.log


def test_compile_error_returns_diagnostics_and_is_remembered(ext_client: kiln.Client, tmp_path: Path) -> None:
    src = _write(tmp_path, "broken.cpp", """
        int broken(int x) { return x +; }
    """)
    err = _build_error(ext_client, [src])
    assert err.code == "INVALID_ARGUMENT"
    assert "/src/broken.cpp" in str(err) and "error" in str(err)
    assert str(tmp_path) not in str(err), "diagnostics name a client path"
    builds = ext_client.stats().ext_builds
    again = _build_error(ext_client, [src])
    assert again.code == "INVALID_ARGUMENT" and "/src/broken.cpp" in str(again)
    assert ext_client.stats().ext_builds == builds, "a remembered failure was built again"


@pytest.mark.parametrize("flag", ["-fplugin=/tmp/evil.so", "-specs=/tmp/evil.specs", "-B/tmp/evil", "-wrapper",
                                  "-fuse-ld=/tmp/evil-ld", "@/tmp/evil-args", "-Wl,--plugin,/tmp/evil.so"])
def test_code_loading_flags_are_refused(ext_client: kiln.Client, tmp_path: Path, flag: str) -> None:
    src = _write(tmp_path, "ok.cpp", "int ok() { return 1; }\n")
    builds = ext_client.stats().ext_builds
    err = _build_error(ext_client, [src], extra_cflags=[flag])
    assert err.code == "INVALID_ARGUMENT"
    assert flag in str(err) and "not allowed" in str(err)
    assert ext_client.stats().ext_builds == builds


def test_nvcc_host_compiler_flag_is_refused(ext_client: kiln.Client, tmp_path: Path) -> None:
    from kiln import ext
    from kiln.v1 import service_pb2

    tree = ext.Tree.from_bytes({"k.cu": b"__global__ void k() {}\n"})
    req = service_pb2.BuildExtensionRequest(name="k", source_tree=tree.digest, compile=["k.cu"], cuda_archs=[90],
                                            cuda_cflags=["-ccbin", "/tmp/evil-gcc"])
    with pytest.raises(RpcError) as info:
        ext.build_extension(ext_client, req, [tree])
    assert info.value.code == "INVALID_ARGUMENT" and "-ccbin" in str(info.value)


def test_includes_outside_the_input_root_fail_without_leaking(ext_client: kiln.Client, ext_kilnd: Any, tmp_path: Path) -> None:
    secret = tmp_path / "secret.h"
    secret.write_text("this_is_a_secret_token_4711\n")
    cache_file = next(p for p in Path(ext_kilnd.cache_dir).rglob("*") if p.is_file())
    for target in ["/etc/passwd", str(secret), str(cache_file), "../../../../../../etc/hostname", "/root/.bashrc"]:
        src = _write(tmp_path, "peek.cpp", f'#include "{target}"\nint peek() {{ return 0; }}\n')
        err = _build_error(ext_client, [src])
        assert err.code == "INVALID_ARGUMENT", (target, err)
        assert "No such file" in str(err), (target, err)
        for leak in ("root:x:", "this_is_a_secret_token_4711"):
            assert leak not in str(err), (target, err)


def test_endless_include_stops_at_a_limit_and_kilnd_keeps_serving(ext_client: kiln.Client, tmp_path: Path,
                                                                  rng: Any) -> None:
    src = _write(tmp_path, "endless.cpp", '#include "/dev/zero"\n')
    start = time.monotonic()
    err = _build_error(ext_client, [src])
    elapsed = time.monotonic() - start
    assert err.code in ("RESOURCE_EXHAUSTED", "INVALID_ARGUMENT"), err
    assert elapsed < 120, f"the build ran {elapsed:.0f} s, past its 90 s limit"
    # Still serving: graph compiles and stats.
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (4, 5))
    k = ext_client.compile(b.build(b.exp(x)))
    import numpy as np

    a = rng.standard_normal((4, 5)).astype(np.float32)
    np.testing.assert_allclose(k(a), np.exp(a), rtol=1e-5)
    assert ext_client.stats().ext_failures >= 1


RAW_SOURCE = """
template <typename T>
__global__ void scale(T* x, T a, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) x[i] *= a;
}
extern "C" __global__ void add_one(float* x, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) x[i] += 1.0f;
}
"""


def test_raw_kernels_compile_on_kilnd_and_are_cached(ext_client: kiln.Client) -> None:
    k = kiln.cuda.RawKernel(RAW_SOURCE, "scale<float>", client=ext_client)
    try:
        cubin, lowered = k.compile(90)
    except RpcError as e:
        if e.code == "FAILED_PRECONDITION" and "NVRTC" in str(e):
            pytest.skip(f"kilnd has no NVRTC here: {e}")
        raise
    assert cubin[:4] == b"\x7fELF"
    assert lowered.startswith("_Z") and "scale" in lowered
    assert kiln.cuda.RawKernel(RAW_SOURCE, "add_one", client=ext_client).compile(90)[1] == "add_one"
    builds, hits = ext_client.stats().ext_builds, ext_client.stats().ext_cache_hits
    again = kiln.cuda.RawKernel(RAW_SOURCE, "scale<float>", client=ext_client).compile(90)
    assert again == (cubin, lowered)
    s = ext_client.stats()
    assert (s.ext_builds, s.ext_cache_hits) == (builds, hits + 1)
    with pytest.raises(RpcError) as info:
        kiln.cuda.RawKernel("__global__ void broken( { }", "broken", client=ext_client).compile(90)
    assert info.value.code == "INVALID_ARGUMENT" and "error" in str(info.value)
    with pytest.raises(RpcError) as info:
        kiln.cuda.RawKernel(RAW_SOURCE, "add_one", options=["-arch=sm_80"], client=ext_client).compile(90)
    assert info.value.code == "INVALID_ARGUMENT"


def test_prewarm_replays_recorded_builds(lltm: Any, ext_client: kiln.Client, record_dir: Path,
                                         tmp_path_factory: pytest.TempPathFactory) -> None:
    """The recordings of this module's builds, replayed by `kiln prewarm` into a fresh kilnd:
    afterwards the same loads are cache hits there."""
    kiln.cuda.RawKernel(RAW_SOURCE, "add_one", client=ext_client)  # recorded when it compiled
    records = sorted(record_dir.glob("*.kbuild"))
    kinds = {json.loads(p.read_text())["kind"] for p in records}
    assert "extension" in kinds
    gen = private_kilnd(tmp_path_factory, "kilnd-ext-prewarm", LIMITS)
    fresh = next(gen)
    try:
        from kiln.cli import main

        assert main(["prewarm", str(record_dir), "--target", "cpu", "--server", fresh.address]) == 0
        c = kiln.Client(fresh.address, cache_dir=tmp_path_factory.mktemp("prewarmed-client"))
        built = c.stats().ext_builds
        assert built >= 1
        kiln.torch.build("lltm_cpp", [LLTM / "lltm.cpp"], client=c)
        s = c.stats()
        assert s.ext_builds == built and s.ext_cache_hits >= 1
    finally:
        next(gen, None)


# TORCH_CUDA_ARCH_LIST values and what cpp_extension builds for them (PyTorch 2.15's grammar).
ARCH_LISTS = [
    ("9.0a", ["9.0a"]),
    ("8.0;9.0+PTX", ["8.0", "9.0+PTX"]),
    ("7.5 8.6", ["7.5", "8.6"]),
    ("9.0;9.0+PTX", ["9.0+PTX"]),
    ("10.0a+PTX 12.0", ["10.0a+PTX", "12.0"]),
    ("Ampere;Hopper", ["8.0", "8.6+PTX", "9.0+PTX"]),
    ("Ampere+Tegra Volta", ["7.0+PTX", "8.7"]),
    ("Blackwell", ["10.0", "10.3", "12.0", "12.1+PTX"]),
    (" 8.0;;9.0a ", ["8.0", "9.0a"]),  # empty items are skipped (cpp_extension refuses them)
]


def _torch_gencode_flags() -> Optional[list[str]]:
    """cpp_extension's own -gencode flags for the current TORCH_CUDA_ARCH_LIST, where this
    PyTorch has the (private) function."""
    import torch.utils.cpp_extension as cpp

    fn = getattr(cpp, "_get_cuda_arch_flags", None)
    return None if fn is None else fn()


def _gencode_flags(archs: list[Any]) -> list[str]:
    flags = set()
    for a in archs:
        n = f"{a.sm}{'a' if a.arch_specific else ''}"
        flags.add(f"-gencode=arch=compute_{n},code=sm_{n}")
        if a.ptx:
            flags.add(f"-gencode=arch=compute_{n},code=compute_{n}")
    return sorted(flags)


@pytest.mark.parametrize("text,want", ARCH_LISTS)
def test_cuda_arch_list_reads_as_cpp_extension_does(text: str, want: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", text)
    got = kiln.torch.extension.cuda_archs()
    assert [str(a) for a in got] == want
    if text.strip() == text and ";;" not in text:
        theirs = _torch_gencode_flags()
        assert theirs is None or _gencode_flags(got) == theirs


@pytest.mark.parametrize("text,bad", [("9.0f", "9.0f"), ("8.0,9.0", "8.0,9.0"), ("sm_90", "sm_90"), ("90", "90"),
                                      ("8.0;8.9a", "8.9a"), ("9.0+ptx", "9.0+ptx"), ("Hopper+PTX", "Hopper+PTX"),
                                      ("9", "9"), ("hopper", "hopper")])
def test_cuda_arch_list_refuses_what_cpp_extension_refuses(text: str, bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", text)
    with pytest.raises(KilnError, match=f"TORCH_CUDA_ARCH_LIST: unknown CUDA architecture '{re.escape(bad)}'") as info:
        kiln.torch.extension.cuda_archs()
    assert "9.0a" in str(info.value) and "Hopper" in str(info.value), "the message lists what is known"
    if "," in text:
        assert "separate architectures with ';' or spaces" in str(info.value)
    import torch.utils.cpp_extension as cpp

    if hasattr(cpp, "_get_cuda_arch_flags"):  # and cpp_extension refuses it too
        with pytest.raises(ValueError):
            cpp._get_cuda_arch_flags()


@pytest.mark.parametrize("env", [None, "", "native"])
@pytest.mark.parametrize("caps,built,want", [
    ([(9, 0), (8, 0), (9, 0)], ["sm_80", "sm_90"], ["8.0", "9.0+PTX"]),
    ([(12, 0)], ["sm_80", "sm_90", "sm_100"], ["10.0+PTX"]),  # capped at what PyTorch was built for
])
def test_without_a_list_the_visible_devices_as_cpp_extension(env: Optional[str], caps: list[tuple[int, int]],
                                                             built: list[str], want: list[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    if env is None:
        monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    else:
        monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", env)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(caps))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: caps[i])
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: built)
    got = kiln.torch.extension.cuda_archs()
    assert [str(a) for a in got] == want
    theirs = _torch_gencode_flags()
    assert theirs is None or _gencode_flags(got) == theirs


def test_explicit_archs_take_numbers_and_arch_list_items() -> None:
    archs = kiln.torch.extension.cuda_archs([90, "9.0a+PTX", "Ampere"])
    assert [str(a) for a in archs] == ["8.0", "8.6+PTX", "9.0", "9.0a+PTX"]
    assert [str(a) for a in kiln.torch.extension.cuda_archs("8.0 9.0a")] == ["8.0", "9.0a"]
    with pytest.raises(KilnError, match="cuda_archs_list: unknown CUDA architecture '9.1'"):
        kiln.torch.extension.cuda_archs(["9.1"])


@pytest.mark.parametrize("text,plain,variants", [
    ("8.0 9.0", [80, 90], []),
    ("9.0a", [], [(90, True, False)]),
    ("8.0;9.0+PTX", [], [(80, False, False), (90, False, True)]),
])
def test_request_carries_variants_in_cuda_arch_list(text: str, plain: list[int], variants: list[tuple[int, bool, bool]],
                                                    tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain lists keep the form older servers read (cuda_archs); any variant sends all of them
    in cuda_arch_list, which an older server would not build for silently wrong archs."""
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", text)
    src = _write(tmp_path, "k.cu", "__global__ void k() {}\n")
    req = kiln.torch.extension.prepare("k", [src], cache_dir=tmp_path / "cache").request
    assert list(req.cuda_archs) == plain
    assert [(a.sm, a.arch_specific, a.ptx) for a in req.cuda_arch_list] == variants


@pytest.mark.parametrize("torch_std", ["c++17", "c++20"])
def test_cxx_standard_is_the_one_pytorch_builds_extensions_with(torch_std: str, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """C++ and CUDA sources compile under the -std= PyTorch's own cpp_extension would pass (a
    source that builds there builds here), unless the caller names one; a PyTorch whose
    ninja-file writer names none gets C++17."""
    import torch.utils.cpp_extension as cpp

    # What the helper reads is the writer's source: a writer of that PyTorch, from a file.
    fake = tmp_path / f"fake_cpp_extension_{torch_std[3:]}.py"
    fake.write_text(f"def writer(cflags):\n    cflags.append('-std={torch_std}')\n")
    spec = importlib.util.spec_from_file_location(fake.stem, fake)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(cpp, "_write_ninja_file_to_build_library", module.writer)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    src = [_write(tmp_path, "m.cpp", "int f() { return 1; }\n"), _write(tmp_path, "k.cu", "__global__ void k() {}\n")]
    req = kiln.torch.extension.prepare("k", src, cache_dir=tmp_path / "cache").request
    assert [f for f in req.cflags if f.startswith("-std=")] == [f"-std={torch_std}"]
    assert [f for f in req.cuda_cflags if f.startswith("-std=")] == [f"-std={torch_std}"]
    named = kiln.torch.extension.prepare("k", src, extra_cuda_cflags=["-std=c++20"], cache_dir=tmp_path / "cache").request
    assert [f for f in named.cuda_cflags if f.startswith("-std=")] == ["-std=c++20"]
    monkeypatch.setattr(cpp, "_write_ninja_file_to_build_library", lambda: None)
    bare = kiln.torch.extension.prepare("k", src, cache_dir=tmp_path / "cache").request
    assert [f for f in bare.cflags if f.startswith("-std=")] == ["-std=c++17"]


@pytest.mark.parametrize("arch,message", [((86, True, False), "cuda_arch_list: sm_86a does not exist"),
                                          ((300, False, True), "cuda_arch_list: sm_300 is not"),
                                          ((45, False, False), "cuda_arch_list: sm_45 is not")])
def test_server_refuses_architectures_naming_field_and_value(ext_client: kiln.Client, arch: tuple[int, bool, bool],
                                                             message: str) -> None:
    from kiln import ext
    from kiln.v1 import service_pb2

    tree = ext.Tree.from_bytes({"k.cu": b"__global__ void k() {}\n"})
    req = service_pb2.BuildExtensionRequest(name="k", source_tree=tree.digest, compile=["k.cu"])
    req.cuda_arch_list.add(sm=arch[0], arch_specific=arch[1], ptx=arch[2])
    with pytest.raises(RpcError) as info:
        ext.build_extension(ext_client, req, [tree])
    assert info.value.code == "INVALID_ARGUMENT" and message in str(info.value)


def _cuda_toolkit_root() -> Optional[Path]:
    """The real root of this machine's CUDA toolkit, found as cpp_extension finds it."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if not home:
        nvcc = shutil.which("nvcc")
        home = str(Path(nvcc).parent.parent) if nvcc else "/usr/local/cuda"
    root = Path(home).resolve()
    return root if (root / "bin" / "nvcc").is_file() else None


SM90A_SOURCE = """
#include "{toolkit}/include/cuda_runtime.h"
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "this device code was not built for sm_90a"
#endif
__global__ void scale(float* x, float a, int n) {{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= a;
}}
void launch_scale(float* x, float a, int n) {{ scale<<<(n + 255) / 256, 256>>>(x, a, n); }}
"""


@pytest.mark.parametrize("named_by", ["--nvcc", "CUDA_HOME"])
def test_cu_extension_for_sm90a_with_a_toolkit_named_through_links(named_by: str, tmp_path: Path,
                                                                   tmp_path_factory: pytest.TempPathFactory,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """nvcc named as <tmp>/cuda/bin/nvcc, where cuda -> cuda-link -> the real toolkit (as
    /usr/local/cuda -> /etc/alternatives/cuda -> /usr/local/cuda-13.0 on NVIDIA's images): kilnd
    finds it (by --nvcc, or by $CUDA_HOME with no nvcc on $PATH), runs it by its real path in
    the sandbox, where the source's include through the linked name resolves, and builds for
    TORCH_CUDA_ARCH_LIST=9.0a+PTX."""
    real = _cuda_toolkit_root()
    if real is None:
        pytest.skip("no CUDA toolkit on this machine")
    links = tmp_path_factory.mktemp("toolkit-links")
    (links / "cuda-link").symlink_to(real)
    (links / "cuda").symlink_to("cuda-link")
    args = list(LIMITS)
    with monkeypatch.context() as env:  # kilnd's environment only
        env.setenv("PATH", "/usr/bin:/bin")
        env.delenv("CUDA_PATH", raising=False)
        if named_by == "--nvcc":
            env.delenv("CUDA_HOME", raising=False)
            args.append(f"--nvcc={links}/cuda/bin/nvcc")
        else:
            env.setenv("CUDA_HOME", str(links / "cuda"))
        gen = private_kilnd(tmp_path_factory, "kilnd-linked-toolkit", args)
        daemon = next(gen)
    try:
        client = kiln.Client(daemon.address, cache_dir=tmp_path / "client-cache")
        src = _write(tmp_path, "scale90a.cu", SM90A_SOURCE.format(toolkit=links / "cuda"))
        monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a+PTX")
        path = kiln.torch.build("kiln_scale90a", [src], client=client)
        assert path.read_bytes()[:4] == b"\x7fELF"
        assert client.stats().ext_builds == 1
        client.close()
    finally:
        next(gen, None)
