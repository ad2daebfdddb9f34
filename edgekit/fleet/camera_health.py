"""Each camera's health as the fleet keeps it: the latest a device reported, per camera.

A window's ``health`` is the device's sources together and each camera entry's ``health`` its
own (``SourceHealth``'s wire form).  Its counts only go up while the device's pipeline runs,
so the fleet keeps the latest, never a sum: per device, each camera of a many-camera
pipeline by name, or a single source's under ``""``.  The store writes them to the
``camera_health`` table (the latest window's, so a camera renamed away leaves it); the
live view keeps them in memory and ``/metrics`` exports them.  A camera is *stalled* when
it has sent no frame for longer than ``STALLED_S`` while its device reports.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from edgekit.core.tally import SourceHealth
from edgekit.fleet.sql import UPSERT_HEALTH

#: No frame from a camera for longer than this while its device reports: the camera is stalled
#: (the dashboard's state and alert; the Prometheus rule EdgekitCameraStalled uses the same 30 s).
STALLED_S = 30.0

Query = Callable[[str, Iterable[Any]], list[tuple[Any, ...]]]
Execute = Callable[[str, Iterable[Any]], int]
ExecuteMany = Callable[[str, list[tuple[Any, ...]]], int]


def of_window(window: Mapping[str, Any]) -> dict[str, SourceHealth] | None:
    """The cameras' health in a window (each camera by name, a single source as ``""``); ``None`` without any.

    A many-camera window's own ``health`` (the cameras together) is not kept: its cameras say it.
    """
    cameras = window.get("cameras")
    if cameras:
        out = {str(n): SourceHealth.from_dict(c["health"]) for n, c in cameras.items() if c.get("health")}
        return out or None
    health = window.get("health")
    return {"": SourceHealth.from_dict(health)} if health else None


def state(health: SourceHealth, online: bool, stalled_s: float = STALLED_S) -> str:
    """``stalled``: no frame for over ``stalled_s`` as its online device last said; ``ok``; ``unknown``
    while its device is offline (what it last said is not now)."""
    if not online:
        return "unknown"
    return "stalled" if health.stalled(stalled_s) else "ok"


def row(name: str, health: SourceHealth, online: bool, stalled_s: float = STALLED_S) -> dict[str, Any]:
    """A camera's health as the dashboard and the device page's JSON show it, with its ``state``."""
    return {"name": name, "state": state(health, online, stalled_s)} | health.to_dict()


def write(
    execute: Execute,
    execute_many: ExecuteMany,
    latest: Mapping[tuple[str, str], tuple[float, Mapping[str, Any]]],
) -> None:
    """Keep each device's latest health: ``latest`` is (fleet, device) -> (its newest window's end, that window).

    Inside the caller's transaction.  A device's rows older than its newest window go (cameras it no
    longer has); a replayed older window changes nothing newer (``UPSERT_HEALTH``).
    """
    rows: list[tuple[Any, ...]] = []
    for (fleet, device), (at, window) in latest.items():
        health = of_window(window)
        if health is None:
            continue
        execute("DELETE FROM camera_health WHERE fleet = ? AND device = ? AND stop < ?", (fleet, device, at))
        for name, h in health.items():
            d = h.to_dict()
            rows.append(
                (
                    fleet,
                    device,
                    name,
                    at,
                    *(d[c] for c in SourceHealth.COUNTS),
                    d["down_s"],
                    d["since_frame_s"],
                )
            )
    if rows:
        execute_many(UPSERT_HEALTH, rows)


def read(
    query: Query, fleet: str | None = None, device: str | None = None
) -> dict[tuple[str, str], dict[str, Any]]:
    """(fleet, device) -> ``{"at": the window's end, "cameras": {name: SourceHealth}}``."""
    clauses, args = [], []
    for column, value in (("fleet", fleet), ("device", device)):
        if value is not None:
            clauses.append(f"{column} = ?")
            args.append(value)
    where = " WHERE " + " AND ".join(clauses) if clauses else ""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for f, d, name, at, outages, reopens, stalls, corrupt, size_changes, rate_changes, down_s, since in query(
        "SELECT fleet, device, camera, stop, outages, reopens, stalls, corrupt, size_changes, rate_changes, "
        "down_s, since_frame_s FROM camera_health" + where + " ORDER BY fleet, device, camera",
        args,
    ):
        entry = out.setdefault((str(f), str(d)), {"at": float(at), "cameras": {}})
        entry["at"] = max(entry["at"], float(at))
        entry["cameras"][str(name)] = SourceHealth(
            int(outages),
            int(reopens),
            int(stalls),
            int(corrupt),
            int(size_changes),
            int(rate_changes),
            float(down_s),
            float(since),
        )
    return out
