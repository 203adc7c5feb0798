"""Writes the hand-made hard cases of tests/fuzz/regressions/ (run once; the files are checked
in). Inputs a fuzz run finds are added next to them as crash-<sha1> files.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "client" / "python"))

import kiln  # noqa: E402


def cases() -> dict[str, object]:
    c = {}
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (3, 0))
    c["softmax_empty_axis"] = b.build([b.softmax(x, axis=-1), b.log_softmax(x, axis=1)])

    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (4,))
    big = b.cast(b.constant(1e300, "f64"), "f16")
    c["f64_1e300_to_f16"] = b.build([x + big, big])

    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (16,))
    y = b.exp(x)
    for _ in range(400):
        y = y + x
    c["deep_chain_400"] = b.build([y])

    b = kiln.GraphBuilder()
    xs = [b.input(f"x{i}", "f16", (2, 1 + i % 3)) for i in range(40)]
    c["concat_40"] = b.build([b.concat(xs, axis=1) * 2])

    b = kiln.GraphBuilder()
    x = b.input("x", "i8", (5,))
    c["clamp_i8_huge_bounds"] = b.build([b.clamp(x, -1e300, 1e300), b.clamp(x, 1000, None)])

    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (2, 0))
    c["logsumexp_norm_empty"] = b.build([b.logsumexp(x, axes=[1]), b.norm(x, ord=1.0, axes=[1]),
                                         b.mean(x, axes=[1]), b.var(x, axes=[1])])

    b = kiln.GraphBuilder()
    x = b.input("x", "i64", (3,))
    c["i64_constants_exact"] = b.build([x + b.constant(2**62 + 1, "i64"), b.cast(b.constant(2**40 + 3, "i64"), "i32")])

    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (4, 3))
    g = b.build([b.sum(x, axes=[1])])
    g.nodes[0].attrs["axis"].i = 1  # unknown attribute: InvalidArgument
    c["unknown_attribute"] = g

    b = kiln.GraphBuilder()
    v = b.full((3,), 300.0, "i8")
    c["full_i8_300"] = b.build([v])
    return c


def main() -> int:
    out = REPO / "tests/fuzz/regressions"
    out.mkdir(parents=True, exist_ok=True)
    for name, g in cases().items():
        (out / f"{name}.pb").write_bytes(g.SerializeToString())
    return 0


if __name__ == "__main__":
    sys.exit(main())
