"""Collector flood: one credential under thousands of fleet names, one device padding its windows.

Starts its own Mosquitto (password file and the fleet guide's ACL, docs/guides/fleet.md: each device writes only under
its own name, ``%u``, in any fleet) and the fleet collector as ``edgekit fleet serve`` runs it
(``edgekit.fleet.mqtt``'s subscriber, batches of 200, the live view, default quotas, an SQLite
store in a temporary folder).  Then, as issue 32 did:

1. ``cam-evil`` publishes a status under ``--fleets`` (10,050) fleet names; then ``cam-new``, a
   real new device, says it is online: is it accepted?
2. ``cam-pad`` publishes ``--padded`` (500) valid telemetry windows, each padded with unknown
   fields to ``--pad-kib`` (250) KiB.

For each: the collector's memory (RSS), the store's growth (database + WAL), ``/metrics``'
size and render time, what was refused by reason, and how long it took.

    .venv/bin/python -m benchmarks.collector_flood [--fleets 10050] [--padded 500] [--pad-kib 250]
        [--only flood|padded] [--json]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from benchmarks._harness import parse, parser, print_json

USERS = {"fleet": "pw-fleet", "cam-evil": "pw-evil", "cam-new": "pw-new", "cam-pad": "pw-pad"}
ACL = (
    "user fleet\ntopic read edgekit/v1/#\ntopic read spBv1.0/#\n\n"
    + "".join(f"pattern write edgekit/v1/+/%u/{leaf}\n" for leaf in ("status", "telemetry", "labels"))
    + "pattern write spBv1.0/+/+/%u\npattern write spBv1.0/+/+/%u/#\n"
)
# The collector's session may have the whole flood waiting: the bench is about the collector.
BROKER = "max_queued_messages 10000000\nmax_queued_bytes 0\nmax_inflight_messages 0\n"


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def store_mb(db: Path) -> float:
    return sum(p.stat().st_size for p in db.parent.glob(db.name + "*")) / 2**20


def status(device: str, fleet: str) -> bytes:
    return json.dumps(
        {
            "schema": "edgekit/v1/status",
            "state": "online",
            "device": device,
            "fleet": fleet,
            "ts": time.time(),
        }
    ).encode()


def publish(port: int, user: str, messages: list[tuple[str, bytes]]) -> float:
    """QoS 1, as the device ``user``; seconds until the broker acknowledged every message."""
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=user)
    c.username_pw_set(user, USERS[user])
    c.max_inflight_messages_set(100)
    c.connect("127.0.0.1", port)
    c.loop_start()
    t0 = time.monotonic()
    try:
        for info in [c.publish(t, p, qos=1) for t, p in messages]:
            info.wait_for_publish(120)
        return time.monotonic() - t0
    finally:
        c.disconnect()
        c.loop_stop()


def padded_windows(tmp: Path, n: int, pad: int) -> list[bytes]:
    from edgekit.pipeline.records import FrameRecord
    from edgekit.protocol.broker import BrokerConfig
    from edgekit.telemetry import Spool, TelemetryPublisher
    from edgekit.telemetry.window import MetricsWindow

    window = MetricsWindow()
    pub = TelemetryPublisher(
        BrokerConfig.from_url("mqtt://127.0.0.1:1"),
        device_id="cam-pad",
        fleet="lab",
        window=window,
        spool=Spool(tmp / "cam-pad.db"),
        counters=lambda: {"frames": 0, "missed": 0, "dropped": 0},
    )
    out = []
    for i in range(n):
        for v in range(10, 40):
            window.observe(FrameRecord(0, 0.0, 0, 0, 0.1, 1.0, v - 1.5, 0.3, 0.1, v, v < 33, 0, "x"))
        body = pub.telemetry_payload()
        size = len(json.dumps(body))
        out.append(json.dumps(body | {"pad": "x" * max(0, pad - size - 20)}).encode())
        if i == 0:
            print(f"a window: {size} bytes; padded: {len(out[0])} bytes", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__, json_flag=True)
    ap.add_argument("--fleets", type=int, default=10_050)
    ap.add_argument("--padded", type=int, default=500)
    ap.add_argument("--pad-kib", type=int, default=250)
    ap.add_argument("--only", choices=("flood", "padded"), help="run one of the two")
    args = parse(ap, argv)

    from edgekit.fleet import prometheus
    from edgekit.fleet.collector import Collector
    from edgekit.fleet.mqtt import FleetSubscriber
    from edgekit.fleet.store import FleetStore
    from edgekit.fleet.view import FleetView
    from edgekit.protocol.broker import BrokerConfig
    from edgekit.testing.mosquitto import Mosquitto

    with tempfile.TemporaryDirectory(prefix="edgekit-flood-") as tmp_dir:
        tmp = Path(tmp_dir)
        passwd, acl = tmp / "passwd", tmp / "acl"
        for i, (user, pw) in enumerate(USERS.items()):
            subprocess.run(
                ["mosquitto_passwd", "-b", *(["-c"] if i == 0 else []), str(passwd), user, pw], check=True
            )
        acl.write_text(ACL)
        extra = f"allow_anonymous false\npassword_file {passwd}\nacl_file {acl}\n{BROKER}"
        broker = Mosquitto(tmp, extra=extra, persistence=False, log=False).start()
        db = tmp / "fleet.db"
        store = FleetStore(db)
        view = FleetView(store)
        collector = Collector(store, batch_size=200, flush_s=0.2, listener=view)
        view.stats = collector.stats
        handled = [0]
        lock = threading.Lock()

        def handle(topic: str, payload: bytes) -> None:
            collector.handle(topic, payload)
            with lock:
                handled[0] += 1

        def settle(n: int) -> float:
            t0 = time.monotonic()
            while handled[0] < n and time.monotonic() - t0 < 300:
                time.sleep(0.05)
            collector.flush()
            return time.monotonic() - t0

        def metrics() -> tuple[float, float]:
            t0 = time.monotonic()
            text = prometheus.render(view.prometheus_state(), view.collector_stats())
            return len(text.encode()) / 2**20, time.monotonic() - t0

        config = BrokerConfig.from_url(f"mqtt://fleet:{USERS['fleet']}@127.0.0.1:{broker.port}")
        sub = FleetSubscriber(config, handle, client_id="bench-flood", commit=collector.flush).start()
        result: dict[str, Any] = {}
        try:
            rss0, store0 = rss_mb(), store_mb(db)
            fleets = 0 if args.only == "padded" else args.fleets
            flood = [
                (f"edgekit/v1/f{i:05d}/cam-evil/status", status("cam-evil", f"f{i:05d}"))
                for i in range(fleets)
            ]
            sent_s = publish(broker.port, "cam-evil", flood)
            settle(fleets)
            publish(broker.port, "cam-new", [("edgekit/v1/lab/cam-new/status", status("cam-new", "lab"))])
            settle(fleets + 1)
            mb, render_s = metrics()
            stats = collector.stats()
            result["fleet_flood"] = {
                "fleet_names": fleets,
                "publish_s": round(sent_s, 2),
                "devices_tracked": stats["devices"]["tracked"],
                "new_device_accepted": store.device("lab", "cam-new") is not None,
                "refused": dict(stats["rejected"]),
                "rss_growth_mb": round(rss_mb() - rss0, 1),
                "store_growth_mb": round(store_mb(db) - store0, 2),
                "metrics_mb": round(mb, 3),
                "metrics_render_s": round(render_s, 3),
            }
            rejected0 = dict(collector.rejected)
            windows = padded_windows(tmp, 0 if args.only == "flood" else args.padded, args.pad_kib * 1024)
            rss0, store0, base = rss_mb(), store_mb(db), handled[0]
            t0 = time.monotonic()
            sent_s = publish(
                broker.port, "cam-pad", [("edgekit/v1/lab/cam-pad/telemetry", w) for w in windows]
            )
            settle(base + len(windows))
            took = time.monotonic() - t0
            mb, render_s = metrics()
            refused = {
                k: v - rejected0.get(k, 0) for k, v in collector.rejected.items() if v != rejected0.get(k, 0)
            }
            result["padded_device"] = {
                "windows": len(windows),
                "bytes_sent_mb": round(sum(map(len, windows)) / 2**20, 1),
                "seconds": round(took, 2),
                "stored_windows": collector.seen["telemetry"],
                "unknown_fields_dropped": collector.seen["unknown-fields-dropped"],
                "refused": refused,
                "rss_growth_mb": round(rss_mb() - rss0, 1),
                "store_growth_mb": round(store_mb(db) - store0, 2),
                "metrics_mb": round(mb, 3),
                "metrics_render_s": round(render_s, 3),
            }
        finally:
            sub.stop()
            broker.stop()
            store.close()
    if args.json:
        print_json(result)
        return
    for phase, numbers in result.items():
        print(phase)
        for key, value in numbers.items():
            print(f"  {key:24s} {value}")


if __name__ == "__main__":
    main()
