"""Telemetry under bad luck, against a real Mosquitto: a silent network drop, a full disk, a damaged spool.

Whatever happens to the link or the disk, every window either reaches the broker or is
counted as lost (a gap in ``seq`` and ``spool_dropped``), reporting recovers by itself,
and the frame loop never stops for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from edgekit.testing.blackhole import telemetry_through_blackhole
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
