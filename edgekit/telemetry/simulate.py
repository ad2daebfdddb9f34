"""Fleet simulator: N simulated edgekit devices publishing realistic telemetry to an MQTT broker.

Every device is edgekit's own ``TelemetryPublisher`` (so the wire format, the birth, the
Will, Sparkplug births and deaths are the real ones) fed synthetic frame records: distinct
profiles, backends and budgets, latency drifting slowly, one device creeping over its
budget.  ``SimOptions.detectors`` makes the last N devices face detectors (BlazeFace): their
windows count the faces they found.  ``--offline DEV@S`` makes device DEV drop its connection after S seconds without
a DISCONNECT, so the broker publishes its Will.  SIGTERM / SIGINT stop every device
cleanly (each says "offline"); a SIGKILL leaves the Wills to the broker.

Load mode (``--rate R``): the devices publish precomputed windows (real sketches, fresh
``seq`` and ``sent_at``) at R messages a second in total, QoS 1, then print how many
the broker acknowledged as one JSON line: ``{"sent": ..., "published": ..., ...}``.  All
clients run from one thread there (see ``Driver``); ``--offline`` applies to the demo mode.

    edgekit fleet simulate --mqtt mqtt://127.0.0.1:1883 --fleet demo --devices 4
        [--prefix sim] [--interval 1.0] [--keepalive 2] [--duration S] [--format json|sparkplug]
        [--rate MSGS_PER_S] [--offline DEVICE@SECONDS ...]

In Python: ``run(SimOptions(mqtt=...))``.  Needs the ``device`` extra (numpy, paho-mqtt) and, in
load mode, ``orjson`` (the ``fleet`` extra).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import select
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np

from edgekit.detection.detector import Detection
from edgekit.errors import EdgekitError
from edgekit.pipeline.records import Counters, FrameRecord
from edgekit.telemetry import BrokerConfig, Spool, TelemetryPublisher
from edgekit.telemetry.gauges import Gauges
from edgekit.telemetry.window import MetricsWindow, Window

log = logging.getLogger(__name__)
FORMATS = ("json", "sparkplug")


@dataclass(frozen=True)
class SimOptions:
    """What to simulate: ``edgekit fleet simulate``'s options."""

    mqtt: str  # broker URL, e.g. mqtt://127.0.0.1:1883
    fleet: str = "demo"
    devices: int = 4
    prefix: str = "sim"  # device ids are <prefix>-01, <prefix>-02, ...
    interval: float = 1.0  # seconds per telemetry window
    keepalive: int = 2  # MQTT keep-alive (s): how soon a Will fires
    duration: float = 0.0  # seconds to run (0: until SIGTERM / Ctrl-C; load mode: 10)
    format: str = "json"
    rate: float = 0.0  # load mode: messages a second over all devices
    offline: tuple[str, ...] = ()  # DEVICE@SECONDS: that device drops its connection then
    detectors: int = 0  # the last N devices run a face detector (per-class detection counts)
    # Scale mode (``edgekit.telemetry.simulate_fleet``): thousands of devices from one thread.
    scale: bool = False
    outages: float = 0.0  # share of the devices that lose their connection once
    restarts: float = 0.0  # share of the devices that restart once (a new epoch)
    ledger: str = ""  # where to write what the broker acknowledged


@dataclass(frozen=True)
class Kind:
    """A kind of device in the simulated fleet: where it runs, on what, within which budget."""

    profile: str
    backend: str
    precision: str
    budget_ms: float
    typical_ms: float  # median latency when all is well
    gpu: bool = False


KINDS = (
    Kind("rpi5", "litert", "int8", 33.3, 19.0),
    Kind("jetson-orin-nano", "tensorrt", "fp16", 16.7, 7.5, gpu=True),
    Kind("coral-devboard", "litert", "int8", 33.3, 11.0),
    Kind("x86_64-cpu", "onnxruntime", "fp32", 50.0, 21.0),
    Kind("x86_64-cpu", "openvino", "fp32", 50.0, 15.0),
)
MODEL = "efficientnet-lite0"
DETECTOR = "blazeface"  # a simulated detector's model: faces, one class
FACE_SHARE = 0.6  # share of a detector's frames with a face in them
VERSIONS = ("1.0", "1.1")
# Share of a frame's latency each stage takes (capture_wait, preprocess, inference, postprocess, sink).
SHARES = (0.06, 0.12, 0.72, 0.05, 0.05)
CREEPER = 1  # this device's latency creeps over its budget


class SimGauges(Gauges):
    """Gauges a device of ``kind`` might report, moving a little each read (not this host's)."""

    def __init__(self, kind: Kind, rng: np.random.Generator) -> None:
        self.kind, self.rng, self.temp = kind, rng, 48.0

    def read(self) -> dict[str, Any]:
        self.temp = float(np.clip(self.temp + self.rng.normal(0.1, 0.6), 40.0, 85.0))
        out: dict[str, Any] = {
            "cpu_percent": round(float(self.rng.uniform(35, 80)), 1),
            "process_cpu_percent": round(float(self.rng.uniform(60, 140)), 1),
            "memory_total_mb": 8192 if self.kind.profile != "coral-devboard" else 1024,
            "memory_available_mb": int(self.rng.integers(300, 900)),
            "process_rss_mb": round(float(self.rng.uniform(180, 220)), 1),
            "temperature_c": {"cpu-thermal": round(self.temp, 1)},
            "cpu_freq_ratio": round(float(self.rng.uniform(0.8, 1.0)), 3),
        }
        if self.kind.gpu:
            out["gpu_percent"] = round(float(self.rng.uniform(40, 95)), 1)
        return out


class SimDevice:
    """One simulated device: a real ``TelemetryPublisher`` and a source of frame records of drifting latency."""

    def __init__(
        self,
        index: int,
        opts: SimOptions,
        broker: BrokerConfig,
        spool_dir: Path,
        t0: float,
    ) -> None:
        self.name = f"{opts.prefix}-{index + 1:02d}"
        self.kind = KINDS[index % len(KINDS)]
        self.version = VERSIONS[(index // len(KINDS)) % len(VERSIONS)]
        self.creeps = index == CREEPER
        self.rng = np.random.default_rng(index)
        self.phase = float(self.rng.uniform(0, 2 * math.pi))
        self.fps = round(1000.0 / self.kind.budget_ms)
        self.t0 = t0
        self.counters = Counters()
        self.detector = index >= opts.devices - max(0, opts.detectors)
        self.window = MetricsWindow(detections=self.detector)
        self.frame = 0
        self.publisher = TelemetryPublisher(
            broker,
            device_id=self.name,
            fleet=opts.fleet,
            interval_s=opts.interval,
            window=self.window,
            counters=self.counters.to_dict,
            birth=self.birth(),
            spool=Spool(spool_dir / f"{self.name}.db"),
            gauges=SimGauges(self.kind, self.rng),
            format=opts.format,
        )
        self.dead = False

    def birth(self) -> dict[str, Any]:
        """What a real pipeline on this device says at birth (see ``Pipeline._birth``)."""
        k = self.kind
        model = DETECTOR if self.detector else MODEL
        digest = f"{abs(hash((model, self.version))):064x}"[-64:]
        return {
            "model": {
                "name": model,
                "version": self.version,
                "sha256": digest,
                "artifact": f"{k.profile}-{k.backend}-{k.precision}",
                "artifact_sha256": digest[::-1],
            },
            "candidate": f"{k.profile}/{k.backend}-{k.precision}",
            "backend": k.backend,
            "precision": k.precision,
            "budget_ms": k.budget_ms,
            "profile": k.profile,
            "source": "synthetic:640x480@30",
            "policy": "drop-oldest",
        }

    def median_ms(self, now: float) -> float:
        """The latency this device runs at ``now``: a slow wave, and for the creeper a steady rise."""
        t = now - self.t0
        if self.creeps:  # reaches its budget after ~20 s, then keeps going to 1.5x
            return self.kind.budget_ms * min(1.5, 0.7 + 0.015 * t)
        return self.kind.typical_ms * (1 + 0.15 * math.sin(2 * math.pi * t / 90 + self.phase))

    def records(self, n: int, now: float) -> list[FrameRecord]:
        """``n`` frames' records around ``now``."""
        median = self.median_ms(now)
        total = median * self.rng.lognormal(0.0, 0.18, n)
        spikes = self.rng.random(n) < 0.01  # the odd slow frame (a GC pause, a thermal dip)
        total[spikes] *= self.rng.uniform(1.5, 3.0, int(spikes.sum()))
        out: list[FrameRecord] = []
        budget_ns = int(self.kind.budget_ms * 1e6)
        for ms in total.tolist():
            wait, pre, infer, post, sink = (ms * s for s in SHARES)
            self.frame += 1
            ns = time.perf_counter_ns()
            met = ms <= self.kind.budget_ms
            out.append(
                FrameRecord(
                    self.frame,
                    now,
                    ns,
                    ns + budget_ns,
                    wait,
                    pre,
                    infer,
                    post,
                    sink,
                    ms,
                    met,
                    0,
                    "sim",
                    detections=self.faces() if self.detector else (),
                )
            )
        return out

    def faces(self) -> tuple[Detection, ...]:
        """A detector's frame: no face, or one to three at random places (640x480 frame pixels)."""
        if self.rng.random() >= FACE_SHARE:
            return ()
        out = []
        for _ in range(int(self.rng.integers(1, 4))):
            x, y, size = (float(v) for v in self.rng.uniform((0, 0, 40), (560, 400, 80)))
            score = float(self.rng.uniform(0.55, 0.99))
            out.append(Detection(0, "face", score, (x, y, x + size, y + size)))
        return tuple(sorted(out, key=lambda d: -d.score))

    def run_frames(self, dt: float, now: float) -> None:
        """Feed ``dt`` seconds of frames to the window (and the counters)."""
        for rec in self.records(max(1, round(self.fps * dt)), now):
            self.window.observe(rec)
            self.counters.add("frames")
            self.counters.add("met" if rec.met else "missed")

    def window_of(self, seconds: float, now: float) -> Window:
        """A closed window of ``seconds`` of frames ending at ``now`` (load mode precomputes these)."""
        window = MetricsWindow(detections=self.detector)  # what the device's own window makes of them
        for rec in self.records(max(1, round(self.fps * seconds)), now):
            window.observe(rec)
        w = window.take()
        w.start, w.end = now - seconds, now
        return w

    def drop_connection(self) -> None:
        """Vanish without a DISCONNECT (a pulled cable, a crash): the broker publishes the Will."""
        pub, self.dead = self.publisher, True
        pub._stop.set()  # the publisher's thread ends; no "offline" from us
        pub._wake.set()
        pub._client.loop_stop()
        sock = pub._client.socket()
        if sock is not None:
            sock.close()
        log.info("sim: %s dropped its connection", self.name)

    def stop(self) -> None:
        """Say "offline" and disconnect (a device that dropped its connection only closes its spool)."""
        if not self.dead:
            self.publisher.stop(timeout=2.0)
        else:
            self.publisher.spool.close()


def parse_offline(specs: tuple[str, ...], names: list[str]) -> dict[str, float]:
    """``DEVICE@SECONDS`` specs as ``{device: seconds}``, every device one of ``names``."""
    out = {}
    for spec in specs:
        name, _, at = spec.rpartition("@")
        if name not in names:
            raise EdgekitError(f"--offline {spec}: no device {name!r}", f"devices: {', '.join(names)}")
        try:
            out[name] = float(at)
        except ValueError:
            raise EdgekitError(f"--offline {spec}: not DEVICE@SECONDS", "e.g. sim-03@20") from None
    return out


class Stopper:
    """SIGTERM and SIGINT end the run cleanly (the devices say offline before they go)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.event.set()


def simulate(opts: SimOptions, broker: BrokerConfig, stop: threading.Event) -> int:
    """Demo mode: every device a started ``TelemetryPublisher``, frames fed ten times a second."""
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="fleet-sim-") as tmp:
        devices = [SimDevice(i, opts, broker, Path(tmp), t0) for i in range(opts.devices)]
        offline = parse_offline(opts.offline, [d.name for d in devices])
        for d in devices:
            d.publisher.start()
        print(
            f"fleet_sim: {len(devices)} devices ({opts.format}) publishing to {broker.describe()}", flush=True
        )
        try:
            tick, last = 0.1, time.monotonic()
            end = last + opts.duration if opts.duration else math.inf
            while not stop.wait(tick) and time.monotonic() < end:
                now_m, now = time.monotonic(), time.time()
                for d in devices:
                    if d.dead:
                        continue
                    if d.name in offline and now - t0 >= offline[d.name]:
                        d.drop_connection()
                        print(f"fleet_sim: {d.name} dropped its connection", flush=True)
                        continue
                    d.run_frames(now_m - last, now)
                last = now_m
        finally:
            for d in devices:
                d.stop()
    print("fleet_sim: stopped", flush=True)
    return 0


class Driver:
    """Runs many paho clients from one thread: no network thread per client, no wake-up socket pair.

    paho's ``loop_start`` costs a thread switch and a few system calls per message; at
    thousands of messages a second that, not the broker, would be the simulator's limit.
    """

    def __init__(self, clients: list[Any]) -> None:  # paho clients
        self.clients = clients
        self._misc = 0.0

    def step(self, timeout: float) -> None:
        by_sock = {c.socket(): c for c in self.clients if c.socket() is not None}
        want = [s for s, c in by_sock.items() if c.want_write()]
        readable, writable, _ = select.select(list(by_sock), want, [], timeout)
        for sock in readable:
            by_sock[sock].loop_read()
        for sock in writable:
            by_sock[sock].loop_write()
        if time.monotonic() - self._misc > 0.5:  # keep-alive pings
            self._misc = time.monotonic()
            for c in self.clients:
                c.loop_misc()

    def until(self, done: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                return False
            self.step(0.01)
        return True


def load(opts: SimOptions, broker: BrokerConfig, stop: threading.Event) -> int:
    """Load mode: precomputed windows with fresh ``seq`` / ``sent_at`` at ``--rate`` messages a second, QoS 1."""
    import orjson

    from edgekit.protocol import sparkplug as sp

    t0 = time.time()
    acked = connected = 0

    def on_publish(client: Any, userdata: Any, mid: int, reason: Any, properties: Any) -> None:
        nonlocal acked
        acked += 1  # one thread: the driver's

    def on_connect(client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        nonlocal connected
        connected += not reason.is_failure

    with tempfile.TemporaryDirectory(prefix="fleet-sim-") as tmp:
        devices = [SimDevice(i, opts, broker, Path(tmp), t0) for i in range(opts.devices)]
        clients: list[Any] = []
        templates: list[Any] = []  # per device: JSON windows, or (Sparkplug message, seq metric index)
        topics: list[str] = []
        for d in devices:
            pub = d.publisher
            client = broker.client(d.name)
            will_topic, will, retain = pub._offline()
            client.will_set(will_topic, will, qos=1, retain=retain)
            client.max_inflight_messages_set(100)
            client.on_publish = on_publish
            client.on_connect = on_connect
            client.connect(broker.host, broker.port, keepalive=broker.keepalive_s)
            clients.append(client)
        driver = Driver(clients)
        if not driver.until(lambda: connected == len(clients), 10):
            raise EdgekitError(
                f"only {connected} of {len(clients)} simulated devices connected to {broker.describe()}",
                "is the broker up, and does it take this many clients?",
            )
        for d, client in zip(devices, clients, strict=True):
            pub = d.publisher
            # A few distinct windows per device, each published many times with a new seq.
            windows = [pub._payload(d.window_of(opts.interval, t0), seq=0) for _ in range(8)]
            if opts.format == "sparkplug":
                pub._births(client)
                # Encoded once; per message only seq and times change in the protobuf.
                msgs: list[tuple[Any, int]] = []
                for body in windows:
                    msg = sp.payload_class()()
                    msg.ParseFromString(sp.encode(sp.window_metrics(body), 0))
                    idx = next(i for i, m in enumerate(msg.metrics) if m.name == "telemetry/seq")
                    msgs.append((msg, idx))
                templates.append(msgs)
                topics.append(sp.topic(opts.fleet, "DDATA", d.name, sp.DEVICE))
            else:
                client.publish(pub.status_topic, pub._status("online"), qos=1, retain=True)
                templates.append(windows)
                topics.append(pub.telemetry_topic)
        n_dev = len(devices)
        births = n_dev if opts.format == "json" else 0  # the retained JSON births are QoS 1
        driver.until(lambda: acked >= births, 10)
        acked = 0  # from here on only telemetry goes out with QoS 1, until the offline messages
        published, seqs = 0, [0] * n_dev
        print(f"fleet_sim: {n_dev} devices, load {opts.rate:g} msg/s ({opts.format})", flush=True)
        start = time.monotonic()
        end = start + (opts.duration or 10.0)
        while not stop.is_set():
            now = time.monotonic()
            if now >= end:
                break
            due = min(int((now - start) * opts.rate) - published, 200)
            for _ in range(due):
                i = published % n_dev
                seq, seqs[i] = seqs[i], seqs[i] + 1
                template = templates[i][seq % len(templates[i])]
                sent_at = time.time()
                if opts.format == "sparkplug":
                    msg, idx = template
                    msg.seq = (seq + 2) % 256  # after NBIRTH (0) and DBIRTH (1)
                    msg.timestamp = int(sent_at * 1000)
                    msg.metrics[idx].long_value = seq
                    payload = msg.SerializeToString()
                else:
                    payload = orjson.dumps(template | {"seq": seq, "sent_at": round(sent_at, 3)})
                clients[i].publish(topics[i], payload, qos=1)
                published += 1
            driver.step(0.0 if due > 0 else 0.001)
        wall = time.monotonic() - start
        driver.until(lambda: acked >= published, 30)
        sent = acked
        for d, client in zip(devices, clients, strict=True):
            topic, payload, retain = d.publisher._offline()
            client.publish(topic, payload, qos=1, retain=retain)
        driver.until(lambda: acked >= sent + n_dev, 5)
        for d, client in zip(devices, clients, strict=True):
            client.disconnect()
            d.publisher.spool.close()
    print(
        json.dumps({"sent": sent, "published": published, "seconds": round(wall, 3),
                    "rate": round(published / wall, 1), "devices": n_dev, "format": opts.format}),
        flush=True,
    )  # fmt: skip
    return 0 if sent == published else 1


def prepare(options: SimOptions) -> tuple[BrokerConfig, threading.Event]:
    """Check the options; the broker to publish to, and the event SIGTERM / SIGINT set."""
    if options.devices < 1:
        raise EdgekitError(f"--devices {options.devices}: at least 1", "e.g. --devices 4")
    if options.format not in FORMATS:
        raise EdgekitError(
            f"--format {options.format}: not one of {', '.join(FORMATS)}", "e.g. --format json"
        )
    for name, share in (("--outages", options.outages), ("--restarts", options.restarts)):
        if not 0.0 <= share <= 1.0:
            raise EdgekitError(f"{name} {share:g}: a share of the devices, 0 to 1", f"e.g. {name} 0.01")
    broker = dataclasses.replace(BrokerConfig.from_url(options.mqtt), keepalive_s=options.keepalive)
    return broker, Stopper().event


def run(options: SimOptions) -> int:
    """Run the simulator until ``options.duration`` ends or SIGTERM / SIGINT; the exit status.

    Demo and load mode; ``--scale`` is ``edgekit.telemetry.simulate_fleet.run``.
    """
    broker, stop = prepare(options)
    return load(options, broker, stop) if options.rate > 0 else simulate(options, broker, stop)
