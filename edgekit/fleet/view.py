"""``FleetView``: the fleet as the dashboard and ``/metrics`` see it, kept live in memory.

The collector hands every new window and status change to the view (``CollectorListener``);
the view only queues them there, so ingest stays cheap.  A tick (once a second, from the
server) folds the queue into ten-second buckets per device — merged sketches, frames,
misses — evaluates the alerts, and builds the snapshot every dashboard client shares.
Percentiles of a device, a model version, a backend or the fleet always come from merged
sketches, never from averaged percentiles.  The last hour lives in memory; longer windows
are read from the store (raw windows and rollups).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from edgekit.core.tally import SourceHealth
from edgekit.fleet import camera_health
from edgekit.fleet.camera_totals import camera_table
from edgekit.fleet.charts import Tally, chart_series, duration, quantile, rate
from edgekit.fleet.detections import class_table
from edgekit.fleet.slow_traces import SLOW_WINDOWS, linked, slow_entry
from edgekit.fleet.zone_events import zone_totals
from edgekit.protocol.stages import STAGES

log = logging.getLogger(__name__)

STEP_S = 10  # the live resolution
LIVE_S = 3600  # kept in memory; longer windows come from the store
REFRESH_S = 5.0  # a quiet fleet still gets a fresh snapshot this often
WINDOWS_S = (300, 900, 3600, 6 * 3600, 24 * 3600)  # what the dashboard offers
PAGE_EVENTS = 20  # the newest zone and line events a device page lists
# Event counters per device for /metrics: (camera, zone, kind) keys come from the device, so they are
# bounded; past this many, new places count under camera and zone "other" (one more key per kind).
MAX_EVENT_KEYS = 256
OTHER = "other"


@dataclass
class SloPolicy:
    """When a device is breaching its latency objective, and when a breach becomes an alert."""

    quantile: float = 0.95
    over_s: float = 60.0  # the quantile is taken over this much recent telemetry
    for_s: float = 300.0  # ...and must stay over budget this long to fire (pending until then)
    miss_rate: float = 0.01  # misses above this share over ``over_s`` also breach
    stalled_s: float = camera_health.STALLED_S  # a camera without frames this long is stalled (an alert)


@dataclass(kw_only=True)
class DeviceTotals(Tally):
    """One device since the server started, what ``/metrics`` exports (counters never go down): its
    tally (frames, misses, sketches, a detector's classes, a many-camera device's cameras) and who it is."""

    fleet: str
    device: str
    state: str
    last_seen: float
    birth: dict[str, Any]
    budget_ms: float | None
    windows: int = 0
    gaps: int = 0
    #: Each camera's latest health (a single source's under ``""``): gauges and the device's own counts.
    health: dict[str, SourceHealth] = field(default_factory=dict)
    #: Zone and line events received, by (camera, zone or line, kind); a count event's zone is ``""``.
    events: dict[tuple[str, str, str], int] = field(default_factory=dict)


@dataclass
class _Device:
    fleet: str
    device: str
    state: str
    since: float
    last_seen: float
    birth: dict[str, Any]
    fps: float | None = None
    buckets: dict[int, Tally] = field(default_factory=dict)
    pending: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    totals: Tally = field(default_factory=Tally)
    windows: int = 0
    gaps: int = 0
    restarts: int = 0  # the device's pipeline started again on its spool (its counters' ``restarts``)
    breach_since: float | None = None
    breach_detail: str = ""
    health: dict[str, SourceHealth] = field(default_factory=dict)  # each camera's latest (replaced whole)
    health_stop: float = -math.inf  # the end of the window it came from
    events: Counter[tuple[str, str, str]] = field(
        default_factory=Counter
    )  # (camera, zone, kind) -> new events
    #: The newest windows that missed a budget and name their slowest frames' traces (``slow_traces``).
    slow: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=SLOW_WINDOWS))

    @property
    def key(self) -> str:
        return f"{self.fleet}/{self.device}"

    @property
    def budget_ms(self) -> float | None:
        return _number(self.birth.get("budget_ms"))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


class FleetView:
    """The live fleet: implements the collector's listener; ``tick()`` once a second, then read snapshots."""

    def __init__(
        self,
        store: Any = None,
        slo: SloPolicy | None = None,
        clock: Callable[[], float] = time.time,
        stats: Callable[[], dict[str, Any]] | None = None,
        trace_url: str | None = None,
    ) -> None:
        self.store = store
        self.trace_url = trace_url  # a trace UI's URL with {trace_id} (``slow_traces``), or None
        self.slo = slo or SloPolicy()
        self.clock = clock
        self.stats = stats  # the collector's counters and lag, for the dashboard and /metrics
        self._devices: dict[tuple[str, str], _Device] = {}
        self._lock = threading.Lock()
        self._snapshots: dict[int, tuple[float, dict[str, Any]]] = {}
        self.version = 0  # bumped by every tick that changed something: SSE sends only news
        self._changed = False
        self._bumped = 0.0

    # -- the collector's listener (its thread; keep it cheap) ------------------------------

    def window(self, fleet: str, device: str, body: dict[str, Any], at: float) -> None:
        """A new telemetry window (queued; folded in by the next tick)."""
        with self._lock:
            d = self._device(fleet, device, at)
            d.pending.append((at, body))
            d.last_seen = max(d.last_seen, at)
            self._changed = True

    def status(self, fleet: str, device: str, state: str, at: float, birth: dict[str, Any] | None) -> None:
        """A device came online (with its birth facts) or went offline (its Will, or a clean stop)."""
        with self._lock:
            d = self._device(fleet, device, at)
            if d.state != state:
                d.state, d.since = state, at
            d.last_seen = max(d.last_seen, at)
            if birth:
                d.birth = dict(birth)
            self._changed = True

    def gap(self, fleet: str, device: str) -> None:
        """The collector saw a jump in a device's sequence."""
        with self._lock:
            self._device(fleet, device, self.clock()).gaps += 1

    def event(self, fleet: str, device: str, body: dict[str, Any], at: float) -> None:
        """A new (not duplicate) zone or line event: counted for /metrics (the store keeps the event)."""
        key = (str(body["camera"]), str(body.get("zone") or ""), str(body["kind"]))
        with self._lock:
            d = self._device(fleet, device, at)
            if key not in d.events and len(d.events) >= MAX_EVENT_KEYS:
                key = (OTHER, OTHER, key[2])
            d.events[key] += 1

    def forget(self, fleet: str, device: str) -> None:
        """The collector aged the device out (``edgekit.fleet.quotas``): it leaves the dashboard and /metrics."""
        with self._lock:
            self._devices.pop((fleet, device), None)
            self._changed = True

    def _follow_health(self, d: _Device, window: dict[str, Any], end: float) -> None:
        # The latest window's (a replayed older one says nothing new about now).
        health = camera_health.of_window(window)
        if health is not None and end >= d.health_stop:
            d.health, d.health_stop = health, end

    def _stalled(self, d: _Device) -> list[str]:
        """The cameras of ``d`` without frames for over ``stalled_s`` while it is online."""
        if d.state != "online":
            return []
        return sorted(n for n, h in d.health.items() if h.stalled(self.slo.stalled_s))

    def _device(self, fleet: str, device: str, at: float) -> _Device:
        d = self._devices.get((fleet, device))
        if d is None:
            d = self._devices[(fleet, device)] = _Device(fleet, device, "online", at, at, {})
        return d

    # -- start-up --------------------------------------------------------------------------

    def load(self) -> None:
        """Devices and the last hour from the store, so a restarted server shows history at once."""
        if self.store is None:
            return
        now = self.clock()
        for row in self.store.devices():
            d = self._device(row["fleet"], row["device"], row["since"])
            d.state, d.since, d.last_seen = row["state"], row["since"], row["last_seen"]
            d.birth = dict(row.get("birth") or {})
        stored_health = getattr(self.store, "camera_health", None)
        if stored_health is not None:
            for (fleet, device), entry in stored_health().items():
                known = self._devices.get((fleet, device))
                if known is not None:
                    known.health, known.health_stop = dict(entry["cameras"]), entry["at"]
        buckets = getattr(self.store, "buckets", None)
        if buckets is None:
            return
        for b in buckets(now - LIVE_S, now, STEP_S):
            known = self._devices.get((b.fleet, b.device))
            if known is None:
                continue
            live = known.buckets.setdefault(int(b.t0), Tally())
            live.merge(Tally.of(b))
        self._changed = True

    # -- the tick (server thread) ----------------------------------------------------------

    def tick(self) -> bool:
        """Fold queued windows into buckets, drop what aged out, evaluate alerts; True when anything changed."""
        now = self.clock()
        with self._lock:
            changed, self._changed = self._changed, False
            horizon = now - LIVE_S - STEP_S
            for d in self._devices.values():
                pending, d.pending = d.pending, []
                for at, body in pending:
                    w = body["window"]
                    # Placed by the device's clock (replays land where they belong), never in the future.
                    end = min(float(w["end"]), at)
                    d.windows += 1
                    # Totals are the windows' sum, so they go on across a device's restarts by
                    # themselves; how many restarts there were, only the counters say.
                    restarts = (body.get("counters") or {}).get("restarts")
                    if isinstance(restarts, int) and not isinstance(restarts, bool):
                        d.restarts = max(d.restarts, restarts)
                    d.fps = _number(w.get("fps")) if end >= now - 2 * STEP_S else d.fps
                    try:
                        slow = slow_entry(w)
                        if slow is not None:
                            d.slow.append(slow)
                        self._follow_health(d, w, float(w["end"]))
                        d.totals.add(w)
                        if end >= horizon:
                            d.buckets.setdefault(int(end // STEP_S) * STEP_S, Tally()).add(w)
                    except (KeyError, TypeError, ValueError) as err:  # the collector checked; belt and braces
                        log.warning("view: skipped a window of %s: %s", d.key, err)
                for t0 in [t for t in d.buckets if t < horizon]:
                    del d.buckets[t0]
                if self._evaluate(d, now):
                    changed = True
            # Also every few seconds on a quiet fleet: "since" durations and pending alerts move on.
            if changed or now - self._bumped >= REFRESH_S:
                self.version += 1
                self._bumped = now
                self._snapshots.clear()
        return changed

    def _evaluate(self, d: _Device, now: float) -> bool:
        """Is ``d`` breaching its objective (quantile over budget, or too many misses)? Returns True on a change."""
        budget = d.budget_ms
        recent = self._merge(d, now - self.slo.over_s, now)
        q = recent.latency.quantile(self.slo.quantile)
        detail = ""
        if d.state == "online" and recent.frames:
            pct = round(self.slo.quantile * 100)
            if budget is not None and q > budget:
                detail = f"p{pct} {q:.1f} ms over budget {budget:g} ms"
            elif recent.missed / recent.frames > self.slo.miss_rate:
                detail = f"{recent.missed / recent.frames:.1%} of frames missed (objective {self.slo.miss_rate:.1%})"
        was = (d.breach_since, d.breach_detail)
        if detail and d.breach_since is None:
            d.breach_since = now
        elif not detail:
            d.breach_since = None
        d.breach_detail = detail
        return was[0] != d.breach_since or (bool(was[1]) != bool(detail))

    # -- reading ---------------------------------------------------------------------------

    def _merge(self, d: _Device, since: float, until: float) -> Tally:
        total = Tally()
        for t0, b in d.buckets.items():
            if t0 + STEP_S > since and t0 <= until:
                total.merge(b)
        return total

    def _series(self, devices: Iterable[_Device], window_s: int, now: float) -> dict[int, dict[str, Tally]]:
        """Per step start, per device key: the merged bucket (from memory, or from the store past an hour)."""
        step = _step(window_s)
        since = now - window_s
        out: dict[int, dict[str, Tally]] = defaultdict(dict)
        wanted = {d.key for d in devices}
        if window_s <= LIVE_S or self.store is None or not hasattr(self.store, "buckets"):
            for d in devices:
                for t0, b in d.buckets.items():
                    if t0 + STEP_S > since:
                        slot = out[int(t0 // step) * step].setdefault(d.key, Tally())
                        slot.merge(b)
            return out
        for b in self.store.buckets(since, now, step):
            key = f"{b.fleet}/{b.device}"
            if key in wanted:
                slot = out[int(b.t0 // step) * step].setdefault(key, Tally())
                slot.merge(Tally.of(b))
        return out

    def snapshot(self, window_s: int = 300) -> dict[str, Any]:
        """The dashboard JSON over the last ``window_s`` seconds (cached until the next tick that changes)."""
        window_s = _window(window_s)
        now = self.clock()
        with self._lock:
            cached = self._snapshots.get(window_s)
            if cached is not None and now - cached[0] < 1.0:
                return cached[1]
            snap = self._build(list(self._devices.values()), window_s, now)
            self._snapshots[window_s] = (now, snap)
        return snap

    def device_page(self, fleet: str, device: str, window_s: int = 300) -> dict[str, Any] | None:
        """One device: its row, birth facts, latency and stage series, gaps and alerts."""
        window_s = _window(window_s)
        now = self.clock()
        with self._lock:
            d = self._devices.get((fleet, device))
            if d is None:
                return None
            series = self._series([d], window_s, now)  # read once (past an hour, from the store)
            snap = self._build([d], window_s, now, series)
            detections = class_table(d.key, series)
            cameras = camera_table(by[d.key].cameras for by in series.values() if d.key in by)
            online = d.state == "online"
            health = [
                camera_health.row(n, h, online, self.slo.stalled_s) for n, h in sorted(d.health.items())
            ]
            slow = [linked(e, self.trace_url) for e in reversed(d.slow) if e["end"] >= now - window_s]
        gaps: list[tuple[int, int]] = []
        events: list[dict[str, Any]] = []
        zones: list[dict[str, Any]] = []
        if self.store is not None:
            try:
                gaps = self.store.gaps(fleet, device)[-50:]
                if hasattr(self.store, "events"):
                    events = self.store.events(fleet, device, limit=PAGE_EVENTS)
                    zones = zone_totals(self.store.zone_counts(fleet, device, now - window_s, now, window_s))
            except Exception:  # a store hiccup must not take the page down
                log.exception("view: reading gaps and events of %s/%s failed", fleet, device)
        return {
            "device": snap["devices"][0],
            "birth": d.birth,
            "series": snap["series"],
            "stages": snap["stages"],
            "stage_names": snap["stage_names"],
            "heatmap": snap["heatmap"],
            "gaps": [list(g) for g in gaps],
            "alerts": snap["alerts"],
            "detections": detections,
            "cameras": cameras,
            "health": health,
            "events": events,
            "zones": zones,
            "slow_windows": slow,
            "window_s": window_s,
            "now": now,
        }

    def device_events(
        self,
        fleet: str,
        device: str,
        camera: str | None = None,
        kinds: list[str] | None = None,
        limit: int = 100,
    ) -> dict[str, Any]:
        """A device's newest zone and line events (of one camera, of some kinds), newest first, from the store."""
        events = (
            self.store.events(fleet, device, camera, kinds, None, limit) if self.store is not None else []
        )
        return {"fleet": fleet, "device": device, "camera": camera, "events": events, "now": self.clock()}

    def zone_counts(
        self, fleet: str, device: str, window_s: int = 3600, camera: str | None = None
    ) -> dict[str, Any]:
        """Counts per zone and line of a device's cameras over the last ``window_s``, per step, from the store."""
        window_s = _window(window_s)
        now, step = self.clock(), _step(window_s)
        out: dict[str, Any] = {"step_s": step, "cameras": {}}
        if self.store is not None:
            out = self.store.zone_counts(fleet, device, now - window_s, now, step, camera)
        return {"fleet": fleet, "device": device, "window_s": window_s, "now": now, **out}

    def _build(
        self,
        devices: list[_Device],
        window_s: int,
        now: float,
        series: dict[int, dict[str, Tally]] | None = None,
    ) -> dict[str, Any]:
        step = _step(window_s)
        if series is None:
            series = self._series(devices, window_s, now)
        charts = chart_series(series, (d.key for d in devices))
        per_device, fleet_total = charts.per_device, charts.total
        budgets = Counter(ms for d in devices if (ms := d.budget_ms) is not None)
        budget = budgets.most_common(1)[0][0] if budgets else None
        rows = [self._row(d, per_device.get(d.key, Tally()), now) for d in devices]
        rows.sort(key=lambda r: (r["state"] != "offline", r["slo"] != "breach", r["fleet"], r["device"]))
        online = sum(1 for d in devices if d.state == "online")
        fps = [r["fps"] for r in rows if r["state"] == "online" and r["fps"] is not None]
        groups = {
            "model": self._groups(devices, per_device, _model_key),
            "backend": self._groups(devices, per_device, lambda d: str(d.birth.get("backend") or "?")),
            "fleet": self._groups(devices, per_device, lambda d: d.fleet),
        }
        return {
            "now": now,
            "window_s": window_s,
            "step_s": step,
            "version": self.version,
            "fleet": {
                "devices": len(devices),
                "online": online,
                "offline": len(devices) - online,
                "frames": fleet_total.frames,
                "missed": fleet_total.missed,
                "miss_rate": rate(fleet_total.missed, fleet_total.frames),
                "fps": round(sum(fps), 1) if fps else None,
                "p50": quantile(fleet_total.latency, 0.5),
                "p95": quantile(fleet_total.latency, 0.95),
                "p99": quantile(fleet_total.latency, 0.99),
                "budget_ms": budget,
            },
            "devices": rows,
            "groups": groups,
            "series": charts.latency | {"budget_ms": budget},
            "stages": charts.stages,
            "stage_names": list(STAGES),  # the order the dashboard stacks them in
            "heatmap": charts.heatmap,
            "alerts": self._alerts(devices, now),
            "collector": self._collector_stats(),
        }

    def _row(self, d: _Device, b: Tally, now: float) -> dict[str, Any]:
        model = _model(d)
        slo = "no-data" if not b.frames else ("breach" if d.breach_since is not None else "ok")
        return {
            "fleet": d.fleet,
            "device": d.device,
            "state": d.state,
            "since": d.since,
            "last_seen": d.last_seen,
            "profile": d.birth.get("profile"),
            "model": model.get("name"),
            "version": model.get("version"),
            "backend": d.birth.get("backend"),
            "precision": d.birth.get("precision"),
            "budget_ms": d.budget_ms,
            "fps": d.fps if d.state == "online" else None,
            "p50": quantile(b.latency, 0.5),
            "p95": quantile(b.latency, 0.95),
            "p99": quantile(b.latency, 0.99),
            "miss_rate": rate(b.missed, b.frames),
            "frames": b.frames,
            "gaps": d.gaps,
            "restarts": d.restarts,
            "slo": slo,
            "cameras_stalled": len(self._stalled(d)),
        }

    @staticmethod
    def _groups(
        devices: list[_Device], per_device: dict[str, Tally], key: Callable[[_Device], str]
    ) -> list[dict[str, Any]]:
        merged: dict[str, Tally] = defaultdict(Tally)
        count: Counter[str] = Counter()
        for d in devices:
            k = key(d)
            count[k] += 1
            if d.key in per_device:
                merged[k].merge(per_device[d.key])
        return [
            {
                "key": k,
                "devices": count[k],
                "frames": merged[k].frames,
                "p50": quantile(merged[k].latency, 0.5),
                "p95": quantile(merged[k].latency, 0.95),
                "p99": quantile(merged[k].latency, 0.99),
                "miss_rate": rate(merged[k].missed, merged[k].frames),
            }
            for k in sorted(count)
        ]

    def _alerts(self, devices: list[_Device], now: float) -> list[dict[str, Any]]:
        out = []
        for d in devices:
            if d.state == "offline":
                out.append(
                    {
                        "kind": "offline",
                        "severity": "critical",
                        "fleet": d.fleet,
                        "device": d.device,
                        "since": d.since,
                        "detail": "offline (its Will or a clean stop); last seen "
                        + time.strftime("%H:%M:%S", time.localtime(d.last_seen)),
                    }
                )
            elif d.breach_since is not None:
                firing = now - d.breach_since >= self.slo.for_s
                out.append(
                    {
                        "kind": "slo",
                        "severity": "critical" if firing else "warning",
                        "state": "firing" if firing else "pending",
                        "fleet": d.fleet,
                        "device": d.device,
                        "since": d.breach_since,
                        "detail": f"{d.breach_detail} for {duration(now - d.breach_since)}"
                        + ("" if firing else f" (fires after {duration(self.slo.for_s)})"),
                    }
                )
            for name in self._stalled(d):
                h = d.health[name]
                out.append(
                    {
                        "kind": "stalled",
                        "severity": "warning",
                        "state": "firing",
                        "fleet": d.fleet,
                        "device": d.device,
                        "camera": name,
                        "since": now - h.since_frame_s,
                        "detail": f"{'camera ' + name if name else 'the source'}: no frames for "
                        f"{duration(h.since_frame_s)} ({h.outages} outages, {h.reopens} reopens)",
                    }
                )
        out.sort(key=lambda a: (a["severity"] != "critical", a["since"]))
        return out

    def _collector_stats(self) -> dict[str, Any]:
        if self.stats is None:
            return {}
        try:
            return self.stats()
        except Exception:
            log.exception("view: collector stats failed")
            return {}

    def prometheus_state(self) -> list[DeviceTotals]:
        """Every device's cumulative totals since the server started (after folding the queue)."""
        self.tick()
        with self._lock:
            out = []
            for d in sorted(self._devices.values(), key=lambda x: x.key):
                t = DeviceTotals(
                    fleet=d.fleet,
                    device=d.device,
                    state=d.state,
                    last_seen=d.last_seen,
                    birth=dict(d.birth),
                    budget_ms=d.budget_ms,
                    windows=d.windows,
                    gaps=d.gaps,
                    health=dict(d.health),  # replaced whole on news, never changed in place
                    events=dict(d.events),
                )
                t.merge(d.totals)  # a copy, read outside the lock: merging copies classes and cameras
                out.append(t)
        return out

    def collector_stats(self) -> dict[str, Any]:
        """The collector's counters (accepted by kind, rejected by reason) and lag."""
        return self._collector_stats()


def _model(d: _Device) -> dict[str, Any]:
    model = d.birth.get("model")
    return model if isinstance(model, dict) else {}


def _model_key(d: _Device) -> str:
    model = _model(d)
    return f"{model.get('name') or '?'} {model.get('version') or ''}".strip()


def _window(window_s: int) -> int:
    """The nearest offered window (requests come from the network: never an arbitrary range)."""
    return min(WINDOWS_S, key=lambda w: abs(w - int(window_s)))


def _step(window_s: int) -> int:
    """About 60 points per chart, in whole multiples of the live step."""
    return max(STEP_S, int(window_s / 60) // STEP_S * STEP_S)
