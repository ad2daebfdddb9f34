"""``RemoteWriter``: the fleet's series pushed to VictoriaMetrics or Prometheus, each window at its own time.

``/metrics`` (``edgekit.fleet.prometheus``) is what a scrape sees *now*; months of history belong in a
time-series database.  The collector hands every window it has stored to a ``RemoteWriter``, which
folds it into cumulative counters and pushes them with the **window's** timestamp (its ``end``), so
a spool or broker backlog of a week lands at the right times, not all at the moment it arrived.

The protocol is Prometheus remote write 1.0 (``POST`` of a snappy-compressed protobuf
``WriteRequest``), which VictoriaMetrics takes at ``/api/v1/write`` and Prometheus at the same path
with ``--web.enable-remote-write-receiver``.  VictoriaMetrics' own ``/api/v1/import/prometheus``
(the text format with timestamps) needs no encoder at all, but only VictoriaMetrics has it; remote
write reaches both (and Mimir, Thanos Receive...).  It costs no dependency: the four protobuf
messages are encoded here by hand (their wire format is fixed by the spec), and the body is snappy's
block format holding literals only, which every snappy decoder reads (it compresses nothing; a
push is a few hundred kB at most, and a native snappy wheel would be one more thing to build on an
ARM gateway).

What is pushed, and how many series (bounded: no per-frame or per-window labels):

* per device, labels ``fleet``, ``device``, ``backend`` and ``profile`` (from its birth, where it
  said them): ``edgekit_frames_total``, ``edgekit_frames_missed_total``, ``edgekit_windows_total``
  and ``edgekit_frame_latency_seconds`` on ``FRAME_BUCKETS`` (24 buckets, ``_sum``, ``_count``):
  ``SERIES_PER_DEVICE`` = 29; each camera of a many-camera device adds ``camera``-labelled
  ``edgekit_camera_{frames,missed,dropped}_total`` (``SERIES_PER_CAMERA`` = 3; no per-camera
  histogram: 26 series times up to 64 cameras would dwarf the rest).  The names are ``/metrics``'
  own, so the shipped Grafana dashboard and alert rules read them alike.
* per fleet: ``edgekit_fleet_frame_latency_seconds``, a histogram on the sketch's own bucket edges
  (``gamma**k`` ms, a 2 % ratio), so ``histogram_quantile(0.95, sum by (le) (increase(...[7d])))``
  agrees with the store's merged sketch within the sketch's error.  The edges run from just below
  the fastest frame seen up to ``FLEET_TOP_MS`` (10 s): about 390 series for a fleet whose frames
  take 5 ms or more, at most ``fleet_series()`` (~580, from 0.1 ms).  Every edge up to the top is
  sent, not only those with counts: an edge first sent later would have no history, and
  ``increase`` over a range that starts before it would count its whole past (or none of it).
  Edges below the fastest frame are zero throughout, so they join exactly (see "new series").
  The fleet series are sampled once per ``FLEET_STEP_S`` of window time and at every push.
* with ``collector=`` (``edgekit fleet collect --share``) every series also has ``collector``: each
  collector of a group counts its own share, and two writing one series would contradict each other.

Counters are the writer's own, since its start.  A **new series** (the process started, a device's
backend changed, a fleet's fastest frame got faster) first gets a 0 sample just before its first
value (at the window's start), so ``increase`` counts it from 0 and a restart reads as a reset.
A window **older** than one already pushed for its device (a spool replaying while live windows
flow) cannot go back in time on a counter: it is counted at the device's latest time (``late`` in
the stats), so totals over a range that covers both are exact.

Never in the collector's way: ``stored`` only appends to a bounded queue (past ``MAX_QUEUE``
windows they are dropped, counted as ``windows_dropped``: their counts are lost).  A thread folds
them and pushes every ``interval_s``; while the database is away it retries with backoff
(1 s doubling to 60 s), and past ``MAX_PENDING`` samples the oldest are dropped
(``samples_dropped``, logged): counters are cumulative, so a dropped sample loses resolution in time,
not counts.  ``stats()`` says all of it (``/metrics``: ``edgekit_collector_remote_write_total``).
"""

from __future__ import annotations

import functools
import logging
import math
import struct
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from edgekit.core.backoff import Backoff
from edgekit.core.sketch import DEFAULT_ACCURACY, LatencySketch
from edgekit.errors import EdgekitError
from edgekit.fleet.prometheus import FRAME_BUCKETS, MAX_LABEL_VALUE, cumulative_counts

log = logging.getLogger(__name__)

WRITE_PATH = "/api/v1/write"
FLEET_TOP_MS = 10_000.0  # the fleet histogram's last finite edge; slower frames count under +Inf
FLEET_LOW_MS = 0.1  # ...and its lowest edge (faster frames count at it)
FLEET_STEP_S = 60.0  # the fleet histogram is sampled once per this much window time (and at each push)
MAX_QUEUE = 50_000  # windows waiting to be folded
MAX_PENDING = 500_000  # samples waiting to be pushed
MAX_BATCH = 50_000  # samples in one push
TIMEOUT_S = 10.0
BACKOFF_S = (1.0, 60.0)
SERIES_PER_DEVICE = 3 + len(FRAME_BUCKETS) + 1 + 2
SERIES_PER_CAMERA = 3

_GAMMA = (1 + DEFAULT_ACCURACY) / (1 - DEFAULT_ACCURACY)
_GAMMA_LOG = math.log(_GAMMA)
_TOP_KEY = math.ceil(math.log(FLEET_TOP_MS) / _GAMMA_LOG)
_LOW_KEY = math.floor(math.log(FLEET_LOW_MS) / _GAMMA_LOG)

Labels = tuple[tuple[str, str], ...]  # sorted by name, ``__name__`` first
Sample = tuple[Labels, int, float]  # labels, milliseconds, value


def fleet_series() -> int:
    """The most series one fleet's histogram has: its edges from ``FLEET_LOW_MS`` to ``FLEET_TOP_MS``, +Inf, sum, count."""
    return _TOP_KEY - _LOW_KEY + 1 + 3


def write_url(url: str, option: str = "--remote-write") -> str:
    """``url`` checked, with ``/api/v1/write`` added when it names only the server; ``EdgekitError`` if unusable."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EdgekitError(
            f"{option} {url!r} is not an http(s) URL",
            "e.g. http://127.0.0.1:8428/api/v1/write (VictoriaMetrics) or "
            "http://prometheus:9090/api/v1/write (Prometheus with --web.enable-remote-write-receiver)",
        )
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as err:
        raise EdgekitError(f"{option} {url!r}: {err}", "e.g. http://127.0.0.1:8428/api/v1/write") from None
    path = parts.path if parts.path not in ("", "/") else WRITE_PATH
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


# -- encoding: protobuf by hand, snappy literals ---------------------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def encode_write_request(samples: Iterable[Sample]) -> bytes:
    """A ``prometheus.WriteRequest`` of ``samples``, one ``TimeSeries`` per label set in first-seen order."""
    grouped: dict[Labels, list[tuple[int, float]]] = {}
    for labels, ts, value in samples:
        grouped.setdefault(labels, []).append((ts, value))
    out = bytearray()
    for labels, points in grouped.items():
        series = bytearray(_encoded_labels(labels))
        for ts, v in points:
            # Sample: double value = 1 (fixed64), int64 timestamp = 2 (varint, two's complement).
            series += _field(2, b"\x09" + struct.pack("<d", v) + b"\x10" + _varint(ts & (2**64 - 1)))
        out += _field(1, bytes(series))
    return bytes(out)


@functools.lru_cache(maxsize=65_536)
def _encoded_labels(labels: Labels) -> bytes:
    """A series' ``Label`` fields: the same few thousand series are pushed over and over."""
    return b"".join(_field(1, _field(1, name.encode()) + _field(2, text.encode())) for name, text in labels)


def snappy_literals(data: bytes) -> bytes:
    """``data`` in snappy's block format as literals only: valid for any snappy decoder, not smaller."""
    out = bytearray(_varint(len(data)))
    chunk = 1 << 16
    for i in range(0, len(data), chunk):
        piece = data[i : i + chunk]
        n = len(piece) - 1
        if n < 60:
            out.append(n << 2)
        elif n < 1 << 8:
            out += bytes((60 << 2, n))
        else:
            out += bytes((61 << 2,)) + n.to_bytes(2, "little")
        out += piece
    return bytes(out)


# -- the series ------------------------------------------------------------------------------------


def _labels(name: str, pairs: Iterable[tuple[str, object]]) -> Labels:
    # Label values come from devices: cut as /metrics cuts them; empty ones are no label at all.
    kept = [(k, str(v)[:MAX_LABEL_VALUE]) for k, v in pairs if v is not None and str(v) != ""]
    return tuple(sorted([("__name__", name), *kept]))


def _le(seconds: float) -> str:
    return f"{seconds:.6g}"


_DEVICE_LE = [_le(b) for b in FRAME_BUCKETS]
_DEVICE_BOUNDS_MS = [b * 1000 for b in FRAME_BUCKETS]


_DEVICE_COUNTERS = ("edgekit_frames_total", "edgekit_frames_missed_total", "edgekit_windows_total")
_CAMERA_COUNTERS = (
    "edgekit_camera_frames_total",
    "edgekit_camera_missed_total",
    "edgekit_camera_dropped_total",
)
_HIST = "edgekit_frame_latency_seconds"
_FLEET_HIST = "edgekit_fleet_frame_latency_seconds"


def _device_series(who: tuple[tuple[str, object], ...]) -> list[Labels]:
    """A device's series in the order ``_window`` gives their values."""
    return [
        *(_labels(n, who) for n in _DEVICE_COUNTERS),
        *(_labels(_HIST + "_bucket", (*who, ("le", le))) for le in [*_DEVICE_LE, "+Inf"]),
        _labels(_HIST + "_sum", who),
        _labels(_HIST + "_count", who),
    ]


@dataclass
class _Device:
    who: tuple[tuple[str, object], ...]
    series: list[Labels] = field(default_factory=list)
    frames: int = 0
    missed: int = 0
    windows: int = 0
    latency: LatencySketch = field(default_factory=LatencySketch)
    cameras: dict[str, tuple[list[Labels], list[int]]] = field(
        default_factory=dict
    )  # frames, missed, dropped
    last_ms: int = -1  # its last sample's time; -1: nothing pushed yet (a new series)


@dataclass
class _Fleet:
    who: tuple[tuple[str, object], ...]
    sketch: LatencySketch = field(default_factory=LatencySketch)
    low: int | None = None  # the lowest edge key sent so far
    edges: dict[int, Labels] = field(default_factory=dict)  # each edge key's series
    last_ms: int = -1  # its last sample's time
    latest_ms: int = -1  # the newest window folded in
    dirty: bool = False


class RemoteWriter:
    """Push the fleet's series to ``url`` (see the module's doc); ``start()``, ``stored()``/``status()``, ``stop()``.

    ``births``: what is known of each device already (``{(fleet, device): birth}``, the store's), so
    a window that arrives before its device's retained status is labelled as it will be after.
    """

    def __init__(
        self,
        url: str,
        interval_s: float = 5.0,
        collector: str | None = None,
        births: Mapping[tuple[str, str], Mapping[str, Any]] | None = None,
        max_queue: int = MAX_QUEUE,
        max_pending: int = MAX_PENDING,
        timeout_s: float = TIMEOUT_S,
    ) -> None:
        self.url = write_url(url)
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.extra: tuple[tuple[str, object], ...] = (("collector", collector),) if collector else ()
        self.max_queue, self.max_pending = max_queue, max_pending
        self._births: dict[tuple[str, str], tuple[object, object]] = {
            k: (b.get("backend"), b.get("profile")) for k, b in (births or {}).items()
        }
        self._queue: deque[tuple[Any, ...]] = deque()
        self._cond = threading.Condition()
        self._devices: dict[tuple[str, str, object, object], _Device] = {}
        self._fleets: dict[str, _Fleet] = {}
        self._pending: deque[Sample] = deque()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Folding and pushing happen on the thread, and on the caller's in ``flush`` and ``stop``.
        self._work = threading.RLock()
        self.counts = {
            "pushes": 0,
            "push_failures": 0,
            "samples_sent": 0,
            "samples_dropped": 0,
            "windows": 0,
            "windows_dropped": 0,
            "windows_late": 0,
        }
        self._failing_since: float | None = None

    # -- the collector's side: cheap, never blocks on the network --------------------------------

    def stored(self, rows: Sequence[tuple[str, str, dict[str, Any], str, float]]) -> None:
        """Windows the store has just taken (the collector's rows): queued, or dropped and counted when full."""
        with self._cond:
            room = self.max_queue - len(self._queue)
            if room < len(rows):
                self.counts["windows_dropped"] += len(rows) - max(room, 0)
                rows = rows[: max(room, 0)]
            self._queue.extend(("window", f, d, body) for f, d, body, _, _ in rows)
            self._cond.notify()

    def status(self, fleet: str, device: str, birth: Mapping[str, Any] | None) -> None:
        """A device's birth: its ``backend`` and ``profile`` label its series from its next window on."""
        if birth:
            with self._cond:
                self._queue.append(("birth", fleet, device, (birth.get("backend"), birth.get("profile"))))

    def stats(self) -> dict[str, int]:
        """Pushes, failures, samples sent and dropped, windows folded, dropped and late, what waits."""
        with self._cond:
            return {**self.counts, "queued_windows": len(self._queue), "pending_samples": len(self._pending)}

    # -- the thread ------------------------------------------------------------------------------

    def start(self) -> RemoteWriter:
        self._thread = threading.Thread(target=self._run, name="edgekit-remote-write", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Fold what is queued and make one last push (at most ``timeout_s``); what is left is counted dropped."""
        self._stop.set()
        with self._cond:
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout_s + self.timeout_s)
        self._fold(final=True)
        if self._pending:
            self._push(min(timeout_s, self.timeout_s))
        with self._cond:
            self.counts["samples_dropped"] += len(self._pending)
            self._pending.clear()
        log.info("remote write: stopped: %s", self.stats())

    def flush(self) -> bool:
        """Fold and push everything now (tests, shutdown); ``True`` when nothing is left unsent."""
        self._fold(final=True)
        while self._pending:
            if not self._push(self.timeout_s):
                return False
        return True

    def _run(self) -> None:
        backoff, next_push = Backoff(BACKOFF_S[0], cap_s=BACKOFF_S[1]), time.monotonic() + self.interval_s
        while not self._stop.is_set():
            with self._cond:
                if not self._queue:
                    self._cond.wait(min(0.5, max(0.0, next_push - time.monotonic())))
            self._fold(final=False)
            now = time.monotonic()
            if now < next_push:
                continue
            self._fold(final=True)  # every fleet's latest, with the push
            if not self._pending:
                next_push = now + self.interval_s
            elif self._push(self.timeout_s):
                backoff.reset()
                # A backlog goes out batch after batch; then back to the interval.
                next_push = now if self._pending else now + self.interval_s
            else:
                next_push = now + backoff.next_delay()

    def _push(self, timeout_s: float) -> bool:
        """One batch to the server; ``False`` (kept for a retry) when it could not take it."""
        with self._work:
            return self._push_batch(timeout_s)

    def _push_batch(self, timeout_s: float) -> bool:
        with self._cond:
            batch = [self._pending[i] for i in range(min(MAX_BATCH, len(self._pending)))]
        body = snappy_literals(encode_write_request(batch))
        request = urllib.request.Request(
            self.url,
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/x-protobuf",
                "Content-Encoding": "snappy",
                "X-Prometheus-Remote-Write-Version": "0.1.0",
                "User-Agent": "edgekit-fleet",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                response.read()
        except urllib.error.HTTPError as err:
            if 400 <= err.code < 500 and err.code != 429:
                # The server refuses these samples (too old for Prometheus' head, say): sending them
                # again would be refused again and hold up everything after.
                self._done(len(batch), dropped=True)
                log.error(
                    "remote write: %s refused %d samples: %s %s", self.url, len(batch), err.code, _text(err)
                )
                return True
            return self._failed(f"{err.code} {_text(err)}")
        except (OSError, ValueError) as err:  # refused, unreachable, timed out, reset
            return self._failed(str(err))
        self._done(len(batch), dropped=False)
        if self._failing_since is not None:
            log.info(
                "remote write: %s takes samples again after %.0f s: %s",
                self.url,
                time.monotonic() - self._failing_since,
                self.stats(),
            )
            self._failing_since = None
        return True

    def _done(self, n: int, dropped: bool) -> None:
        with self._cond:
            for _ in range(min(n, len(self._pending))):
                self._pending.popleft()
            self.counts["samples_dropped" if dropped else "samples_sent"] += n
            self.counts["pushes"] += not dropped

    def _failed(self, why: str) -> bool:
        with self._cond:
            self.counts["push_failures"] += 1
        if self._failing_since is None:
            self._failing_since = time.monotonic()
            log.warning(
                "remote write: %s is away (%s); retrying with backoff, the collector goes on storing",
                self.url,
                why,
            )
        return False

    # -- folding windows into series -------------------------------------------------------------

    def _fold(self, final: bool) -> None:
        with self._work:
            self._fold_queued(final)

    def _fold_queued(self, final: bool) -> None:
        with self._cond:
            events = list(self._queue)
            self._queue.clear()
        out: list[Sample] = []
        for event in events:
            if event[0] == "birth":
                self._births[(event[1], event[2])] = event[3]
            else:
                self._window(event[1], event[2], event[3], out)
        if final:
            for fleet in self._fleets.values():
                if fleet.dirty:
                    self._emit_fleet(fleet, out)
        if out:
            self._enqueue(out)

    def _enqueue(self, samples: list[Sample]) -> None:
        with self._cond:
            self._pending.extend(samples)
            over = len(self._pending) - self.max_pending
            if over > 0:
                for _ in range(over):
                    self._pending.popleft()
                self.counts["samples_dropped"] += over
                first = self.counts["samples_dropped"] == over
        if over > 0 and first:
            log.warning(
                "remote write: more than %d samples wait for %s: dropping the oldest (counted; counters "
                "are cumulative, so later samples still carry their counts)",
                self.max_pending,
                self.url,
            )

    def _window(self, fleet_name: str, device_name: str, body: dict[str, Any], out: list[Sample]) -> None:
        window = body["window"]
        backend, profile = self._births.get((fleet_name, device_name), (None, None))
        key = (fleet_name, device_name, backend, profile)
        d = self._devices.get(key)
        if d is None:
            who = (("fleet", fleet_name), ("device", device_name), ("backend", backend), ("profile", profile))
            d = self._devices[key] = _Device((*who, *self.extra))
            d.series = _device_series(d.who)
        end_ms, start_ms = int(float(window["end"]) * 1000), int(float(window["start"]) * 1000)
        ts = max(end_ms, d.last_ms + 1)
        if ts != end_ms:
            self.counts["windows_late"] += 1
        self.counts["windows"] += 1
        zero_ts = min(start_ms, ts - 1)
        new = d.last_ms < 0
        d.frames += int(window["frames"])
        d.missed += int(window["missed"])
        d.windows += 1
        d.latency.merge_dict(window["latency_ms"])
        counts = cumulative_counts(d.latency, _DEVICE_BOUNDS_MS)
        values = [
            d.frames,
            d.missed,
            d.windows,
            *counts,
            d.latency.count,
            d.latency.sum / 1000,
            d.latency.count,
        ]
        pairs: list[tuple[Labels, float]] = list(zip(d.series, values, strict=True))
        if new:
            out += [(labels, zero_ts, 0.0) for labels in d.series]
        for name, camera in (window.get("cameras") or {}).items():
            known = d.cameras.get(name)
            if known is None:
                cams = [_labels(n, (*d.who, ("camera", name))) for n in _CAMERA_COUNTERS]
                known = d.cameras[name] = (cams, [0, 0, 0])
                out += [(labels, zero_ts, 0.0) for labels in cams]
            cams, tally = known
            tally[0] += int(camera["frames"])
            tally[1] += int(camera["missed"])
            tally[2] += int(camera["dropped"])
            pairs += zip(cams, tally, strict=True)
        out += [(labels, ts, float(v)) for labels, v in pairs]
        d.last_ms = ts

        fleet = self._fleets.get(fleet_name)
        if fleet is None:
            fleet = self._fleets[fleet_name] = _Fleet((("fleet", fleet_name), *self.extra))
        # A sample of what came before, at the time of the newest window in it, once this window is a
        # step on: windows that end together (a fleet's devices in step) go in one sample.
        if fleet.dirty and end_ms > fleet.latest_ms and end_ms - fleet.last_ms >= FLEET_STEP_S * 1000:
            self._emit_fleet(fleet, out)
        fleet.sketch.merge_dict(window["latency_ms"])
        fleet.latest_ms = max(fleet.latest_ms, end_ms)
        fleet.dirty = True

    def _emit_fleet(self, fleet: _Fleet, out: list[Sample]) -> None:
        sketch = fleet.sketch
        ts = max(fleet.latest_ms, fleet.last_ms + 1)
        lowest = min(sketch.buckets, default=_TOP_KEY)
        low = min(max(lowest - 1, _LOW_KEY), _TOP_KEY)
        inf, total, count = (
            _labels(_FLEET_HIST + "_bucket", (*fleet.who, ("le", "+Inf"))),
            _labels(_FLEET_HIST + "_sum", fleet.who),
            _labels(_FLEET_HIST + "_count", fleet.who),
        )
        if fleet.low is None:  # the first sample: every series starts at 0
            out += [(labels, ts - 1, 0.0) for labels in (inf, total, count)]
        for k in range(low, _TOP_KEY + 1 if fleet.low is None else fleet.low):
            # Below the fastest frame so far (or the first sample): zero until now.
            fleet.edges[k] = _labels(_FLEET_HIST + "_bucket", (*fleet.who, ("le", _le(_GAMMA**k / 1000))))
            out.append((fleet.edges[k], ts - 1, 0.0))
        fleet.low = low if fleet.low is None else min(low, fleet.low)
        seen = sketch.zero
        items = sorted(sketch.buckets.items())
        i = 0
        for k in range(fleet.low, _TOP_KEY + 1):
            while i < len(items) and items[i][0] <= k:
                seen += items[i][1]
                i += 1
            out.append((fleet.edges[k], ts, float(seen)))
        out += [
            (inf, ts, float(sketch.count)),
            (total, ts, sketch.sum / 1000),
            (count, ts, float(sketch.count)),
        ]
        fleet.last_ms, fleet.dirty = ts, False


def _text(err: urllib.error.HTTPError) -> str:
    try:
        return err.read(300).decode("utf-8", "replace").strip()
    except OSError:
        return ""
