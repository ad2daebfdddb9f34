"""Zone and line events as the fleet keeps them: one row per event, read back per device and camera.

A row is keyed by ``(fleet, device, id)``: the id is the event's own (stable: the device sends
the same id again after an outage), so a replay or a duplicate is dropped by the insert
itself (``ON CONFLICT DO NOTHING``), whichever collector or store sees it.  The device is part
of the key because two devices running the same footage derive the same ids.  The event is
stored as the JSON the device sent (checked by the collector), its key fields in columns.

Counts per zone over time are read from the ``count`` events: each reports one interval of a
camera's zones (enters, leaves, occupancy at its end) and lines (crossings per direction),
per class; ``zone_counts`` adds them up per time step.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

Query = Callable[[str, Iterable[Any]], list[tuple[Any, ...]]]

# How many events one read returns at most.
MAX_LIST = 1000

INSERT = """INSERT INTO events (fleet, device, id, camera, kind, zone, t, received, payload)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"""


def event_row(fleet: str, device: str, body: Mapping[str, Any], raw: str, at: float) -> tuple[Any, ...]:
    """An event message as an ``events`` row (its columns in order), ``raw`` its JSON as received."""
    zone = body.get("zone")
    return (
        fleet,
        device,
        str(body["id"]),
        str(body["camera"]),
        str(body["kind"]),
        None if zone is None else str(zone),
        float(body["t"]),
        at,
        raw,
    )


def _where(
    fleet: str, device: str, camera: str | None, kinds: Iterable[str] | None, since: float | None
) -> tuple[str, list[Any]]:
    clauses: list[str] = ["fleet = ?", "device = ?"]
    args: list[Any] = [fleet, device]
    if camera is not None:
        clauses.append("camera = ?")
        args.append(camera)
    kinds = list(kinds or ())
    if kinds:
        clauses.append("kind IN (" + ", ".join("?" * len(kinds)) + ")")
        args.extend(kinds)
    if since is not None:
        clauses.append("t >= ?")
        args.append(since)
    return " WHERE " + " AND ".join(clauses), args


def recent(
    query: Query,
    fleet: str,
    device: str,
    camera: str | None = None,
    kinds: Iterable[str] | None = None,
    since: float | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """A device's newest events (of one camera, of some kinds, from ``since``), newest first.

    Each is the message as the device sent it with ``received`` (when the collector took it).
    """
    where, args = _where(fleet, device, camera, kinds, since)
    limit = max(1, min(int(limit), MAX_LIST))
    rows = query(f"SELECT payload, received FROM events{where} ORDER BY t DESC, id LIMIT {limit}", args)
    return [json.loads(payload) | {"received": float(received)} for payload, received in rows]


def zone_counts(
    query: Query,
    fleet: str,
    device: str,
    since: float,
    until: float,
    step_s: float,
    camera: str | None = None,
) -> dict[str, Any]:
    """Per camera, per zone and per line, what the ``count`` events of ``[since, until]`` say, per ``step_s``.

    ``{"step_s", "cameras": {camera: {"zones": {zone: [{"t0", "enter", "leave", "occupancy",
    "classes": {class: {"enter", "leave", "occupancy"}}}]}, "lines": {line: [{"t0", "<direction>": n,
    "classes": {class: {direction: n}}}]}}}}``, each list in time order.  An interval counts in
    the step its end falls in; enters, leaves and crossings are added up.  A class's occupancy is
    the highest any interval of the step ended with, and the step's the sum of its classes' (an
    upper bound when classes peaked at different intervals).
    """
    if not step_s > 0:
        raise ValueError(f"step_s must be > 0, not {step_s}")
    where, args = _where(fleet, device, camera, ["count"], since)
    rows = query(f"SELECT camera, t, payload FROM events{where} AND t <= ? ORDER BY t", [*args, until])
    cameras: dict[str, dict[str, dict[str, dict[float, dict[str, Any]]]]] = {}
    for cam, t, payload in rows:
        counts = json.loads(payload).get("counts") or {}
        t0 = float(math.floor(float(t) / step_s) * step_s)
        places = cameras.setdefault(str(cam), {"zones": {}, "lines": {}})
        for group in ("zones", "lines"):
            for place, by_what in (counts.get(group) or {}).items():
                step = (
                    places[group].setdefault(place, {}).setdefault(t0, {"t0": t0, "classes": {}, "what": {}})
                )
                for what, by_class in by_what.items():
                    step["what"][what] = 0  # a direction nothing crossed in is still a 0
                    for cls, n in by_class.items():
                        per_class = step["classes"].setdefault(cls, {})
                        if what == "occupancy":
                            per_class[what] = max(per_class.get(what, 0), n)
                        else:
                            per_class[what] = per_class.get(what, 0) + n
    out: dict[str, Any] = {}
    for cam, places in cameras.items():
        out[cam] = {}
        for group, by_place in places.items():
            out[cam][group] = {}
            for place, steps in by_place.items():
                series = []
                for t0 in sorted(steps):
                    step = steps[t0]
                    totals: dict[str, int] = dict(step["what"])
                    for per_class in step["classes"].values():
                        for what, n in per_class.items():
                            totals[what] = totals.get(what, 0) + n
                    if group == "zones":
                        totals = {"enter": 0, "leave": 0, "occupancy": 0} | totals
                    series.append({**totals, "t0": t0, "classes": step["classes"]})
                out[cam][group][place] = series
    return {"step_s": step_s, "cameras": out}


def zone_totals(counts: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``zone_counts`` of one step over the whole range as rows for a table: per camera, zone or line.

    A zone's row has ``enter``, ``leave`` and ``occupancy`` (the highest); a line's one entry per
    direction.  Sorted by camera, zones before lines, then name.
    """
    rows = []
    for camera, places in sorted((counts.get("cameras") or {}).items()):
        for group in ("zones", "lines"):
            for name, series in sorted((places.get(group) or {}).items()):
                row: dict[str, Any] = {"camera": camera, "type": group[:-1], "name": name}
                for step in series:
                    for what, n in step.items():
                        if what in ("t0", "classes"):
                            continue
                        row[what] = max(row.get(what, 0), n) if what == "occupancy" else row.get(what, 0) + n
                rows.append(row)
    return rows
