"""Telemetry under bad luck, against a real Mosquitto: a silent network drop, a full disk, a damaged spool.

Whatever happens to the link or the disk, every window either reaches the broker or is
counted as lost (a gap in ``seq`` and ``spool_dropped``), reporting recovers by itself,
and the frame loop never stops for it.
"""

from __future__ import annotations

import errno
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edgekit.protocol.broker import BrokerConfig
from edgekit.telemetry.publisher import TelemetryPublisher
from edgekit.telemetry.spool import Spool
from edgekit.testing.blackhole import WindowSeqs, telemetry_through_blackhole
from edgekit.testing.broker import Mosquitto


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    b = Mosquitto(tmp_path).start()
    try:
        yield b
    finally:
        b.stop()


@pytest.mark.parametrize("format", ["json", "sparkplug"])
def test_a_silent_network_drop_loses_no_window(broker: Mosquitto, tmp_path: Path, format: str) -> None:
    # A proxy swallows every byte for 2.5 s, then resets: the publisher writes into the void
    # until the reset tells it so.  What the broker did not acknowledge is sent again.
    run = telemetry_through_blackhole(broker.port, tmp_path / "spool.db", format=format, seconds=2.5)
    print(run.line())
    assert run.swallowed > 0 and run.reconnects >= 1  # the blackhole did swallow windows
    assert run.made >= 15 and run.lost == 0, run.line()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 2 MiB filesystem (tmpfs) that can be filled: ENOSPC from the kernel, not from a mock."""
    where = tmp_path / "disk"
    where.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs (a filesystem that really fills up) needs root")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path) -> Path:
    """Write zeros to ``disk`` until the kernel says ENOSPC; the file that took the room."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as err:
            assert err.errno == errno.ENOSPC
    return filler


def wait_until(done: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.parametrize("format", ["json", "sparkplug"])
def test_a_full_disk_is_a_counted_gap_and_reporting_resumes(
    broker: Mosquitto, small_disk: Path, format: str
) -> None:
    seqs = WindowSeqs(broker.port, format, "lab", "cam-f")
    assert seqs.ready.wait(10)
    publisher = TelemetryPublisher(
        BrokerConfig.from_url(broker.url),
        device_id="cam-f",
        fleet="lab",
        interval_s=0.1,
        # A small memory bound: with the broker away as well, windows are soon dropped (counted).
        spool=Spool(small_disk / "spool.db", memory_bytes=16 * 1024),
        format=format,
    ).start()
    try:
        assert wait_until(lambda: len(seqs.copy()) >= 3)
        # The disk fills up and the broker goes away: windows can be neither sent nor kept.
        filler = fill(small_disk)
        broker.kill()
        assert wait_until(lambda: publisher.spool.dropped >= 5, 20), "windows lost without being counted"
        # The broker is back, the disk still full: windows go out from memory.
        broker.start()
        made_then = publisher.last_seq
        assert wait_until(lambda: max(seqs.copy(), default=-1) > made_then + 3, 30), "nothing sent after"
        assert publisher.spool.disk_error
        # Room again: the spool is written again, by itself.
        filler.unlink()
        assert wait_until(lambda: not publisher.spool.disk_error, 10)
        made_then = publisher.last_seq
        assert wait_until(lambda: max(seqs.copy(), default=-1) > made_then + 10, 30)
    finally:
        publisher.stop()
        seqs.close()
    made = publisher.last_seq + 1
    assert wait_until(lambda: bool(seqs.copy()) and max(seqs.copy()) == made - 1, 10)
    missing = set(range(made)) - set(seqs.copy())
    # Every window arrived or was counted as dropped: the seq gap is exactly what the device reports.
    last = dict(zip(seqs.copy(), seqs.dropped, strict=True))[made - 1]  # the last window's count
    assert len(missing) >= 5 and last == len(missing) == publisher.spool.dropped
