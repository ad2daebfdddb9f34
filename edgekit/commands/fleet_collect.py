"""``edgekit fleet collect``: the collector alone (subscribe and store, no dashboard), so that several
can share a fleet's stream: ``--share GROUP`` makes it one member of an MQTT shared subscription."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from types import FrameType
from typing import Annotated

import typer

from edgekit.commands.common import MqttCaOpt, err_console
from edgekit.commands.fleet_options import (
    DbOpt,
    DeviceBurstOpt,
    DeviceBytesOpt,
    DeviceRateOpt,
    HourKeepOpt,
    KeepOpt,
    MaxDevicesOpt,
    MaxFleetsOpt,
    MqttOpt,
    PerCredentialOpt,
    QuietOpt,
    RawKeepOpt,
    RemoteWriteIntervalOpt,
    RemoteWriteOpt,
    describe_db,
    quotas,
    remote_writer,
    retention,
    subscribe,
)
from edgekit.core.units import parse_seconds
from edgekit.errors import EdgekitError

log = logging.getLogger("edgekit.commands.fleet")

# How often the collector compacts the store and logs what it did (``fleet serve``'s period).
HOUSEKEEPING_S = 300.0


def collect_command(
    mqtt: MqttOpt = "mqtt://127.0.0.1:1883",
    db: DbOpt = "fleet.db",
    share: Annotated[
        str | None,
        typer.Option(
            "--share",
            metavar="GROUP",
            help="Be one collector of this group (an MQTT shared subscription): the broker hands each "
            "telemetry, event and labels message to one of the group; run each with the same GROUP and --db.",
        ),
    ] = None,
    client_id: Annotated[
        str | None,
        typer.Option(
            "--client-id",
            help="MQTT client id: one per collector, the same across its restarts (the broker keeps its "
            "session). Needed with --share; without, edgekit-fleet-collect.",
        ),
    ] = None,
    ca_file: MqttCaOpt = None,
    raw_keep: RawKeepOpt = "1h",
    keep: KeepOpt = "30d",
    hour_keep: HourKeepOpt = None,
    max_devices: MaxDevicesOpt = 10_000,
    max_fleets: MaxFleetsOpt = 1_000,
    per_credential: PerCredentialOpt = 4,
    device_rate: DeviceRateOpt = 300.0,
    device_burst: DeviceBurstOpt = 20_000,
    device_bytes: DeviceBytesOpt = "4MiB",
    quiet: QuietOpt = "24h",
    remote_write: RemoteWriteOpt = None,
    remote_write_interval: RemoteWriteIntervalOpt = "5s",
) -> None:
    """Collect fleet telemetry from MQTT into the store, without the dashboard (several can share the work)."""
    from edgekit.core.redact import warn_secret_on_command_line
    from edgekit.fleet.collector import Collector
    from edgekit.fleet.mqtt import TOPICS, shared_topics
    from edgekit.fleet.open_store import open_store
    from edgekit.protocol.broker import BrokerConfig

    topics = TOPICS if share is None else shared_topics(share)
    if share is not None and not client_id:
        raise EdgekitError(
            "--share needs --client-id: each collector of a group has its own",
            "give each a stable id, e.g. --client-id collector-1 (a systemd template: collector-%i); "
            "a collector that comes back under the same id gets what the broker kept for it",
        )
    if max_devices < 1:
        raise EdgekitError("--max-devices must be 1 or more", "e.g. --max-devices 10000")
    raw_keep_s, keep_s = parse_seconds(raw_keep, "--raw-keep"), parse_seconds(keep, "--keep")
    levels = retention(keep_s, hour_keep)
    limits = quotas(max_devices, max_fleets, per_credential, device_rate, device_burst, device_bytes, quiet)
    if remote_write is not None:
        from edgekit.fleet.remote_write import write_url

        write_url(remote_write)  # a bad URL is said before anything starts
    # A service says what it does (connects, compactions, its counters when it stops) unless told
    # otherwise; edgekit's root callback set WARNING without -v, and --debug stays DEBUG.
    level = logging.getLevelName(os.environ.get("EDGEKIT_LOG", "INFO").upper())
    ours = logging.getLogger("edgekit")
    if isinstance(level, int) and ours.getEffectiveLevel() > level:
        ours.setLevel(level)
    broker = BrokerConfig.from_url(mqtt, ca_file=ca_file)  # warns of a password on the command line
    warn_secret_on_command_line(
        db,
        "the database password in",
        "give the URL without it and set PGPASSWORD or ~/.pgpass (libpq reads both), "
        "or put the whole URL in EDGEKIT_FLEET_DB",
        logger=log,
    )
    if share is not None and not db.startswith(("postgresql://", "postgres://")):
        log.warning(
            "fleet: collectors sharing one SQLite file write one at a time; "
            "a group that should scale writes to PostgreSQL (--db postgresql://...)"
        )
    store = open_store(db)
    try:
        sink = remote_writer(remote_write, remote_write_interval, store, client_id if share else None)
    except BaseException:
        store.close()
        raise
    collector = Collector(
        store, batch_size=200, flush_s=0.2, quotas=limits, shared=share is not None, sink=sink
    )
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    subscriber = subscribe(broker, collector, client_id or "edgekit-fleet-collect", topics, store, sink)
    err_console.print(
        f"[bold]edgekit fleet collect[/]: collecting from {broker.describe()} into {describe_db(db)} "
        f"(raw windows: {store.layout()}) "
        f"as {subscriber.client_id}"
        + (f", one of group {share!r}" if share else "")
        + (f"; pushing to {sink.url}" if sink is not None else "")
    )
    try:
        last = time.monotonic()
        while not stop.wait(1.0):
            if time.monotonic() - last >= HOUSEKEEPING_S:
                last = time.monotonic()
                try:
                    done = store.compact(time.time(), raw_keep_s=raw_keep_s, levels=levels)
                    log.info("fleet: compacted the store: %s; %s", done, _counts(collector.stats()))
                except store.errors:  # the database is away: the next round tries again
                    log.exception("fleet: compacting the store failed")
    finally:
        # A member of a group leaves it: the others take its share while it is away (see FleetSubscriber.stop).
        subscriber.stop(leave=share is not None)
        collector.try_flush()
        if sink is not None:
            sink.stop()
        stats = {**collector.stats(), "link": subscriber.stats()}
        store.close()
        log.info("fleet: collector stopped: %s", json.dumps(stats, sort_keys=True))


def _counts(stats: dict[str, object]) -> str:
    pushed = f", remote write {stats['remote_write']}" if "remote_write" in stats else ""
    return f"seen {stats['seen']}, rejected {stats['rejected']}{pushed}"
