"""A fleet at scale: thousands of simulated devices, each its own MQTT connection and identity, from one thread.

``edgekit fleet simulate --scale`` (``run_scale``).  Every device is a paho client of its own:
client id = device id, a Will (its retained "offline" status), a retained "online" status with
its birth facts, and a telemetry window every ``--interval`` seconds at QoS 1, the devices'
windows spread evenly over the interval, so the broker sees a steady stream rather than a burst.

What goes wrong in a real fleet goes wrong here, on a schedule drawn from a seeded generator:

- ``--outages SHARE``: that share of the devices loses its connection once, without a DISCONNECT
  (the socket just closes: the broker publishes the Will), for 5-30 s.  The windows made while
  away, and those sent but not acknowledged when the link went, are kept and sent when the device
  is back, oldest first, as a device's spool does: some of them may reach the broker twice.
- ``--restarts SHARE``: that share restarts once: "offline", a disconnect, 3 s later a new boot
  (a new ``epoch``: ``seq`` starts at 0 again) with its unacknowledged windows still to send.

At the end every window still unsent is sent, every device says "offline" and disconnects, and
one JSON line says what happened: windows made, acknowledged, sent again, outages, restarts.
``--ledger FILE`` writes what the broker acknowledged, per device and epoch, as seq ranges:
what a store must hold, to count lost and duplicated rows against (``benchmarks.fleet_scale``).

Why one thread holds ten thousand clients: paho runs without its network thread, driven from one
epoll loop (``edgekit.protocol.paho_loop``), and a payload is a
few precomputed windows per kind of device with this device's identity, epoch, seq and times.
A device costs a socket here and one in the broker: ``raise_fd_limit`` lifts this process's
soft limit to the hard one and says so when that is too low.
"""

from __future__ import annotations

import heapq
import json
import logging
import math
import resource
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.errors import EdgekitError
from edgekit.protocol.broker import BrokerConfig
from edgekit.protocol.paho_loop import PahoLoop
from edgekit.telemetry.simulate import KINDS, SimDevice, SimOptions, prepare

log = logging.getLogger(__name__)

TEMPLATES = 8  # distinct windows per kind of device; each device cycles through its kind's
CONNECTS_PER_S = 1000.0  # how fast devices come online at the start (a fleet does not boot in one instant)
OUTAGE_S = (5.0, 30.0)  # how long a lost connection lasts
RESTART_S = 3.0  # how long a restart takes
FD_SPARE = 64  # descriptors besides the devices' sockets (files, the broker's address lookups...)


@dataclass(eq=False)
class Device:
    """One simulated device's state: its link, its epoch and seq, what it still has to send."""

    index: int
    name: str
    kind: int
    epoch: str
    session: str
    seq: int = 0
    client: Any = None  # a paho client while a link is open or opening
    online: bool = False
    backlog: deque[tuple[str, int, bytes]] = field(default_factory=deque)  # (epoch, seq, payload)
    inflight: dict[int, tuple[str, int, bytes]] = field(default_factory=dict)  # mid -> window
    restarting: bool = False  # said offline and disconnecting; boots again when the link is gone
    gone: bool = False  # the run's end: no reconnects


def raise_fd_limit(needed: int) -> int:
    """Lift this process's soft descriptor limit to its hard one; ``EdgekitError`` if that is below ``needed``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise EdgekitError(
            f"{needed} open files are needed (a socket per device) but this process may have {hard}",
            f"raise the hard limit first: `ulimit -Hn {needed}` as root, or LimitNOFILE={needed} in a unit; "
            "the broker needs as many",
        )
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return int(soft)


class Ledger:
    """What the broker acknowledged: per device and epoch, the seqs (as ranges when written)."""

    def __init__(self) -> None:
        self.acked: dict[str, dict[str, list[int]]] = {}
        self.count = 0

    def add(self, device: str, epoch: str, seq: int) -> None:
        self.acked.setdefault(device, {}).setdefault(epoch, []).append(seq)
        self.count += 1

    def ranges(self) -> dict[str, dict[str, list[list[int]]]]:
        """``{device: {epoch: [[first, last], ...]}}``, each seq once."""
        out: dict[str, dict[str, list[list[int]]]] = {}
        for device, epochs in self.acked.items():
            for epoch, seqs in epochs.items():
                runs: list[list[int]] = []
                for s in sorted(set(seqs)):
                    if runs and s == runs[-1][1] + 1:
                        runs[-1][1] = s
                    else:
                        runs.append([s, s])
                out.setdefault(device, {})[epoch] = runs
        return out

    def distinct(self) -> int:
        return sum(len(set(seqs)) for epochs in self.acked.values() for seqs in epochs.values())


class Templates:
    """Per kind of device: a few real windows and a birth, made by ``SimDevice`` (the real publisher's payloads)."""

    def __init__(self, opts: SimOptions, tmp: Path, t0: float) -> None:
        self.windows: list[list[dict[str, Any]]] = []
        self.status: list[dict[str, Any]] = []
        for k in range(len(KINDS)):
            d = SimDevice(k, opts, BrokerConfig.from_url(opts.mqtt), tmp, t0)
            pub = d.publisher
            self.windows.append(
                [pub._payload(d.window_of(opts.interval, t0), seq=0) for _ in range(TEMPLATES)]
            )
            self.status.append(json.loads(pub._status("online")))
            pub.spool.close()
        self.offline = {"schema": self.status[0]["schema"], "state": "offline", "fleet": opts.fleet}


class ScaleSim:
    """The fleet: devices, their schedule, and the epoll loop that drives every client (see the module doc)."""

    def __init__(self, opts: SimOptions, broker: BrokerConfig, templates: Templates) -> None:
        import orjson

        from edgekit.protocol.topics import topic

        self._dumps = orjson.dumps
        self.opts, self.broker, self.templates = opts, broker, templates
        self.loop = PahoLoop()
        self.ledger = Ledger()
        self.rng = np.random.default_rng(0)
        self.devices = [
            Device(
                i, f"{opts.prefix}-{i + 1:05d}", i % len(KINDS), uuid.uuid4().hex[:16], uuid.uuid4().hex[:12]
            )
            for i in range(opts.devices)
        ]
        self.topics = [
            (topic(opts.fleet, d.name, "telemetry"), topic(opts.fleet, d.name, "status"))
            for d in self.devices
        ]
        self.made = self.published = self.resent = self.outages = self.restarts = 0
        self.refused = self.statuses = 0  # statuses: what the devices said online and offline
        self._heap: list[tuple[float, int, str]] = []  # (monotonic time, device, what): windows and faults

    # -- the links -----------------------------------------------------------------------------

    def connect(self, d: Device) -> None:
        client = self.broker.client(d.name)
        client.user_data_set(d)
        client.max_inflight_messages_set(1000)
        client.max_queued_messages_set(0)
        client.will_set(self.topics[d.index][1], self._status(d, "offline"), qos=1, retain=True)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        self.loop.attach(client)
        d.client = client
        try:
            client.connect(self.broker.host, self.broker.port, keepalive=self.broker.keepalive_s)
        except OSError as err:  # refused (the broker is full or away): try again in a while
            log.warning("sim: %s could not connect: %s", d.name, err)
            self._drop_link(d)
            self._at(time.monotonic() + 1.0, d.index, "connect")

    def _on_connect(self, client: Any, d: Device, flags: Any, reason: Any, properties: Any) -> None:
        if reason.is_failure:
            self.refused += 1
            return
        d.online = True
        client.publish(self.topics[d.index][1], self._status(d, "online"), qos=1, retain=True)
        self.statuses += 1
        while d.backlog:  # what was made while away, oldest first
            self._send(d, *d.backlog.popleft())

    def _on_disconnect(self, client: Any, d: Device, flags: Any, reason: Any, properties: Any) -> None:
        if d.client is not client:
            return
        self._drop_link(d)
        if d.gone:
            return
        if d.restarting:  # the process is gone; it boots again as a new epoch
            d.restarting = False
            d.epoch, d.session, d.seq = uuid.uuid4().hex[:16], uuid.uuid4().hex[:12], 0
            self._at(time.monotonic() + RESTART_S, d.index, "connect")
        else:  # the broker closed the link: come back in a second, like paho's back-off
            self._at(time.monotonic() + 1.0, d.index, "connect")

    def _on_publish(self, client: Any, d: Device, mid: int, reason: Any, properties: Any) -> None:
        if d.client is not client:
            return
        window = d.inflight.pop(mid, None)
        if window is not None:
            self.ledger.add(d.name, window[0], window[1])

    def _drop_link(self, d: Device) -> None:
        """Forget the link; what it had in flight goes back to the front of the backlog."""
        if d.client is not None:
            self.loop.forget(d.client)
        d.client, d.online = None, False
        d.backlog.extendleft(reversed(list(d.inflight.values())))  # in the order they were sent
        d.inflight.clear()

    # -- what devices say ------------------------------------------------------------------------

    def _status(self, d: Device, state: str) -> bytes:
        if state == "offline":
            body = self.templates.offline | {"device": d.name}
        else:
            body = self.templates.status[d.kind] | {
                "device": d.name,
                "session": d.session,
                "ts": round(time.time(), 3),
            }
        return self._dumps(body)

    def _window(self, d: Device, now: float) -> tuple[str, int, bytes]:
        tpl = self.templates.windows[d.kind][d.seq % TEMPLATES]
        body = tpl | {
            "device": d.name,
            "session": d.session,
            "epoch": d.epoch,
            "seq": d.seq,
            "sent_at": round(now, 3),
            "window": tpl["window"] | {"start": round(now - self.opts.interval, 3), "end": round(now, 3)},
        }
        d.seq += 1
        self.made += 1
        return d.epoch, d.seq - 1, self._dumps(body)

    def _send(self, d: Device, epoch: str, seq: int, payload: bytes) -> None:
        info = d.client.publish(self.topics[d.index][0], payload, qos=1)
        d.inflight[info.mid] = (epoch, seq, payload)
        self.published += 1

    # -- the schedule --------------------------------------------------------------------------

    def _at(self, t: float, index: int, what: str) -> None:
        heapq.heappush(self._heap, (t, index, what))

    def plan(self, start: float) -> None:
        """Windows spread over the interval; outages and restarts at random times in the run's middle."""
        n, every, length = len(self.devices), self.opts.interval, self.opts.duration
        for d in self.devices:
            self._at(start + every * (d.index + 1) / n, d.index, "window")
        for share, what in ((self.opts.outages, "outage"), (self.opts.restarts, "restart")):
            chosen: list[int] = (
                self.rng.choice(n, size=round(share * n), replace=False).tolist() if share > 0 else []
            )
            for i in chosen:
                self._at(start + float(self.rng.uniform(0.2, 0.7)) * length, int(i), what)

    def _due(self, now: float, end: float) -> None:
        while self._heap and self._heap[0][0] <= now:
            t, i, what = heapq.heappop(self._heap)
            d = self.devices[i]
            if what == "connect":
                if d.client is None and not d.gone:
                    self.connect(d)
            elif t >= end:
                continue  # the run is over: no more windows or faults
            elif what == "window":
                window = self._window(d, time.time())
                if d.online:
                    self._send(d, *window)
                else:
                    d.backlog.append(window)
                self._at(t + self.opts.interval, i, "window")
            elif what == "outage" and d.online:
                self.outages += 1
                sock = self.loop.forget(d.client)
                self._drop_link(d)
                if sock is not None:
                    sock.close()  # no DISCONNECT: the broker publishes the Will
                self._at(now + float(self.rng.uniform(*OUTAGE_S)), i, "connect")
            elif what == "restart" and d.online:
                self.restarts += 1
                d.restarting, d.online = True, False  # windows made from here on wait for the new boot
                d.client.publish(self.topics[i][1], self._status(d, "offline"), qos=1, retain=True)
                self.statuses += 1
                d.client.disconnect()  # sent after the status; no Will; _on_disconnect boots it again

    # -- the loop ------------------------------------------------------------------------------

    def step(self, timeout: float) -> None:
        self.loop.step(timeout)

    def pings(self) -> None:
        for d in self.devices:
            if d.client is not None:
                d.client.loop_misc()

    def run(self, stop: threading.Event) -> dict[str, Any]:
        n, opts = len(self.devices), self.opts
        t_connect = time.monotonic()
        pace = 1.0 / CONNECTS_PER_S
        for d in self.devices:  # come online at a steady pace, answering the broker between connects
            self.connect(d)
            self.step(0)
            while time.monotonic() - t_connect < (d.index + 1) * pace:
                self.step(pace / 2)
            if stop.is_set():
                break
        online = self._until(lambda: sum(d.online for d in self.devices) + self.refused >= n, 30.0, stop)
        up = sum(d.online for d in self.devices)
        connect_s = time.monotonic() - t_connect
        if not online or up < n:
            raise EdgekitError(
                f"only {up} of {n} simulated devices connected to {self.broker.describe()} in {connect_s:.0f} s",
                "is the broker up, and may it take this many connections (max_connections, its open-file limit)?",
            )
        print(
            f"fleet_sim: {n} devices online in {connect_s:.1f} s; a window every {opts.interval:g} s",
            flush=True,
        )
        start = time.monotonic()
        end = start + (opts.duration or math.inf)
        self.plan(start)
        last_ping = start
        while not stop.is_set() and time.monotonic() < end:
            now = time.monotonic()
            self._due(now, end)
            if now - last_ping >= 1.0:
                last_ping = now
                self.pings()
            wait = min(0.05, max(0.0, self._heap[0][0] - time.monotonic())) if self._heap else 0.05
            self.step(wait)
        wall = time.monotonic() - start
        # The end: the devices still away come back, and everything made is sent and acknowledged.
        for d in self.devices:
            if d.client is None:
                self.connect(d)
        drained = self._until(
            lambda: all(d.online and not d.inflight and not d.backlog for d in self.devices), 120.0, None
        )
        for d in self.devices:
            d.gone = True
            if d.client is not None:
                d.client.publish(self.topics[d.index][1], self._status(d, "offline"), qos=1, retain=True)
                self.statuses += 1
        for d in self.devices:
            if d.client is not None:
                d.client.disconnect()
        self._until(lambda: self.loop.watching() == 0, 10.0, None)
        return {
            "devices": n,
            "interval_s": opts.interval,
            "seconds": round(wall, 3),
            "connect_s": round(connect_s, 3),
            "windows": self.made,
            "acked": self.ledger.distinct(),
            "published": self.published,
            "sent_again": self.published - self.made,
            "statuses": self.statuses,
            "outages": self.outages,
            "restarts": self.restarts,
            "rate": round(self.made / wall, 1) if wall else 0.0,
            "drained": drained,
        }

    def _until(self, done: Callable[[], bool], timeout: float, stop: threading.Event | None) -> bool:
        deadline = time.monotonic() + timeout
        last_ping = time.monotonic()
        while not done():
            now = time.monotonic()
            if now > deadline or (stop is not None and stop.is_set()):
                return False
            if now - last_ping >= 1.0:
                last_ping = now
                self.pings()
                self._due(now, now)  # reconnects still come due; windows do not
            self.step(0.01)
        return True


def run_scale(opts: SimOptions, broker: BrokerConfig, stop: threading.Event) -> int:
    """``--scale``: the fleet above; 0 when every window made was acknowledged."""
    if opts.format != "json":
        raise EdgekitError("--scale speaks the JSON format only", "drop --format sparkplug, or drop --scale")
    raise_fd_limit(opts.devices + FD_SPARE)
    with tempfile.TemporaryDirectory(prefix="fleet-sim-") as tmp:
        templates = Templates(opts, Path(tmp), time.time())
    sim = ScaleSim(opts, broker, templates)
    summary = sim.run(stop)
    if opts.ledger:
        path = Path(opts.ledger)
        part = path.with_name(path.name + ".part")  # nothing half-written looks like a ledger
        part.write_text(json.dumps({"fleet": opts.fleet, "acked": sim.ledger.ranges()}))
        part.replace(path)
    print(json.dumps(summary), flush=True)
    return 0 if summary["drained"] and summary["acked"] == summary["windows"] else 1


def run(options: SimOptions) -> int:
    """``edgekit fleet simulate --scale``: the options checked, then ``run_scale`` until done or SIGTERM."""
    broker, stop = prepare(options)
    return run_scale(options, broker, stop)
