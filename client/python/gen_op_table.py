"""Writes kiln/op_table.py, the Python form of the op typing table, from the repository's
kernels/ir/op_table.def (the one place the table is written; the daemon's registry includes it).

    python client/python/gen_op_table.py          # rewrite kiln/op_table.py
    python client/python/gen_op_table.py --check  # exit 1 when it is stale (a test runs this)
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEF = HERE.parent.parent / "kernels" / "ir" / "op_table.def"
OUT = HERE / "kiln" / "op_table.py"

_ENTRY = re.compile(r"^KILN_(UNARY|BINARY|REDUCTION)\(([^)]*)\)\s*$")


def parse(text: str) -> dict[str, dict[str, str]]:
    """{"UNARY": {op: rule}, "BINARY": {...}, "REDUCTION": {op: rule}} in the file's order."""
    tables: dict[str, dict[str, str]] = {"UNARY": {}, "BINARY": {}, "REDUCTION": {}}
    for line in text.splitlines():
        m = _ENTRY.match(line.strip())
        if not m:
            continue
        args = [a.strip() for a in m.group(2).split(",")]
        # A reduction's kind (reduction or composite) is the daemon's business; its rule is shared.
        tables[m.group(1)][args[0]] = args[-1]
    return tables


def render(tables: dict[str, dict[str, str]]) -> str:
    lines = [
        '"""The op typing table: each elementwise op and reduction and the rule of its result type.',
        "",
        "Generated from kernels/ir/op_table.def by client/python/gen_op_table.py; do not edit. The rules",
        "are implemented in builder.py (GraphBuilder.unary, binary and reduce), as the daemon implements",
        "them in kernels/ir/op_registry.cc.",
        '"""',
        "",
    ]
    for kind, table in tables.items():
        lines.append(f"{kind}_RULES: dict[str, str] = {{")
        lines += [f'    "{op}": "{rule}",' for op, rule in table.items()]
        lines.append("}")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when kiln/op_table.py is stale")
    args = ap.parse_args()
    text = render(parse(DEF.read_text()))
    if args.check:
        if OUT.read_text() != text:
            print(f"{OUT} is stale: run python {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
