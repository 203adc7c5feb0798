"""Compile workers that crash, hang, burn CPU or memory, and host compilers that hang or crash:
each request gets a clean error naming what happened, kilnd keeps serving throughout, the lost
worker is replaced and nothing is left running."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

import kiln
import kiln.local
from kiln.errors import RpcError
from conftest import alive, descendants, small_graph, wait_until

WORKERS = 2


def expect_error(client, graph, code: str, *needles: str, target: str = "cpu", timeout: float = 60):
    with pytest.raises(RpcError) as info:
        client.compile(graph, target, timeout=timeout)
    err = info.value
    assert err.code == code, f"{err.code}: {err.details}"
    for needle in needles:
        assert needle in err.details, err.details
    return err


def expect_serving(client, daemon, seed: float) -> None:
    """A normal compile still works and the health check says SERVING."""
    assert daemon.proc.poll() is None, daemon.log(4000)
    assert client.health() == "SERVING"
    c = client.compile(small_graph(seed), "cpu", timeout=120)
    assert len(c.handle) == 64


def expect_clean_tree(daemon) -> None:
    """Exactly the worker processes are kilnd's children, none a zombie, none with children."""
    def settled() -> bool:
        tree = descendants(daemon.proc.pid)
        direct = [p for p in tree if _ppid(p) == daemon.proc.pid]
        return len(tree) == WORKERS and len(direct) == WORKERS and "Z" not in tree.values()
    assert wait_until(settled, 10), f"process tree of kilnd: {descendants(daemon.proc.pid)}"


def _ppid(pid: int) -> int:
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rindex(")") + 2:].split()[1])


def test_worker_crash_and_hang(daemons):
    d = daemons.start(f"--workers={WORKERS}", "--fault-injection=crash,abort,hang",
                      "--worker-timeout-s=6", "--negative-cache-s=0")
    with kiln.Client(d.address, max_attempts=1) as client:
        expect_clean_tree(d)
        before = set(descendants(d.proc.pid))
        expect_serving(client, d, 1)

        expect_error(client, small_graph(2, "crash"), "INTERNAL", "compile worker crashed", "signal 11")
        expect_serving(client, d, 3)
        expect_error(client, small_graph(4, "abort"), "INTERNAL", "compile worker crashed", "signal 6")
        expect_clean_tree(d)
        assert before - set(descendants(d.proc.pid)), "no worker was replaced"

        start = time.monotonic()
        expect_error(client, small_graph(5, "hang"), "DEADLINE_EXCEEDED", "ran past its 6 s limit")
        assert time.monotonic() - start < 30
        expect_serving(client, d, 6)
        expect_clean_tree(d)

        stats = client.stats()
        assert stats.worker_crashes == 2
        assert stats.worker_timeouts == 1
        assert stats.worker_restarts == 3
    assert d.stop() == 0


def test_worker_cpu_and_memory_limits(daemons):
    def limited(fault: str, cpu_s: int, seed: float, needle: str, crashes: int, *flags: str) -> None:
        d = daemons.start(f"--workers={WORKERS}", f"--fault-injection={fault}", f"--worker-cpu-s={cpu_s}",
                          "--worker-timeout-s=120", "--negative-cache-s=0", *flags)
        with kiln.Client(d.address, max_attempts=1) as client:
            expect_error(client, small_graph(seed, fault), "RESOURCE_EXHAUSTED", needle)
            expect_serving(client, d, seed + 2)
            expect_clean_tree(d)
            stats = client.stats()
            assert stats.worker_crashes == crashes and stats.worker_restarts == crashes
        assert d.stop() == 0

    # The wall-clock limit is far away: the CPU-time cap must be what stops the spinning worker.
    limited("spin", 1, 7, "CPU-time limit", 1)
    # Refused allocations end the compile, not the worker. A daemon of its own, with a CPU
    # allowance the allocations never reach: touching 1 GiB on a loaded 2-core machine once took
    # past a 1-second allowance, and the CPU limit answered instead of the memory limit.
    limited("oom", 60, 8, "memory limit", 0, "--worker-memory=1GiB")


def test_cancelled_request_stops_its_worker(daemons):
    """A client that gives up (cancels its call, or its deadline passes) stops the compile it
    alone was waiting for: its worker is killed within about a second and replaced."""
    import grpc
    from kiln.v1 import service_pb2, service_pb2_grpc

    d = daemons.start(f"--workers={WORKERS}", "--fault-injection=hang", "--worker-timeout-s=120",
                      "--negative-cache-s=0")
    with kiln.Client(d.address, max_attempts=1) as client, grpc.insecure_channel(d.address) as channel:
        stub = service_pb2_grpc.KilnStub(channel)
        request = service_pb2.CompileRequest(graph=small_graph(30, "hang"))
        request.target.CopyFrom(kiln.Target.parse("cpu").to_proto())
        call = stub.Compile.future(request)
        assert wait_until(lambda: b"injecting fault 'hang'" in d.log_path.read_bytes(), 30)
        cancelled_at = time.monotonic()
        call.cancel()
        assert wait_until(lambda: client.stats().worker_cancels == 1, 10)
        assert time.monotonic() - cancelled_at < 3, "the worker was not stopped promptly"

        # A deadline that passes does the same.
        expect_error(client, small_graph(31, "hang"), "DEADLINE_EXCEEDED", timeout=1.5)
        assert wait_until(lambda: client.stats().worker_cancels == 2, 10)
        expect_serving(client, d, 32)
        expect_clean_tree(d)
        assert client.stats().worker_timeouts == 0
    assert d.stop() == 0


def test_nvrtc_worker_crash(daemons):
    """The same isolation for a CUDA compile (NVRTC runs in the worker)."""
    d = daemons.start(f"--workers={WORKERS}", "--fault-injection=crash", "--negative-cache-s=0")
    with kiln.Client(d.address, max_attempts=1) as client:
        try:
            client.compile(small_graph(10), "cuda:sm_80", timeout=120)
        except RpcError as e:
            if e.code == "FAILED_PRECONDITION":
                pytest.skip(f"no NVRTC here: {e.details}")
            raise
        expect_error(client, small_graph(11, "crash"), "INTERNAL", "signal 11", target="cuda:sm_80")
        assert client.compile(small_graph(12), "cuda:sm_80", timeout=120).handle
        expect_clean_tree(d)
    assert d.stop() == 0


def test_fault_markers_do_nothing_without_the_flag(daemons):
    d = daemons.start(f"--workers={WORKERS}")
    with kiln.Client(d.address, max_attempts=1) as client:
        assert client.compile(small_graph(13, "crash"), "cpu", timeout=120).handle
        assert client.stats().worker_crashes == 0
    assert d.stop() == 0


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n"
                    "# Answers version queries like the real compiler; misbehaves when compiling.\n"
                    'case "$1" in --version|-dumpversion|-v) exec g++ "$@";; esac\n' + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker in Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry))
            except OSError:
                pass
    return [p for p in found if alive(p)]


def test_hanging_host_compiler(daemons, tmp_path):
    # A unique sleep length marks the processes this test starts.
    marker = "4321.125"
    cc = _script(tmp_path / "hang-cc", f"sleep {marker} &\nsleep {marker}\n")
    d = daemons.start(f"--workers={WORKERS}", f"--host-compiler={cc}", "--compile-timeout-s=2",
                      "--negative-cache-s=0")
    with kiln.Client(d.address, max_attempts=1) as client:
        start = time.monotonic()
        expect_error(client, small_graph(20), "DEADLINE_EXCEEDED", "ran past its 2 s limit")
        assert time.monotonic() - start < 30
        assert wait_until(lambda: not _processes_with(marker), 5), _processes_with(marker)
        assert client.health() == "SERVING"
        expect_clean_tree(d)
    assert d.stop() == 0


def test_crashing_host_compiler(daemons, tmp_path):
    cc = _script(tmp_path / "crash-cc", "kill -SEGV $$\n")
    d = daemons.start(f"--workers={WORKERS}", f"--host-compiler={cc}", "--negative-cache-s=0")
    with kiln.Client(d.address, max_attempts=1) as client:
        err = expect_error(client, small_graph(21), "INTERNAL")
        assert "11" in err.details or "signal" in err.details.lower(), err.details
        assert client.health() == "SERVING"
        expect_clean_tree(d)
        # The worker survived its child's crash: it was not replaced.
        assert client.stats().worker_crashes == 0
    assert d.stop() == 0



def test_workers_inherit_no_descriptor_of_kilnd(daemons, tmp_path):
    """A worker holds its end of the supervisor's socket (fd 3) and stdin/stdout/stderr, and
    nothing else of kilnd's, not even a descriptor kilnd itself inherited without close-on-exec
    (a service manager's socket, a shell's redirection): here fd 7, open on a file, handed to
    kilnd by a wrapper. (A compile job runs untrusted generated code in the worker.)"""
    secret = tmp_path / "kilnd-only"
    secret.write_text("for kilnd's eyes\n")
    wrapper = tmp_path / "kilnd-with-fd-7"
    wrapper.write_text(f'#!/bin/sh\nexec 7<"{secret}"\nexec "{daemons.binary}" "$@"\n')
    wrapper.chmod(0o755)
    d = kiln.local.LocalDaemon(wrapper, tmp_path / "kilnd", args=[f"--workers={WORKERS}"], timeout=60)
    daemons.started.append(d)  # stopped, and its tree checked, with the fixture's
    with kiln.Client(d.address, max_attempts=1) as client:
        expect_serving(client, d, 5)  # the workers have run a compile
        expect_clean_tree(d)
        assert os.readlink(f"/proc/{d.proc.pid}/fd/7") == str(secret), "kilnd did not get fd 7 (the setup failed)"
        for pid in descendants(d.proc.pid):
            fds = {int(n): os.readlink(f"/proc/{pid}/fd/{n}") for n in os.listdir(f"/proc/{pid}/fd")}
            extra = {n: target for n, target in fds.items() if n > 3}
            assert not extra, f"worker {pid} inherited descriptors of kilnd: {extra}"
            assert 3 in fds and fds[3].startswith("socket:"), fds
