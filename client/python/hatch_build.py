"""hatchling build hook: generates kiln's protocol modules and compiles kiln's native client
core while the wheel is built.

The modules come from the repository's proto/ (or the copy an sdist carries) through the
grpcio-tools pinned in pyproject.toml's build requirements, so an installed kiln never needs the
generator. A regular wheel gets them from a scratch folder, leaving the source tree alone; an
editable install runs the package from the source tree, so they are written into kiln/_proto
there (ignored by git).

The wheel also carries the client core's CUDA loader sources (client/core/cuda_plan.* and
cuda_loader.*, listed in kiln/native/loader_files.txt) beside the native part runner
(kiln/native/client/core), which kilnd compiles into it: one loader for every client and the
runner. An sdist carries the whole core at that place already.

The native client core (client/core, ``libkiln_core.so``: the artifact store and the CPU and CUDA
loaders behind kiln.core) is compiled here with the system's C++ compiler ($CXX, else c++) into
``kiln/_native/``, which makes the wheel a platform wheel (``py3-none-<platform>``: the core is
reached through ctypes, so one wheel serves every Python version). OpenSSL's libcrypto and the
C++ runtime are linked in statically, so the library needs only libc wherever the wheel goes.
A C++ compiler and OpenSSL's headers are what building needs (deploy/setup.sh installs both).
Why not CMake through scikit-build-core: the core is a handful of files with no dependency CMake
would find better than the compiler does, and this keeps one backend (hatchling) for the protocol
modules and the core alike.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import os
import shutil
import subprocess
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


def _load_protogen(root: Path) -> Any:
    # Loaded by path: importing the kiln package would need the very modules being generated.
    spec = importlib.util.spec_from_file_location("_kiln_protogen", root / "kiln" / "_protogen.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The core's files, relative to the repository root (an sdist carries them at the same paths
# under kiln/native/): the library sources listed in client/core/sources.txt (CMake reads the
# same list; it names them from the root, as some, kernels/key/sha256.cc and the wire/ files,
# are shared with the rest of kiln), the C ABI, and the headers and linker version script beside
# them.
CORE_DIR = "client/core"
CORE_LIST = f"{CORE_DIR}/sources.txt"


def core_sources(src: Path) -> list[str]:
    """The core's sources under ``src``: those of sources.txt, then the C ABI."""
    listed = [line.strip() for line in (src / CORE_LIST).read_text().splitlines()]
    return [f for f in listed if f and not f.startswith("#")] + [f"{CORE_DIR}/c_api.cc"]


def core_headers(src: Path) -> list[str]:
    """The headers, the version script and the list, whose changes rebuild the core too."""
    found = sorted(p.name for p in (src / CORE_DIR).iterdir() if p.suffix == ".h")
    # The header of each listed source from elsewhere in the repository (sha256.h).
    shared = [str(Path(f).with_suffix(".h")) for f in core_sources(src) if not f.startswith(f"{CORE_DIR}/")]
    return [f"{CORE_DIR}/{f}" for f in found] + shared + [f"{CORE_DIR}/exports.map", CORE_LIST]


def _core_source_root(root: Path) -> Path:
    """Where the core's sources are: the sdist's kiln/native/, else the repository around client/python."""
    for candidate in (root / "kiln" / "native", root.parent.parent):
        if (candidate / CORE_LIST).is_file() and all((candidate / f).is_file() for f in core_sources(candidate)):
            return candidate
    raise RuntimeError(f"kiln: the native core's sources ({CORE_LIST} and what it lists) are neither under "
                       f"{root / 'kiln' / 'native'} nor under {root.parent.parent}")


def _libcrypto(cxx: str) -> list[str]:
    """The static libcrypto when the toolchain has one (the library then needs only libc), else
    the shared one."""
    found = subprocess.run([cxx, "-print-file-name=libcrypto.a"], capture_output=True, text=True).stdout.strip()
    return [found] if os.path.isabs(found) and os.path.isfile(found) else ["-lcrypto"]


def build_core(src: Path, out: Path) -> None:
    """Compiles libkiln_core.so from the sources under ``src`` into ``out`` (skipped when ``out``
    is newer than every source, for repeated editable installs)."""
    sources = core_sources(src)
    inputs = [src / f for f in sources + core_headers(src)]
    if out.is_file() and out.stat().st_mtime >= max(p.stat().st_mtime for p in inputs):
        return
    cxx = os.environ.get("CXX", "c++")
    flags = ["-std=c++20", "-O2", "-fPIC", "-fvisibility=hidden", f"-I{src}"]
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kiln-core-") as tmp:
        objects = [Path(tmp) / (Path(f).stem + ".o") for f in sources]

        def compile_one(pair: tuple[str, Path]) -> None:
            source, obj = pair
            subprocess.run([cxx, *flags, "-c", str(src / source), "-o", str(obj)], check=True)

        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            list(pool.map(compile_one, zip(sources, objects)))
        linked = Path(tmp) / "libkiln_core.so"
        subprocess.run([cxx, "-shared", "-o", str(linked), *map(str, objects), "-static-libstdc++", "-static-libgcc",
                        "-Wl,--no-undefined", "-Wl,--exclude-libs,ALL", "-s",
                        f"-Wl,--version-script={src / 'client/core/exports.map'}", *_libcrypto(cxx), "-ldl",
                        "-lpthread"], check=True)
        os.replace(linked, out)


def platform_tag() -> str:
    return sysconfig.get_platform().replace("-", "_").replace(".", "_")


class ProtocolModulesHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        root = Path(self.root)
        gen = _load_protogen(root)
        proto_root = gen.find_proto_root(root, bundled=False)
        if proto_root is None:
            raise RuntimeError(f"kiln: no kiln/v1/*.proto under {root} or its parents (set KILN_PROTO_DIR)")
        # The native core: a platform wheel for every Python 3.
        build_data["pure_python"] = False
        build_data["tag"] = f"py3-none-{platform_tag()}"
        src = _core_source_root(root)
        # The core's CUDA loader sources, which the native part runner compiles too (one list,
        # read by kiln.native as well).
        if version != "editable":
            for f in (root / "kiln" / "native" / "loader_files.txt").read_text().split():
                build_data["force_include"][str(src / "client" / "core" / f)] = f"kiln/native/client/core/{f}"
        if version == "editable":
            build_core(src, root / "kiln" / "_native" / "libkiln_core.so")
            gen.generate(proto_root, root / "kiln" / "_proto")
            return
        self._scratch = Path(tempfile.mkdtemp(prefix="kiln-proto-"))
        gen.generate(proto_root, self._scratch / "proto")
        build_data["force_include"][str(self._scratch / "proto")] = "kiln/_proto"
        build_core(src, self._scratch / "libkiln_core.so")
        build_data["force_include"][str(self._scratch / "libkiln_core.so")] = "kiln/_native/libkiln_core.so"

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        scratch = getattr(self, "_scratch", None)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
