"""A TCP proxy that can turn into a blackhole: forwards, then swallows everything for N seconds, then resets.

This is the network failure that hurts most: no FIN, no RST, no ICMP while it lasts, so
each side keeps writing into a socket whose bytes go nowhere and a QoS 0 publish looks
"sent".  It ends the way a NAT or a mobile link usually ends it, with a reset.  Tests and
``benchmarks/telemetry_blackhole.py`` put it between a publisher and a real Mosquitto::

    with Blackhole(broker.port) as hole:
        ...connect to hole.url...
        hole.swallow(3.0)   # blocks 3 s, then resets every connection it carried
"""

from __future__ import annotations

import json
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from edgekit.testing.mosquitto import free_port


class _Pair:
    """One proxied connection: the client's socket and ours to the upstream."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client, self.upstream = client, upstream
        self.reset = threading.Event()


class Blackhole:
    """``127.0.0.1:<port>`` forwarding to ``127.0.0.1:<upstream>``; ``swallow(seconds)`` blackholes it."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.port = free_port()
        self.swallowed = 0  # bytes dropped on the floor, both directions
        self.resets = 0  # connections reset at the end of a blackhole
        self._swallowing = threading.Event()
        self._closed = threading.Event()
        self._pairs: list[_Pair] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._listener.settimeout(0.1)
        self._thread = threading.Thread(target=self._accept, name="blackhole-accept", daemon=True)

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self) -> Blackhole:
        self._thread.start()
        return self

    def swallow(self, seconds: float) -> None:
        """Swallow all traffic (new connections too) for ``seconds``, then reset every connection."""
        self._swallowing.set()
        time.sleep(seconds)
        with self._lock:
            pairs = list(self._pairs)
        for pair in pairs:
            pair.reset.set()
        # Forward again only once every old connection is gone: nothing swallowed slips through later.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with self._lock:
                if not any(p in self._pairs for p in pairs):
                    break
            time.sleep(0.01)
        self._swallowing.clear()

    def close(self) -> None:
        self._closed.set()
        self._thread.join(5)
        self._listener.close()
        with self._lock:
            pairs = list(self._pairs)
        for pair in pairs:
            pair.reset.set()

    def __enter__(self) -> Blackhole:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream), timeout=5)
            except OSError:
                client.close()
                continue
            pair = _Pair(client, upstream)
            with self._lock:
                self._pairs.append(pair)
            threading.Thread(target=self._pump, args=(pair,), name="blackhole-pump", daemon=True).start()

    def _pump(self, pair: _Pair) -> None:
        other = {pair.client: pair.upstream, pair.upstream: pair.client}
        try:
            while not pair.reset.is_set() and not self._closed.is_set():
                readable, _, _ = select.select(list(other), [], [], 0.05)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if self._swallowing.is_set():
                        self.swallowed += len(data)
                    else:
                        other[sock].sendall(data)
            if pair.reset.is_set():
                self.resets += 1
                for sock in other:  # SO_LINGER 0: close() sends a RST, not a FIN
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        finally:
            for sock in other:
                sock.close()
            with self._lock:
                self._pairs.remove(pair)


@dataclass(frozen=True)
class BlackholeRun:
    """What went through one blackhole: windows made by the publisher, seqs the subscriber got."""

    format: str
    made: int
    received: int  # distinct seqs of the made ones
    duplicates: int  # arrivals beyond the first of a seq (allowed: subscribers de-duplicate)
    swallowed: int  # bytes the blackhole dropped
    reconnects: int
    dead_data: int = 0  # Sparkplug: DDATA that came after an NDEATH, before the next NBIRTH

    @property
    def lost(self) -> int:
        return self.made - self.received

    def line(self) -> str:
        return (
            f"{self.format:9s} made {self.made:4d}  received {self.received:4d}  lost {self.lost:3d}  "
            f"duplicates {self.duplicates:3d}  (swallowed {self.swallowed} B, reconnects {self.reconnects}"
            + (f", DDATA of a dead node {self.dead_data})" if self.format == "sparkplug" else ")")
        )


class WindowSeqs:
    """A subscriber on the broker itself (not through a blackhole) noting each window's seq.

    And each window's ``spool_dropped`` counter, in ``dropped``: windows the device could not keep;
    of Sparkplug, every message's kind in ``kinds`` (NBIRTH, DBIRTH, DDATA, NDEATH) in arrival order.
    """

    def __init__(self, port: int, format: str, fleet: str, device: str) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        self.format = format
        self.seqs: list[int] = []
        self.dropped: list[int] = []
        self.kinds: list[str] = []
        self._lock = threading.Lock()
        where = (
            f"edgekit/v1/{fleet}/{device}/telemetry"
            if format == "json"
            else f"spBv1.0/{fleet}/+/{device}/#"  # '#' matches the node's own topics too
        )
        self.ready = threading.Event()
        self.client = mqtt.Client(
            callback_api_version=CallbackAPIVersion.VERSION2, client_id=f"seqs-{device}"
        )
        self.client.on_connect = lambda c, u, f, rc, p: c.subscribe(where, qos=1)
        self.client.on_subscribe = lambda *a: self.ready.set()
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port, keepalive=10)
        self.client.loop_start()

    def _on_message(self, client: Any, userdata: Any, msg: Any) -> None:
        if self.format == "json":
            body = json.loads(msg.payload)
            seq, dropped = int(body["seq"]), int(body["counters"]["spool_dropped"])
        else:
            from edgekit.protocol import sparkplug as sp

            kind = msg.topic.split("/")[2]
            with self._lock:
                self.kinds.append(kind)
            if kind != "DDATA":
                return
            metrics = sp.decode(msg.payload)["metrics"]
            seq, dropped = int(metrics["telemetry/seq"]), int(metrics["counters/spool_dropped"])
        with self._lock:
            self.seqs.append(seq)
            self.dropped.append(dropped)

    def copy(self) -> list[int]:
        with self._lock:
            return list(self.seqs)

    def dead_data(self) -> int:
        """DDATA seen after an NDEATH and before the next NBIRTH: data of a node a host holds dead."""
        count, dead = 0, False
        with self._lock:
            for kind in self.kinds:
                dead = kind == "NDEATH" or (dead and kind != "NBIRTH")
                count += dead and kind == "DDATA"
        return count

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _wait(done: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def telemetry_through_blackhole(
    broker_port: int,
    spool: Path,
    *,
    format: str = "json",
    seconds: float = 3.0,
    interval_s: float = 0.2,
    before: int = 5,
    after: int = 5,
    timeout: float = 60.0,
) -> BlackholeRun:
    """A ``TelemetryPublisher`` reporting through a ``Blackhole`` that swallows for ``seconds`` once.

    ``before`` windows arrive first, then the blackhole, then on until the publisher has
    reconnected and made ``after`` more; it stops (sending its last window) and the
    subscriber is given until ``timeout`` to see every seq that was made.
    """
    from edgekit.protocol.broker import BrokerConfig
    from edgekit.telemetry.publisher import TelemetryPublisher

    fleet, device = "lab", f"hole-{format}"
    seqs = WindowSeqs(broker_port, format, fleet, device)
    try:
        if not seqs.ready.wait(10):
            raise RuntimeError("the subscriber did not get its subscription acknowledged")
        with Blackhole(broker_port) as hole:
            publisher = TelemetryPublisher(
                BrokerConfig.from_url(hole.url),
                device_id=device,
                fleet=fleet,
                interval_s=interval_s,
                spool=spool,
                format=format,
            ).start()
            try:
                if not _wait(lambda: len(set(seqs.copy())) >= before, timeout):
                    raise RuntimeError(f"no {before} windows arrived before the blackhole")
                hole.swallow(seconds)
                made_then = publisher.last_seq
                _wait(lambda: publisher.connects >= 2 and publisher.last_seq >= made_then + after, timeout)
            finally:
                publisher.stop()
            made = publisher.last_seq + 1
            # What the broker acknowledged reaches a subscriber at once: a few seconds is plenty.
            _wait(lambda: set(range(made)) <= set(seqs.copy()), 5.0)
            got = seqs.copy()
            return BlackholeRun(
                format=format,
                made=made,
                received=len(set(range(made)) & set(got)),
                duplicates=len(got) - len(set(got)),
                swallowed=hole.swallowed,
                reconnects=publisher.connects - 1,
                dead_data=seqs.dead_data(),
            )
    finally:
        seqs.close()
