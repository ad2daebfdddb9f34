"""``Collector``: turns what devices publish into the fleet's state, rejecting bad input without falling over.

Every message is checked before it is stored: the topic shape, the fleet and device
names (no ``/``, ``+``, ``#`` or ``..``), the size, JSON (and only JSON: nothing is
evaluated or unpickled), the schema version, and that the payload names the device of
its topic.  A rejected message is counted by reason and logged; the collector stays up.
Telemetry is de-duplicated on ``(fleet, device, seq)``; a jump in ``seq`` is recorded as a gap.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from edgekit.fleet.store import FleetStore
from edgekit.names import safe_name
from edgekit.pipeline.records import STAGES
from edgekit.sketch import DEFAULT_ACCURACY, LatencySketch

log = logging.getLogger(__name__)

MAX_PAYLOAD = 256 * 1024
LEAVES = ("status", "telemetry", "labels")


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


class Rejected(ValueError):
    """A message that is not stored; ``reason`` is the counter it adds to."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


# How far below a device's highest seq the collector remembers what it saw (for duplicates).
RECENT = 4096


@dataclass
class _Track:
    """What the collector remembers of one device between messages."""

    state: str
    high: int  # the highest seq seen
    epoch: str = ""  # the device spool's epoch the seqs belong to
    recent: set[int] = field(default_factory=set)  # seqs seen within RECENT of ``high``


class Collector:
    """Feed it ``handle(topic, payload)``; it keeps ``store`` current and counts what it saw.

    With ``batch_size > 1`` telemetry windows are written in transactions of that many (or
    every ``flush_s``); call ``flush()`` before reading the store.  Thread-safe.
    """

    def __init__(self, store: FleetStore, batch_size: int = 1, flush_s: float = 0.25) -> None:
        self.store = store
        self.batch_size = max(1, batch_size)
        self.flush_s = flush_s
        self.seen: Counter[str] = Counter()  # accepted messages by kind, duplicates, gaps
        self.rejected: Counter[str] = Counter()  # by reason
        self._tracks: dict[tuple[str, str], _Track] = {}
        self._pending: list[tuple[str, str, dict[str, Any], str, float]] = []
        self._last_flush = time.monotonic()
        self._lock = threading.RLock()

    def handle(self, topic: str, payload: bytes, now: float | None = None) -> str:
        """Take one message; returns what became of it (``telemetry``, ``duplicate``, ``rejected:<why>``…)."""
        at = time.time() if now is None else now
        with self._lock:
            try:
                outcome = self._handle(topic, payload, at)
            except Rejected as err:
                self.rejected[err.reason] += 1
                log.warning("collector: rejected a message on %r: %s", topic[:200], err)
                return f"rejected:{err.reason}"
            self.seen[outcome] += 1
            if len(self._pending) >= self.batch_size or time.monotonic() - self._last_flush >= self.flush_s:
                self.flush()
            return outcome

    def flush(self) -> None:
        """Write the buffered windows (one transaction; one by one if that fails, dropping what cannot be stored)."""
        with self._lock:
            pending, self._pending = self._pending, []
            self._last_flush = time.monotonic()
            try:
                self.store.add_windows(pending)
                return
            except (sqlite3.Error, OverflowError, ValueError, TypeError):
                log.exception("collector: writing %d windows failed; retrying one by one", len(pending))
            for row in pending:
                try:
                    self.store.add_windows([row])
                except (sqlite3.Error, OverflowError, ValueError, TypeError) as err:
                    fleet, device, body = row[0], row[1], row[2]
                    self.rejected["store-error"] += 1
                    log.error(
                        "collector: could not store %s/%s seq %s: %s", fleet, device, body.get("seq"), err
                    )
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
            recent = {s for s in self.store.seqs(fleet, device, epoch) if s > high - RECENT}
            track = _Track(known["state"], high, epoch=epoch, recent=recent)
            self._tracks[key] = track
        return track

    def _handle(self, topic: str, payload: bytes, at: float) -> str:
        parts = topic.split("/")
        if len(parts) != 5 or parts[:2] != ["edgekit", "v1"] or parts[4] not in LEAVES:
            raise Rejected("topic", "not edgekit/v1/<fleet>/<device>/{status,telemetry,labels}")
        fleet, device, leaf = parts[2], parts[3], parts[4]
        if not (safe_name(fleet) and safe_name(device)):
            raise Rejected("bad-id", f"fleet {fleet!r} / device {device!r}")
        if len(payload) > MAX_PAYLOAD:
            raise Rejected("oversized", f"{len(payload)} bytes > {MAX_PAYLOAD}")
        try:
            text = payload.decode("utf-8")
            body = json.loads(text, parse_constant=_no_constant)
        except (ValueError, UnicodeDecodeError, RecursionError) as err:
            raise Rejected("malformed-json", str(err)[:120]) from None
        if not isinstance(body, dict):
            raise Rejected("malformed-json", "not a JSON object")
        if body.get("schema") != f"edgekit/v1/{leaf}":
            raise Rejected("schema-version", f"schema {str(body.get('schema'))[:60]!r} on a {leaf} topic")
        if body.get("device") != device:
            raise Rejected("device-mismatch", f"payload says {str(body.get('device'))[:60]!r}")
        if leaf == "status":
            state = body.get("state")
            if state not in ("online", "offline"):
                raise Rejected("bad-field", f"state {str(state)[:40]!r}")
            self.store.set_state(fleet, device, state, at, body if state == "online" else None)
            track = self._track(fleet, device)
            if track is not None:
                track.state = state
            return "status"
        if leaf == "labels":
            return "labels"
        return self._telemetry(fleet, device, body, text, at)

    def _telemetry(self, fleet: str, device: str, body: dict[str, Any], raw: str, at: float) -> str:
        seq, window, epoch = body.get("seq"), body.get("window"), body.get("epoch", "")
        if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq < 2**63:
            raise Rejected("bad-field", f"seq {str(seq)[:40]!r}")
        if not isinstance(epoch, str) or len(epoch) > 32:
            raise Rejected("bad-field", f"epoch {str(epoch)[:40]!r}")
        if not isinstance(window, dict) or not isinstance(body.get("counters"), dict):
            raise Rejected("bad-field", "window and counters must be objects")
        try:
            stages = dict(window["stages_ms"])
            if not set(STAGES) <= stages.keys():
                raise ValueError(f"stages_ms lacks {sorted(set(STAGES) - stages.keys())}")
            for sketch in (window["latency_ms"], *stages.values()):
                # Sketches of one accuracy merge exactly; another accuracy would break fleet queries.
                if LatencySketch.from_dict(sketch).accuracy != DEFAULT_ACCURACY:
                    raise ValueError(f"sketch accuracy {sketch['accuracy']} is not {DEFAULT_ACCURACY}")
            float(window["start"]), float(window["end"]), int(window["frames"]), int(window["missed"])
        except (KeyError, TypeError, ValueError, OverflowError) as err:
            raise Rejected("bad-field", f"window: {str(err)[:120]}") from None
        track = self._track(fleet, device)
        if track is None:
            self.store.set_state(fleet, device, "online", at, None)
            track = self._tracks[(fleet, device)] = _Track("online", -1)
        elif track.state == "offline":
            self.store.set_state(fleet, device, "online", at, None)
            track.state = "online"
        if epoch != track.epoch:
            if track.high >= 0:
                log.warning(
                    "collector: %s/%s restarted its sequence (epoch %s -> %s)",
                    fleet,
                    device,
                    track.epoch,
                    epoch,
                )
            self.flush()
            self.store.set_epoch(fleet, device, epoch)
            track.epoch, track.high, track.recent = epoch, -1, set()
        if seq in track.recent:
            return "duplicate"
        if seq > track.high + 1 and track.high >= 0:
            self.store.add_gap(fleet, device, track.high + 1, seq - 1, at, epoch)
            self.seen["gaps"] += 1
            log.info("collector: %s/%s skipped seq %d..%d", fleet, device, track.high + 1, seq - 1)
        track.recent.add(seq)
        if seq > track.high:
            track.high = seq
            if len(track.recent) > 2 * RECENT:
                track.recent = {s for s in track.recent if s > seq - RECENT}
        self._pending.append((fleet, device, body, raw, at))
        return "telemetry"

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
