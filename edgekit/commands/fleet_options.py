"""The options ``edgekit fleet serve`` and ``edgekit fleet collect`` share (broker, database, quotas,
retention), and what turns them into the fleet's objects."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from edgekit.core.units import parse_seconds
from edgekit.errors import EdgekitError

if TYPE_CHECKING:
    from edgekit.fleet.collector import Collector
    from edgekit.fleet.mqtt import FleetSubscriber
    from edgekit.fleet.quotas import Quotas
    from edgekit.fleet.remote_write import RemoteWriter
    from edgekit.fleet.store import FleetStore
    from edgekit.protocol.broker import BrokerConfig

MqttOpt = Annotated[
    str, typer.Option("--mqtt", help="The broker the devices publish to: mqtt[s]://[user@]host[:port].")
]
DbOpt = Annotated[
    str,
    typer.Option(
        "--db",
        envvar="EDGEKIT_FLEET_DB",
        help="SQLite file, or postgresql://user@host/db for a bigger fleet (its password: PGPASSWORD, "
        "~/.pgpass, or the whole URL in EDGEKIT_FLEET_DB).",
    ),
]
RawKeepOpt = Annotated[
    str, typer.Option("--raw-keep", help="Keep raw windows this long, then one-minute rollups.")
]
KeepOpt = Annotated[str, typer.Option("--keep", help="Delete rollups older than this.")]
HourKeepOpt = Annotated[
    str | None,
    typer.Option(
        "--hour-keep",
        help="Merge minute rollups older than --keep into hour rollups (sketches merged) and keep those "
        "this long, e.g. 400d; without it minute rollups are deleted past --keep.",
    ),
]
MaxDevicesOpt = Annotated[
    int, typer.Option("--max-devices", help="Track at most this many devices; more are rejected, counted.")
]
MaxFleetsOpt = Annotated[
    int, typer.Option("--max-fleets", help="Track at most this many fleets; more are rejected, counted.")
]
PerCredentialOpt = Annotated[
    int,
    typer.Option(
        "--per-credential",
        help="Fleets one device name may report in (with the broker ACL in docs/guides/fleet.md, one credential's devices).",
    ),
]
DeviceRateOpt = Annotated[
    float,
    typer.Option("--device-rate", help="Messages per minute one device may send (burst: --device-burst)."),
]
DeviceBurstOpt = Annotated[
    int, typer.Option("--device-burst", help="Messages a device may send at once (a spool's replay).")
]
DeviceBytesOpt = Annotated[
    str, typer.Option("--device-bytes", help="Bytes per minute one device may send (burst: 64 MiB).")
]
QuietOpt = Annotated[
    str, typer.Option("--quiet", help="A device not heard from this long is aged out when room is needed.")
]
RemoteWriteOpt = Annotated[
    str | None,
    typer.Option(
        "--remote-write",
        metavar="URL",
        envvar="EDGEKIT_FLEET_REMOTE_WRITE",
        help="Also push every stored window's series, at the window's own time, to this time-series database "
        "(Prometheus remote write): http://HOST:8428/api/v1/write for VictoriaMetrics.",
    ),
]
RemoteWriteIntervalOpt = Annotated[
    str, typer.Option("--remote-write-interval", help="Push to --remote-write this often (e.g. 5s, 1m).")
]


def remote_writer(
    url: str | None, interval: str, store: FleetStore, collector: str | None = None
) -> RemoteWriter | None:
    """The started ``RemoteWriter`` of ``--remote-write`` (``None`` without it), its devices' labels from ``store``.

    ``collector``: this collector's id when it is one of a group (each pushes its own share's series).
    """
    if url is None:
        return None
    from edgekit.fleet.remote_write import RemoteWriter

    every = parse_seconds(interval, "--remote-write-interval")
    births = {(d["fleet"], d["device"]): d["birth"] or {} for d in store.devices()}
    return RemoteWriter(url, interval_s=every, collector=collector, births=births).start()


def subscribe(
    broker: BrokerConfig,
    collector: Collector,
    client_id: str,
    topics: tuple[str, ...],
    store: FleetStore,
    sink: RemoteWriter | None,
) -> FleetSubscriber:
    """The started subscriber feeding ``collector``; if it cannot start, ``sink`` and ``store`` are closed."""
    from edgekit.fleet.collector import StoreUnavailable
    from edgekit.fleet.mqtt import FleetSubscriber

    try:
        # commit: each read's windows are written before the broker is told they arrived.
        return FleetSubscriber(
            broker,
            collector.handle,
            client_id=client_id,
            topics=topics,
            reject=collector.reject,
            commit=collector.flush,
            retry_on=(StoreUnavailable,),
        ).start()
    except BaseException:
        if sink is not None:
            sink.stop()
        store.close()
        raise


def retention(keep_s: float, hour_keep: str | None) -> tuple[tuple[float, float], ...]:
    """``FleetStore.compact``'s levels: minute rollups kept ``keep_s``, then hour rollups ``--hour-keep``."""
    if hour_keep is None:
        return ((60.0, keep_s),)
    hour_keep_s = parse_seconds(hour_keep, "--hour-keep")
    if hour_keep_s < keep_s:
        raise EdgekitError(
            f"--hour-keep {hour_keep} is shorter than --keep",
            "hour rollups are made of minute rollups older than --keep: give --hour-keep longer, e.g. 400d",
        )
    return ((60.0, keep_s), (3600.0, hour_keep_s))


def describe_db(db: str) -> str:
    """The database without its password (it goes to logs and terminals)."""
    from urllib.parse import urlsplit

    parts = urlsplit(db)
    if not parts.scheme.startswith("postgres"):
        return db
    user = f"{parts.username}@" if parts.username else ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{user}{parts.hostname or ''}{port}{parts.path}"


def parse_bytes(text: str) -> int:
    """``4MiB``, ``512KiB``, ``1000000`` -> bytes (``--device-bytes``)."""
    units = {"kib": 1024, "mib": 1024**2, "gib": 1024**3, "b": 1}
    t = text.strip().lower()
    unit = next((u for u in units if t.endswith(u)), "")
    try:
        value = float(t[: len(t) - len(unit)]) * units.get(unit, 1)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise EdgekitError(f"--device-bytes {text!r} is not a size", "e.g. 4MiB, 512KiB or 1000000")
    return int(value)


def quotas(
    max_devices: int,
    max_fleets: int,
    per_credential: int,
    device_rate: float,
    device_burst: int,
    device_bytes: str,
    quiet: str,
) -> Quotas:
    """The collector's quotas from their options (``edgekit.fleet.quotas``)."""
    from edgekit.fleet.quotas import Quotas

    return Quotas(
        max_devices=max_devices,
        max_fleets=max_fleets,
        per_credential=per_credential,
        messages_per_min=device_rate,
        message_burst=device_burst,
        bytes_per_min=parse_bytes(device_bytes),
        quiet_s=parse_seconds(quiet, "--quiet"),
    )
