"""Fleet rollup size: bytes on disk in PostgreSQL of a raw window, a minute rollup and an hour rollup.

The scale simulator's own windows (``edgekit fleet simulate --scale``'s templates: real sketches)
for ``--devices`` devices over ``--hours`` hours, 10 s apart, stored through ``PostgresStore``,
then compacted to minute rollups and to hour rollups (``compact(levels=...)``); each table's size
(its partitions and indexes) after ``VACUUM``, per row.  For sizing a store: rows a day times bytes.

    .venv/bin/python -m benchmarks.fleet_rollup_size [--devices 100] [--hours 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._harness import parse, parser, print_doc, run

TABLE_BYTES = (
    "SELECT pg_total_relation_size(%(t)s::regclass) + coalesce((SELECT sum(pg_total_relation_size(inhrelid)) "
    "FROM pg_inherits WHERE inhparent = %(t)s::regclass), 0)"
)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import psycopg

    from edgekit.fleet.pgstore import PostgresStore
    from edgekit.protocol.broker import BrokerConfig
    from edgekit.telemetry.simulate import KINDS, SimDevice, SimOptions
    from edgekit.testing.postgres import PostgresServer

    opts = SimOptions(mqtt="mqtt://127.0.0.1:1883", interval=10.0)
    t0 = time.time() - (args.hours + 1) * 3600
    with tempfile.TemporaryDirectory() as tmp:
        kinds = [
            SimDevice(k, opts, BrokerConfig.from_url(opts.mqtt), Path(tmp), t0) for k in range(len(KINDS))
        ]
        templates = [[d.publisher._payload(d.window_of(10.0, t0), seq=0) for _ in range(8)] for d in kinds]
        for d in kinds:
            d.publisher.spool.close()
    pg = PostgresServer().start()
    try:
        url = pg.new_database()
        store = PostgresStore(url)
        rows = []
        for i in range(args.devices):
            name = f"sim-{i + 1:05d}"
            store.set_state("size", name, "online", t0, {})
            for seq in range(int(args.hours * 360)):
                end = t0 + 10.0 * (seq + 1)
                tpl = templates[i % len(templates)][seq % 8]
                p = tpl | {"device": name, "epoch": "e", "seq": seq, "sent_at": end,
                           "window": tpl["window"] | {"start": end - 10.0, "end": end}}  # fmt: skip
                rows.append(("size", name, p, json.dumps(p), end))
        for i in range(0, len(rows), 2000):
            store.add_windows(rows[i : i + 2000])
        levels = ((60.0, 86400.0), (3600.0, 400 * 86400.0))

        def sizes() -> dict[str, tuple[int, int]]:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("VACUUM FULL")
                out = {}
                for name, table, where in (
                    ("window", "windows", ""),
                    ("minute_rollup", "rollups", " WHERE span = 60"),
                    ("hour_rollup", "rollups", " WHERE span = 3600"),
                ):
                    n = conn.execute(f"SELECT count(*) FROM {table}{where}").fetchone()
                    b = conn.execute(TABLE_BYTES, {"t": table}).fetchone()
                    out[name] = (int(n[0]) if n else 0, int(b[0]) if b else 0)
            return out

        raw = sizes()["window"]
        store.compact(time.time(), raw_keep_s=0, levels=levels)
        minutes = sizes()["minute_rollup"]
        store.compact(time.time() + 2 * 86400, raw_keep_s=0, levels=levels)  # minutes past their keep
        hours = sizes()["hour_rollup"]
        store.close()
    finally:
        pg.stop()
    return {
        "devices": args.devices,
        "hours": args.hours,
        "rows": {"window": raw[0], "minute_rollup": minutes[0], "hour_rollup": hours[0]},
        "bytes_per_row": {
            k: round(b / max(n, 1))
            for k, (n, b) in (("window", raw), ("minute_rollup", minutes), ("hour_rollup", hours))
        },
    }


def render(r: dict[str, Any]) -> str:
    return "\n".join(
        f"{name:14}: {r['rows'][name]:>7} rows, {b} bytes a row" for name, b in r["bytes_per_row"].items()
    )


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, json_flag=True)
    ap.add_argument("--devices", type=int, default=100)
    ap.add_argument("--hours", type=float, default=2.0)
    args = parse(ap, argv)
    print_doc(measure(args), args.json, render)
    return 0


if __name__ == "__main__":
    run(main)
