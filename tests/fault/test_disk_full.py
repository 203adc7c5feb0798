"""kilnd whose cache disk fills up: it keeps serving hits, answers compiles without storing them
(CompileResponse.not_persisted, store stats), resumes writing by itself once space is back, and
loses or corrupts nothing. The cache lives on a small tmpfs (mounting needs root)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import kiln
from conftest import small_graph, wait_until


def cannot_test(why: str) -> None:
    """Skips, or fails where $KILN_REQUIRE_DISK_FULL is 1 (deploy/test.sh, run as root)."""
    if os.environ.get("KILN_REQUIRE_DISK_FULL") == "1":
        pytest.fail(f"KILN_REQUIRE_DISK_FULL=1, but {why}")
    pytest.skip(why)


@pytest.fixture
def small_disk(tmp_path: Path):
    if os.geteuid() != 0:
        cannot_test("mounting a small tmpfs needs root")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        cannot_test(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(path: Path) -> None:
    chunk = b"f" * (64 << 10)
    with open(path, "wb") as f:
        try:
            while True:
                f.write(chunk)
                f.flush()
        except OSError:
            pass
    # Whatever the buffered writer still holds was refused: the disk is full.


def fetch_all(client, compiled) -> None:
    for a in compiled.result.artifacts:
        client.fetch(a.digest, size=a.size)  # the client checks the digest


def test_disk_full_then_space_returns(daemons, small_disk):
    cache = small_disk / "cache"
    d = daemons.start("--workers=2", "--negative-cache-s=0", cache_dir=cache)
    with kiln.Client(d.address, max_attempts=1) as client:
        before = [client.compile(small_graph(100 + i), "cpu", timeout=120) for i in range(3)]
        assert not any(c.response.not_persisted for c in before)

        filler = small_disk / "filler"
        fill(filler)
        during = []
        for i in range(40):
            c = client.compile(small_graph(200 + i), "cpu", timeout=120)
            during.append(c)
            if c.response.not_persisted:
                break
        assert during[-1].response.not_persisted, "the full disk never refused a write"
        stats = client.stats()
        assert stats.store.writes_suspended and stats.store.write_errors >= 1

        # Still serving: old results (hits), results held in memory, new compiles.
        for c in before + during:
            assert client.get(c.handle).handle == c.handle
            fetch_all(client, client.get(c.handle))
        extra = client.compile(small_graph(300), "cpu", timeout=120)
        assert extra.response.not_persisted
        assert client.compile(small_graph(100), "cpu", timeout=120).cache_hit
        assert client.health() == "SERVING"

        filler.unlink()
        assert wait_until(lambda: not client.stats().store.writes_suspended, 20), \
            "writes did not resume"
        assert client.stats().store.write_resumes >= 1
        after = client.compile(small_graph(400), "cpu", timeout=120)
        assert not after.response.not_persisted
        handles = [c.handle for c in before + during + [extra, after]]
    assert d.stop() == 0

    # Everything, including what was compiled while the disk was full, survived a restart.
    d = daemons.start("--workers=1", name="restarted", cache_dir=cache)
    with kiln.Client(d.address, max_attempts=1) as client:
        for h in handles:
            fetch_all(client, client.get(h))
        assert client.stats().store.corruptions == 0
    assert d.stop() == 0
