"""The kiln package is layered and free of import cycles, checked from its source with ``ast``
(nothing is imported).

Every module may import modules of its own layer or of lower ones, never of higher ones:

=====  ===========  ==============================================================================
layer  name         modules
=====  ===========  ==============================================================================
0      wire         talking to kilnd: the protocol modules (``kiln.v1.*``), errors, dtypes, targets,
                    graphs (builder, graph files), the retry and trust policies, the native
                    client core's binding and the artifact cache, the recorder, launch-plan sizes and strided layouts, custom builds
                    (``ext``), and :class:`kiln.connection.Connection`
1      runtime      running what kilnd built: the CPU loader, the CUDA driver and launcher
                    (``kiln.cuda``), the native part runner and the PyTorch extension builder it
                    is built with, :class:`kiln.Client` with its runnable ``Compiled`` results,
                    and autotuning
2      front ends   turning user code into graphs: ``kiln.jit`` with its tracer, ``kiln.torch``
3      tools        the command line, the local daemon helper, and the ``kiln`` package itself,
                    which re-exports the public API of the layers below
=====  ===========  ==============================================================================

Within a layer any import is allowed as long as the module graph stays acyclic. The graph holds
module-level and function-level imports, relative ones resolved; importing a module inside a
package from outside that package also runs the package's ``__init__``, so it counts as an
import of each such package (except the root ``kiln``, whose ``__init__`` runs before any of its
modules and which no module may import).

No function may import a kiln module (a function-local import is how a cycle hides), and
function-local imports of other packages are kept for the optional or costly ones in
``LOCAL_IMPORTS_ALLOWED``.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Optional

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "client" / "python" / "kiln"

LAYERS: dict[str, int] = {
    # 0: wire
    "kiln._version": 0, "kiln._protogen": 0, "kiln.v1": 0, "kiln.errors": 0, "kiln._once": 0,
    "kiln.dtypes": 0, "kiln.plan": 0, "kiln.strides": 0, "kiln.retry": 0, "kiln.target": 0,
    "kiln.trust": 0, "kiln.cache": 0, "kiln.graphio": 0, "kiln.recorder": 0, "kiln.builder": 0,
    "kiln.op_table": 0, "kiln.ext": 0, "kiln.connection": 0, "kiln.core": 0,
    # 1: runtime
    "kiln.loader": 1, "kiln.torch_extension": 1, "kiln.native": 1, "kiln.cuda": 1, "kiln.client": 1,
    "kiln.autotune": 1,
    # 2: front ends
    "kiln.tracer": 2, "kiln.jit": 2, "kiln.torch": 2,
    # 3: tools
    "kiln.cli": 3, "kiln.__main__": 3, "kiln.local": 3, "kiln.bundle": 3, "kiln": 3,
}
LAYER_NAMES = ("wire", "runtime", "front ends", "tools")

#: Packages other than kiln that a function may import, and why not at the top of its module.
LOCAL_IMPORTS_ALLOWED: dict[str, str] = {
    "torch": "an optional dependency (the torch extra); its submodules (Dynamo, Inductor, the "
             "decompositions, cpp_extension) cost up to seconds to import and load where used",
    "functorch": "ships with torch; functorch.compile imports Dynamo's partitioners",
    "cupy": "an optional array library, never a dependency",
    "sympy": "comes with torch, about 0.3 s to import, needed only for symbolic sizes",
    "grpc_tools": "the protocol modules' generator, needed at build time only, not installed with kiln",
    "importlib.metadata": "about 40 ms to import, needed only to stamp generated protocol modules",
}


def layer_of(module: str) -> int:
    """The layer of ``module``: its own entry, else its closest package's."""
    name = module
    while name not in LAYERS:
        if "." not in name:
            raise KeyError(f"{module} is in no layer: add it to LAYERS in {Path(__file__).name}")
        name = name.rsplit(".", 1)[0]
    return LAYERS[name]


class Import:
    def __init__(self, source: str, target: str, line: int, local: bool) -> None:
        self.source, self.target, self.line, self.local = source, target, line, local

    def __repr__(self) -> str:
        where = "in a function" if self.local else "at module level"
        return f"{self.source}:{self.line} imports {self.target} {where}"


def find_modules(package: Path) -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package's ``__init__``) for every module of the package; the
    generated protocol modules (``_proto``) are left out."""
    out: dict[str, tuple[Path, bool]] = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).with_suffix("")
        if "_proto" in rel.parts:
            continue
        parts = list(rel.parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        out[".".join(parts)] = (path, is_package)
    return out


def _resolve(module: str, is_package: bool, node: ast.AST, modules: dict[str, tuple[Path, bool]]) -> list[str]:
    """The modules one import statement names (the absolute module, or for ``from M import X``
    the submodule ``M.X`` where X is one)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        origin = ".".join(base + ([node.module] if node.module else []))
    else:
        origin = node.module or ""
    out = []
    for alias in node.names:
        sub = f"{origin}.{alias.name}"
        out.append(sub if sub in modules or sub.startswith("kiln.v1.") or sub == "kiln.v1" else origin)
    return out


def find_imports(modules: dict[str, tuple[Path, bool]]) -> list[Import]:
    imports: list[Import] = []
    for module, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text(), str(path))

        def walk(node: ast.AST, local: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    for target in _resolve(module, is_package, child, modules):
                        imports.append(Import(module, target, child.lineno, local))
                inner = local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef))
                walk(child, inner)

        walk(tree, False)
    return imports


def is_kiln(name: str) -> bool:
    return name == "kiln" or name.startswith("kiln.")


def graph_of(imports: list[Import]) -> dict[str, set[str]]:
    """The kiln module graph: each import of a kiln module, plus the packages around the target
    whose ``__init__`` the import runs (those the importing module is not inside)."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        if not is_kiln(imp.target):
            continue
        targets = {imp.target}
        parts = imp.target.split(".")
        for n in range(2, len(parts)):
            package = ".".join(parts[:n])
            if imp.source != package and not imp.source.startswith(package + "."):
                targets.add(package)
        graph.setdefault(imp.source, set()).update(t for t in targets if t != imp.source)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> Optional[list[str]]:
    """One cycle of ``graph`` as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> Optional[list[str]]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    return find_imports(find_modules(PACKAGE))


def test_every_module_has_a_layer() -> None:
    for module in find_modules(PACKAGE):
        layer_of(module)


def test_no_import_cycle(imports: list[Import]) -> None:
    cycle = find_cycle(graph_of(imports))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_imports_go_down_the_layers(imports: list[Import]) -> None:
    graph = graph_of(imports)
    upward = [f"{src} ({LAYER_NAMES[layer_of(src)]}) imports {dst} ({LAYER_NAMES[layer_of(dst)]})"
              for src, targets in sorted(graph.items()) for dst in sorted(targets)
              if layer_of(dst) > layer_of(src)]
    assert not upward, "\n".join(upward)


def test_no_module_imports_the_kiln_package(imports: list[Import]) -> None:
    """``from .. import X`` of a name the package re-exports: the module that owns X is the one
    to import, or the package's ``__init__`` would sit below its own modules."""
    bad = [imp for imp in imports if imp.target == "kiln" and imp.source not in ("kiln", "kiln.__main__")]
    assert not bad, bad


def test_no_function_imports_a_kiln_module(imports: list[Import]) -> None:
    bad = [imp for imp in imports if imp.local and is_kiln(imp.target)]
    assert not bad, "\n".join(map(repr, bad))


def test_function_local_imports_are_optional_or_costly_packages(imports: list[Import]) -> None:
    def allowed(name: str) -> bool:
        return any(name == a or name.startswith(a + ".") for a in LOCAL_IMPORTS_ALLOWED)

    bad = [imp for imp in imports if imp.local and not is_kiln(imp.target) and not allowed(imp.target)]
    assert not bad, "\n".join(map(repr, bad))


def test_the_checks_find_a_planted_cycle(tmp_path: Path) -> None:
    """The analysis itself: a package whose modules import each other in a circle, one of them
    from inside a function, and a module that imports a subpackage's module from outside it
    (running the subpackage's ``__init__``, which imports back)."""
    pkg = tmp_path / "kiln"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import x\n")
    (pkg / "c.py").write_text("from .sub import leaf\n")
    (pkg / "sub" / "__init__.py").write_text("from .. import c\n")
    (pkg / "sub" / "leaf.py").write_text("import os\n")
    found = find_imports(find_modules(pkg))
    graph = graph_of(found)
    assert graph["kiln.b"] == {"kiln.a"} and graph["kiln.c"] == {"kiln.sub.leaf", "kiln.sub"}
    assert [imp.target for imp in found if imp.local] == ["kiln.a"]
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1]
    assert set(cycle) in ({"kiln.a", "kiln.b"}, {"kiln.c", "kiln.sub"})
    del graph["kiln.b"]
    assert set(find_cycle(graph) or ()) == {"kiln.c", "kiln.sub"}
