"""Build hook: generates kiln's protocol modules (kiln/_proto) from the repository's proto/.

Everything else is declared in pyproject.toml. The generated modules go into the build folder
(for wheels) or the source tree (for editable installs); kiln also generates them on first
import when they are missing, so a plain checkout on PYTHONPATH works.
"""

import importlib.util
import os
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def _protogen():
    # Loaded by path: importing the kiln package itself would need the modules being built.
    spec = importlib.util.spec_from_file_location("_kiln_protogen", HERE / "kiln" / "_protogen.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class BuildPyWithProtos(build_py):
    """build_py that also writes kiln/_proto/kiln/v1/*_pb2*.py (and the .proto sources)."""

    def run(self):
        super().run()
        gen = _protogen()
        proto_root = gen.find_proto_root(HERE)
        if proto_root is None:
            raise RuntimeError("kiln: cannot find proto/kiln/v1/*.proto (set KILN_PROTO_DIR)")
        if getattr(self, "editable_mode", False):
            out = HERE / "kiln" / "_proto"
        else:
            out = Path(self.build_lib) / "kiln" / "_proto"
        gen.generate(proto_root, out)
        # A source tree used in place gets fresh modules too.
        if os.access(HERE / "kiln", os.W_OK) and not gen.is_generated(HERE / "kiln" / "_proto", gen.source_stamp(proto_root)):
            gen.generate(proto_root, HERE / "kiln" / "_proto")


setup(cmdclass={"build_py": BuildPyWithProtos})
