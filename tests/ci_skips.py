"""Skips in CI: a skip whose reason CI may meet passes as a skip (and ``pytest -rs`` prints
it); any other skip fails the test when ``$CI`` is set. A skip means a test did not run, and
CI provides what the tests need (deploy/setup.sh installs it), so a missing kilnd, redis-server
or openssl there is a broken run, not a skipped test.

What CI may lack, and the variable that makes even that an error where the machine has it
(deploy/test.sh sets them): NVRTC (``KILN_REQUIRE_NVRTC=1``), root to mount the disk-full
tests' tmpfs (``KILN_REQUIRE_DISK_FULL=1``), a CUDA device (always allowed: CI has none), and
PyTorch where ``KILN_SKIP_TORCH=1`` says it is left out on purpose.

Both test conftests (tests/python, tests/fault) import the hook below.
"""

from __future__ import annotations

import os
import re
from typing import Any

import pytest

# (pattern of a skip reason, the variable that turns it into a failure, or None)
ALLOWED: list[tuple[str, str | None]] = [
    (r"no CUDA device|needs a machine without a CUDA device|neither PyTorch with CUDA nor CuPy|PyTorch without CUDA",
     None),
    (r"NVRTC|cannot build CUDA code", "KILN_REQUIRE_NVRTC"),
    (r"mounting a small tmpfs needs root|cannot mount a tmpfs here", "KILN_REQUIRE_DISK_FULL"),
    (r"\(KILN_SKIP_TORCH=1\)", None),
]


def allowed_in_ci(reason: str, env: Any = os.environ) -> bool:
    """Whether CI may skip a test for ``reason``."""
    for pattern, required in ALLOWED:
        if re.search(pattern, reason):
            return not (required and env.get(required) == "1")
    return False


def _reason(report: Any) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Any:
    outcome = yield
    report = outcome.get_result()
    if not os.environ.get("CI") or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = _reason(report)
    if not allowed_in_ci(reason):
        report.outcome = "failed"
        report.longrepr = (f"skipped in CI ($CI is set), for a reason CI must not have: {reason}\n"
                           "(tests/ci_skips.py lists the reasons CI may skip for)")
