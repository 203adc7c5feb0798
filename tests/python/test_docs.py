"""The documentation holds together: links resolve, quoted sections exist, and the pages keep
the sizes that make them readable.

- Every relative link in README.md, BENCHMARKS.md and docs/*.md names a file or folder of the
  repository, and so does every path of a script under tests/ those pages name (the commands
  they quote: ``$W python3 tests/gpu/models_gpu.py``).
- Every reference of the form ``FILE.md, "Section"`` (in those pages, and in comments of code,
  scripts and manifests) names a heading of that file.
- BENCHMARKS.md stays at 400 lines or fewer; README.md reaches the end of its quick start (the
  line before "## Layout") within 60 lines and keeps the commands that CI and the tests quote.
- The roles table of docs/trust.md says what tests/python/test_trust.py enforces.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path
from typing import Optional

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", REPO / "BENCHMARKS.md", *sorted((REPO / "docs").glob("*.md"))]

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
# `docs/cluster.md, "Sizing"`, `[cluster.md](cluster.md), "Sizing"`, `BENCHMARKS.md's "GPU kernels"`.
SECTION_REF = re.compile(r"([\w./-]+\.md)(?:\]\([^)]*\))?(?:'s)?,?\s+(?:section\s+)?\"([^\"\n]+)\"")
# A script under tests/ named by its path from the repository root, in a command or in prose.
SCRIPT_PATH = re.compile(r"(?<![\w./-])tests/[\w./-]+\.(?:py|sh)\b")
SCANNED_SUFFIXES = {".md", ".py", ".sh", ".yaml", ".yml", ".cc", ".h", ".txt", ".cmake", ".service"}


def headings(path: Path) -> list[str]:
    out, fenced = [], False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            out.append(line.lstrip("#").strip())
    return out


def names_section(heading: str, section: str) -> bool:
    """A quoted section names a heading whole, or its start ("Warm start" names "Warm start:
    program records"); backticks do not count."""
    heading, section = heading.replace("`", ""), section.replace("`", "")
    return heading == section or heading.startswith((section + " ", section + ":"))


def resolve(name: str, where: Path) -> Optional[Path]:
    """A file named in ``where``: relative to it, else to the repository root."""
    for base in (where.parent, REPO):
        candidate = (base / name).resolve()
        if candidate.exists():
            return candidate
    return None


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:|#", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_resolve(page):
    broken = [t for t in links(page) if not (page.parent / t.split("#")[0]).exists()]
    assert not broken, f"{page.name}: links to nothing: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_named_scripts_exist(page):
    """A moved or renamed script takes the commands that run it along."""
    missing = sorted({s for s in SCRIPT_PATH.findall(page.read_text()) if not (REPO / s).is_file()})
    assert not missing, f"{page.name}: names scripts that do not exist: {missing}"


def scanned_files() -> list[Path]:
    """Text files of the repository, without build outputs, virtualenvs and hidden folders."""
    out = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith((".", "build")) and d not in ("node_modules", "_proto")]
        out += [Path(root, f) for f in files if Path(f).suffix in SCANNED_SUFFIXES]
    return [p for p in out if p != Path(__file__).resolve()]


def test_quoted_sections_exist():
    missing = []
    for path in scanned_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for name, section in SECTION_REF.findall(re.sub(r"\s+", " ", text)):
            target = resolve(name, path)
            if target is None or target.suffix != ".md":
                continue
            if not any(names_section(h, section) for h in headings(target)):
                missing.append(f"{path.relative_to(REPO)}: {name}, \"{section}\"")
    assert not missing, "references to sections that do not exist:\n" + "\n".join(missing)


def test_benchmarks_stay_short():
    n = len((REPO / "BENCHMARKS.md").read_text().splitlines())
    assert n <= 400, f"BENCHMARKS.md has {n} lines: keep the current figures only (git keeps history)"


def test_readme_quick_start_is_short_and_keeps_its_commands():
    lines = (REPO / "README.md").read_text().splitlines()
    end = next(i for i, line in enumerate(lines) if line.startswith("## Layout"))
    assert end <= 60, f"the README's quick start takes {end} lines (at most 60)"
    quick = "\n".join(lines[:end])
    # CI runs the test command (.ci/run); test_shared_cache.py quotes the cluster command.
    for command in ("    ./deploy/run.sh\n", "    ./deploy/test.sh\n", "    ./deploy/cluster-local.sh\n"):
        assert command in quick + "\n", command.strip()
    for page in ("jit", "torch", "dynamic-shapes", "extensions", "operations", "cluster", "trust"):
        assert f"(docs/{page}.md)" in quick, f"the quick start links docs/{page}.md"


def required_roles() -> dict[str, str]:
    tree = ast.parse((REPO / "tests" / "python" / "test_trust.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "REQUIRED_ROLE" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("test_trust.py has no REQUIRED_ROLE")


def test_roles_table_matches_what_kilnd_enforces():
    rows = {}
    for line in (REPO / "docs" / "trust.md").read_text().splitlines():
        m = re.match(r"\| `(read|compile|admin)` \| (.*) \|$", line)
        if m:
            rows[m.group(1)] = set(re.findall(r"\b[A-Z][A-Za-z]+\b", m.group(2)))
    assert set(rows) == {"read", "compile", "admin"}, rows
    required = required_roles()
    for rpc, role in required.items():
        assert rpc in rows[role], f"docs/trust.md: {rpc} belongs in the `{role}` row"
    for role in ("read", "compile"):
        stray = {name for name in rows[role] if required.get(name) != role}
        assert not stray, f"docs/trust.md: the `{role}` row names calls of another role: {stray}"


def test_kilnd_help_lists_every_flag():
    """``kilnd --help`` shows every flag kilnd defines (server/flags.cc), with its help text."""
    import subprocess

    from conftest import find_kilnd, no_kilnd

    binary = find_kilnd()
    if binary is None:
        no_kilnd()
    defined = re.findall(r"ABSL_FLAG\(\s*[\w:]+,\s*(\w+),", (REPO / "server" / "flags.cc").read_text())
    out = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=30)
    shown = set(re.findall(r"--(\w+)", out.stdout + out.stderr))
    assert len(defined) > 40 and [f for f in defined if f not in shown] == [], out.stdout[-2000:]


def test_every_mutant_still_applies():
    """Each mutant of tests/mutation/mutants.py names text that occurs exactly once in its file,
    so an edit to the code it plants a bug in shows here, not after CI's long mutation stage."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("kiln_mutants", REPO / "tests" / "mutation" / "mutants.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while they are made
    spec.loader.exec_module(module)
    stale = [f"{m.name}: {(REPO / m.file).read_text().count(m.find)} matches in {m.file}"
             for m in module.MUTANTS if (REPO / m.file).read_text().count(m.find) != 1]
    assert len(module.MUTANTS) >= 50 and stale == []
