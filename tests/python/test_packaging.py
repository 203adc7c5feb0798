"""The kiln package as users install it: a wheel built from client/python with its standard
build backend, installed into fresh virtualenvs with the oldest and the newest grpcio/protobuf
the package declares, without grpcio-tools. Importing it must generate nothing and warn about
nothing, and it must talk to a real kilnd.

"Newest" is what deploy/setup.sh installed into the project's venv (it takes the newest
releases from PyPI). Wheels come from ``$KILN_WHEELHOUSE`` (setup's wheelhouse) without asking
an index, which is downloaded into only when it lacks one (the oldest pins, on a first run), and
the test venvs are made without pip of their own: this process's pip installs into them.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Optional, Sequence

import pytest

REPO = Path(__file__).resolve().parents[2]
WHEELHOUSE = os.environ.get("KILN_WHEELHOUSE", "")

# The lower bounds pyproject.toml declares, pinned exactly, and the newest releases.
OLDEST = ["grpcio==1.62.0", "protobuf==4.25.0", "numpy==2.0.0"]
NEWEST = [f"{name}=={importlib.metadata.version(name)}" for name in ("grpcio", "protobuf", "numpy")]

SMOKE = r"""
import importlib.util, sys, warnings
warnings.simplefilter("error")
import grpc, google.protobuf, numpy as np
import kiln
assert importlib.util.find_spec("grpc_tools") is None, "grpcio-tools must not be needed"
assert "site-packages" in kiln.__file__, kiln.__file__
import kiln.core
assert str(kiln.core.library_path()).startswith(kiln.__path__[0]), kiln.core.library_path()
print("versions", grpc.__version__, google.protobuf.__version__, np.__version__)
b = kiln.GraphBuilder()
x = b.input("x", "f32", (4, 5))
g = b.build(b.softmax(x, axis=1))
with kiln.Client(sys.argv[1], cache_dir=sys.argv[2]) as c:
    compiled = c.compile(g, "cpu")
    xv = np.arange(20, dtype=np.float32).reshape(4, 5) / 7
    e = np.exp(xv - xv.max(axis=1, keepdims=True))
    np.testing.assert_allclose(compiled(xv), e / e.sum(axis=1, keepdims=True), rtol=1e-5)
print("compiled", compiled.handle[:12])
"""


def _pip(*args: str, target: Optional[Path] = None, fetch: Sequence[str] = (),
         timeout: float = 600) -> subprocess.CompletedProcess:
    """This interpreter's pip, on ``target``'s environment when given; local wheels first, and
    when they do not suffice, ``fetch`` is downloaded into the wheelhouse and the index used."""
    where = ["--python", str(target)] if target is not None else []
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", *where, "-q", *args]
    if WHEELHOUSE:
        local = subprocess.run(cmd + ["--no-index", "--find-links", WHEELHOUSE], cwd="/", timeout=timeout,
                               capture_output=True, text=True)
        if local.returncode == 0:
            return local
        # Something is not in the wheelhouse yet: fetch it there, then use it.
        if fetch:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "-d", WHEELHOUSE, *fetch],
                           check=True, cwd="/", timeout=timeout)
        cmd += ["--find-links", WHEELHOUSE]
    return subprocess.run(cmd, check=True, cwd="/", timeout=timeout, capture_output=True, text=True)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    _pip("wheel", "--no-deps", "-w", str(out), str(REPO / "client" / "python"))
    (built,) = out.glob("kiln-*.whl")
    return built


def test_wheel_core_needs_only_libc(wheel, tmp_path):
    with zipfile.ZipFile(wheel) as z:
        z.extract("kiln/_native/libkiln_core.so", tmp_path)
    core = tmp_path / "kiln" / "_native" / "libkiln_core.so"
    needed = subprocess.run(["objdump", "-p", str(core)], capture_output=True, text=True, check=True).stdout
    libraries = sorted(line.split()[1] for line in needed.splitlines() if line.strip().startswith("NEEDED"))
    assert set(libraries) <= {"libc.so.6", "ld-linux-x86-64.so.2"}, libraries  # glibc and its loader
    exported = subprocess.run(["nm", "-D", "--defined-only", str(core)], capture_output=True, text=True,
                              check=True).stdout.split("\n")
    names = [line.split()[-1] for line in exported if line.strip()]
    assert names and all(n.startswith("kiln_") for n in names), [n for n in names if not n.startswith("kiln_")]


def test_wheel_carries_generated_protocol_and_metadata(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        stamp = z.read("kiln/_proto/STAMP").decode()
        graph_pb2 = z.read("kiln/_proto/kiln/v1/graph_pb2.py").decode()
        grpc_stubs = z.read("kiln/_proto/kiln/v1/service_pb2_grpc.py").decode()
    for f in ("graph_pb2.py", "service_pb2.py", "service_pb2_grpc.py", "graph.proto", "service.proto"):
        assert f"kiln/_proto/kiln/v1/{f}" in names
    assert not any(n.endswith("setup.py") or "hatch_build" in n for n in names)
    # The native part runner and the core's CUDA loader sources kilnd compiles into it.
    loader = {f"kiln/native/client/core/{f}" for f in ("cuda_plan.h", "cuda_plan.cc", "cuda_loader.h", "cuda_loader.cc")}
    assert {"kiln/native/runner.cc", "kiln/native/loader_files.txt"} | loader <= names
    # The native client core, compiled for this platform; its other sources stay out of the wheel.
    assert "kiln/_native/libkiln_core.so" in names
    assert {n for n in names if n.startswith("kiln/native/client/")} == loader
    assert not any(n.startswith(("kiln/native/kernels/", "kiln/native/wire/")) for n in names)
    assert wheel.name.endswith("-py3-none-linux_x86_64.whl"), wheel.name
    # Generated by the pinned generator, whose output carries no runtime version check.
    assert "grpcio-tools==1.62.3" in stamp
    assert "ValidateProtobufRuntimeVersion" not in graph_pb2
    assert "GRPC_GENERATED_VERSION" not in grpc_stubs
    assert "Requires-Dist: grpcio>=1.62" in meta
    assert "Requires-Dist: protobuf<8,>=4.25" in meta or "Requires-Dist: protobuf>=4.25,<8" in meta
    assert "Requires-Dist: torch>=2.2; extra == 'torch'" in meta
    assert "cryptography" not in meta  # signatures are checked by the native core


def test_sdist_carries_the_core_sources_from_outside_client_core():
    """The core compiles kiln's one SHA-256 (kernels/key/sha256.cc) from outside client/core:
    pyproject.toml's sdist force-include must carry every such source of client/core/sources.txt,
    and its header, to kiln/native/<the same path>, where hatch_build.py looks in an sdist."""
    import tomllib

    project = tomllib.loads((REPO / "client" / "python" / "pyproject.toml").read_text())
    carried = project["tool"]["hatch"]["build"]["targets"]["sdist"]["force-include"]
    listed = [line.strip() for line in (REPO / "client" / "core" / "sources.txt").read_text().splitlines()]
    outside = [f for f in listed if f and not f.startswith("#") and not f.startswith("client/core/")]
    assert "kernels/key/sha256.cc" in outside
    for source in outside:
        for f in (source, str(Path(source).with_suffix(".h"))):
            assert (REPO / f).is_file(), f
            assert carried.get(f"../../{f}") == f"kiln/native/{f}", f


@pytest.mark.parametrize("pins", [OLDEST, NEWEST], ids=["oldest", "newest"])
def test_wheel_imports_cleanly_and_compiles_in_a_fresh_venv(wheel, pins, server, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    _pip("install", str(wheel), *pins, target=python, fetch=pins)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KILN_PROTO_DIR", "KILN_CORE_LIBRARY")}
    plain = subprocess.run([str(python), "-W", "error", "-c", "import kiln"], cwd="/", env=env,
                           capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0 and plain.stderr == "", plain.stderr
    run = subprocess.run([str(python), "-c", SMOKE, server, str(tmp_path / "cache")], cwd="/", env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stderr == "", run.stderr
    versions = next(line for line in run.stdout.splitlines() if line.startswith("versions")).split()[1:]
    if pins is OLDEST:
        assert versions == [p.split("==")[1] for p in OLDEST]
    version = subprocess.run([str(venv / "bin" / "kiln"), "--version"], env=env, capture_output=True,
                             text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("kiln "), version
