"""How many threads a CPU kernel runs on: ``$KILN_NUM_THREADS``, then ``$OMP_NUM_THREADS``, then
the affinity mask (kiln/loader.py, kernels/runtime/kiln_threads.h); the torch backend uses
``torch.get_num_threads()``.

The end-to-end checks run a real kernel in a fresh process and count the threads its OpenMP
runtime starts: libgomp starts ``n - 1`` workers for an ``n``-thread region and keeps them.
Last, how the client loads kernels from several threads at once (one load per result).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

import kiln
from kiln.loader import default_num_threads

CPUS = len(os.sched_getaffinity(0))


@pytest.mark.parametrize("kiln_env, omp_env, want", [
    (None, None, CPUS),
    (None, "3", 3),
    (None, "5,2", 5),          # OpenMP's per-level list: the outer level counts
    ("7", "3", 7),
    ("0", "2", 2),             # not a positive integer: skipped
    ("many", None, CPUS),
    (None, " 4 ", 4),
])
def test_rule(monkeypatch, kiln_env, omp_env, want):
    for var, value in (("KILN_NUM_THREADS", kiln_env), ("OMP_NUM_THREADS", omp_env)):
        if value is None:
            monkeypatch.delenv(var, raising=False)
        else:
            monkeypatch.setenv(var, value)
    assert default_num_threads() == want


def test_affinity_mask_counts_when_no_variable_is_set(monkeypatch):
    monkeypatch.delenv("KILN_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        assert default_num_threads() == 1
    finally:
        os.sched_setaffinity(0, before)


# Runs a compiled kernel the way Compiled.__call__ does (the default thread count of
# kiln.loader), in a process that never opens a gRPC channel, whose threads would blur the count.
RUN_KERNEL = r"""
import os, sys
import numpy as np
from kiln.loader import default_num_threads, load_cpu_kernel
if sys.argv[3] == "one-cpu":
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
kernel = load_cpu_kernel(sys.argv[1], sys.argv[2], 1)
x = np.linspace(-1, 1, 1 << 16, dtype=np.float32)
out = np.empty_like(x)
before = len(os.listdir("/proc/self/task"))
rc = kernel.run([x.ctypes.data, out.ctypes.data], None, default_num_threads())
after = len(os.listdir("/proc/self/task"))
assert rc == 0
np.testing.assert_allclose(out, np.exp(x) * 0.5 + 1.0, rtol=1e-6)
print(after - before)
"""


@pytest.fixture(scope="module")
def exp_kernel(client):
    """The .so of exp(x) * 0.5 + 1 over f32[65536], fetched: (path, digest)."""
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (1 << 16,))
    compiled = client.compile(b.build(b.exp(x) * 0.5 + 1.0), "cpu")
    assert compiled.plan.workspace_bytes == 0
    art = compiled.artifact("SHARED_OBJECT")
    return str(client.fetch(art.digest)), art.digest


@pytest.mark.parametrize("kiln_env, omp_env, one_cpu, want", [
    (None, "3", False, 3),
    ("4", "3", False, 4),
    (None, None, True, 1),
])
def test_kernel_runs_on_the_rule_s_thread_count(exp_kernel, kiln_env, omp_env, one_cpu, want):
    env = {k: v for k, v in os.environ.items() if k not in ("KILN_NUM_THREADS", "OMP_NUM_THREADS")}
    if kiln_env is not None:
        env["KILN_NUM_THREADS"] = kiln_env
    if omp_env is not None:
        env["OMP_NUM_THREADS"] = omp_env
    args = [sys.executable, "-c", RUN_KERNEL, *exp_kernel, "one-cpu" if one_cpu else "all-cpus"]
    p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    started = int(p.stdout.split()[-1])
    # libgomp starts n - 1 workers for an n-thread region.
    assert started == want - 1, (p.stdout, p.stderr)


def test_torch_backend_uses_torch_s_thread_count(client, monkeypatch):
    torch = pytest.importorskip("torch")
    seen: list[int] = []
    real_run = kiln.loader.CpuKernel.run

    def recording_run(self, pointers, workspace, num_threads):
        seen.append(num_threads)
        return real_run(self, pointers, workspace, num_threads)

    monkeypatch.setattr(kiln.loader.CpuKernel, "run", recording_run)
    monkeypatch.setenv("KILN_NUM_THREADS", "5")  # the torch path follows torch, not this
    old = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        torch._dynamo.reset()
        # The Python path, whose thread count this checks (the native runner, when loaded,
        # passes at::get_num_threads(), torch's own count, in C++).
        f = torch.compile(lambda t: torch.tanh(t) * 2 + 1, backend="kiln", options={"client": client, "native": False})
        t = torch.linspace(-2, 2, 1000)
        torch.testing.assert_close(f(t), torch.tanh(t) * 2 + 1)
    finally:
        torch.set_num_threads(old)
        torch._dynamo.reset()
    assert seen and set(seen) == {3}, seen


def test_once_per_key_makes_different_keys_concurrently():
    """Loaded kernels are made once per key (OncePerKey): a slow load of one result does not
    hold back another's (a global lock made a graph's parts load one at a time), callers of
    one key share one value, and a failed make leaves the key for the next caller."""
    from kiln._once import OncePerKey

    once = OncePerKey()
    b_done = threading.Event()
    made: list[str] = []

    def make_a():
        # Finishes only once "b" has been made on another thread: a lock shared by all keys
        # would make this wait forever (here: fail after the timeout).
        assert b_done.wait(30), "b was not made while a was being made"
        made.append("a")
        return "A"

    t = threading.Thread(target=lambda: once.get("a", make_a))
    t.start()
    time.sleep(0.05)
    assert once.get("b", lambda: made.append("b") or "B") == "B"
    b_done.set()
    t.join(60)
    assert once.get("a", lambda: "other") == "A" and made == ["b", "a"] and len(once) == 2

    def failing():
        raise RuntimeError("load failed")

    with pytest.raises(RuntimeError):
        once.get("c", failing)
    assert once.peek("c") is None and once.get("c", lambda: "C") == "C"

    results: list[str] = []
    calls: list[int] = []

    def slow():
        calls.append(1)
        time.sleep(0.1)
        return "D"

    threads = [threading.Thread(target=lambda: results.append(once.get("d", slow))) for _ in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert results == ["D"] * 6 and len(calls) == 1
