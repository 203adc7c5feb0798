"""Generates the Python protobuf and gRPC modules for the kiln wire protocol.

The generated modules are laid out as the proto package says (``kiln/v1/graph_pb2.py``,
``kiln/v1/service_pb2.py``, ``kiln/v1/service_pb2_grpc.py``) under a root folder, by default
``kiln/_proto`` inside this package. ``kiln/__init__.py`` adds ``<root>/kiln`` to the package's
``__path__``, so ``kiln.v1.graph_pb2`` is importable and the generated ``from kiln.v1 import
graph_pb2`` in ``service_pb2`` resolves without rewriting generated code.

Generation happens at build time (``setup.py``'s ``build_py`` hook) and, when the modules are
missing or older than the ``.proto`` sources, on first import: an editable install or a plain
``PYTHONPATH`` checkout works without a build step. This module imports nothing from ``kiln`` so
that ``setup.py`` can load it on its own.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Optional, Sequence

#: The proto files, relative to the proto root, in dependency order.
PROTO_FILES: tuple[str, ...] = ("kiln/v1/graph.proto", "kiln/v1/service.proto")
#: The modules generation must produce, relative to the output root.
GENERATED_FILES: tuple[str, ...] = (
    "kiln/v1/graph_pb2.py",
    "kiln/v1/service_pb2.py",
    "kiln/v1/service_pb2_grpc.py",
)
_STAMP = "STAMP"
_PACKAGE_DIR = Path(__file__).resolve().parent


def default_output_root() -> Path:
    """The folder generated modules go to by default: ``<package>/_proto``."""
    return _PACKAGE_DIR / "_proto"


def find_proto_root(start: Optional[Path] = None) -> Optional[Path]:
    """Finds a folder holding ``kiln/v1/graph.proto`` and ``kiln/v1/service.proto``.

    Looks at ``$KILN_PROTO_DIR``, then at ``proto/`` in every parent of ``start`` (default: this
    package), which finds the repository's protocol in a source checkout, then at the copy the
    build step bundles inside ``_proto``. Returns None when none is found.
    """
    candidates: list[Path] = []
    env = os.environ.get("KILN_PROTO_DIR")
    if env:
        candidates.append(Path(env))
    here = (start or _PACKAGE_DIR).resolve()
    for parent in [here, *here.parents]:
        candidates.append(parent / "proto")
    candidates.append(default_output_root())
    for root in candidates:
        if all((root / f).is_file() for f in PROTO_FILES):
            return root
    return None


def _grpc_tools_version() -> str:
    try:
        from importlib.metadata import version

        return version("grpcio-tools")
    except Exception:  # not installed, or installed without metadata
        return "unknown"


def source_stamp(proto_root: Path) -> str:
    """A digest of the proto sources and the generator version; changes when either does."""
    h = hashlib.sha256()
    for name in PROTO_FILES:
        h.update(name.encode())
        h.update(b"\0")
        h.update((proto_root / name).read_bytes())
        h.update(b"\0")
    h.update(_grpc_tools_version().encode())
    return h.hexdigest()


def is_generated(out_root: Path, stamp: Optional[str] = None) -> bool:
    """True when every generated module exists in ``out_root`` (and, given ``stamp``, matches it)."""
    if not all((out_root / f).is_file() for f in GENERATED_FILES):
        return False
    if stamp is None:
        return True
    try:
        return (out_root / _STAMP).read_text().strip() == stamp
    except OSError:
        return False


def generate(proto_root: Path, out_root: Path) -> None:
    """Runs grpc_tools.protoc on the kiln protos, writing modules and a copy of the sources.

    Each file is written to a temporary folder first and moved into place with an atomic rename,
    the stamp last, so a concurrent importer sees either the old set or the new one, never a
    half-written module. Raises RuntimeError when protoc fails or grpcio-tools is missing.
    """
    try:
        import grpc_tools
        from grpc_tools import protoc
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise RuntimeError(
            "kiln needs grpcio-tools to generate its protocol modules: pip install grpcio-tools"
        ) from e

    stamp = source_stamp(proto_root)
    out_root.mkdir(parents=True, exist_ok=True)
    well_known = Path(grpc_tools.__file__).resolve().parent / "_proto"
    with tempfile.TemporaryDirectory(prefix=".gen-", dir=out_root) as tmp_name:
        tmp = Path(tmp_name)
        args = [
            "grpc_tools.protoc",
            f"-I{proto_root}",
            f"-I{well_known}",
            f"--python_out={tmp}",
            f"--grpc_python_out={tmp}",
            *[str(proto_root / f) for f in PROTO_FILES],
        ]
        rc = protoc.main(args)
        if rc != 0:
            raise RuntimeError(f"grpc_tools.protoc failed with status {rc} on {proto_root}")
        for name in PROTO_FILES:  # bundled so an installed package can regenerate
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(proto_root / name, tmp / name)
        for pkg in ("kiln", "kiln/v1"):
            (tmp / pkg / "__init__.py").write_text("")
        (tmp / _STAMP).write_text(stamp + "\n")
        files = sorted(p.relative_to(tmp) for p in tmp.rglob("*") if p.is_file())
        files.sort(key=lambda p: p.name == _STAMP)  # the stamp goes last
        for rel in files:
            dest = out_root / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp / rel, dest)


def _fallback_root(stamp: str) -> Path:
    base = os.environ.get("KILN_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "kiln")
    return Path(base) / "proto" / stamp[:16]


def ensure(out_root: Optional[Path] = None) -> Path:
    """Makes sure up-to-date generated modules exist and returns their root folder.

    Uses ``out_root`` (default ``<package>/_proto``) when it is current. When the sources are
    available and the modules are missing or stale, regenerates them there, or, when that
    folder is not writable (a read-only install), in the user's kiln cache folder. Raises
    ImportError when the modules are missing and no proto sources can be found.
    """
    root = out_root or default_output_root()
    proto_root = find_proto_root()
    if proto_root is None or proto_root.resolve() == root.resolve():
        # An installed package: use what the build produced (its bundled sources regenerate
        # it only when the generated modules are gone).
        if is_generated(root):
            return root
        if proto_root is None:
            raise ImportError(
                "kiln's protocol modules are missing and no kiln/v1/*.proto sources were found; "
                "set KILN_PROTO_DIR to the repository's proto/ folder"
            )
    stamp = source_stamp(proto_root)
    if is_generated(root, stamp):
        return root
    try:
        generate(proto_root, root)
        return root
    except PermissionError:
        alt = _fallback_root(stamp)
        if not is_generated(alt, stamp):
            generate(proto_root, alt)
        return alt
    except RuntimeError as e:
        # No generator here but modules from an earlier build exist: use them, loudly.
        if is_generated(root):
            warnings.warn(f"kiln: using existing protocol modules, regeneration failed: {e}")
            return root
        raise ImportError(str(e)) from e


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m kiln._protogen [OUT_ROOT]``: (re)generates the modules."""
    args = list(sys.argv[1:] if argv is None else argv)
    root = Path(args[0]) if args else default_output_root()
    proto_root = find_proto_root()
    if proto_root is None:
        print("no kiln/v1/*.proto found; set KILN_PROTO_DIR", file=sys.stderr)
        return 1
    generate(proto_root, root)
    print(f"generated {', '.join(GENERATED_FILES)} in {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
