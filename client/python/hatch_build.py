"""hatchling build hook: generates kiln's protocol modules while the wheel is built.

The modules come from the repository's proto/ (or the copy an sdist carries) through the
grpcio-tools pinned in pyproject.toml's build requirements, so an installed kiln never needs the
generator. A regular wheel gets them from a scratch folder, leaving the source tree alone; an
editable install runs the package from the source tree, so they are written into kiln/_proto
there (ignored by git).

The wheel also carries the C++ client's CUDA loader sources (client/cpp/cuda_plan.* and
cuda_loader.*) beside the native part runner (kiln/native/client/cpp), which kilnd compiles
into it: one loader for the C++ client and the runner. An sdist carries them at
that place already.
"""

from __future__ import annotations

import importlib.util
import shutil
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


class ProtocolModulesHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        root = Path(self.root)
        gen = _load_protogen(root)
        proto_root = gen.find_proto_root(root, bundled=False)
        if proto_root is None:
            raise RuntimeError(f"kiln: no kiln/v1/*.proto under {root} or its parents (set KILN_PROTO_DIR)")
        # The C++ client's loader sources the native part runner compiles (one list, read by
        # kiln.native too).
        _LOADER_FILES = (root / "kiln" / "native" / "loader_files.txt").read_text().split()
        bundled = root / "kiln" / "native" / "client" / "cpp"
        if version != "editable" and not all((bundled / f).is_file() for f in _LOADER_FILES):
            loader = root.parent / "cpp"
            missing = [f for f in _LOADER_FILES if not (loader / f).is_file()]
            if missing:
                raise RuntimeError(f"kiln: the C++ loader sources {missing} are not under {loader}")
            for f in _LOADER_FILES:
                build_data["force_include"][str(loader / f)] = f"kiln/native/client/cpp/{f}"
        if version == "editable":
            gen.generate(proto_root, root / "kiln" / "_proto")
            return
        self._scratch = Path(tempfile.mkdtemp(prefix="kiln-proto-"))
        gen.generate(proto_root, self._scratch)
        build_data["force_include"][str(self._scratch)] = "kiln/_proto"

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        scratch = getattr(self, "_scratch", None)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
