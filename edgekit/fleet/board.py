"""``FleetBoard``: the dashboard's large-fleet API read from the store, not from one server's memory.

Every answer comes from the database, so any number of ``edgekit fleet serve --no-collect`` processes
behind a proxy give the same pages, and a page of 10,000 devices costs one indexed statement:

* ``devices``: the device list (``device_latest`` joined to ``devices``), filtered, sorted worst first
  and paged in SQL (``LIMIT``/``OFFSET``: a list of 10,000 narrow rows sorts in a few ms, so keyset
  paging would buy nothing and lose sorting by a computed ratio);
* ``device``: one device's row and its series from raw windows, minute and hour rollups, by range;
* ``summary``: a fleet's merged sketch over a range (``fleet_rollups``: the per-step merge of all its
  devices, written by compaction), its devices by state and those over budget now;
* ``alerts``: grouped, one alert per kind with its members (12 offline devices are one alert).
"""

from __future__ import annotations

import math
import time
from typing import Any

from edgekit.fleet.store import FleetStore
from edgekit.fleet.sums import SketchSum, loads

#: Sort orders of the device list: worst first, by p99 over the device's own budget or by missed share.
SORTS = {
    # Devices without a figure (no window yet, no budget) go last: (x IS NULL) sorts false first.
    "worst": "(l.p99 / NULLIF(l.budget_ms, 0)) IS NULL, l.p99 / NULLIF(l.budget_ms, 0) DESC, d.fleet, d.device",
    "missed": "(l.missed * 1.0 / NULLIF(l.frames, 0)) IS NULL, "
    "l.missed * 1.0 / NULLIF(l.frames, 0) DESC, d.fleet, d.device",
    "p99": "l.p99 IS NULL, l.p99 DESC, d.fleet, d.device",
    "device": "d.fleet, d.device",
    "last_seen": "d.last_seen DESC, d.fleet, d.device",
}
#: Columns the list filters on exactly (``?site=lobby&backend=onnx``).
FILTERS = ("site", "profile", "backend", "model", "version")
#: Columns the search box matches (case-insensitive substring of any of them).
SEARCHED = ("d.device", "l.site", "l.profile", "l.backend", "l.model", "l.version")
#: The device page's ranges and their steps: about 60-170 points a chart, each step a rollup level's
#: multiple so a step never splits a rollup.
RANGES = {"1h": (3600, 60), "6h": (6 * 3600, 300), "1d": (86400, 900), "7d": (7 * 86400, 3600)}
MAX_LIMIT = 500
MAX_MEMBERS = 100  # an alert's members listed; the count says how many there are

LIST = """SELECT d.fleet, d.device, d.state, d.since, d.last_seen, l.site, l.profile, l.backend, l.model,
    l.version, l.budget_ms, l.stop, l.frames, l.missed, l.p50, l.p95, l.p99
    FROM devices d LEFT JOIN device_latest l ON l.fleet = d.fleet AND l.device = d.device"""
LIST_COLUMNS = (
    "fleet", "device", "state", "since", "last_seen", "site", "profile", "backend", "model",
    "version", "budget_ms", "stop", "frames", "missed", "p50", "p95", "p99",
)  # fmt: skip


def _row(values: tuple[Any, ...]) -> dict[str, Any]:
    row = dict(zip(LIST_COLUMNS, values, strict=True))
    frames, missed, p99, budget = row["frames"], row["missed"], row["p99"], row["budget_ms"]
    row["missed_share"] = round(missed / frames, 5) if frames else None
    row["over_budget"] = None if p99 is None or not budget else round(p99 / budget, 4)
    return row


def _quantiles(total: SketchSum) -> dict[str, float | None]:
    sketch = total.sketch()
    return {
        f"p{round(q * 100)}": (None if not sketch.count else round(sketch.quantile(q), 3))
        for q in (0.5, 0.95, 0.99)
    }


class FleetBoard:
    """The large-fleet API over ``store`` (SQLite or PostgreSQL); thread-safe as the store is."""

    def __init__(self, store: FleetStore, clock: Any = time.time) -> None:
        self.store = store
        self.clock = clock

    def devices(
        self,
        *,
        fleet: str | None = None,
        state: str | None = None,
        q: str | None = None,
        sort: str = "worst",
        limit: int = 50,
        offset: int = 0,
        **exact: str | None,
    ) -> dict[str, Any]:
        """A page of devices: ``{"total", "offset", "limit", "sort", "devices": [...]}``.

        ``q`` matches any of the device, site, profile, backend, model, version (case-insensitive);
        ``exact`` filters ``FILTERS`` columns; ``state`` is ``online``/``offline``.
        """
        if sort not in SORTS:
            raise ValueError(f"sort is one of {', '.join(SORTS)}, not {sort!r}")
        unknown = set(exact) - set(FILTERS)
        if unknown:
            raise ValueError(f"no filter {', '.join(sorted(unknown))}; filters are {', '.join(FILTERS)}")
        limit = max(1, min(int(limit), MAX_LIMIT))
        offset = max(0, int(offset))
        clauses: list[str] = []
        args: list[Any] = []
        if fleet is not None:
            clauses.append("d.fleet = ?")
            args.append(fleet)
        if state is not None:
            clauses.append("d.state = ?")
            args.append(state)
        for column, value in sorted(exact.items()):
            if value is not None:
                clauses.append(f"l.{column} = ?")
                args.append(value)
        if q:
            # The pattern is an argument (never SQL text); LIKE's own wildcards in it are taken literally.
            pattern = "%" + q.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            clauses.append("(" + " OR ".join(f"LOWER({c}) LIKE ? ESCAPE '\\'" for c in SEARCHED) + ")")
            args.extend([pattern] * len(SEARCHED))
        where = (" WHERE " + " AND ".join(clauses)) if clauses else ""
        store = self.store
        with store._lock:
            (total,) = store._query(
                "SELECT COUNT(*) FROM devices d LEFT JOIN device_latest l "
                "ON l.fleet = d.fleet AND l.device = d.device" + where,
                args,
            )[0]
            rows = store._query(
                f"{LIST}{where} ORDER BY {SORTS[sort]} LIMIT ? OFFSET ?", [*args, limit, offset]
            )
        return {
            "total": int(total),
            "offset": offset,
            "limit": limit,
            "sort": sort,
            "devices": [_row(r) for r in rows],
        }

    def device(self, fleet: str, device: str, range_: str = "1h") -> dict[str, Any] | None:
        """One device's row and its series over ``range_`` (a ``RANGES`` key); ``None`` if unknown."""
        if range_ not in RANGES:
            raise ValueError(f"range is one of {', '.join(RANGES)}, not {range_!r}")
        span, step = RANGES[range_]
        store = self.store
        with store._lock:
            rows = store._query(f"{LIST} WHERE d.fleet = ? AND d.device = ?", (fleet, device))
        if not rows:
            return None
        now = self.clock()
        series = [
            {
                "t": b.t0,
                "frames": b.frames,
                "missed": b.missed,
                "p50": None if not b.latency.count else round(b.latency.quantile(0.5), 3),
                "p95": None if not b.latency.count else round(b.latency.quantile(0.95), 3),
                "p99": None if not b.latency.count else round(b.latency.quantile(0.99), 3),
            }
            for b in store.buckets(now - span, now, step, fleet=fleet, device=device)
        ]
        stored = store.device(fleet, device)
        return {
            **_row(rows[0]),
            "birth": stored["birth"] if stored else {},
            "range": range_,
            "step_s": step,
            "series": series,
        }

    def summary(
        self, fleet: str | None = None, since: float | None = None, until: float | None = None
    ) -> dict[str, Any]:
        """A fleet's (or every fleet's) merged latency and missed share over [since, until] (default: the
        last 7 days) from ``fleet_rollups``, its devices by state, and how many online ones are over budget now."""
        now = self.clock()
        until = now if until is None else until
        since = until - 7 * 86400 if since is None else since
        where, args = ("WHERE fleet = ? AND", [fleet]) if fleet is not None else ("WHERE", [])
        store = self.store
        with store._lock:
            rolled = store._query(
                f"SELECT windows, frames, missed, latency, stop FROM fleet_rollups {where} stop >= ? AND stop <= ?",
                [*args, since, until],
            )
            dwhere = " WHERE d.fleet = ?" if fleet is not None else ""
            states = store._query(f"SELECT d.state, COUNT(*) FROM devices d{dwhere} GROUP BY d.state", args)
            (over,) = store._query(
                "SELECT COUNT(*) FROM devices d JOIN device_latest l ON l.fleet = d.fleet AND l.device = d.device"
                + (dwhere or " WHERE 1 = 1")
                + " AND d.state = 'online' AND l.budget_ms > 0 AND l.p99 > l.budget_ms",
                args,
            )[0]
        total = SketchSum()
        windows = frames = missed = 0
        covered = -math.inf
        for w, f, m, latency, stop in rolled:
            windows += int(w)
            frames += int(f)
            missed += int(m)
            total.add(loads(latency))
            covered = max(covered, float(stop))
        by_state = {str(s): int(n) for s, n in states}
        return {
            "fleet": fleet,
            "since": since,
            "until": until,
            # Compaction's last rolled-up window: the range's newest ``raw_keep_s`` is not in it yet.
            "covered_until": covered if rolled else None,
            "windows": windows,
            "frames": frames,
            "missed": missed,
            "missed_share": round(missed / frames, 5) if frames else None,
            **_quantiles(total),
            "devices": sum(by_state.values()),
            "states": by_state,
            "over_budget": int(over),
        }

    def groups(self, by: str = "site", fleet: str | None = None) -> list[dict[str, Any]]:
        """Devices grouped by a ``FILTERS`` column: per group its devices, those offline, those online
        and over their own budget, and the worst p99-over-budget; worst groups first."""
        if by not in FILTERS:
            raise ValueError(f"group by one of {', '.join(FILTERS)}, not {by!r}")
        dwhere, args = (" WHERE d.fleet = ?", [fleet]) if fleet is not None else ("", [])
        over = "d.state = 'online' AND l.budget_ms > 0 AND l.p99 > l.budget_ms"
        store = self.store
        with store._lock:
            rows = store._query(
                f"SELECT l.{by}, COUNT(*), SUM(CASE WHEN d.state = 'offline' THEN 1 ELSE 0 END), "
                f"SUM(CASE WHEN {over} THEN 1 ELSE 0 END), MAX(l.p99 / NULLIF(l.budget_ms, 0)) "
                "FROM devices d LEFT JOIN device_latest l ON l.fleet = d.fleet AND l.device = d.device"
                f"{dwhere} GROUP BY l.{by}",
                args,
            )
        out = [
            {
                "key": key,
                "devices": int(n),
                "offline": int(off or 0),
                "over_budget": int(o or 0),
                "worst": None if worst is None else round(float(worst), 4),
            }
            for key, n, off, o, worst in rows
        ]
        out.sort(
            key=lambda g: (
                -(g["over_budget"] + g["offline"]) / g["devices"],
                -(g["worst"] or 0),
                str(g["key"]),
            )
        )
        return out

    def alerts(self, fleet: str | None = None) -> list[dict[str, Any]]:
        """Alerts grouped by kind: offline devices, devices over their budget now; each with its members
        (the first ``MAX_MEMBERS``, worst or longest first) and their count."""
        dwhere, args = (" AND d.fleet = ?", [fleet]) if fleet is not None else ("", [])
        store = self.store
        kinds = (
            (
                "offline",
                "critical",
                f"SELECT d.fleet, d.device, d.since FROM devices d WHERE d.state = 'offline'{dwhere} "
                "ORDER BY d.since, d.fleet, d.device",
            ),
            (
                "over_budget",
                "warning",
                "SELECT d.fleet, d.device, l.p99 / l.budget_ms FROM devices d JOIN device_latest l "
                "ON l.fleet = d.fleet AND l.device = d.device "
                f"WHERE d.state = 'online' AND l.budget_ms > 0 AND l.p99 > l.budget_ms{dwhere} "
                "ORDER BY l.p99 / l.budget_ms DESC, d.fleet, d.device",
            ),
        )
        out = []
        with store._lock:
            for kind, severity, sql in kinds:
                rows = store._query(sql, args)
                if not rows:
                    continue
                out.append(
                    {
                        "kind": kind,
                        "severity": severity,
                        "count": len(rows),
                        "members": [
                            {"fleet": f, "device": d, ("since" if kind == "offline" else "over_budget"): v}
                            for f, d, v in rows[:MAX_MEMBERS]
                        ],
                    }
                )
        return out
