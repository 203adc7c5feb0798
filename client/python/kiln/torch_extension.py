"""PyTorch C++/CUDA extensions built by kilnd: drop-in counterparts of
``torch.utils.cpp_extension.load`` and ``load_inline``.

The build runs on kilnd, in its sandbox, and its result is cached there cluster-wide: a second
machine (or a fresh container) with the same sources, flags and PyTorch gets the module from
the cache instead of running g++ and nvcc again. The key covers the sources and the header
trees they compile against (PyTorch's, Python's, any ``extra_include_paths``) by digest, the
flags, the CUDA archs, the Python ABI tag and PyTorch's ABI facts, and kilnd adds its
compilers' versions.

Flags follow ``cpp_extension``: ``-DTORCH_EXTENSION_NAME=<name>``,
``-DTORCH_API_INCLUDE_EXTENSION_H``, ``-fPIC`` and the C++ standard the installed PyTorch's
``cpp_extension`` compiles with (``-std=c++17`` up to 2.11, C++20 later: a source that builds
there builds here, under the same language rules) for C++; PyTorch's and Python's headers are
system headers (``-isystem``), the caller's ``extra_include_paths`` plain ``-I``; PyTorch's
``COMMON_NVCC_FLAGS`` for ``.cu`` files, built for each arch of ``TORCH_CUDA_ARCH_LIST`` (or of
the visible devices). The module is linked without PyTorch's libraries, naming them as
dependencies (``libtorch_python.so`` and the rest): they resolve against the copies already in
the process that imports it, so kilnd needs PyTorch's headers only, never its 1 GB of libraries.
CUDA code links the CUDA runtime statically, so the module does not depend on which CUDA
runtime the importing process has.

Differences from ``cpp_extension``: ``build_directory`` is accepted and ignored (nothing is
built locally); ``is_standalone`` is not supported; ``verbose`` prints kilnd's build log.
``build()`` builds (or finds) the module without importing it, for prewarming on a machine
without a GPU.

Users reach this module as ``kiln.torch.extension`` (``kiln.torch.load`` and friends); it imports
PyTorch only when a build is prepared or a module imported, so the native part runner
(:mod:`kiln.native`) builds through it from below the torch front end.
"""

from __future__ import annotations

import base64
import dataclasses
import importlib.machinery
import importlib.util
import inspect
import os
import re
import sys
import sysconfig
import tempfile
import warnings
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from . import ext as _ext
from .connection import Connection
from .errors import KilnError
from .v1 import service_pb2

PathLike = Union[str, os.PathLike]
#: Architectures as callers name them: sm numbers (90) or TORCH_CUDA_ARCH_LIST items ("9.0a+PTX").
ArchList = Union[str, Sequence[Union[int, str]], None]

_CUDA_SONAMES = ("libc10_cuda.so", "libtorch_cuda.so")
_CPU_SONAMES = ("libc10.so", "libtorch_cpu.so", "libtorch.so", "libtorch_python.so")
_DEFAULT_NVCC_FLAGS = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                       "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__",
                       "--expt-relaxed-constexpr"]


def _torch() -> Any:
    import torch

    return torch


# TORCH_CUDA_ARCH_LIST's grammar, as torch.utils.cpp_extension reads it (PyTorch 2.15): items
# separated by ';' or spaces, each a known "major.minor" with an optional "a" (arch-specific
# features: sm_90a) and "+PTX" (embed the PTX as well), or a name standing for several.
_KNOWN_ARCHS = ("3.5", "3.7", "5.0", "5.2", "5.3", "6.0", "6.1", "6.2", "7.0", "7.2", "7.5", "8.0", "8.6", "8.7",
                "8.9", "9.0", "9.0a", "10.0", "10.0a", "10.3", "10.3a", "10.7", "10.7a", "11.0", "11.0a", "12.0",
                "12.0a", "12.1", "12.1a")
_NAMED_ARCHS = {
    "Kepler+Tesla": "3.7", "Kepler": "3.5+PTX", "Maxwell+Tegra": "5.3", "Maxwell": "5.0;5.2+PTX",
    "Pascal": "6.0;6.1+PTX", "Volta+Tegra": "7.2", "Volta": "7.0+PTX", "Turing": "7.5+PTX", "Ampere+Tegra": "8.7",
    "Ampere": "8.0;8.6+PTX", "Ada": "8.9+PTX", "Hopper": "9.0+PTX", "Blackwell+Tegra": "11.0",
    "Blackwell": "10.0;10.3;12.0;12.1+PTX", "Rubin": "10.7+PTX",
}


@dataclasses.dataclass(frozen=True, order=True)
class CudaArch:
    """One architecture ``.cu`` files are built for: ``sm`` (major * 10 + minor), ``arch_specific``
    (the "a" of "9.0a": sm_90a), ``ptx`` (the "+PTX": compute_<sm> PTX as well)."""

    sm: int
    arch_specific: bool = False
    ptx: bool = False

    def __str__(self) -> str:
        return f"{self.sm // 10}.{self.sm % 10}{'a' if self.arch_specific else ''}{'+PTX' if self.ptx else ''}"


def _merged(archs: Sequence[CudaArch]) -> list[CudaArch]:
    """One entry per architecture and variant, with PTX when any asked for it ("9.0;9.0+PTX" is
    "9.0+PTX", as cpp_extension's set of -gencode flags makes it), sorted."""
    ptx: dict[tuple[int, bool], bool] = {}
    for a in archs:
        ptx[(a.sm, a.arch_specific)] = ptx.get((a.sm, a.arch_specific), False) or a.ptx
    return [CudaArch(sm, specific, p) for (sm, specific), p in sorted(ptx.items())]


def parse_cuda_arch_list(text: str, what: str = "TORCH_CUDA_ARCH_LIST") -> list[CudaArch]:
    """The architectures a TORCH_CUDA_ARCH_LIST value names ("8.0;9.0a", "7.5 8.6+PTX",
    "Ampere;Hopper"), merged and sorted. KilnError naming the item for anything PyTorch would
    refuse, except that empty items (doubled or trailing separators) are skipped."""
    out = []
    for item in text.replace(" ", ";").split(";"):
        for arch in _NAMED_ARCHS.get(item, item).split(";"):
            if not arch:
                continue
            version, plus, suffix = arch.partition("+")
            if version not in _KNOWN_ARCHS or (plus and suffix != "PTX"):
                hint = " (separate architectures with ';' or spaces)" if "," in arch else ""
                raise KilnError(f"{what}: unknown CUDA architecture '{arch}'{hint}: PyTorch knows "
                                f"{', '.join(_KNOWN_ARCHS)}, each optionally with '+PTX', and the names "
                                f"{', '.join(_NAMED_ARCHS)}")
            major, _, minor = version.rstrip("a").partition(".")
            out.append(CudaArch(int(major) * 10 + int(minor), version.endswith("a"), bool(plus)))
    return _merged(out)


def cuda_archs(explicit: ArchList = None) -> list[CudaArch]:
    """The architectures to build ``.cu`` files for, as cpp_extension chooses them: ``explicit``
    (sm numbers such as 90, or TORCH_CUDA_ARCH_LIST items such as "9.0a"), else
    ``TORCH_CUDA_ARCH_LIST``, else (unset, empty or "native") the visible devices', capped at
    the newest PyTorch was built for, the newest with PTX too. KilnError when none can be found."""
    if explicit:
        if isinstance(explicit, str):
            return parse_cuda_arch_list(explicit, "cuda_archs_list")
        out = []
        for a in explicit:
            out += [CudaArch(a)] if isinstance(a, int) else parse_cuda_arch_list(a, "cuda_archs_list")
        return _merged(out)
    env = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if env and env != "native":
        archs = parse_cuda_arch_list(env)
        if archs:
            return archs
    torch = _torch()
    if torch.cuda.is_available() and torch.cuda.device_count():
        built = [int("".join(c for c in a.split("_")[1] if c.isdigit()))
                 for a in torch.cuda.get_arch_list() if a.startswith("sm_")]
        newest = max(((sm // 10, sm % 10) for sm in built), default=(99, 9))
        caps = {min(newest, tuple(torch.cuda.get_device_capability(i))) for i in range(torch.cuda.device_count())}
        sms = sorted(major * 10 + minor for major, minor in caps)
        return [CudaArch(sm, ptx=sm == sms[-1]) for sm in sms]
    raise KilnError("no CUDA architecture to build for: set TORCH_CUDA_ARCH_LIST (e.g. '9.0') on a machine without a GPU")


_STD_FLAG = re.compile(r"-std=(c\+\+\d+)")


def _torch_cxx_std(cpp: Any) -> str:
    """The ``-std=`` flag the installed PyTorch's ``cpp_extension`` adds where a build names
    none: the first one its ninja-file writer holds (PyTorch keeps no public name for it), else
    ``-std=c++17``, every PyTorch 2 release's floor."""
    try:
        found = _STD_FLAG.search(inspect.getsource(cpp._write_ninja_file_to_build_library))
    except (AttributeError, OSError, TypeError):
        found = None
    return f"-std={found.group(1)}" if found else "-std=c++17"


def _python_tag() -> str:
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return suffix.strip(".").removesuffix(".so").removesuffix(".")


def _include_trees(paths: Sequence[PathLike], cache_dir: Optional[Path]) -> tuple[list[_ext.Tree], list[tuple[int, str]], list[str]]:
    """Trees for -I paths: a path inside another path's folder shares its tree (PyTorch's API
    headers live inside its include folder). Returns (trees, (tree index, subdir) per path,
    the trees' local roots)."""
    resolved = [Path(p).resolve() for p in paths]
    roots: list[Path] = []
    for p in sorted(set(resolved), key=lambda q: len(q.parts)):
        if not any(p == r or r in p.parents for r in roots):
            roots.append(p)
    trees = [_ext.tree_of_folder(r, cache_dir=cache_dir) for r in roots]
    where = []
    for p in resolved:
        i = next(i for i, r in enumerate(roots) if p == r or r in p.parents)
        where.append((i, "" if p == roots[i] else p.relative_to(roots[i]).as_posix()))
    return trees, where, [str(r) for r in roots]


def _multiarch_pyconfig() -> Optional[_ext.Tree]:
    multiarch = sysconfig.get_config_var("MULTIARCH")
    ver = sysconfig.get_config_var("LDVERSION") or sysconfig.get_python_version()
    if not multiarch:
        return None
    folder = Path("/usr/include") / multiarch / f"python{ver}"
    if not folder.is_dir() or not str(sysconfig.get_path("include", scheme="posix_prefix")).startswith("/usr/include"):
        return None
    prefix = f"{multiarch}/python{ver}"
    return _ext.Tree.from_bytes({f"{prefix}/{f.name}": f.read_bytes() for f in sorted(folder.iterdir()) if f.is_file()})


def _source_tree(sources: Sequence[PathLike]) -> tuple[_ext.Tree, list[str]]:
    """The tree of the sources' common folder (sources and headers only) and the sources'
    paths in it."""
    paths = [Path(s).resolve() for s in sources]
    for p in paths:
        if not p.is_file():
            raise KilnError(f"no such source file: {p}")
    root = Path(os.path.commonpath([str(p.parent) for p in paths]))
    try:
        tree = _ext.tree_of_folder(root, suffixes=_ext.SOURCE_SUFFIXES)
    except KilnError:
        # A root too large to send (sources spread over a big folder): the sources and the
        # headers beside each of them.
        contents = {}
        for p in paths:
            for f in p.parent.iterdir():
                if f.is_file() and f.name.endswith(_ext.SOURCE_SUFFIXES):
                    contents[f.relative_to(root).as_posix()] = f.read_bytes()
        tree = _ext.Tree.from_bytes(contents)
    rels = [p.relative_to(root).as_posix() for p in paths]
    known = {f.path for f in tree.files}
    for r in rels:
        if r not in known:
            raise KilnError(f"source {r} must end in .c, .cc, .cpp, .cxx or .cu")
    return tree, rels


class Prepared:
    """A build request with the trees it names, ready to send (and to record)."""

    def __init__(self, request: Any, source_tree: _ext.Tree, include_trees: list[_ext.Tree], include_roots: list[str]) -> None:
        self.request = request
        self.source_tree = source_tree
        self.include_trees = include_trees
        self.include_roots = include_roots

    @property
    def trees(self) -> list[_ext.Tree]:
        return [self.source_tree, *self.include_trees]

    def record(self) -> dict[str, Any]:
        return {
            "kind": "extension",
            "name": self.request.name,
            "request": base64.b64encode(self.request.SerializeToString(deterministic=True)).decode(),
            "source_tree": _ext.tree_to_record(self.source_tree, inline=True),
            "include_trees": [{"digest": t.digest, "root": r} if r else {"digest": t.digest, **_ext.tree_to_record(t, inline=True)}
                              for t, r in zip(self.include_trees, self.include_roots)],
        }


def prepare(name: str, sources: Union[PathLike, Sequence[PathLike]], extra_cflags: Optional[Sequence[str]] = None,
            extra_cuda_cflags: Optional[Sequence[str]] = None, extra_ldflags: Optional[Sequence[str]] = None,
            extra_include_paths: Optional[Sequence[PathLike]] = None, with_cuda: Optional[bool] = None,
            cuda_archs_list: ArchList = None, cache_dir: Optional[Path] = None) -> Prepared:
    """The BuildExtensionRequest for these arguments (no server involved)."""
    import torch.utils.cpp_extension as cpp

    torch = _torch()
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    if not sources:
        raise KilnError("no sources to build")
    source_tree, compile_paths = _source_tree(sources)
    if with_cuda is None:
        with_cuda = any(p.endswith(".cu") for p in compile_paths)
    torch_includes = [p for p in cpp.include_paths("cpu")]
    py_include = sysconfig.get_path("include", scheme="posix_prefix")
    user_includes = [str(p) for p in (extra_include_paths or [])]
    includes = user_includes + torch_includes + ([py_include] if py_include else [])
    trees, where, roots = _include_trees(includes, cache_dir)

    common = [f"-DTORCH_EXTENSION_NAME={name}", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    get_abi = getattr(cpp, "_get_pybind11_abi_build_flags", None)
    if get_abi is not None:  # pybind11's ABI defines, on the PyTorch versions that set them
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            common += list(get_abi())
    common.append(f"-D_GLIBCXX_USE_CXX11_ABI={int(bool(torch._C._GLIBCXX_USE_CXX11_ABI))}")
    std = _torch_cxx_std(cpp)
    cflags = common + [std, "-fPIC"] + list(extra_cflags or [])
    cuda_cflags: list[str] = []
    archs: list[CudaArch] = []
    if with_cuda:
        archs = cuda_archs(cuda_archs_list)
        nvcc_common = list(getattr(cpp, "COMMON_NVCC_FLAGS", _DEFAULT_NVCC_FLAGS))
        cuda_cflags = common + nvcc_common + list(extra_cuda_cflags or [])
        if not any(f.startswith("-std=") for f in cuda_cflags):
            cuda_cflags.append(std)
    lib_dir = Path(torch.__file__).parent / "lib"
    sonames = [s for s in _CPU_SONAMES if (lib_dir / s).exists()]
    if with_cuda:
        sonames = [s for s in _CUDA_SONAMES if (lib_dir / s).exists()] + sonames

    req = service_pb2.BuildExtensionRequest(
        name=name, source_tree=source_tree.digest, compile=compile_paths,
        cflags=cflags, cuda_cflags=cuda_cflags, ldflags=list(extra_ldflags or []),
        python_tag=_python_tag(), link_sonames=sonames)
    if any(a.arch_specific or a.ptx for a in archs):
        for a in archs:
            req.cuda_arch_list.add(sm=a.sm, arch_specific=a.arch_specific, ptx=a.ptx)
    else:  # the form servers older than cuda_arch_list read too
        req.cuda_archs.extend(a.sm for a in archs)
    # PyTorch's and Python's headers are system headers (-isystem), as cpp_extension has them;
    # the caller's extra_include_paths stay -I.
    for n, (i, sub) in enumerate(where):
        req.include_dirs.add(tree=trees[i].digest, subdir=sub, system=n >= len(user_includes))
    # Debian-style Pythons split pyconfig.h by architecture: Python.h's pyconfig.h includes
    # <x86_64-linux-gnu/python3.X/pyconfig.h> from /usr/include, which kilnd's /usr/include
    # need not hold (another Python). That folder alone goes up as a tree of its own.
    arch_tree = _multiarch_pyconfig()
    if arch_tree is not None:
        trees.append(arch_tree)
        roots.append("")
        req.include_dirs.add(tree=arch_tree.digest, subdir="", system=True)
    req.client_abi["torch"] = torch.__version__
    req.client_abi["cxx11_abi"] = str(int(bool(torch._C._GLIBCXX_USE_CXX11_ABI)))
    req.client_abi["python"] = sys.version.split()[0]
    return Prepared(req, source_tree, trees, roots)


def _client(client: Any) -> Any:
    """``client``, else a connection to ``$KILN_SERVER`` (a build needs the daemon's answers
    only)."""
    if client is not None:
        return client
    return Connection()


def build_prepared(prepared: Prepared, client: Any = None, *, verbose: bool = False, priority: int = 0) -> tuple[Path, _ext.BuildOutcome]:
    """Gets or builds a prepared request; returns the module's local path and the outcome."""
    client = _client(client)
    prepared.request.priority = priority
    outcome = _ext.build_extension(client, prepared.request, prepared.trees)
    if verbose:
        print(f"kiln: extension {prepared.request.name}: {'cache hit' if outcome.cache_hit else 'built'} "
              f"({outcome.seconds:.2f} s, {outcome.uploaded_bytes} bytes uploaded)\n{outcome.log}", file=sys.stderr)
    art = next((a for a in outcome.result.artifacts if a.kind == service_pb2.SHARED_OBJECT), None)
    if art is None:
        raise KilnError(f"kilnd's result for extension {prepared.request.name} holds no module")
    client.read_verified(art.digest, size=art.size or None)  # fetched and checked here
    path = client.fetch(art.digest, size=art.size or None)
    _ext.record_build(client, prepared.record())
    return path, outcome


def build(name: str, sources: Union[PathLike, Sequence[PathLike]], extra_cflags: Optional[Sequence[str]] = None,
          extra_cuda_cflags: Optional[Sequence[str]] = None, extra_ldflags: Optional[Sequence[str]] = None,
          extra_include_paths: Optional[Sequence[PathLike]] = None, verbose: bool = False,
          with_cuda: Optional[bool] = None, client: Any = None, cuda_archs_list: ArchList = None) -> Path:
    """Builds (or finds in kilnd's cache) the extension without importing it; returns the local
    path of the module. For prewarming: a machine without a GPU builds CUDA extensions for
    ``TORCH_CUDA_ARCH_LIST``."""
    client = _client(client)
    prepared = prepare(name, sources, extra_cflags, extra_cuda_cflags, extra_ldflags, extra_include_paths, with_cuda,
                       cuda_archs_list, cache_dir=client.cache.root)
    return build_prepared(prepared, client, verbose=verbose)[0]


_loaded: dict[str, Any] = {}


def _import_module(name: str, path: Path) -> Any:
    key = f"{name}:{path}"
    if key in _loaded:
        return _loaded[key]
    _torch()  # PyTorch's libraries must be in the process before the module's dependencies resolve
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    if spec is None:
        raise KilnError(f"cannot import {path} as {name}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    _loaded[key] = module
    return module


def load(name: str, sources: Union[PathLike, Sequence[PathLike]], extra_cflags: Optional[Sequence[str]] = None,
         extra_cuda_cflags: Optional[Sequence[str]] = None, extra_ldflags: Optional[Sequence[str]] = None,
         extra_include_paths: Optional[Sequence[PathLike]] = None, build_directory: Optional[str] = None,
         verbose: bool = False, with_cuda: Optional[bool] = None, is_python_module: bool = True,
         is_standalone: bool = False, keep_intermediates: bool = True, *, client: Any = None,
         cuda_archs_list: ArchList = None) -> Any:
    """Like ``torch.utils.cpp_extension.load``, built on kilnd: returns the imported module
    (``is_python_module=False``: loads it into the process as a library of torch ops, with
    ``torch.ops.load_library``, and returns its path)."""
    del build_directory, keep_intermediates  # nothing is built here
    if is_standalone:
        raise KilnError("kiln.torch.load builds modules, not standalone executables")
    path = build(name, sources, extra_cflags, extra_cuda_cflags, extra_ldflags, extra_include_paths, verbose,
                 with_cuda, client, cuda_archs_list)
    if not is_python_module:
        _torch().ops.load_library(str(path))
        return path
    return _import_module(name, path)


def _inline_sources(name: str, cpp_sources: Union[str, Sequence[str]], cuda_sources: Union[str, Sequence[str], None],
                    functions: Union[str, Sequence[str], dict[str, str], None], with_pytorch_error_handling: bool) -> dict[str, str]:
    """The files ``load_inline`` compiles, as ``cpp_extension.load_inline`` writes them."""
    if isinstance(cpp_sources, str):
        cpp_sources = [cpp_sources]
    if isinstance(cuda_sources, str):
        cuda_sources = [cuda_sources]
    cpp = "#include <torch/extension.h>\n" + "\n".join(cpp_sources)
    if functions is not None:
        if isinstance(functions, str):
            functions = [functions]
        if isinstance(functions, (list, tuple)):
            functions = {f: f"{f}" for f in functions}
        defs = []
        for fn, doc in functions.items():
            wrap = f"torch::wrap_pybind_function(&{fn})" if with_pytorch_error_handling else f"&{fn}"
            defs.append(f'  m.def("{fn}", {wrap}, "{doc}");')
        cpp += "\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n" + "\n".join(defs) + "\n}\n"
    files = {"main.cpp": cpp}
    if cuda_sources:
        files["cuda.cu"] = ("#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n"
                            + "\n".join(cuda_sources))
    return files


def load_inline(name: str, cpp_sources: Union[str, Sequence[str]], cuda_sources: Union[str, Sequence[str], None] = None,
                functions: Union[str, Sequence[str], dict[str, str], None] = None,
                extra_cflags: Optional[Sequence[str]] = None, extra_cuda_cflags: Optional[Sequence[str]] = None,
                extra_ldflags: Optional[Sequence[str]] = None, extra_include_paths: Optional[Sequence[PathLike]] = None,
                build_directory: Optional[str] = None, verbose: bool = False, with_cuda: Optional[bool] = None,
                is_python_module: bool = True, with_pytorch_error_handling: bool = True,
                keep_intermediates: bool = True, use_pch: bool = False, *, client: Any = None,
                cuda_archs_list: ArchList = None) -> Any:
    """Like ``torch.utils.cpp_extension.load_inline``, built on kilnd."""
    del use_pch
    files = _inline_sources(name, cpp_sources, cuda_sources, functions, with_pytorch_error_handling)
    with tempfile.TemporaryDirectory(prefix=f"kiln-inline-{name}-") as d:
        paths = []
        for fname, text in files.items():
            p = Path(d) / fname
            p.write_text(text)
            paths.append(p)
        path = build(name, paths, extra_cflags, extra_cuda_cflags, extra_ldflags, extra_include_paths, verbose,
                     with_cuda if with_cuda is not None else bool(cuda_sources), client, cuda_archs_list)
    if not is_python_module:
        _torch().ops.load_library(str(path))
        return path
    return _import_module(name, path)
