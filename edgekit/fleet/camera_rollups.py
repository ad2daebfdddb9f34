"""A rollup's per-camera figures in the ``rollup_cameras`` table: read for a query, merged into and
written by a compaction (``edgekit.fleet.store``).  One row per camera per rollup; the latency is
the camera's merged sketch, so percentiles over rolled-up time still come from merged counts.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from edgekit.fleet.camera_totals import add_cameras
from edgekit.fleet.sums import WindowSum, loads

Query = Callable[[str, Iterable[Any]], list[tuple[Any, ...]]]
ExecuteMany = Callable[[str, list[tuple[Any, ...]]], int]
RollupKey = tuple[str, str, float]  # fleet, device, t0

SELECT = "SELECT fleet, device, stop, name, frames, missed, dropped, latency FROM rollup_cameras"


def as_window(frames: Any, missed: Any, dropped: Any, latency: str) -> dict[str, Any]:
    """A stored camera row as a window's camera entry (what ``FrameTally.add`` takes)."""
    return {"frames": frames, "missed": missed, "dropped": dropped, "latency_ms": loads(latency)}


def add_rows(at: Callable[[str, str, float], WindowSum], rows: list[tuple[Any, ...]]) -> None:
    """Add ``SELECT``'s rows to the sums ``at(fleet, device, stop)`` picks."""
    for f, d, stop, name, frames, missed, dropped, latency in rows:
        total = at(f, d, stop)
        total.cameras = add_cameras(total.cameras, {str(name): as_window(frames, missed, dropped, latency)})


def merge_earlier(
    query: Query, fleet: str, device: str, span: float, t0s: list[float], rollups: dict[RollupKey, WindowSum]
) -> None:
    """Merge the camera rows an earlier compaction wrote for these rollups into them (they are rewritten whole)."""
    for t0, name, frames, missed, dropped, latency in query(
        "SELECT t0, name, frames, missed, dropped, latency FROM rollup_cameras "
        "WHERE fleet = ? AND device = ? AND span = ? AND t0 >= ? AND t0 <= ?",
        (fleet, device, span, min(t0s), max(t0s)),
    ):
        r = rollups.get((fleet, device, float(t0)))
        if r is not None:
            r.cameras = add_cameras(r.cameras, {str(name): as_window(frames, missed, dropped, latency)})


def write(execute_many: ExecuteMany, span: float, rollups: dict[RollupKey, WindowSum]) -> None:
    """Write each rollup's cameras whole (its earlier rows were merged in by ``merge_earlier``)."""
    with_cameras = [(key, r) for key, r in rollups.items() if r.cameras]
    execute_many(
        "DELETE FROM rollup_cameras WHERE fleet = ? AND device = ? AND span = ? AND t0 = ?",
        [(f, d, span, t0) for (f, d, t0), _ in with_cameras],
    )
    execute_many(
        "INSERT INTO rollup_cameras (fleet, device, span, t0, stop, name, frames, missed, dropped, latency) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (f, d, span, t0, r.stop, name, c.frames, c.missed, c.dropped, json.dumps(c.latency.to_dict()))
            for (f, d, t0), r in with_cameras
            for name, c in (r.cameras or {}).items()
        ],
    )
