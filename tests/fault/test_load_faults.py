"""kilnd under load: overload, kill -9 in the middle of compiles, SIGTERM in the middle of
compiles. Each test bounds its own time and request count."""

from __future__ import annotations

import hashlib
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import kiln
from kiln.errors import RpcError
from conftest import Outcomes, alive, descendants, kill_tree, rss_bytes, small_graph, wait_until


def test_overload_is_refused_and_memory_stays_bounded(daemons):
    d = daemons.start("--workers=1", "--queue-size=2")
    baseline = rss_bytes(d.proc.pid)
    peak = [baseline]
    outcomes = Outcomes()
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss_bytes(d.proc.pid))
            time.sleep(0.05)

    def one(i: int) -> None:
        outcomes.run(lambda: client.compile(small_graph(1000 + i), "cpu", timeout=120))

    sampler = threading.Thread(target=sample)
    sampler.start()
    with kiln.Client(d.address, max_attempts=1) as client:
        with ThreadPoolExecutor(max_workers=100) as pool:
            list(pool.map(one, range(300)))
        stats = client.stats()
        assert client.health() == "SERVING"
    stop.set()
    sampler.join()

    counts = outcomes.counts
    assert set(counts) <= {"OK", "RESOURCE_EXHAUSTED"}, counts
    assert counts.get("RESOURCE_EXHAUSTED", 0) >= 100, counts
    assert counts.get("OK", 0) >= 1, counts
    assert stats.rejected == counts["RESOURCE_EXHAUSTED"]
    # A refused request costs nothing that stays: 300 requests in flight must not grow kilnd
    # by more than a modest constant.
    assert peak[0] - baseline < 256 << 20, (baseline, peak[0])
    assert d.stop() == 0


def _verify(client, handle: str, digests: dict[str, str]) -> None:
    c = client.get(handle)
    got = {a.kind: a.digest for a in c.result.artifacts}
    assert got == digests, (handle, got, digests)
    for a in c.result.artifacts:
        path = client.fetch(a.digest, size=a.size)  # verified by the client against the digest
        assert hashlib.sha256(path.read_bytes()).hexdigest() == a.digest


def test_kill9_under_concurrent_compiles(daemons, tmp_path):
    """Several rounds of: compiles in flight, kilnd killed with SIGKILL. Every compile that was
    acknowledged before a kill is still there afterwards, byte for byte, and nothing is
    corrupt."""
    cache = tmp_path / "cache"
    acknowledged: dict[str, dict[str, str]] = {}
    lock = threading.Lock()
    seed = [5000]
    for round_ in range(3):
        d = daemons.start("--workers=2", name=f"round{round_}", cache_dir=cache)
        workers = set(descendants(d.proc.pid))
        stop = threading.Event()

        def loop() -> None:
            with kiln.Client(d.address, max_attempts=1) as client:
                while not stop.is_set():
                    with lock:
                        seed[0] += 1
                        s = seed[0]
                    try:
                        c = client.compile(small_graph(s), "cpu", timeout=60)
                    except RpcError:
                        continue  # the kill cut it off: never acknowledged
                    with lock:
                        acknowledged[c.handle] = {a.kind: a.digest for a in c.result.artifacts}

        threads = [threading.Thread(target=loop) for _ in range(4)]
        for t in threads:
            t.start()
        # Kill once compiles have been acknowledged in this round (bounded wait).
        want = len(acknowledged) + 2
        wait_until(lambda: len(acknowledged) >= want, 60)
        time.sleep(0.3)
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait(timeout=10)
        stop.set()
        for t in threads:
            t.join(timeout=90)
        # The workers die with kilnd (they get SIGKILL when their parent goes).
        assert wait_until(lambda: not any(alive(p) for p in workers), 5), workers

    assert len(acknowledged) >= 6, len(acknowledged)
    d = daemons.start("--workers=1", name="final", cache_dir=cache)
    with kiln.Client(d.address, max_attempts=1) as client:
        for handle, digests in acknowledged.items():
            _verify(client, handle, digests)
        assert client.stats().store.corruptions == 0
    assert d.stop() == 0


def test_sigterm_under_load_exits_cleanly(daemons):
    d = daemons.start("--workers=2", "--grace-s=30")
    # The two workers; a short-lived child of the daemon's start (a toolchain probe) may still
    # be there at first.
    assert wait_until(lambda: len(descendants(d.proc.pid)) == 2, 10), descendants(d.proc.pid)
    workers = set(descendants(d.proc.pid))
    outcomes = Outcomes()

    def compile_one(i: int) -> None:
        with kiln.Client(d.address, max_attempts=1) as client:
            client.compile(small_graph(9000 + i), "cpu", timeout=90)

    late = Outcomes()
    with ThreadPoolExecutor(max_workers=20) as pool, kiln.Client(d.address, max_attempts=1) as watcher:
        before = watcher.stats().requests
        futures = [pool.submit(outcomes.run, lambda i=i: compile_one(i)) for i in range(16)]
        # Every compile request arrived (and, 50 ms later, was prepared and queued), then the signal.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and watcher.stats().requests - before < 16:
            time.sleep(0.005)
        time.sleep(0.05)
        s = watcher.stats()
        accepted = s.queue_depth + s.in_flight
        assert accepted >= 2, "no compile was queued or running when the signal came"
        d.proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        # Compiles asked for while kilnd drains are refused as retryable.
        late_futures = [pool.submit(late.run, lambda i=i: compile_one(100 + i)) for i in range(4)]
        code = d.proc.wait(timeout=60)
        for f in futures + late_futures:
            f.result(timeout=90)
    assert code == 0, d.log(4000)
    assert not any(alive(p) for p in workers), workers
    # Every compile accepted before the signal finished within the grace period.
    assert outcomes.counts == {"OK": 16}, (outcomes.counts, accepted)
    assert late.counts == {"UNAVAILABLE": 4}, late.counts


def test_local_daemon_stops_when_its_parent_is_killed(daemons, tmp_path):
    """A kilnd started by kiln.local.LocalDaemon does not outlive the process that started it,
    even one killed with SIGKILL (no stop(), no atexit): its stdin pipe closes, and it drains,
    closes its cache and exits as on SIGTERM, its compile workers with it."""
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time, kiln.local\n"
         "d = kiln.local.LocalDaemon(sys.argv[1], sys.argv[2], args=['--workers=1'], timeout=60)\n"
         "print(d.proc.pid, flush=True)\n"
         "time.sleep(300)\n",
         str(daemons.binary), str(tmp_path / "child")],
        stdout=subprocess.PIPE, text=True)
    pid = 0
    try:
        pid = int(parent.stdout.readline())
        assert wait_until(lambda: len(descendants(pid)) >= 1, 10)
        workers = set(descendants(pid))
        assert alive(pid)
        parent.kill()
        parent.wait(timeout=10)
        assert wait_until(lambda: not alive(pid), 30), "kilnd outlived the process that started it"
        assert not any(alive(p) for p in workers), workers
        log = (tmp_path / "child" / "kilnd.log").read_text()
        assert "standard input closed" in log and "kilnd stopped" in log, log[-2000:]
    finally:
        parent.kill()
        parent.wait(timeout=10)
        if pid and alive(pid):
            kill_tree(pid)
