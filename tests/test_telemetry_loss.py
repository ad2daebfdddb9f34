"""Telemetry under bad luck, against a real Mosquitto: a silent network drop, a full disk, a damaged spool.

Whatever happens to the link or the disk, every window either reaches the broker or is
counted as lost (a gap in ``seq`` and ``spool_dropped``), reporting recovers by itself,
and the frame loop never stops for it.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from edgekit.protocol.broker import BrokerConfig
from edgekit.telemetry.publisher import TelemetryPublisher
from edgekit.telemetry.spool import Spool
from edgekit.testing.blackhole import WindowSeqs, telemetry_through_blackhole
from edgekit.testing.mosquitto import Mosquitto

from conftest import EDGEKIT


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
    # paho would resend the dead session's DDATA (its seq) after the NDEATH, before the new NBIRTH.
    assert run.dead_data == 0, run.line()


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


def spool_with_unsent_windows(path: Path, windows: int) -> tuple[str, int]:
    """A real spool holding ``windows`` unsent windows (no broker listens); its epoch and last seq."""
    from edgekit.testing.mosquitto import free_port

    publisher = TelemetryPublisher(
        BrokerConfig.from_url(f"mqtt://127.0.0.1:{free_port()}"), device_id="cam-x", fleet="lab", spool=path
    )
    for _ in range(windows):
        publisher._report()  # what the publisher's timer does each interval
    epoch, last = publisher.spool.epoch, publisher.last_seq
    publisher.spool.close()
    return epoch, last


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def garble(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[100 : 100 + 4096] = b"\xa5" * 4096  # the header's tail and the first table pages
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [truncate, garble])
def test_a_damaged_spool_is_set_aside_and_the_loss_is_a_gap(
    broker: Mosquitto, tmp_path: Path, damage: Callable[[Path], None]
) -> None:
    spool = tmp_path / "spool.db"
    epoch, last = spool_with_unsent_windows(spool, 40)
    (tmp_path / "spool.db-wal").unlink(missing_ok=True)  # checkpointed at close: the file is the spool
    damage(spool)
    seqs = WindowSeqs(broker.port, "json", "lab", "cam-x")
    assert seqs.ready.wait(10)
    publisher = TelemetryPublisher(
        BrokerConfig.from_url(broker.url), device_id="cam-x", fleet="lab", interval_s=0.1, spool=spool
    ).start()
    try:
        assert wait_until(lambda: len(seqs.copy()) >= 3, 20)
        carried_on = publisher.spool.epoch == epoch
    finally:
        publisher.stop()
        seqs.close()
    assert len(list(tmp_path.glob("spool.db.corrupt-*"))) == 1 and publisher.spool.set_aside == 1
    if carried_on:  # the old counters could be read: seq goes on, the lost windows are a gap
        assert min(seqs.copy()) == last + 1
    else:  # nothing could be read: a new epoch (a collector sees the sequence restart)
        assert min(seqs.copy()) == 0
    assert carried_on or damage is garble  # a truncated file still has its counters


def test_edgekit_run_labels_frames_over_a_spool_that_is_not_a_database(
    x86_bundle: tuple[Path, dict[str, Any]], broker: Mosquitto, cache_env: dict[str, str], tmp_path: Path
) -> None:
    spool = tmp_path / "telemetry.db"
    spool.write_bytes(b"not a database, " * 1024)  # what a half-written or foreign file looks like
    done = subprocess.run(
        [*EDGEKIT, "run", str(x86_bundle[0]), "--source", "synthetic:160x120@30", "--device", "x86_64-cpu",
         "--frames", "30", "--mqtt", broker.url, "--fleet", "lab", "--device-id", "cam-r", "--spool", str(spool)],
        env=cache_env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "is damaged" in done.stderr and "set aside" in done.stderr
    assert len(list(tmp_path.glob("telemetry.db.corrupt-*"))) == 1


def test_a_spool_found_damaged_in_use_is_set_aside_and_numbering_goes_on(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool.db")
    epoch = spool.epoch
    first = [spool.next_sequence() for _ in range(5)]
    sent = spool.push("t", b"sent")
    spool.ack(sent)
    spool.push("t", b"unsent")
    # What SQLite raises when it reads a damaged page while in use.
    assert spool.repair(sqlite3.DatabaseError("database disk image is malformed"))
    assert not spool.repair(sqlite3.OperationalError("database is locked"))  # not damage: left alone
    assert len(list(tmp_path.glob("spool.db.corrupt-*"))) == 1 and spool.set_aside == 1
    assert spool.epoch == epoch and spool.next_sequence() == first[-1] + 1 and spool.dropped == 1
    newer = spool.push("t", b"after")
    assert newer > sent and [m.payload for m in spool.pending(after=sent)] == [b"after"]
    spool.close()
    again = Spool(tmp_path / "spool.db")  # and all of it was written to the new file
    assert again.epoch == epoch and again.next_sequence() == first[-1] + 2 and again.set_aside == 1
    again.close()
