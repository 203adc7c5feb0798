"""The protocol modules of kiln: where they are, and how the build generates them.

The modules are laid out as the proto package says (``kiln/v1/graph_pb2.py``,
``kiln/v1/service_pb2.py``, ``kiln/v1/service_pb2_grpc.py``) under a root folder,
``kiln/_proto`` inside this package. ``kiln/__init__.py`` adds ``<root>/kiln`` to the package's
``__path__``, so ``kiln.v1.graph_pb2`` is importable and the generated ``from kiln.v1 import
graph_pb2`` in ``service_pb2`` resolves without rewriting generated code.

They are generated when the package is built (``hatch_build.py``, with the grpcio-tools pinned
in pyproject.toml), never on import: importing kiln only finds them. A source checkout used
through ``PYTHONPATH`` gets them from ``deploy/setup.sh`` (an editable install), or from running
this file as a script with grpcio-tools installed. This module imports nothing from ``kiln`` so
that the build hook can load it on its own.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
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
#: Written last by generate(): the digest of the sources, then the generator's version.
STAMP = "STAMP"
_PACKAGE_DIR = Path(__file__).resolve().parent


def default_output_root() -> Path:
    """The folder the modules live in: ``<package>/_proto``."""
    return _PACKAGE_DIR / "_proto"


def find_proto_root(start: Optional[Path] = None, *, bundled: bool = True) -> Optional[Path]:
    """Finds a folder holding ``kiln/v1/graph.proto`` and ``kiln/v1/service.proto``.

    Looks at ``$KILN_PROTO_DIR``, then at ``proto/`` in ``start`` (default: this package) and
    every parent, which finds the repository's protocol in a checkout and the copy an sdist
    carries; then, with ``bundled``, at the copy a built package keeps in ``_proto``.
    """
    candidates: list[Path] = []
    env = os.environ.get("KILN_PROTO_DIR")
    if env:
        candidates.append(Path(env))
    here = (start or _PACKAGE_DIR).resolve()
    candidates.extend(parent / "proto" for parent in [here, *here.parents])
    if bundled:
        candidates.append(default_output_root())
    for root in candidates:
        if all((root / f).is_file() for f in PROTO_FILES):
            return root
    return None


def source_digest(proto_root: Path) -> str:
    """SHA-256 over the proto sources' names and bytes."""
    h = hashlib.sha256()
    for name in PROTO_FILES:
        h.update(name.encode() + b"\0")
        h.update((proto_root / name).read_bytes() + b"\0")
    return h.hexdigest()


def _checkout_proto_root() -> Optional[Path]:
    """The repository's proto/ when this package runs from a source checkout
    (``<repo>/client/python/kiln``), else None: an installed package keeps what it was built with."""
    repo = _PACKAGE_DIR.parent.parent.parent
    if not (_PACKAGE_DIR.parent / "pyproject.toml").is_file():
        return None
    root = repo / "proto"
    return root if all((root / f).is_file() for f in PROTO_FILES) else None


def locate(out_root: Optional[Path] = None) -> Path:
    """The root folder of the generated modules, for ``import kiln``. Generates nothing.

    Raises ImportError, saying how to generate them, when they are missing or, in a source
    checkout, were generated from other proto sources than the checkout's.
    """
    root = out_root or default_output_root()
    script = Path(__file__).resolve()
    how = (f"install the package (pip install {_PACKAGE_DIR.parent}), run deploy/setup.sh, or "
           f"run `python {script}` with grpcio-tools installed")
    if not all((root / f).is_file() for f in GENERATED_FILES):
        raise ImportError(f"kiln's protocol modules are missing from {root}: {how}")
    sources = _checkout_proto_root()
    if sources is not None:
        try:
            recorded = (root / STAMP).read_text().split()[0]
        except (OSError, IndexError):
            recorded = ""
        if recorded != source_digest(sources):
            raise ImportError(f"kiln's protocol modules in {root} are older than {sources}: {how}")
    return root


def _grpc_tools_version() -> str:
    try:
        from importlib.metadata import version

        return version("grpcio-tools")
    except Exception:  # installed without metadata
        return "unknown"


def generate(proto_root: Path, out_root: Path) -> None:
    """Runs grpc_tools.protoc on the kiln protos, writing the modules and a copy of the sources.

    Each file is written to a scratch folder first and moved into place with an atomic rename,
    the stamp last, so a concurrent reader sees either the old set or the new one, never a
    half-written module. Raises RuntimeError when protoc fails or grpcio-tools is missing.
    """
    try:
        import grpc_tools
        from grpc_tools import protoc
    except ImportError as e:
        raise RuntimeError("generating kiln's protocol modules needs grpcio-tools") from e

    stamp = f"{source_digest(proto_root)} grpcio-tools=={_grpc_tools_version()}\n"
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
        for name in PROTO_FILES:  # kept beside the modules: the protocol a package speaks
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(proto_root / name, tmp / name)
        for pkg in ("kiln", "kiln/v1"):
            (tmp / pkg / "__init__.py").write_text("")
        (tmp / STAMP).write_text(stamp)
        files = sorted(p.relative_to(tmp) for p in tmp.rglob("*") if p.is_file())
        files.sort(key=lambda p: p.name == STAMP)  # the stamp goes last
        for rel in files:
            dest = out_root / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp / rel, dest)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python kiln/_protogen.py [OUT_ROOT]``: (re)generates the modules."""
    args = list(sys.argv[1:] if argv is None else argv)
    root = Path(args[0]) if args else default_output_root()
    proto_root = find_proto_root(bundled=False)
    if proto_root is None:
        print("no kiln/v1/*.proto found; set KILN_PROTO_DIR", file=sys.stderr)
        return 1
    generate(proto_root, root)
    print(f"generated {', '.join(GENERATED_FILES)} in {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
