"""``backfill``: a PostgreSQL fleet store filled with days of a large fleet's telemetry, fast, the way
``compact`` would have left it: hour rollups for the oldest days, minute rollups for the recent hours,
raw 10 s windows for the last minutes, the fleets' merged rollups beside them, and device rows with
varied births (sites, profiles, backends, models, versions, budgets), a few devices over budget and
some offline.

Every table is written with ``COPY`` from generated text: a device's telemetry is one of a few dozen
latency shapes (sketches of real samples), scaled to a step's windows, so generating a row is string
formatting, not sketching.  It is a tool for benchmarks and tests of the dashboard, not a simulator.
"""

from __future__ import annotations

import io
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgekit.core.sketch import LatencySketch
from edgekit.fleet.pgstore import PostgresStore
from edgekit.fleet.sums import SketchSum
from edgekit.protocol.stages import STAGES

WINDOW_S = 10
FPS = 30
SHAPES = 32
STAGE_SHARE = {"capture_wait": 0.1, "preprocess": 0.15, "inference": 0.6, "postprocess": 0.1, "sink": 0.05}
PROFILES = ("x86_64-cpu", "jetson-orin", "rpi5", "x86_64-openvino")
BACKENDS = ("onnxruntime", "tensorrt", "tflite", "openvino")
MODELS = (("yolov8n", "1.2.0"), ("yolov8n", "1.3.0"), ("yolov8s", "2.0.1"), ("mobilenet-v3", "0.9.4"))
BUDGETS = (33.0, 50.0, 100.0, 200.0)


@dataclass(frozen=True)
class Plan:
    """What to write: ``devices`` devices of ``fleets`` fleets over ``days`` days ending ``now``; minute
    rollups for the last ``minute_hours`` hours, raw windows for the last ``raw_minutes`` minutes."""

    devices: int = 10_000
    days: float = 7.0
    minute_hours: float = 24.0
    raw_minutes: float = 60.0
    fleets: int = 4
    sites: int = 200
    offline_share: float = 0.02
    slow_share: float = 0.03
    seed: int = 7
    now: float = 0.0


def _scaled(data: dict[str, Any], n: int) -> dict[str, Any]:
    """A sketch dict of ``n`` windows with this one's shape (counts times ``n``: what merging n would give)."""
    return {
        **data,
        "count": data["count"] * n,
        "sum": data["sum"] * n,
        "zero": data["zero"] * n,
        "buckets": {k: v * n for k, v in data["buckets"].items()},
    }


def _shape(rng: random.Random, median_ms: float) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """One window's latency sketch (``FPS * WINDOW_S`` frames around ``median_ms``) and its stages'."""
    values = [
        median_ms * math.exp(rng.gauss(0, 0.12)) * (2.5 if rng.random() < 0.01 else 1)
        for _ in range(FPS * WINDOW_S)
    ]
    latency = LatencySketch()
    latency.extend(values)
    stages = {}
    for name in STAGES:
        s = LatencySketch()
        s.extend(v * STAGE_SHARE.get(name, 0.05) for v in values)
        stages[name] = s.to_dict()
    return latency.to_dict(), stages


def _dumps(data: Any) -> str:
    # COPY's text format: compact JSON has no tab or newline, and these dicts no backslash.
    return json.dumps(data, separators=(",", ":"))


class _Copy:
    """Rows of one table buffered as COPY text and sent in chunks of a few MB."""

    def __init__(self, conn: Any, table: str, columns: str) -> None:
        self.conn, self.sql = conn, f"COPY {table} ({columns}) FROM STDIN"
        self.buf = io.StringIO()
        self.rows = 0

    def add(self, line: str) -> None:
        self.buf.write(line)
        self.rows += 1
        if self.buf.tell() > 8 << 20:
            self.flush()

    def flush(self) -> None:
        data = self.buf.getvalue()
        if data:
            with self.conn.cursor() as cur, cur.copy(self.sql) as copy:
                copy.write(data)
        self.buf = io.StringIO()


def backfill(
    url: str, plan: Plan = Plan(), progress: Callable[[str], None] = lambda s: None
) -> dict[str, Any]:
    """Fill the (empty) store at ``url``; returns counts of rows per table and seconds taken."""
    started = time.monotonic()
    rng = random.Random(plan.seed)
    now = plan.now or float(math.floor(time.time() / 60) * 60)
    store = PostgresStore(url)  # makes the schema and the windows' layout
    conn = store._conn()
    # Shapes: fast ones for most devices, slow ones (past any budget) for the ``slow_share``.
    fast = [_shape(rng, rng.uniform(6, 28)) for _ in range(SHAPES - 4)]
    slow = [_shape(rng, rng.uniform(40, 120)) for _ in range(4)]
    shapes = fast + slow
    # A device is given a budget its shape meets (the smallest over its p99), a slow one the largest it
    # misses: so ``slow_share`` of the fleet is over budget, and budgets differ across the fleet.
    p99s = [LatencySketch.from_dict(lat).quantile(0.99) for lat, _ in shapes]
    budgets = [
        min((b for b in BUDGETS if b >= p), default=BUDGETS[-1])
        if k < SHAPES - 4
        else max((b for b in BUDGETS if b < p), default=BUDGETS[0])
        for k, p in enumerate(p99s)
    ]
    minute_n, hour_n = 60 // WINDOW_S, 3600 // WINDOW_S
    text = {
        span: [
            (_dumps(_scaled(lat, n)), _dumps({k: _scaled(v, n) for k, v in st.items()})) for lat, st in shapes
        ]
        for span, n in ((60.0, minute_n), (3600.0, hour_n))
    }
    start = now - plan.days * 86400
    raw_from = now - plan.raw_minutes * 60
    minute_from = max(start, math.floor((now - plan.minute_hours * 3600) / 3600) * 3600)
    hours = [t for t in range(int(math.ceil(start / 3600) * 3600), int(minute_from), 3600)]
    minutes = [float(t) for t in range(int(minute_from), int(math.floor(raw_from / 60) * 60), 60)]
    raw_first = math.floor(raw_from / 60) * 60  # minute rollups end where raw windows begin
    raw_stops = [raw_first + WINDOW_S * (i + 1) for i in range(int((now - raw_first) // WINDOW_S))]
    if raw_stops:
        store._prepare_windows([(None,) * 6 + (s,) for s in (raw_stops[0], raw_stops[-1])])

    devices = _Copy(conn, "devices", "fleet, device, state, since, last_seen, birth, last_seq, epoch")
    latest = _Copy(
        conn,
        "device_latest",
        "fleet, device, site, profile, backend, model, version, budget_ms, stop, frames, missed, p50, p95, p99",
    )
    rollups = _Copy(
        conn, "rollups", "fleet, device, span, t0, stop, windows, frames, missed, latency, stages"
    )
    windows = _Copy(
        conn, "windows", "fleet, device, epoch, seq, session, start, stop, frames, missed, payload"
    )
    compacted = _Copy(conn, "compacted", "fleet, device, epoch, first_seq, last_seq, stop")
    # Per fleet and step: how many devices of each shape reported (their merge is the fleet's rollup).
    per_fleet: dict[tuple[str, float, float], list[int]] = {}
    fleet_missed: dict[tuple[str, float, float], int] = {}
    frames_w = FPS * WINDOW_S
    for i in range(plan.devices):
        fleet = f"fleet-{i % plan.fleets}"
        device = f"cam-{i:05d}"
        slow_one = rng.random() < plan.slow_share
        k = rng.randrange(SHAPES - 4, SHAPES) if slow_one else rng.randrange(SHAPES - 4)
        model, version = MODELS[rng.randrange(len(MODELS))]
        profile = PROFILES[rng.randrange(len(PROFILES))]
        birth = {
            "profile": profile,
            "backend": BACKENDS[PROFILES.index(profile)],
            "model": {"name": model, "version": version},
            "budget_ms": budgets[k],
            "site": f"site-{rng.randrange(plan.sites):03d}",
            "precision": "int8" if profile == "rpi5" else "fp16",
        }
        offline = rng.random() < plan.offline_share
        # An offline device stopped somewhere in the last day: nothing after that.
        gone = now - rng.uniform(600, 86400) if offline else now
        lat, st = shapes[k]
        # Slow devices miss a fifth of their frames, a few others now and then, the rest none.
        missed_w = frames_w // 5 if k >= SHAPES - 4 else (3 if k % 7 == 0 else 0)
        epoch = f"{i:012x}"
        seq = 0
        last = start
        for span, steps in ((3600.0, hours), (60.0, minutes)):
            n = hour_n if span == 3600.0 else minute_n
            lt, stt = text[span][k]
            for t0 in steps:
                stop = t0 + span - 1
                if stop > gone:
                    break
                rollups.add(
                    f"{fleet}\t{device}\t{span}\t{t0}\t{stop}\t{n}\t{frames_w * n}\t{missed_w * n}\t{lt}\t{stt}\n"
                )
                key = (fleet, span, float(t0))
                per_fleet.setdefault(key, [0] * SHAPES)[k] += 1
                fleet_missed[key] = fleet_missed.get(key, 0) + missed_w * n
                seq += n
                last = stop
        if seq:
            compacted.add(f"{fleet}\t{device}\t{epoch}\t0\t{seq - 1}\t{last}\n")
        window = {
            "frames": frames_w,
            "missed": missed_w,
            "fps": float(FPS),
            "latency_ms": lat,
            "stages_ms": st,
        }
        for stop in raw_stops:
            if stop > gone:
                break
            body = {
                "schema": "edgekit/v1/telemetry",
                "device": device,
                "fleet": fleet,
                "session": "s1",
                "epoch": epoch,
                "seq": seq,
                "sent_at": stop,
                "window": {"start": stop - WINDOW_S, "end": stop, **window},
            }
            windows.add(
                f"{fleet}\t{device}\t{epoch}\t{seq}\ts1\t{stop - WINDOW_S}\t{stop}\t{frames_w}\t{missed_w}\t{_dumps(body)}\n"
            )
            seq += 1
            last = stop
        sketch = LatencySketch.from_dict(lat)
        p50, p95, p99 = (round(sketch.quantile(q), 3) for q in (0.5, 0.95, 0.99))
        state = "offline" if offline else "online"
        site, budget = birth["site"], birth["budget_ms"]
        devices.add(
            f"{fleet}\t{device}\t{state}\t{min(gone, last)}\t{last}\t{_dumps(birth)}\t{seq - 1}\t{epoch}\n"
        )
        latest.add(
            f"{fleet}\t{device}\t{site}\t{profile}\t{birth['backend']}\t{model}\t{version}\t{budget}\t"
            f"{last}\t{frames_w}\t{missed_w}\t{p50}\t{p95}\t{p99}\n"
        )
        if i % 1000 == 999:
            progress(f"{i + 1} devices, {rollups.rows} rollups, {windows.rows} windows")
    fleet_rollups = _Copy(conn, "fleet_rollups", "fleet, span, t0, stop, windows, frames, missed, latency")
    for (fleet, span, t0), counts in sorted(per_fleet.items()):
        n = hour_n if span == 3600.0 else minute_n
        total = SketchSum()
        for k, c in enumerate(counts):
            if c:
                total.add(_scaled(shapes[k][0], n * c))
        reporting = sum(counts)
        fleet_rollups.add(
            f"{fleet}\t{span}\t{t0}\t{t0 + span - 1}\t{n * reporting}\t{frames_w * n * reporting}\t"
            f"{fleet_missed[(fleet, span, t0)]}\t{_dumps(total.to_dict())}\n"
        )
    tables = (devices, latest, rollups, windows, compacted, fleet_rollups)
    for t in tables:
        t.flush()
    progress("analyze")
    conn.execute("ANALYZE")
    store.close()
    return {
        "devices": devices.rows,
        "rollups": rollups.rows,
        "windows": windows.rows,
        "fleet_rollups": fleet_rollups.rows,
        "hour_rollups_per_device": len(hours),
        "minute_rollups_per_device": len(minutes),
        "raw_windows_per_device": len(raw_stops),
        "now": now,
        "seconds": round(time.monotonic() - started, 1),
    }
