"""Fleet at scale: thousands of simulated devices through Mosquitto into collectors sharing one PostgreSQL.

Starts its own Mosquitto (the queue the fleet guide tells a shared group to have), its own
PostgreSQL, ``--collectors`` processes of ``edgekit fleet collect --share`` and ``edgekit fleet
simulate --scale`` (every device its own MQTT connection and identity, a window every
``--interval`` seconds, some outages and restarts).  With ``--kill`` one collector is SIGKILLed
at 40 % of the run and started again ``--down`` seconds later.  When the simulator has every
window acknowledged, the benchmark waits for the store to settle and compares it with the
simulator's ledger (what the broker acknowledged, per device and epoch):

- sent, stored, lost (acknowledged but not in the store: the goal is 0), duplicated rows (the
  same device, epoch and seq twice: 0), stored but never acknowledged (a PUBACK lost with a link);
- p50 / p99 lag from the device (its window's end) to the commit of its row, every row's own
  (PostgreSQL's commit timestamps), and p99 per minute;
- CPU seconds per 1,000 messages of the collectors, the broker, PostgreSQL and the simulator, from
  the moment every device is online (a collector started again after its kill counts in full);
- the devices' rows: every device known, every one "offline" after the run.

    .venv/bin/python -m benchmarks.fleet_scale [--devices 10000] [--minutes 10] [--interval 10]
        [--collectors 2] [--kill] [--down 5] [--outages 0.01] [--restarts 0.01] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._harness import parse, parser, print_doc, run, verdict
from edgekit.telemetry.simulate_fleet import FD_SPARE, raise_fd_limit
from edgekit.testing.mosquitto import Mosquitto
from edgekit.testing.postgres import PostgresServer
from edgekit.testing.process import stop_process

EDGEKIT = [sys.executable, "-m", "edgekit.cli"]
FLEET = "scale"
# The fleet guide's setting for a shared group: a member's share waits while it restarts.
BROKER = "max_queued_messages 1000000\npersistent_client_expiration 1d\n"
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process so far (``None`` once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


class CpuMeter:
    """Each process's CPU seconds, sampled while it lives: a killed process keeps its last sample."""

    def __init__(self) -> None:
        self.last: dict[tuple[str, int], float] = {}
        self.base: dict[tuple[str, int], float] = {}

    def start(self) -> None:
        """From here on: what the processes running now spent before (starting up) is not counted."""
        self.base = dict(self.last)

    def sample(self, role: str, pids: list[int]) -> None:
        for pid in pids:
            if (s := cpu_s(pid)) is not None:
                self.last[(role, pid)] = s

    def total(self, role: str) -> float:
        return sum(v - self.base.get((r, pid), 0.0) for (r, pid), v in self.last.items() if r == role)


class Collectors:
    """``edgekit fleet collect --share g`` processes, each with its own client id and log."""

    def __init__(self, folder: Path, mqtt: str, db: str, devices: int) -> None:
        self.folder, self.mqtt, self.db, self.devices = folder, mqtt, db, devices
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.starts: dict[str, int] = {}
        self.reports: list[dict[str, Any]] = []

    def log(self, name: str) -> Path:
        return self.folder / f"{name}-{self.starts[name]}.log"

    def start(self, name: str) -> None:
        self.starts[name] = self.starts.get(name, 0) + 1
        with self.log(name).open("wb") as err:
            self.procs[name] = subprocess.Popen(
                [*EDGEKIT, "fleet", "collect", "--mqtt", self.mqtt, "--share", "g", "--client-id", name,
                 "--max-devices", str(max(10_000, 2 * self.devices))],
                stdout=subprocess.DEVNULL, stderr=err,
                env={**os.environ, "EDGEKIT_FLEET_DB": self.db, "EDGEKIT_LOG": "INFO"},
            )  # fmt: skip
        if not wait_for(lambda: "collecting from" in self.log(name).read_text(), 60):
            raise SystemExit(f"collector {name} did not start:\n{self.log(name).read_text()[-3000:]}")

    def kill(self, name: str) -> None:
        self.procs[
            name
        ].kill()  # SIGKILL: no flush, no goodbye; what it had not acknowledged stays with the broker
        self.procs[name].wait(10)

    def stop_all(self) -> None:
        """SIGTERM each; keep its final counters (its last log line)."""
        for name, proc in self.procs.items():
            stop_process(proc, grace_s=60)
            found = re.findall(r"collector stopped: (\{.*\})", self.log(name).read_text())
            if found:
                self.reports.append({"collector": name, **json.loads(found[-1])})

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs.values() if p.poll() is None]


def wait_for(check: Callable[[], bool], timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.2)
    return check()


def stored_keys(db: str) -> tuple[set[tuple[str, str, int]], int, dict[str, int], list[tuple[float, float]]]:
    """The store's (device, epoch, seq) of the fleet, its row count, its devices by state, and each
    row's (window end, commit time): the server tracks commit timestamps (``track_commit_timestamp``)."""
    import psycopg

    with psycopg.connect(db) as conn:
        rows = conn.execute(
            "SELECT device, epoch, seq, stop, extract(epoch FROM pg_xact_commit_timestamp(xmin))::float8 "
            "FROM windows WHERE fleet = %s",
            (FLEET,),
        ).fetchall()
        states = conn.execute(
            "SELECT state, count(*) FROM devices WHERE fleet = %s GROUP BY state", (FLEET,)
        ).fetchall()
    keys = {(d, e, int(s)) for d, e, s, _, _ in rows}
    times = [(float(stop), float(at)) for *_, stop, at in rows if at is not None]
    return keys, len(rows), {str(s): int(n) for s, n in states}, times


def store_bytes(db: str) -> dict[str, int]:
    """On-disk bytes of the raw windows (their day partitions summed, indexes included) and of the database."""
    import psycopg

    with psycopg.connect(db) as conn:
        row = conn.execute(
            "SELECT pg_total_relation_size('windows') + coalesce((SELECT sum(pg_total_relation_size(inhrelid)) "
            "FROM pg_inherits WHERE inhparent = 'windows'::regclass), 0), pg_database_size(current_database())"
        ).fetchone()
    assert row is not None
    return {"windows": int(row[0]), "database": int(row[1])}


def lag_ms(times: list[tuple[float, float]]) -> dict[str, Any]:
    """Device (window end) to committed row, in ms: over the run, and p99 per minute of window ends."""
    from edgekit.core.stats import percentile

    if not times:
        return {"p50": None, "p99": None, "p999": None, "max": None, "p99_by_minute": []}
    first = min(stop for stop, _ in times)
    lags = sorted((at - stop) * 1000.0 for stop, at in times)
    minutes: dict[int, list[float]] = {}
    for stop, at in times:
        minutes.setdefault(int((stop - first) // 60), []).append((at - stop) * 1000.0)
    by_minute = [round(percentile(sorted(minutes.get(m, [])), 99), 1) for m in range(max(minutes) + 1)]
    q = {k: round(percentile(lags, p), 1) for k, p in (("p50", 50), ("p99", 99), ("p999", 99.9))}
    return {**q, "max": round(lags[-1], 1), "p99_by_minute": by_minute}


def stored_count(db: str) -> int:
    import psycopg

    with psycopg.connect(db) as conn:
        row = conn.execute("SELECT count(*) FROM windows WHERE fleet = %s", (FLEET,)).fetchone()
    return int(row[0]) if row else 0


def acked_keys(ledger: Path) -> set[tuple[str, str, int]]:
    doc = json.loads(ledger.read_text())
    return {
        (device, epoch, seq)
        for device, epochs in doc["acked"].items()
        for epoch, runs in epochs.items()
        for first, last in runs
        for seq in range(first, last + 1)
    }


def sample(
    meter: CpuMeter,
    collectors: Collectors,
    broker: Mosquitto,
    pg: PostgresServer,
    sim: subprocess.Popen[bytes] | None,
) -> None:
    assert pg.proc is not None and broker.proc is not None
    meter.sample("collectors", collectors.pids())
    meter.sample("broker", [broker.proc.pid])
    meter.sample("postgres", [pg.proc.pid, *children(pg.proc.pid)])  # the server and its backends
    if sim is not None:
        meter.sample("simulator", [sim.pid])


def measure(args: argparse.Namespace, progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    raise_fd_limit(args.devices + FD_SPARE)  # the broker, started from here, inherits it
    seconds = args.minutes * 60
    with tempfile.TemporaryDirectory(prefix="fleet-scale-") as tmp:
        folder = Path(tmp)
        broker = Mosquitto(folder, BROKER, persistence=False, log=False).start()
        # Commit timestamps: each row's own lag from the device, whichever collector wrote it (killed or not).
        pg = PostgresServer({"track_commit_timestamp": "on"}).start()
        meter = CpuMeter()
        collectors: Collectors | None = None
        sim: subprocess.Popen[bytes] | None = None
        try:
            db = pg.new_database()
            collectors = Collectors(folder, broker.url, db, args.devices)
            names = [f"c{i + 1}" for i in range(args.collectors)]
            for name in names:
                collectors.start(name)
            ledger = folder / "ledger.json"
            out = folder / "sim.out"
            with out.open("wb") as so, (folder / "sim.err").open("wb") as se:
                sim = subprocess.Popen(
                    [*EDGEKIT, "fleet", "simulate", "--scale", "--mqtt", broker.url, "--fleet", FLEET,
                     "--devices", str(args.devices), "--interval", str(args.interval),
                     "--duration", str(seconds), "--keepalive", "30", "--outages", str(args.outages),
                     "--restarts", str(args.restarts), "--ledger", str(ledger)],
                    stdout=so, stderr=se,
                )  # fmt: skip
            progress(
                f"{args.devices} devices connecting; {args.minutes:g} min of windows every {args.interval:g} s"
            )
            t0 = time.monotonic()
            killed_at = restarted_at = None
            started = False
            while sim.poll() is None:
                time.sleep(1.0)
                sample(meter, collectors, broker, pg, sim)
                if not started and "online in" in out.read_text():
                    started, t0 = True, time.monotonic()
                    meter.start()  # steady state: start-up and connecting are not per-message costs
                    progress(out.read_text().strip().splitlines()[-1])
                elapsed = time.monotonic() - t0
                if started and args.kill and killed_at is None and elapsed >= 0.4 * seconds:
                    collectors.kill(names[0])
                    killed_at = round(elapsed, 1)
                    progress(f"{names[0]} SIGKILLed at {killed_at} s")
                if killed_at is not None and restarted_at is None and elapsed >= killed_at + args.down:
                    collectors.start(names[0])
                    restarted_at = round(time.monotonic() - t0, 1)
                    progress(f"{names[0]} started again at {restarted_at} s")
            lines = [ln for ln in out.read_text().splitlines() if ln.startswith("{")]
            if not lines or not ledger.exists():
                raise SystemExit(
                    f"the simulator failed:\n{out.read_text()}\n{(folder / 'sim.err').read_text()[-3000:]}"
                )
            load = json.loads(lines[-1])
            acked = acked_keys(ledger)
            progress(
                f"simulator done: {load['windows']} windows, {len(acked)} acknowledged; waiting for the store"
            )
            settle = time.monotonic()
            last, last_change = -1, time.monotonic()
            while time.monotonic() - settle < 180:
                n = stored_count(db)
                if n != last:
                    last, last_change = n, time.monotonic()
                if n >= len(acked) or time.monotonic() - last_change > 15:
                    break
                time.sleep(0.5)
            settle_s = time.monotonic() - settle
            sample(meter, collectors, broker, pg, None)
            collectors.stop_all()
            keys, rows, states, times = stored_keys(db)
            sizes = store_bytes(db)
        finally:
            if sim is not None and sim.poll() is None:
                stop_process(sim, grace_s=5, sig=signal.SIGKILL)
            if collectors is not None:
                for proc in collectors.procs.values():
                    stop_process(proc, grace_s=10, sig=signal.SIGKILL)
            broker.stop()
            pg.stop()
    messages = load["published"] + load["statuses"] + load["outages"]  # windows, statuses, Wills
    per_1000 = {role: round(1000 * meter.total(role) / max(messages, 1), 4)
                for role in ("collectors", "broker", "postgres", "simulator")}  # fmt: skip
    reports = collectors.reports
    return {
        "devices": args.devices,
        "minutes": args.minutes,
        "interval_s": args.interval,
        "collectors": args.collectors,
        "killed_at_s": killed_at,
        "restarted_at_s": restarted_at,
        "windows": load["windows"],
        "sent": len(acked),
        "published": load["published"],
        "messages": messages,
        "rate": load["rate"],
        "outages": load["outages"],
        "restarts": load["restarts"],
        "stored": len(keys),
        "rows": rows,
        "lost": len(acked - keys),
        "duplicated_rows": rows - len(keys),
        "stored_not_acked": len(keys - acked),
        "duplicates_seen": sum(r["seen"].get("duplicate", 0) for r in reports),
        "settle_s": round(settle_s, 1),
        "lag_ms": lag_ms(times),
        "stored_lag_ms": {r["collector"]: r["stored_lag_ms"] for r in reports},
        "cpu_s_per_1000": per_1000,
        "devices_by_state": states,
        "bytes_per_window": round(sizes["windows"] / max(rows, 1)),
        "database_bytes": sizes["database"],
        "connect_s": load["connect_s"],
    }


def render(r: dict[str, Any]) -> str:
    lag = r["lag_ms"]
    lags = (
        f"p50 {lag['p50']} ms, p99 {lag['p99']} ms, p99.9 {lag['p999']} ms, max {lag['max']} ms; "
        f"p99 by minute {lag['p99_by_minute']}"
    )
    cpu = r["cpu_s_per_1000"]
    kill = (
        f"; collector c1 SIGKILLed at {r['killed_at_s']} s, back at {r['restarted_at_s']} s"
        if r["killed_at_s"]
        else ""
    )
    ok = r["lost"] == 0 and r["duplicated_rows"] == 0
    return "\n".join(
        [
            f"fleet     : {r['devices']} devices, a window every {r['interval_s']:g} s for {r['minutes']:g} min, "
            f"{r['collectors']} collectors{kill}",
            f"faults    : {r['outages']} lost connections, {r['restarts']} restarts",
            f"sent      : {r['sent']} windows acknowledged by the broker ({r['published']} publishes, "
            f"{r['messages']} messages with statuses and Wills, {r['rate']} windows/s)",
            f"stored    : {r['stored']} ({r['rows']} rows); lost {r['lost']}, duplicated rows {r['duplicated_rows']}, "
            f"stored but never acknowledged {r['stored_not_acked']}, duplicates dropped {r['duplicates_seen']}",
            f"lag       : device to committed row: {lags}",
            f"CPU s/1000: collectors {cpu['collectors']}, broker {cpu['broker']}, PostgreSQL {cpu['postgres']}, "
            f"simulator {cpu['simulator']}",
            f"devices   : {r['devices_by_state']}",
            f"goal 0 lost, 0 duplicated rows: {verdict(ok)}",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, json_flag=True)
    ap.add_argument("--devices", type=int, default=10_000)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--interval", type=float, default=10.0, help="seconds between a device's windows")
    ap.add_argument("--collectors", type=int, default=2)
    ap.add_argument("--kill", action="store_true", help="SIGKILL one collector at 40%% of the run")
    ap.add_argument("--down", type=float, default=5.0, help="seconds the killed collector stays down")
    ap.add_argument("--outages", type=float, default=0.01, help="share of devices that lose their link once")
    ap.add_argument("--restarts", type=float, default=0.01, help="share of devices that restart once")
    args = parse(ap, argv)
    r = measure(args, progress=lambda s: print(f"fleet_scale: {s}", file=sys.stderr, flush=True))
    print_doc(r, args.json, render)
    return 0 if r["lost"] == 0 and r["duplicated_rows"] == 0 else 1


if __name__ == "__main__":
    run(main)
