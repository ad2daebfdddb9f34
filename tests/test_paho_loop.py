"""``PahoLoop``: many paho clients from one thread, through a real Mosquitto."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from edgekit.protocol.broker import BrokerConfig
from edgekit.protocol.paho_loop import PahoLoop
from edgekit.testing.mosquitto import Mosquitto


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    b = Mosquitto(tmp_path).start()
    yield b
    b.stop()


def run_until(loop: PahoLoop, done: Callable[[], bool], timeout: float = 20.0) -> bool:
    end = time.monotonic() + timeout
    while not done() and time.monotonic() < end:
        loop.step(0.01)
    return done()


def test_clients_connect_publish_and_close_from_one_loop(broker: Mosquitto) -> None:
    loop = PahoLoop()
    config = BrokerConfig.from_url(broker.url)
    connected: set[str] = set()
    acked: list[str] = []
    clients: list[Any] = []
    for i in range(5):
        c = config.client(f"loop-{i}")
        c.user_data_set(f"loop-{i}")
        c.on_connect = lambda client, name, flags, reason, props: connected.add(name)
        c.on_publish = lambda client, name, mid, reason, props: acked.append(name)
        loop.attach(c)
        c.connect(config.host, config.port, keepalive=30)
        clients.append(c)
    assert loop.watching() == 5
    assert run_until(loop, lambda: len(connected) == 5)
    for c in clients:  # nothing is written until the loop sees the socket writable
        c.publish("edgekit/v1/loop/d/telemetry", b"x", qos=1)
    assert run_until(loop, lambda: len(acked) == 5)
    sock = loop.forget(clients[0])  # a pulled cable: no DISCONNECT
    assert sock is not None and loop.watching() == 4 and loop.forget(clients[0]) is None
    sock.close()
    for c in clients[1:]:
        c.disconnect()  # paho closes each socket once its DISCONNECT is out
    assert run_until(loop, lambda: loop.watching() == 0)
