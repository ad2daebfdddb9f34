"""Fleet ingest: can the collector, on one CPU core, take the simulator's telemetry through a real broker?

Starts its own Mosquitto on a free loopback port (queues big enough that the broker drops
nothing), the collector in its own process pinned to one core (``edgekit.fleet.mqtt``'s
subscriber feeding ``Collector.handle``, an SQLite store in a temporary folder), and
``edgekit fleet simulate`` in load mode on the other cores.  Prints messages sent (acknowledged
by the broker), stored, duplicates, dropped (sent - stored), the ingest rate, the collector's
lag (device ``sent_at`` to handled) and its CPU seconds per 1000 messages.  Goal: >= 5,000 msg/s.

    .venv/bin/python -m benchmarks.fleet_ingest [--rate 6000] [--duration 10] [--devices 20]
        [--format json|sparkplug] [--batch 500] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from benchmarks._harness import parse, parser, pinned, print_json, run, verdict
from edgekit.testing.mosquitto import Mosquitto

SIM = [sys.executable, "-m", "edgekit.cli", "fleet", "simulate"]
# The default queue (1000 messages a client) would drop QoS 1 messages whenever the
# collector fell a second behind: the bench is about the collector, not the broker's limits.
BROKER_QUEUES = "max_queued_messages 10000000\nmax_queued_bytes 0\n"


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def collector_main(url: str, db: str, core: int, batch: int, conn: Connection, backlog: bool = False) -> None:
    """The collector process: one core, the fleet subscriber, an SQLite store; reports over ``conn``.

    With ``backlog`` it subscribes once (the broker keeps the session), leaves while the
    simulator publishes, and comes back when told to: then it drains the broker's queue as fast
    as its core allows, which is the collector's rate without the simulator's limit.
    """
    os.sched_setaffinity(0, {core})
    from edgekit.fleet.collector import Collector
    from edgekit.fleet.mqtt import FleetSubscriber
    from edgekit.fleet.store import FleetStore
    from edgekit.protocol.broker import BrokerConfig

    store = FleetStore(db)
    collector = Collector(store, batch_size=batch, flush_s=0.25)
    times = [0.0, 0.0]  # first and last message handled (monotonic)

    def handle(topic: str, payload: bytes) -> None:
        now = time.monotonic()
        if not times[0]:
            times[0] = now
        collector.handle(topic, payload)
        times[1] = time.monotonic()

    config = BrokerConfig.from_url(url)
    sub = FleetSubscriber(config, handle, client_id="bench-collector", commit=collector.flush).start()
    conn.send("ready")
    if backlog:
        sub.stop()
        expected = conn.recv()
        sub = FleetSubscriber(config, handle, client_id="bench-collector", commit=collector.flush).start()
        cpu0 = _cpu_s()
    else:
        cpu0 = _cpu_s()
        expected = conn.recv()  # the number the simulator got acknowledged
    deadline, last, last_change = time.monotonic() + 120, -1, time.monotonic()
    while time.monotonic() < deadline:
        now = collector.stats()
        done = sum(now["seen"].get(k, 0) for k in ("telemetry", "duplicate")) + sum(now["rejected"].values())
        if done >= expected:
            break
        if done != last:
            last, last_change = done, time.monotonic()
        elif time.monotonic() - last_change > 5:  # nothing more is coming
            break
        time.sleep(0.05)
    cpu = _cpu_s() - cpu0
    collector.flush()
    sub.stop()
    stats = collector.stats()
    store.close()
    with sqlite3.connect(db) as check:
        stored = int(check.execute("SELECT COUNT(*) FROM windows").fetchone()[0])
    conn.send(
        {
            "handled": sub.messages,
            "stored": stored,
            "telemetry": stats["seen"].get("telemetry", 0),
            "duplicates": stats["seen"].get("duplicate", 0),
            "rejected": stats["rejected"],
            "lag_ms": stats["lag_ms"],
            "cpu_s": cpu,
            "seconds": times[1] - times[0],
        }
    )


def measure(args: argparse.Namespace) -> dict[str, Any]:
    cores = sorted(os.sched_getaffinity(0))
    core = cores[-1]
    others = set(cores) - {core}  # the broker and the simulator stay off the collector's core
    with (
        tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp,
        Mosquitto(Path(tmp), BROKER_QUEUES, persistence=False, log=False, cores=others) as broker,
    ):
        url = broker.url
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(
            target=collector_main, args=(url, f"{tmp}/fleet.db", core, args.batch, child, args.backlog)
        )
        try:
            proc.start()
            if not parent.poll(60) or parent.recv() != "ready":
                raise SystemExit("the collector did not start")
            sim = subprocess.run(
                [*SIM, "--mqtt", url, "--fleet", "bench", "--devices", str(args.devices),
                 "--rate", str(args.rate), "--duration", str(args.duration), "--format", args.format],
                capture_output=True, text=True, timeout=args.duration + 120, preexec_fn=pinned(others),
            )  # fmt: skip
            lines = [ln for ln in sim.stdout.splitlines() if ln.startswith("{")]
            if not lines:
                raise SystemExit(f"the simulator failed:\n{sim.stdout}\n{sim.stderr[-2000:]}")
            load = json.loads(lines[-1])
            parent.send(load["sent"])
            if not parent.poll(180):
                raise SystemExit("the collector did not report")
            got = parent.recv()
            proc.join(10)
        finally:
            if proc.is_alive():
                proc.kill()
    n = max(got["telemetry"] + got["duplicates"], 1)
    return {
        "mode": "backlog" if args.backlog else "live",
        "format": args.format,
        "devices": args.devices,
        "target_rate": args.rate,
        "sent": load["sent"],
        "published": load["published"],
        "sim_rate": load["rate"],
        "stored": got["stored"],
        "duplicates": got["duplicates"],
        "rejected": got["rejected"],
        "dropped": load["sent"] - got["stored"],
        "ingest_rate": round(n / got["seconds"], 1) if got["seconds"] > 0 else None,
        "lag_ms": got["lag_ms"],
        "cpu_s_per_1000": round(1000 * got["cpu_s"] / n, 4),
        "core_capacity": round(n / got["cpu_s"], 1) if got["cpu_s"] > 0 else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, json_flag=True)
    ap.add_argument("--rate", type=float, default=6000.0, help="simulator load, messages a second in all")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds of load")
    ap.add_argument("--devices", type=int, default=20)
    ap.add_argument("--format", choices=("json", "sparkplug"), default="json")
    ap.add_argument("--batch", type=int, default=500, help="windows per store transaction")
    ap.add_argument(
        "--backlog",
        action="store_true",
        help="publish while the collector is away, then time it draining the broker's queue "
        "(its own rate, not the simulator's: on two cores the simulator tops out near 4.5k msg/s)",
    )
    args = parse(ap, argv)
    r = measure(args)
    if args.json:
        print_json(r)
        return 0 if r["dropped"] == 0 else 1
    lag = r["lag_ms"]
    print(
        f"load      : {r['devices']} simulated devices, {r['format']}, target {r['target_rate']:g} msg/s "
        f"(the simulator reached {r['sim_rate']:g} msg/s)"
    )
    print(f"sent      : {r['sent']} (acknowledged by the broker)")
    print(f"stored    : {r['stored']}")
    print(f"duplicates: {r['duplicates']}   rejected: {sum(r['rejected'].values())}")
    print(f"dropped   : {r['dropped']}")
    how = "draining the broker's queue" if r["mode"] == "backlog" else "live"
    print(f"ingest    : {r['ingest_rate']} msg/s (first to last message handled; {how})")
    away = "; includes the time the collector was away" if r["mode"] == "backlog" else ""
    print(f"lag       : p50 {lag['p50']} ms  p99 {lag['p99']} ms (device sent_at -> collector{away})")
    print(
        f"collector : {r['cpu_s_per_1000']:.3f} CPU s per 1000 msgs on one core "
        f"(= {r['core_capacity']} msg/s if the core were its own)"
    )
    ok = r["dropped"] == 0 and (r["ingest_rate"] or 0) >= 5000
    print(f"goal >= 5000 msg/s on one core, nothing dropped: {verdict(ok)}")
    return 0 if r["dropped"] == 0 else 1


if __name__ == "__main__":
    run(main)
