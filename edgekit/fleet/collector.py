"""``Collector``: turns what devices publish into the fleet's state, rejecting bad input without falling over.

Two wire formats arrive: edgekit's JSON (``edgekit/v1/<fleet>/<device>/{status,telemetry,labels,events}``)
and Sparkplug B (``spBv1.0/<fleet>/{NBIRTH,NDEATH,DBIRTH,DDATA}/<device>[/pipeline]``, see
``edgekit.protocol.sparkplug``).  A Sparkplug DDATA is turned into the JSON telemetry body,
so the store, the listener and the dashboard treat both alike.

Every message is checked before it is stored: the topic shape, the fleet and device
names (no ``/``, ``+``, ``#`` or ``..``), the size, JSON or protobuf (and only those: nothing
is evaluated or unpickled), the schema version, that the payload names the device of its
topic, and then the whole payload against its model (``edgekit.protocol.messages``): every
number and sketch a later query would trip over.  A rejected message is
counted by reason and logged; the collector stays up.  Telemetry is de-duplicated on
``(fleet, device, epoch, seq)``; a jump in ``seq`` is recorded as a gap.  Zone and line events
(the ``events`` topic, or a Sparkplug DDATA with ``event/json``) are de-duplicated on their id by the
store's insert: a replay after an outage stores nothing twice.  What one device,
credential or fleet may cost is bounded by ``edgekit.fleet.quotas`` (devices per credential,
fleets, devices, messages and bytes per device per minute; quiet devices aged out to make
room), and only the schema's fields are stored: unknown ones are dropped first.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from edgekit.core.names import safe_name
from edgekit.core.redact import redact_source
from edgekit.core.sketch import LatencySketch
from edgekit.fleet.quotas import Gate, Key, LogThrottle, Quotas, Rejected, known_fields
from edgekit.fleet.store import FleetStore
from edgekit.protocol.messages import EventMessage, Labels, Sketch, Status, Telemetry, first_error
from edgekit.protocol.topics import SCHEMA_EVENT, SCHEMA_STATUS, schema

log = logging.getLogger(__name__)

MAX_PAYLOAD = 256 * 1024
LEAVES = ("status", "telemetry", "labels", "events")
# The schema each leaf's payloads carry, where it is not ``edgekit/v1/<leaf>``.
LEAF_SCHEMAS = {"events": SCHEMA_EVENT}
# The deploy channel shares the tree (agent status, commands and their results): seen, not stored here.
DEPLOY_LEAVES = ("agent", "cmd")
SPARKPLUG = "spBv1.0"
# Sparkplug message kinds a fleet collector has no use for (commands to nodes, host state, node data).
SPARKPLUG_IGNORED = ("NCMD", "DCMD", "NDATA", "STATE")
MAX_TOPICS = 100_000
_M = TypeVar("_M", bound=BaseModel)


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


try:  # orjson parses telemetry about 3x faster than json; both refuse NaN and Infinity here
    import orjson

    _loads: Callable[[bytes], Any] = orjson.loads
    _dumps: Callable[[Any], bytes] = orjson.dumps
except ImportError:  # pragma: no cover - the fleet extra installs orjson

    def _loads(data: bytes) -> Any:
        # Decoded first: json.loads would take UTF-16 and UTF-32 bytes too.
        return json.loads(data.decode("utf-8"), parse_constant=_no_constant)

    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()


class CollectorListener(Protocol):
    """Told of what the collector accepts (the live dashboard view implements it).

    Called from the thread that called ``Collector.handle``, after the collector's lock is
    released (so a listener may read ``Collector.stats()``); an exception it raises is logged.
    A listener may also have ``gap(fleet, device)``: called when a device's sequence jumps;
    ``forget(fleet, device)``: the device was aged out (``edgekit.fleet.quotas``); and
    ``event(fleet, device, body, at)``: a new (not duplicate) zone or line event.
    """

    def window(self, fleet: str, device: str, body: dict[str, Any], at: float) -> None:
        """A new (not duplicate) telemetry window, in the JSON body shape, received at ``at``."""

    def status(self, fleet: str, device: str, state: str, at: float, birth: dict[str, Any] | None) -> None:
        """``online`` (with the birth facts when the message had them) or ``offline``."""


class StoredSink(Protocol):
    """Told of what the store has taken (``edgekit.fleet.remote_write.RemoteWriter`` implements it).

    Called from the collector's thread with its lock held, so it must only queue: ``stored`` after
    each write of windows succeeded (the rows given to ``FleetStore.add_windows``), ``status`` with
    each birth stored.
    """

    def stored(self, rows: list[tuple[str, str, dict[str, Any], str, float]]) -> None: ...

    def status(self, fleet: str, device: str, birth: dict[str, Any] | None) -> None: ...


# How far below a device's highest seq the collector remembers what it saw (for duplicates).
RECENT = 4096


@dataclass
class _Track:
    """What the collector remembers of one device between messages."""

    state: str
    high: int  # the highest seq seen
    epoch: str = ""  # the device spool's epoch the seqs belong to
    recent: set[int] = field(default_factory=set)  # seqs seen within RECENT of ``high``


@dataclass
class _Node:
    """A Sparkplug edge node's current session: its NBIRTH's bdSeq and facts."""

    bdseq: int
    facts: dict[str, Any]


class StoreUnavailable(Exception):
    """The store cannot take writes now (``FleetStore.transient``): nothing of the message is lost.

    Raised by ``Collector.handle`` and ``Collector.flush``; what they took is kept (buffered
    windows stay buffered) or not marked as seen, so the same message delivered again is stored
    once the database is back.  The MQTT reader sends no acknowledgement on it: the broker keeps
    the messages and delivers them again (``FleetSubscriber(retry_on=...)``).
    """


def check_sketch(sketch: Any) -> None:
    """Raise ``ValueError`` unless ``sketch`` is a latency sketch dict that merges cleanly with the fleet's."""
    Sketch.model_validate(sketch)


def _quantiles(sketch: LatencySketch) -> dict[str, float | None]:
    """p50 and p99 of a lag sketch in ms (``None`` before any window)."""
    out = {f"p{q}": sketch.quantile(q / 100) for q in (50, 99)}
    return {k: None if math.isnan(v) else round(v, 3) for k, v in out.items()}


def _valid(model: type[_M], body: dict[str, Any]) -> _M:
    """``body`` validated into its message model, or rejected as ``bad-field`` saying where."""
    try:
        return model.model_validate(body)
    except ValidationError as err:
        raise Rejected("bad-field", first_error(err)[:160]) from None


class Collector:
    """Feed it ``handle(topic, payload)``; it keeps ``store`` current, tells ``listener``, and counts what it saw.

    With ``batch_size > 1`` telemetry windows are written in transactions of that many (or
    every ``flush_s``); call ``flush()`` before reading the store.  Thread-safe.
    ``lag`` is a sketch of how long accepted windows took from the device (``sent_at``) to here, in ms;
    ``stored_lag`` to the commit of their row (what a dashboard reading the store waits for).

    ``shared``: one of several collectors sharing the stream (an MQTT shared subscription,
    ``edgekit fleet collect --share``).  Each sees only its share of a device's windows, so a jump
    in ``seq`` is another collector's share, not a loss: no gaps are recorded (``open_gaps``
    still finds what is missing, from the store).

    ``sink`` is told of every window once the store has it, and of every birth (``StoredSink``: the
    remote write to a time-series database).
    """

    def __init__(
        self,
        store: FleetStore,
        batch_size: int = 1,
        flush_s: float = 0.25,
        listener: CollectorListener | None = None,
        max_devices: int | None = None,
        quotas: Quotas | None = None,
        shared: bool = False,
        sink: StoredSink | None = None,
    ) -> None:
        self.store = store
        self.sink = sink
        self.shared = shared
        self.quotas = quotas or Quotas()
        if max_devices is not None:
            self.quotas = dataclasses.replace(self.quotas, max_devices=max_devices)
        self.max_devices = self.quotas.max_devices
        self.batch_size = max(1, batch_size)
        self.flush_s = flush_s
        self.listener = listener
        self.seen: Counter[str] = Counter()  # accepted messages by kind, duplicates, gaps
        self.rejected: Counter[str] = Counter()  # by reason
        self.lag = LatencySketch()
        self.stored_lag = LatencySketch()
        self._tracks: dict[tuple[str, str], _Track] = {}
        self._nodes: dict[tuple[str, str], _Node] = {}  # Sparkplug sessions
        self._topics: dict[str, tuple[str, str, str]] = {}  # valid topics seen
        self._pending: list[tuple[str, str, dict[str, Any], str, float]] = []
        # What to tell the listener, kept until the lock is released (see CollectorListener).
        self._events: list[tuple[Any, ...]] = []
        self._last_flush = time.monotonic()
        self._lock = threading.RLock()
        # Every device the store has (the quotas count these), with when it was last heard from.
        self.gate = Gate(self.quotas, store.device_seen())
        self._log_throttle = LogThrottle()

    def _admit(self, fleet: str, device: str, size: int, at: float) -> None:
        """Charge a known device's rates; make room for a new one within the quotas (``edgekit.fleet.quotas``).

        A device becomes known when it is stored (``_set_state``), not when a message names it:
        rejected messages with made-up names do not use up the quotas.
        """
        key = (fleet, device)
        if key in self.gate:
            self.gate.charge(key, size, at)
            return
        for old in self.gate.admit(key, at):
            self._forget(old)

    def _forget(self, key: Key) -> None:
        """An aged-out device: its row leaves the store (its windows stay), the view forgets it."""
        self.flush()
        self.store.forget(*key)
        self._tracks.pop(key, None)
        self._nodes.pop(key, None)
        self.seen["aged-out"] += 1
        self._events.append(("forget", *key))
        log.info("collector: aged out %s/%s (quiet for %g s; room was needed)", *key, self.quotas.quiet_s)

    def reject(self, topic: str, reason: str, detail: str) -> None:
        """Count and log a message refused before ``handle`` (the MQTT reader drops one too large to read)."""
        with self._lock:
            self.rejected[reason] += 1
            unlogged = self._log_throttle(reason, time.monotonic())
        if unlogged is not None:
            log.warning(
                "collector: rejected %r: %s: %s (%d more unlogged)", topic[:200], reason, detail, unlogged
            )

    def handle(self, topic: str, payload: bytes, now: float | None = None) -> str:
        """Take one message; returns what became of it (``telemetry``, ``duplicate``, ``rejected:<why>``…)."""
        at = time.time() if now is None else now
        with self._lock:
            try:
                if topic.startswith(SPARKPLUG):
                    outcome = self._sparkplug(topic, payload, at)
                else:
                    outcome = self._handle(topic, payload, at)
            except self.store.transient as err:
                self.seen["store-unavailable"] += 1
                raise StoreUnavailable(f"the fleet store cannot take writes: {err}") from err
            except Rejected as err:
                outcome = f"rejected:{err.reason}"
                self.rejected[err.reason] += 1
                if (unlogged := self._log_throttle(err.reason, time.monotonic())) is not None:
                    log.warning("collector: rejected %r: %s (%d more unlogged)", topic[:200], err, unlogged)
            else:
                self.seen[outcome] += 1
            if self._pending and (
                len(self._pending) >= self.batch_size or time.monotonic() - self._last_flush >= self.flush_s
            ):
                self.flush()
            events, self._events = self._events, []
        if events and self.listener is not None:
            self._tell(events)
        return outcome

    def _tell(self, events: list[tuple[Any, ...]]) -> None:
        assert self.listener is not None
        for event in events:
            try:
                if event[0] == "window":
                    self.listener.window(*event[1:])
                elif event[0] == "status":
                    self.listener.status(*event[1:])
                elif (other := getattr(self.listener, event[0], None)) is not None:
                    other(*event[1:])  # gap, forget
            except Exception:  # the dashboard's trouble must not stop collection
                log.exception("collector: the listener failed on a %s event", event[0])

    def stats(self) -> dict[str, Any]:
        """``{seen: {...}, rejected: {...}, lag_ms: {p50, p99}, devices: {tracked, max}}`` (lag ``None`` before any window)."""
        with self._lock:
            return {
                "seen": dict(self.seen),
                "rejected": dict(self.rejected),
                "lag_ms": _quantiles(self.lag),
                "stored_lag_ms": _quantiles(self.stored_lag),
                "devices": {"tracked": len(self.gate), "max": self.max_devices, "fleets": self.gate.fleets()},
                "quotas": dataclasses.asdict(self.quotas),
                **({"remote_write": stats()} if (stats := getattr(self.sink, "stats", None)) else {}),
            }

    def flush(self) -> None:
        """Write the buffered windows (one transaction; one by one if that fails, dropping what cannot be stored).

        Raises ``StoreUnavailable`` when the database cannot take writes now: the windows not
        stored stay buffered, for the next flush.
        """
        with self._lock:
            pending, self._pending = self._pending, []
            self._last_flush = time.monotonic()
            if not pending:
                return
            try:
                self._write(pending)
            except self.store.transient as err:
                self._pending = [*pending, *self._pending]
                self.seen["store-unavailable"] += 1
                raise StoreUnavailable(f"the fleet store cannot take writes: {err}") from err
            committed = time.time()
            for row in pending:
                sent_at = row[2].get("sent_at")
                if isinstance(sent_at, int | float):  # what the device sent (the model may have coerced it)
                    self.stored_lag.add((committed - sent_at) * 1000.0)

    def try_flush(self) -> bool:
        """``flush``, or, while the store cannot take writes, leave the windows buffered and say ``False``.

        For timers and shutdown: a window still buffered then belongs to a message the reader left
        unacknowledged (``FleetSubscriber(commit=...)``), so the broker still has it.
        """
        try:
            self.flush()
        except StoreUnavailable as err:
            log.warning("collector: %d windows wait for the store: %s", len(self._pending), err)
            return False
        return True

    def _write(self, pending: list[tuple[str, str, dict[str, Any], str, float]]) -> None:
        """``flush``'s transaction, and the one-by-one retry; a transient failure is left to the caller."""
        # The store's own errors (sqlite3 or psycopg) and what bad numbers raise on the way in.
        failures: tuple[type[BaseException], ...] = (
            *self.store.errors,
            OverflowError,
            ValueError,
            TypeError,
        )
        try:
            self.store.add_windows(pending)
            if self.sink is not None:
                self.sink.stored(pending)
            return
        except self.store.transient:
            raise
        except failures:
            log.exception("collector: writing %d windows failed; retrying one by one", len(pending))
        for i, row in enumerate(pending):
            try:
                self.store.add_windows([row])
                if self.sink is not None:
                    self.sink.stored([row])
            except self.store.transient:
                del pending[:i]  # those before are stored; the rest stay buffered
                raise
            except failures as err:
                fleet, device, body = row[0], row[1], row[2]
                self.rejected["store-error"] += 1
                log.error("collector: could not store %s/%s seq %s: %s", fleet, device, body.get("seq"), err)
                track = self._tracks.get((fleet, device))
                if track is not None:
                    track.recent.discard(int(body["seq"]))  # a replay may still bring it

    def _track(self, fleet: str, device: str) -> _Track | None:
        key = (fleet, device)
        track = self._tracks.get(key)
        if track is None:
            known = self.store.device(fleet, device)
            if known is None:
                return None
            high, epoch = int(known["last_seq"]), str(known["epoch"])
            recent = set(self.store.seqs(fleet, device, epoch, above=high - RECENT))
            track = _Track(known["state"], high, epoch=epoch, recent=recent)
            self._tracks[key] = track
        return track

    def _set_state(
        self, fleet: str, device: str, state: str, at: float, birth: dict[str, Any] | None
    ) -> None:
        if birth is not None and isinstance(birth.get("source"), str):
            # A device from before source redaction (or a third-party publisher) may still send a
            # camera URL with its password or token: the fleet never stores or shows one.
            birth = {**birth, "source": redact_source(birth["source"])}
        new = (fleet, device) not in self.gate  # nor, then, in the store as this collector knows it
        self.store.set_state(fleet, device, state, at, birth)
        if self.sink is not None and birth is not None:
            self.sink.status(fleet, device, birth)
        self.gate.add((fleet, device), at)
        if new and (fleet, device) not in self._tracks:
            # Nothing to read back: no seqs yet (in a group another collector may have some, but
            # a group's member records no gaps, and the store's keys drop what it repeats).
            self._tracks[(fleet, device)] = _Track(state, -1)
        track = self._track(fleet, device)
        if track is not None:
            track.state = state
        self._events.append(("status", fleet, device, state, at, birth))

    # -- edgekit JSON ----------------------------------------------------------------------

    def _topic(self, topic: str) -> tuple[str, str, str]:
        """``(fleet, device, leaf)`` of a valid edgekit topic (remembered: the same few recur all day)."""
        known = self._topics.get(topic)
        if known is not None:
            return known
        parts = topic.split("/")
        deploy = parts[:2] == ["edgekit", "v1"] and len(parts) in (5, 6) and parts[4] in DEPLOY_LEAVES
        if deploy and (len(parts) == 5 or parts[5] == "result"):
            if not (safe_name(parts[2]) and safe_name(parts[3])):
                raise Rejected("bad-id", f"fleet {parts[2]!r} / device {parts[3]!r}")
            return parts[2], parts[3], "deploy"
        if len(parts) != 5 or parts[0] != "edgekit" or parts[1] != "v1" or parts[4] not in LEAVES:
            raise Rejected("topic", "not edgekit/v1/<fleet>/<device>/{status,telemetry,labels,events}")
        fleet, device, leaf = parts[2], parts[3], parts[4]
        if not (safe_name(fleet) and safe_name(device)):
            raise Rejected("bad-id", f"fleet {fleet!r} / device {device!r}")
        if len(self._topics) >= MAX_TOPICS:  # a flood of made-up names must not grow memory without end
            self._topics.clear()
        self._topics[topic] = (fleet, device, leaf)
        return fleet, device, leaf

    def _handle(self, topic: str, payload: bytes, at: float) -> str:
        fleet, device, leaf = self._topic(topic)
        if leaf == "deploy":
            return "deploy"  # the agents' channel (edgekit.deploy): counted, not the dashboard's to store
        self._admit(fleet, device, len(payload), at)
        if len(payload) > MAX_PAYLOAD:
            raise Rejected("oversized", f"{len(payload)} bytes > {MAX_PAYLOAD}")
        try:
            body = _loads(payload)
        except (ValueError, UnicodeDecodeError, RecursionError) as err:
            raise Rejected("malformed-json", str(err)[:120]) from None
        if type(body) is not dict:
            raise Rejected("malformed-json", "not a JSON object")
        if body.get("schema") != LEAF_SCHEMAS.get(leaf, schema(leaf)):
            raise Rejected("schema-version", f"schema {str(body.get('schema'))[:60]!r} on a {leaf} topic")
        if body.get("device") != device:
            raise Rejected("device-mismatch", f"payload says {str(body.get('device'))[:60]!r}")
        if leaf == "status":
            status = _valid(Status, body)
            body = known_fields(status, body, self.seen) or body
            self._set_state(fleet, device, status.state, at, body if status.state == "online" else None)
            return "status"
        if leaf == "labels":
            _valid(Labels, body)
            return "labels"
        if leaf == "events":
            return self._event(fleet, device, body, bytes(payload).decode(), at)
        # The stored text is what the device sent (valid UTF-8: the parser checked).
        return self._telemetry(fleet, device, body, bytes(payload).decode(), at)

    def _telemetry(self, fleet: str, device: str, body: dict[str, Any], raw: str, at: float) -> str:
        # The store and the listener keep the dict as sent; the model is what vouches for it.
        message = _valid(Telemetry, body)
        known = known_fields(message, body, self.seen)
        if known is not None:  # padding or a newer device's fields: neither is stored nor kept
            body, raw = known, _dumps(known).decode()
        seq, epoch, sent_at = message.seq, message.epoch, message.sent_at
        track = self._track(fleet, device)
        if track is None:
            self._set_state(fleet, device, "online", at, None)
            track = self._tracks[(fleet, device)] = _Track("online", -1)
        elif track.state == "offline":
            self._set_state(fleet, device, "online", at, None)
        if epoch != track.epoch:
            if track.high >= 0:
                log.warning(
                    "collector: %s/%s restarted its sequence (epoch %s -> %s)",
                    fleet,
                    device,
                    track.epoch,
                    epoch,
                )
            # The old epoch's buffered windows go first (set_epoch resets last_seq); a flush only for
            # them: a fleet's first minute is 10,000 first windows, each a new epoch to this collector.
            if any(p[0] == fleet and p[1] == device for p in self._pending):
                self.flush()
            self.store.set_epoch(fleet, device, epoch)
            track.epoch, track.high, track.recent = epoch, -1, set()
        if seq in track.recent:
            return "duplicate"
        if seq > track.high + 1 and track.high >= 0 and not self.shared:
            self.store.add_gap(fleet, device, track.high + 1, seq - 1, at, epoch)
            self.seen["gaps"] += 1
            self._events.append(("gap", fleet, device))
            log.info("collector: %s/%s skipped seq %d..%d", fleet, device, track.high + 1, seq - 1)
        track.recent.add(seq)
        if seq > track.high:
            track.high = seq
            if len(track.recent) > 2 * RECENT:
                track.recent = {s for s in track.recent if s > seq - RECENT}
        if sent_at is not None:
            self.lag.add((at - sent_at) * 1000.0)
        self.gate.add((fleet, device), at)
        self._pending.append((fleet, device, body, raw, at))
        self._events.append(("window", fleet, device, body, at))
        return "telemetry"

    def _event(self, fleet: str, device: str, body: dict[str, Any], raw: str, at: float) -> str:
        """A zone or line event: stored once by its id (``event``), a repeat is ``duplicate-event``."""
        message = _valid(EventMessage, body)
        known = known_fields(message, body, self.seen)
        if known is not None:  # padding or a newer device's fields: neither is stored
            body, raw = known, _dumps(known).decode()
        track = self._track(fleet, device)
        if track is None or track.state == "offline":
            self._set_state(fleet, device, "online", at, None)
        self.gate.add((fleet, device), at)
        failures: tuple[type[BaseException], ...] = (*self.store.errors, OverflowError, ValueError, TypeError)
        try:
            new = self.store.add_event(fleet, device, body, raw, at)
        except self.store.transient:
            raise  # not a bad event: the database is away (``StoreUnavailable``)
        except failures as err:
            log.error("collector: could not store event %s of %s/%s: %s", message.id, fleet, device, err)
            raise Rejected("store-error", str(err)[:120]) from None
        if not new:
            return "duplicate-event"
        self._events.append(("event", fleet, device, body, at))
        return "event"

    # -- Sparkplug B -----------------------------------------------------------------------

    def _sparkplug(self, topic: str, payload: bytes, at: float) -> str:
        from google.protobuf.message import DecodeError

        from edgekit.protocol import sparkplug as sp

        parts = topic.split("/")
        if (len(parts) == 3 and parts[1] == "STATE") or (len(parts) > 2 and parts[2] in SPARKPLUG_IGNORED):
            return "sparkplug-ignored"
        kind = parts[2] if len(parts) > 2 else ""
        node_topic = len(parts) == 4 and kind in ("NBIRTH", "NDEATH")
        device_topic = len(parts) == 5 and kind in ("DBIRTH", "DDATA", "DDEATH") and parts[4] == sp.DEVICE
        if not (node_topic or device_topic):
            raise Rejected(
                "topic", f"not {SPARKPLUG}/<fleet>/{{N,D}}{{BIRTH,DEATH,DATA}}/<device>[/pipeline]"
            )
        fleet, device = parts[1], parts[3]
        if not (safe_name(fleet) and safe_name(device)):
            raise Rejected("bad-id", f"fleet {fleet!r} / device {device!r}")
        self._admit(fleet, device, len(payload), at)
        if len(payload) > MAX_PAYLOAD:
            raise Rejected("oversized", f"{len(payload)} bytes > {MAX_PAYLOAD}")
        try:
            ts_ms, metrics = sp.read_metrics(payload)
            if kind == "DDATA" and sp.is_event(metrics):
                body = sp.event_body(metrics)
                if body.get("schema") != SCHEMA_EVENT or body.get("device") != device:
                    raise ValueError(f"event/json is not an {SCHEMA_EVENT} message of {device}")
                raw = _dumps(body).decode()
            elif kind == "DDATA":
                node = self._nodes.get((fleet, device))
                session = str(node.facts.get("session", "")) if node is not None else ""
                body = sp.telemetry_body(metrics, fleet=fleet, device=device, ts_ms=ts_ms, session=session)
                if not body["epoch"]:  # a publisher without the epoch metric: its session numbers the seqs
                    body["epoch"] = session
                raw = _dumps(body).decode()
            elif kind in ("NBIRTH", "NDEATH"):
                value = metrics.get("bdSeq")
                if type(value) is not int:
                    raise ValueError(f"bdSeq is {type(value).__name__}, not an integer")
                bdseq: int = value
            if kind in ("NBIRTH", "DBIRTH"):
                facts = sp.birth_facts(metrics)
        except (DecodeError, ValueError, TypeError, KeyError, RecursionError) as err:
            raise Rejected("sparkplug-parse", f"{kind}: {str(err)[:120]}") from None
        if kind == "DDATA" and body.get("schema") == SCHEMA_EVENT:
            return self._event(fleet, device, body, raw, at)
        if kind == "DDATA":
            return self._telemetry(fleet, device, body, raw, at)
        if kind == "NBIRTH":
            # A new session: its bdSeq is what this node's death certificate will carry.
            self._nodes[(fleet, device)] = _Node(bdseq, facts)
            self._set_state(fleet, device, "online", at, self._birth(fleet, device, facts, ts_ms))
            return "sparkplug-birth"
        if kind == "DBIRTH":
            node = self._nodes.get((fleet, device))
            merged = (node.facts if node is not None else {}) | facts
            self._set_state(fleet, device, "online", at, self._birth(fleet, device, merged, ts_ms))
            return "sparkplug-birth"
        if kind == "NDEATH":
            node = self._nodes.get((fleet, device))
            # Without a birth seen by this process (it restarted) there is nothing to compare: believe it.
            if node is not None and node.bdseq != bdseq:
                # The Will of an earlier session, delivered after the node was born again: not a death.
                log.info(
                    "collector: %s/%s: stale NDEATH (bdSeq %d, alive with %d)",
                    fleet,
                    device,
                    bdseq,
                    node.bdseq,
                )
                return "sparkplug-stale-death"
            self._nodes.pop((fleet, device), None)
        self._set_state(fleet, device, "offline", at, None)
        return "sparkplug-death"

    @staticmethod
    def _birth(fleet: str, device: str, facts: dict[str, Any], ts_ms: int) -> dict[str, Any]:
        """A Sparkplug birth as the JSON status ``online`` body (what the store and the listener keep)."""
        return {
            "schema": SCHEMA_STATUS,
            "state": "online",
            "device": device,
            "fleet": fleet,
            "ts": ts_ms / 1000,
            **facts,
            "format": "sparkplug",
        }

    def open_gaps(self, fleet: str, device: str) -> list[tuple[int, int]]:
        """Sequence ranges of the current epoch still missing (a replay after an outage fills earlier gaps)."""
        self.flush()
        track = self._track(fleet, device)
        seqs = self.store.seqs(fleet, device, track.epoch if track else None)
        missing, prev = [], None
        for s in seqs:
            if prev is not None and s > prev + 1:
                missing.append((prev + 1, s - 1))
            prev = s
        return missing
