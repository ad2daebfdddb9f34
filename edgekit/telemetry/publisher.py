"""``TelemetryPublisher``: reports a device's measurements to an MQTT broker from its own thread.

Topics (JSON payloads: the models ``Status``, ``Telemetry``, ``Labels`` and ``EventMessage`` of
``edgekit.protocol.messages``; their schemas are in ``edgekit/protocol/schema/``)::

    edgekit/v1/<fleet>/<device>/status     retained, QoS 1: "online" and the birth facts on every
                                           connect; the Last Will sets it "offline"
    edgekit/v1/<fleet>/<device>/telemetry  QoS 1, every interval: seq, window, sketches, counters, gauges
    edgekit/v1/<fleet>/<device>/labels     QoS 0, optional, at most once per labels interval: a
                                           classifier's top labels, or a detector's detections
    edgekit/v1/<fleet>/<device>/events     QoS 1, through the spool: each zone or line event
                                           handed to ``publish_event`` (Sparkplug: a DDATA of its own)

The frame loop never waits on any of this: it only adds each frame to a ``MetricsWindow``.
On the timer this thread closes the window, writes the message to the spool, and
publishes the spool in order while connected; a message leaves the spool only when
the broker acknowledged it.  After an outage the spool is replayed in order.  A message
may then arrive twice (sent, PUBACK lost); subscribers de-duplicate on ``(device, seq)``
(events: on ``(device, id)``).
"""

from __future__ import annotations

import json
import logging
import math
import queue
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from edgekit._version import __version__
from edgekit.core.names import safe_name
from edgekit.errors import TelemetryError
from edgekit.protocol.broker import BrokerConfig, drop_unsent
from edgekit.protocol.messages import Status, Telemetry, checked, first_error
from edgekit.protocol.topics import SCHEMA_STATUS, SCHEMA_TELEMETRY, topic
from edgekit.telemetry.continuity import Continuity
from edgekit.telemetry.event_queue import EventQueue, event_body
from edgekit.telemetry.gauges import Gauges
from edgekit.telemetry.labels import labels_payload
from edgekit.telemetry.spool import Spool, default_spool
from edgekit.telemetry.window import MetricsWindow, Window

if TYPE_CHECKING:
    from edgekit.detection.detector import Detection
    from edgekit.events.event import Event
    from edgekit.pipeline.records import FrameResult
    from edgekit.processing.postprocess import Label

log = logging.getLogger(__name__)

MAX_INFLIGHT = 20
# Numeric gauges a device may report (see gauges.py); Sparkplug declares them all at birth.
KNOWN_GAUGES = (
    "cpu_percent",
    "process_cpu_percent",
    "memory_total_mb",
    "memory_available_mb",
    "process_rss_mb",
    "gpu_percent",
    "cpu_freq_ratio",
)
FORMATS = ("json", "sparkplug")


def _check_name(what: str, value: str) -> str:
    if not safe_name(value):
        raise TelemetryError(
            f"{what} {value!r} cannot be part of an MQTT topic",
            f"use 1-128 letters, digits, '.', '_' or '-' for the {what}, starting with a letter or digit",
        )
    return value


class TelemetryPublisher:
    """Publishes ``window`` and ``counters()`` every ``interval_s`` to the broker; start() / stop()."""

    def __init__(
        self,
        broker: BrokerConfig,
        *,
        device_id: str,
        fleet: str = "default",
        interval_s: float = 5.0,
        window: MetricsWindow | None = None,
        counters: Callable[[], Mapping[str, int]] = dict,
        birth: Mapping[str, Any] | None = None,
        spool: Spool | Path | str | None = None,
        labels_interval_s: float | None = None,
        gauges: Gauges | None = None,
        format: str = "json",
    ) -> None:
        if format not in FORMATS:
            raise TelemetryError(f"unknown telemetry format {format!r}", "use json or sparkplug")
        if not interval_s > 0:
            raise TelemetryError(f"telemetry interval must be positive, got {interval_s}", "e.g. 5 (seconds)")
        self.broker = broker
        self.device_id = _check_name("device id", device_id)
        self.fleet = _check_name("fleet", fleet)
        self.interval_s = interval_s
        self.window = window or MetricsWindow()
        self.counters = counters
        self.birth = dict(birth or {})
        try:  # the birth facts go into every online status: a fact the fleet would refuse fails here
            Status.model_validate(
                {"schema": SCHEMA_STATUS, "state": "online", "device": self.device_id, **self.birth}
            )
        except ValidationError as err:
            raise TelemetryError(
                f"the birth facts are not a valid status: {first_error(err)}",
                "see edgekit/protocol/schema/status.schema.json",
            ) from None
        self.spool = (
            spool
            if isinstance(spool, Spool)
            else Spool(spool or default_spool(self.fleet, self.device_id, format))
        )
        self._epoch = self.spool.epoch
        self.continuity = Continuity(self.spool)  # totals go on from an earlier process's
        self.labels_interval_s = labels_interval_s
        self.gauges = gauges or Gauges()
        self.session = uuid.uuid4().hex[:12]  # tells a restarted process from a replay
        self.status_topic = topic(self.fleet, self.device_id, "status")
        self.telemetry_topic = topic(self.fleet, self.device_id, "telemetry")
        self.labels_topic = topic(self.fleet, self.device_id, "labels")
        self.events_topic = topic(self.fleet, self.device_id, "events")
        self.events = EventQueue()
        self.events_spooled = 0  # only goes up
        self.events_invalid = 0  # only goes up: events a receiver would refuse, logged and not sent
        self.format = format
        self.sparkplug = format == "sparkplug"
        # Sparkplug: bdSeq numbers MQTT sessions (kept in the spool), seq every message 0..255.
        self._bdseq = self.spool.next_sequence("bdseq") % 256 if self.sparkplug else 0
        self._sp_seq = 0
        self._birth_due = threading.Event()
        self._declared: set[str] = set()  # metric names the last DBIRTH declared
        self._late_metrics: dict[str, Any] = {}  # metrics first seen after a birth
        self._last_gauges: dict[str, Any] = {}
        self._connected_at = 0.0
        # Counters of the reporting itself (only go up).
        self.connects = 0
        self.disconnects = 0
        self.published = 0
        self.acked = 0
        self.last_error = ""
        self.last_seq = -1
        self._stopped = False
        self._generation = 0  # bumped by paho's thread on every connect
        self._seen_generation = 0
        self._connected = threading.Event()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._acks: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._inflight: dict[int, int] = {}  # paho mid -> spool id (this thread only)
        self._sent_upto = 0
        # Per camera ("" for a single source), its newest frame's (time, labels, detections or None for
        # a classifier), swapped in by the frame loop, and when each was sent: one camera's frames
        # never hide another's (the frames of cameras batched together come at once).
        self._labels: dict[str, tuple[float, tuple[Label, ...], tuple[Detection, ...] | None]] = {}
        self._labels_sent: dict[str, float] = {}
        self._thread = threading.Thread(target=self._run, name=f"edgekit-telemetry[{device_id}]", daemon=True)
        self._client = self._make_client()

    # -- MQTT ----------------------------------------------------------------------------

    def _make_client(self) -> Any:
        # Back off to at most 5 s: a device should be reporting again soon after its broker is.
        client = self.broker.client(self.device_id, max_delay_s=5)
        self._set_will(client)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        client.on_message = self._on_message
        return client

    def _offline(self) -> tuple[str, bytes, bool]:
        """Topic, payload and retain flag of "this device is gone": the Will, and what a clean stop says."""
        if self.sparkplug:
            from edgekit.protocol import sparkplug as sp

            return (
                sp.topic(self.fleet, "NDEATH", self.device_id),
                sp.encode({"bdSeq": self._bdseq}, None),
                False,
            )
        return self.status_topic, self._status("offline"), True

    def _set_will(self, client: Any) -> None:
        topic, payload, retain = self._offline()
        client.will_set(topic, payload, qos=1, retain=retain)

    def _next_sp_seq(self) -> int:
        seq = self._sp_seq
        self._sp_seq = (seq + 1) % 256
        return seq

    def _births(self, client: Any) -> None:
        """NBIRTH (seq 0, this session's bdSeq) then DBIRTH declaring every metric DDATA carries."""
        from edgekit.protocol import sparkplug as sp

        self._sp_seq = 0
        node = {"bdSeq": self._bdseq, sp.REBIRTH: False, "Properties/edgekit": __version__}
        node["Properties/session"] = self.session
        client.publish(
            sp.topic(self.fleet, "NBIRTH", self.device_id), sp.encode(node, self._next_sp_seq()), qos=0
        )
        now = time.time()
        # Declare every gauge DDATA may carry (NaN until measured) without reading them here.
        gauges: dict[str, Any] = dict.fromkeys(KNOWN_GAUGES, math.nan) | self._last_gauges
        # And every camera seen so far (all of them when report() named them up front).
        empty = self._payload(self.window.blank(now), seq=max(self.last_seq, 0), gauges=gauges)
        template = sp.window_metrics(empty) | sp.EVENT_METRICS | self._late_metrics
        facts: dict[str, Any] = {}
        for key, value in self.birth.items():
            if isinstance(value, dict):
                facts |= {f"Properties/{key}/{k}": v for k, v in value.items() if v is not None}
            elif value is not None:
                facts[f"Properties/{key}"] = value
        client.publish(
            sp.topic(self.fleet, "DBIRTH", self.device_id, sp.DEVICE),
            sp.encode(facts | template, self._next_sp_seq()),
            qos=0,
        )
        self._declared = set(template)

    def _on_message(self, client: Any, userdata: Any, msg: Any) -> None:
        # Commands from the network: parsed as protobuf, acted on only if they are the Rebirth metric.
        from google.protobuf.message import DecodeError

        from edgekit.protocol import sparkplug as sp

        try:
            command = sp.decode(msg.payload)
        except DecodeError:
            log.warning("telemetry: ignoring an unreadable command on %s", msg.topic)
            return
        if command["metrics"].get(sp.REBIRTH) is True:
            log.info("telemetry: rebirth requested")
            self._birth_due.set()
            self._wake.set()

    def _status(self, state: str) -> bytes:
        body: dict[str, Any] = {
            "schema": SCHEMA_STATUS,
            "state": state,
            "device": self.device_id,
            "fleet": self.fleet,
        }
        if state == "online":
            body |= {
                "ts": round(time.time(), 3),
                "session": self.session,
                "edgekit": __version__,
                **self.birth,
            }
        return json.dumps(checked(Status, body), separators=(",", ":")).encode()

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        if reason.is_failure:
            self.last_error = f"{self.broker.describe()} refused the connection: {reason}"
            log.error(
                "telemetry: %s (check the user, password and ACL; frames keep running)", self.last_error
            )
            return
        self.connects += 1
        self.last_error = ""
        log.info("telemetry: connected to %s as %s", self.broker.describe(), self.device_id)
        self._connected_at = time.time()
        if self.sparkplug:
            from edgekit.protocol import sparkplug as sp

            client.subscribe(sp.topic(self.fleet, "NCMD", self.device_id), qos=0)
        self._generation += 1  # the publisher thread restarts its replay from the oldest spooled row
        self._birth_due.set()
        self._connected.set()
        self._wake.set()

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        try:
            self._disconnected(client, reason)
        except Exception:  # an exception here would end paho's network thread: no more reconnects
            log.exception("telemetry: on_disconnect failed")
        finally:
            self._connected.clear()
            self._wake.set()

    def _disconnected(self, client: Any, reason: Any) -> None:
        if self._connected.is_set() and not self._stop.is_set():
            self.disconnects += 1
            log.warning("telemetry: disconnected from %s (%s); spooling", self.broker.describe(), reason)
        if self.sparkplug and self._connected.is_set() and not self._stop.is_set():
            self._bdseq = self.spool.next_sequence("bdseq") % 256
            self._set_will(client)  # the next session's death certificate
            drop_unsent(client)  # DDATA of this session must not precede the next NBIRTH: the spool resends

    def _on_publish(self, client: Any, userdata: Any, mid: int, reason: Any, properties: Any) -> None:
        # paho's network thread: only hand the ack over; the spool is touched by our thread.
        self._acks.put(mid)
        self._wake.set()

    # -- the thread ----------------------------------------------------------------------

    def start(self) -> TelemetryPublisher:
        """Connect (in the background: an unreachable broker does not block) and start reporting."""
        b = self.broker
        try:
            self._client.connect_async(b.host, b.port, keepalive=b.keepalive_s)
        except (OSError, ValueError) as err:
            raise TelemetryError(
                f"cannot reach {b.describe()}: {err}", "check the host name and port"
            ) from err
        self._client.loop_start()
        self._thread.start()
        return self

    def offer_labels(self, labels: tuple[Label, ...]) -> None:
        """The newest labels (from the frame loop: a reference swap); sent at most every labels interval."""
        if self.labels_interval_s is not None:
            self._labels[""] = (time.time(), labels, None)

    def offer_result(self, result: FrameResult, detector: bool = False) -> None:
        """A frame's result (from the frame loop: a reference swap): a detector's detections, or labels.

        Of many cameras, each camera's newest frame is sent (at most once per labels interval),
        and the message says which camera.
        """
        if self.labels_interval_s is not None:
            detections = result.detections if detector else None
            self._labels[result.record.camera] = (time.time(), result.labels, detections)

    def publish_event(self, event: Event | Mapping[str, Any]) -> None:
        """Send a zone or line event at least once (from any thread: only queued here, never waits).

        The publisher's thread writes it to the spool; it leaves the spool when the broker
        acknowledged it, and is sent again after an outage.  A receiver drops a repeat by its id.
        """
        self.events.put(event)
        self._wake.set()

    def _run(self) -> None:
        next_tick = time.monotonic() + self.interval_s
        while not self._stop.is_set():
            self._wake.wait(max(0.0, next_tick - time.monotonic()))
            self._wake.clear()
            try:
                now = time.monotonic()
                if now >= next_tick:
                    next_tick = max(next_tick + self.interval_s, now)  # after a stall: no catch-up burst
                    self._report()
                self._step()
            except Exception as err:  # a disk or broker hiccup must not end reporting for good
                self.last_error = f"telemetry step failed: {err}"
                log.exception("telemetry: step failed; retrying in 1 s")
                self.spool.repair(err)  # a spool damaged under our feet is set aside, as at start
                self._stop.wait(1.0)

    def _step(self) -> None:
        if self._generation != self._seen_generation:  # a new connection (maybe a quick reconnect)
            self._seen_generation = self._generation
            self._inflight.clear()
            self._sent_upto = 0
        self._take_acks()
        self._spool_events()
        if self._connected.is_set() and self._birth_due.is_set():
            self._birth_due.clear()
            self._announce()
        if self._connected.is_set():
            self._drain()
            self._send_labels()
        else:
            self._inflight.clear()
            self._sent_upto = 0

    def _announce(self) -> None:
        """Births after a connect or a Rebirth command (on this thread: one writer of ``seq``)."""
        if self.sparkplug:
            self._births(self._client)
        else:
            # The birth message: retained, so a dashboard that subscribes later still sees it.
            self._client.publish(self.status_topic, self._status("online"), qos=1, retain=True)

    def _report(self) -> None:
        try:
            payload = self.telemetry_payload()
            if self.sparkplug:
                from edgekit.protocol import sparkplug as sp

                # Kept as JSON until sent: seq is assigned at publish time, and what waited out an
                # outage goes out marked historical.
                row = {"ts": int(payload["sent_at"] * 1000), "metrics": sp.window_metrics(payload)}
                ddata = sp.topic(self.fleet, "DDATA", self.device_id, sp.DEVICE)
                self.spool.push(ddata, json.dumps(row, separators=(",", ":")).encode(), qos=1)
            else:
                self.spool.push(
                    self.telemetry_topic, json.dumps(payload, separators=(",", ":")).encode(), qos=1
                )
            # After the message is in the spool: a crash in between under-counts, never counts twice.
            self.continuity.keep(payload["counters"])
        except Exception as err:  # a reporting failure must never reach the frame loop
            log.exception("telemetry: could not write a report")
            self.spool.repair(err)

    def _spool_events(self) -> None:
        """Number the queued events, check them and write them to the spool (this thread only)."""
        for event in self.events.take():
            try:
                seq = self.spool.next_sequence("events")
                body = event_body(
                    event,
                    device=self.device_id,
                    fleet=self.fleet,
                    session=self.session,
                    epoch=self._epoch,
                    seq=seq,
                )
            except ValidationError as err:
                self.events_invalid += 1
                log.error("telemetry: not sending event %s: %s", event.get("id"), first_error(err))
                continue
            if self.sparkplug:
                from edgekit.protocol import sparkplug as sp

                row = {"ts": int(body["sent_at"] * 1000), "metrics": sp.event_metrics(body)}
                ddata = sp.topic(self.fleet, "DDATA", self.device_id, sp.DEVICE)
                self.spool.push(ddata, json.dumps(row, separators=(",", ":")).encode(), qos=1)
            else:
                self.spool.push(self.events_topic, json.dumps(body, separators=(",", ":")).encode(), qos=1)
            self.events_spooled += 1

    def telemetry_payload(self) -> dict[str, Any]:
        """Close the current window and describe it (also what ``--json`` tools can print)."""
        w = self.window.take()
        self.last_seq = self.spool.next_sequence()
        payload = checked(Telemetry, self._payload(w, self.last_seq))
        self._last_gauges = payload["gauges"]
        return payload

    def _payload(self, w: Window, seq: int, gauges: dict[str, Any] | None = None) -> dict[str, Any]:
        counters = dict(self.counters())
        counters |= {"mqtt_connects": self.connects, "mqtt_disconnects": self.disconnects}
        counters |= {"events_dropped": self.events.dropped + self.events_invalid}
        counters = self.continuity.totals(counters)  # and restarts
        counters |= {"spool_dropped": self.spool.dropped, "spool_set_aside": self.spool.set_aside}
        return {
            "schema": SCHEMA_TELEMETRY,
            "device": self.device_id,
            "fleet": self.fleet,
            "session": self.session,
            "epoch": self._epoch,
            "seq": seq,
            "sent_at": round(time.time(), 3),
            "window": w.to_dict(),
            "counters": counters,
            "gauges": self.gauges.read() if gauges is None else gauges,
            "spool": {"pending": len(self.spool), "bytes": self.spool.bytes},
        }

    def _take_acks(self) -> None:
        while True:
            try:
                mid = self._acks.get_nowait()
            except queue.Empty:
                return
            sid = self._inflight.pop(mid, None)
            if sid is not None:
                self.spool.ack(sid)
                self.acked += 1

    def _drain(self) -> None:
        room = MAX_INFLIGHT - len(self._inflight)
        if room <= 0:
            return
        for msg in self.spool.pending(limit=room, after=self._sent_upto):
            body = msg.payload
            if msg.topic.startswith("spBv1.0/"):
                from edgekit.protocol import sparkplug as sp

                try:
                    row = json.loads(body)
                    new = set(row["metrics"]) - self._declared
                    if new:  # a metric DBIRTH did not declare (a new thermal zone): be born again
                        self._late_metrics |= {name: row["metrics"][name] for name in new}
                        self._births(self._client)
                    historical = row["ts"] < self._connected_at * 1000
                    body = sp.encode(
                        row["metrics"], self._next_sp_seq(), ts_ms=row["ts"], historical=historical
                    )
                except (ValueError, KeyError, TypeError) as err:
                    log.error("telemetry: dropping spool row %d that cannot be encoded: %s", msg.id, err)
                    self.spool.ack(msg.id)
                    continue
            # QoS 1 for every row, Sparkplug DDATA too (the specification says 0) and rows an older edgekit
            # spooled as 0: a QoS 0 publish is "done" once in the socket, lost if the link silently is.
            info = self._client.publish(msg.topic, body, qos=max(1, msg.qos), retain=msg.retain)
            if info.rc != 0:  # not connected after all: resend from the spool next time
                break
            self._inflight[info.mid] = msg.id
            self._sent_upto = msg.id
            self.published += 1

    def _send_labels(self) -> None:
        if self.labels_interval_s is None:
            return
        for camera, (at, labels, detections) in list(self._labels.items()):
            sent = self._labels_sent.get(camera, 0.0)
            # Never the same labels twice: a QoS 0 publish acks at once and wakes this thread again.
            if at == sent or at - sent < self.labels_interval_s:
                continue
            self._labels_sent[camera] = at
            payload = labels_payload(self.device_id, at, labels, detections, camera)
            self._client.publish(self.labels_topic, payload, qos=0)

    def stop(self, timeout: float = 3.0) -> None:
        """Send the last window, wait up to ``timeout`` s for acks, say offline, disconnect."""
        if self._stopped:
            return
        self._stopped = True
        self._stop.set()
        self._wake.set()
        try:
            if self._thread.is_alive():
                self._thread.join(timeout)
            if not self._thread.is_alive():  # never two threads on the spool at once
                self._spool_events()
                self._report()
                deadline = time.monotonic() + timeout
                while len(self.spool) and self._connected.is_set() and time.monotonic() < deadline:
                    self._take_acks()
                    self._drain()
                    time.sleep(0.02)
            if self._connected.is_set():
                # A clean disconnect sends no Will: say offline ourselves.
                topic, payload, retain = self._offline()
                info = self._client.publish(topic, payload, qos=1, retain=retain)
                if info.rc == 0:
                    info.wait_for_publish(1.0)
        except Exception:
            log.exception("telemetry: could not finish cleanly")
        finally:
            self._client.disconnect()
            self._client.loop_stop()
            if not self._thread.is_alive():
                self.spool.close()

    @property
    def connected(self) -> bool:
        return self._connected.is_set()
