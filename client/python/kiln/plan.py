"""Reading a launch plan (kernels/codegen/PLAN.md): a kiln.v1.SizeExpr is a polynomial of the
plan's symbols, and a guarded step runs only where its guard is in range; and the plan's
plan.json text, the form the client core's CUDA loader reads.

The jit's shape checks and kiln.torch's parts evaluate plans through these functions.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from . import dtypes as dt
from .v1 import service_pb2


def eval_size(expr: Any, sizes: Sequence[int]) -> int:
    """A kiln.v1.SizeExpr at ``sizes``."""
    total = 0
    for t in expr.terms:
        v = int(t.coeff)
        for k, e in enumerate(t.exponents):
            v *= int(sizes[k]) ** int(e)
        total += v
    return total


def step_runs(step: Any, sizes: Sequence[int]) -> bool:
    """Whether a launch plan step runs at ``sizes``: a step with a guard (a launch-time choice
    among kernels of a symbolic plan) only where guard_min <= guard <= guard_max (0: unbounded)."""
    if step.guard_min <= 0 and step.guard_max <= 0:
        return True
    v = eval_size(step.guard, sizes)
    return v >= step.guard_min and (step.guard_max <= 0 or v <= step.guard_max)


def size_name(expr: Any, names: Sequence[str]) -> str:
    """"N", "2*N*T": the expression's text, or "" when it is a constant."""
    parts = []
    for t in expr.terms:
        factors = [names[k] for k, e in enumerate(t.exponents) for _ in range(int(e))]
        if not factors:
            if len(expr.terms) == 1:
                return ""
            factors = [str(t.coeff)]
        elif t.coeff != 1:
            factors.insert(0, str(t.coeff))
        parts.append("*".join(factors))
    return " + ".join(parts)


def expr_text(expr: Any, names: list[str]) -> str:
    """A kiln.v1.SizeExpr as plan.json writes it: "3*N*T + -2*N + 1"."""
    terms = []
    for t in expr.terms:
        factors = [str(int(t.coeff))] + [names[k] for k, e in enumerate(t.exponents) for _ in range(int(e))]
        terms.append("*".join(factors))
    return " + ".join(terms) if terms else "0"


def plan_json(plan: Any) -> str:
    """A kiln.v1.LaunchPlan of a CUDA target in plan.json's form (kernels/codegen/PLAN.md), as
    the C++ loader reads it."""
    names = [s.name for s in plan.symbols]
    roles = {service_pb2.INPUT: "input", service_pb2.OUTPUT: "output", service_pb2.TEMP: "temp"}
    buffers = []
    for b in plan.buffers:
        entry: dict[str, Any] = {"role": roles[b.role], "index": int(b.index), "dtype": dt.from_wire(b.dtype),
                                 "shape": [int(d) for d in b.shape], "bytes": int(b.bytes), "offset": int(b.offset)}
        if names:
            entry["shape_exprs"] = [expr_text(e, names) for e in b.shape_exprs]
            entry["bytes_expr"] = expr_text(b.bytes_expr, names)
        buffers.append(entry)
    steps = []
    for s in plan.steps:
        entry = {"kernel": s.kernel, "grid": [int(v) for v in s.grid], "block": [int(v) for v in s.block],
                 "shared_bytes": int(s.shared_bytes), "args": [int(a) for a in s.args]}
        if s.grid_per_block > 0:
            entry["grid_work"] = expr_text(s.grid_work, names)
            entry["grid_per_block"] = int(s.grid_per_block)
        if s.guard_min > 0 or s.guard_max > 0:
            entry["guard"] = expr_text(s.guard, names)
            entry["guard_min"] = int(s.guard_min)
            entry["guard_max"] = int(s.guard_max)
        steps.append(entry)
    out: dict[str, Any] = {"abi_version": int(plan.abi_version or 1), "workspace_bytes": int(plan.workspace_bytes),
                           "buffers": buffers, "steps": steps}
    if names:
        out["symbols"] = [{"name": s.name, "input": int(s.input), "axis": int(s.axis)} for s in plan.symbols]
        out["index_bound"] = expr_text(plan.index_bound, names)
    return json.dumps(out)


__all__ = ["eval_size", "expr_text", "plan_json", "size_name", "step_runs"]
