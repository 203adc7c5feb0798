"""Reading a launch plan's symbolic sizes (kernels/codegen/ABI.md): a kiln.v1.SizeExpr is a
polynomial of the plan's symbols, and a guarded step runs only where its guard is in range.

The CPU and CUDA launchers, the jit's shape checks and kiln.torch's parts all evaluate plans
through these functions.
"""

from __future__ import annotations

from typing import Any, Sequence


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


__all__ = ["eval_size", "size_name", "step_runs"]
