"""``edgekit fleet serve``: the collector, its store, the live dashboard and ``/metrics`` in one process;
``edgekit fleet collect``: the collector alone (``edgekit.commands.fleet_collect``);
``edgekit fleet simulate``: simulated devices publishing to a broker (``edgekit.telemetry.simulate``)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from edgekit.commands.common import MqttCaOpt, err_console
from edgekit.commands.fleet_collect import collect_command
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

fleet_app = typer.Typer(help="The fleet: collect telemetry, store it, show it.", no_args_is_help=True)

log = logging.getLogger(__name__)


def register(app: typer.Typer) -> None:
    app.add_typer(fleet_app, name="fleet")


def _check_port(host: str, port: int) -> None:
    """Fail before connecting anything when the dashboard's address is taken (uvicorn would just exit 1)."""
    import socket

    try:
        with socket.create_server((host, port)):
            pass
    except OSError as err:
        raise EdgekitError(
            f"cannot listen on {host}:{port}: {err.strerror or err}",
            "another program has this port (an earlier `edgekit fleet serve`?): pass --port N",
        ) from err


@fleet_app.command("serve")
def serve_command(
    mqtt: MqttOpt = "mqtt://127.0.0.1:1883",
    db: DbOpt = "fleet.db",
    host: Annotated[str, typer.Option("--host", help="Address the dashboard listens on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port of the dashboard and /metrics.")] = 8765,
    raw_keep: RawKeepOpt = "1h",
    keep: KeepOpt = "30d",
    hour_keep: HourKeepOpt = None,
    slo_for: Annotated[
        str, typer.Option("--slo-for", help="A latency breach must last this long to fire an alert.")
    ] = "5m",
    slo_quantile: Annotated[
        float, typer.Option("--slo-quantile", help="The latency quantile held to each device's budget.")
    ] = 0.95,
    trace_url: Annotated[
        str | None,
        typer.Option(
            "--trace-url",
            envvar="EDGEKIT_TRACE_URL",
            help="A trace UI's URL with {trace_id} in it (e.g. http://jaeger.local:16686/trace/{trace_id}): "
            "a device page links each slow window's traces there (devices run with --trace).",
        ),
    ] = None,
    ca_file: MqttCaOpt = None,
    client_id: Annotated[
        str,
        typer.Option("--client-id", help="MQTT client id (one per collector: the broker keeps its queue)."),
    ] = "edgekit-fleet-collector",
    artifacts: Annotated[
        Path | None,
        typer.Option(
            "--artifacts", help="Also serve the bundle archives in DIR at /artifacts/ (fleet deploys)."
        ),
    ] = None,
    artifacts_port: Annotated[
        int | None,
        typer.Option(
            "--artifacts-port",
            help="Serve --artifacts on this port instead (devices fetch there): only what rollouts named, "
            "read-only, with the --artifact-token-file token (needed off loopback) and the --allowed-host names.",
        ),
    ] = None,
    artifact_token_file: Annotated[
        Path | None,
        typer.Option(
            "--artifact-token-file",
            help="The download token of --artifacts-port (agents: --artifact-token-file); "
            "or set EDGEKIT_ARTIFACT_TOKEN. Not the dashboard's token.",
        ),
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option(
            "--token-file",
            help="Require this token (Authorization: Bearer, or /?token= once in a browser); "
            "or set EDGEKIT_FLEET_TOKEN. Needed off loopback.",
        ),
    ] = None,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-host", help="Also answer requests for this host name (browsers' Host header)."
        ),
    ] = None,
    max_devices: MaxDevicesOpt = 10_000,
    max_streams: Annotated[
        int, typer.Option("--max-streams", help="At most this many live dashboards (SSE) at once, then 503.")
    ] = 64,
    max_fleets: MaxFleetsOpt = 1_000,
    per_credential: PerCredentialOpt = 4,
    device_rate: DeviceRateOpt = 300.0,
    device_burst: DeviceBurstOpt = 20_000,
    device_bytes: DeviceBytesOpt = "4MiB",
    quiet: QuietOpt = "24h",
    metrics_max_series: Annotated[
        int, typer.Option("--metrics-max-series", help="At most this many device samples in /metrics.")
    ] = 250_000,
    remote_write: RemoteWriteOpt = None,
    remote_write_interval: RemoteWriteIntervalOpt = "5s",
    no_collect: Annotated[
        bool,
        typer.Option(
            "--no-collect",
            help="Only serve the store's dashboard (/board) and API (/api/v2/): no MQTT, no collector, no "
            "compaction. Stateless: run several behind a proxy over the PostgreSQL that "
            "`edgekit fleet collect --share` fills.",
        ),
    ] = False,
    sign_key: Annotated[
        Path | None,
        typer.Option(
            "--sign-key",
            help="Sign the proof commands (list an event's snapshot and clip, fetch one) with this key; "
            "the agents trust its .pub.pem, as for edgekit deploy --sign-key.",
        ),
    ] = None,
) -> None:
    """Collect fleet telemetry from MQTT and serve the dashboard (http://HOST:PORT/) and /metrics."""
    try:
        import uvicorn
    except ImportError as err:
        raise EdgekitError(
            f"the fleet dashboard needs its extra: {err}", "pip install 'edgekit[fleet]'"
        ) from err
    from edgekit.core.redact import warn_secret_on_command_line
    from edgekit.fleet.access import ARTIFACT_TOKEN_ENV, MAKE_ONE, allowed_hosts, needs_token, read_token
    from edgekit.fleet.collector import Collector
    from edgekit.fleet.dashboard import Ticker, create_app
    from edgekit.fleet.mqtt import TOPICS
    from edgekit.fleet.open_store import open_store
    from edgekit.fleet.proofs import ProofFetcher
    from edgekit.fleet.view import FleetView, SloPolicy
    from edgekit.protocol.broker import BrokerConfig

    token = read_token(token_file)
    if needs_token(host, token):
        raise EdgekitError(
            f"--host {host} would put the dashboard, its API, /metrics and /artifacts/ on the network "
            "with nothing to keep anyone out",
            f"give it a token with --token-file PATH or EDGEKIT_FLEET_TOKEN ({MAKE_ONE}), "
            "or keep the default --host 127.0.0.1 behind a reverse proxy that authenticates",
        )
    if artifacts is not None and token is not None and artifacts_port is None:
        raise EdgekitError(
            "--artifacts with a token: devices do not send the dashboard's token",
            "serve the bundles on their own read-only listener: --artifacts-port N "
            "(and --artifact-url http://HOST:N/artifacts for edgekit deploy)",
        )
    if artifacts_port is not None and artifacts is None:
        raise EdgekitError(
            "--artifacts-port without --artifacts", "add --artifacts DIR, the bundles to serve"
        )
    if artifact_token_file is not None and artifacts_port is None:
        raise EdgekitError(
            "--artifact-token-file without --artifacts-port", "the download token guards --artifacts-port N"
        )
    artifact_token = None
    if artifacts_port is not None:
        artifact_token = read_token(artifact_token_file, ARTIFACT_TOKEN_ENV, "--artifact-token-file")
        # The one rule of fleet serve, for this listener too: off loopback, a token or nothing.
        if needs_token(host, artifact_token):
            raise EdgekitError(
                f"--artifacts-port on --host {host} would hand the bundles to anyone who reaches the port",
                f"give it a download token with --artifact-token-file PATH or {ARTIFACT_TOKEN_ENV} "
                f"({MAKE_ONE.replace('fleet.token', 'artifact.token')}); the agents get the same file "
                "with edgekit agent run --artifact-token-file",
            )
        if artifact_token is not None and artifact_token == token:
            raise EdgekitError(
                "--artifact-token-file holds the dashboard's token",
                "give the devices a token of their own: the dashboard's lets its holder read the whole fleet",
            )
    if max_devices < 1 or max_streams < 1:
        raise EdgekitError("--max-devices and --max-streams must be 1 or more", "e.g. --max-devices 10000")
    hosts = allowed_hosts(host, allowed_host or ())
    if not 0 < slo_quantile < 1:
        raise EdgekitError(f"--slo-quantile {slo_quantile} is not in (0, 1)", "e.g. 0.95 or 0.99")
    raw_keep_s, keep_s = parse_seconds(raw_keep, "--raw-keep"), parse_seconds(keep, "--keep")
    levels = retention(keep_s, hour_keep)
    slo = SloPolicy(quantile=slo_quantile, for_s=parse_seconds(slo_for, "--slo-for"))
    if trace_url is not None:
        from edgekit.fleet.slow_traces import check_template

        trace_url = check_template(trace_url)
    logging.basicConfig(
        level=os.environ.get("EDGEKIT_LOG", "INFO"), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    broker = BrokerConfig.from_url(mqtt, ca_file=ca_file)  # warns of a password on the command line
    warn_secret_on_command_line(
        db,
        "the database password in",
        "give the URL without it and set PGPASSWORD or ~/.pgpass (libpq reads both), "
        "or put the whole URL in EDGEKIT_FLEET_DB",
        logger=log,
    )
    _check_port(host, port)
    if artifacts_port is not None:
        _check_port(host, artifacts_port)
    if artifacts is not None and not artifacts.is_dir():
        raise EdgekitError(
            f"--artifacts {artifacts} is not a folder",
            "create it; edgekit deploy --fleet writes bundles there",
        )
    limits = quotas(max_devices, max_fleets, per_credential, device_rate, device_burst, device_bytes, quiet)
    if remote_write is not None:
        from edgekit.fleet.remote_write import write_url

        write_url(remote_write)  # a bad URL is said before anything starts
    sign = None
    if sign_key is not None:
        from edgekit.deploy.command_trust import load_signing_key

        sign = load_signing_key(sign_key).sign
    store = open_store(db)
    from edgekit.fleet.board import FleetBoard

    board = FleetBoard(store)
    if no_collect:
        # No live view: its devices would be what this process heard, and it hears nothing.
        app = create_app(
            FleetView(None, slo=slo), token=token, allowed_hosts=hosts, max_sse=max_streams, board=board
        )
        err_console.print(
            f"[bold]edgekit fleet[/]: serving {describe_db(db)} (no collector); "
            f"dashboard on http://{host}:{port}/board  (API: /api/v2/)"
            + (" — token required" if token else "")
        )
        try:
            uvicorn.run(app, host=host, port=port, log_level="warning")
        finally:
            store.close()
        return
    view = FleetView(store, slo=slo, trace_url=trace_url)
    view.load()
    sink = remote_writer(remote_write, remote_write_interval, store)
    collector = Collector(store, batch_size=200, flush_s=0.2, listener=view, quotas=limits, sink=sink)

    def housekeeping() -> None:
        import time

        collector.try_flush()
        done = store.compact(time.time(), raw_keep_s=raw_keep_s, levels=levels)
        log.info("fleet: compacted the store: %s", done)

    # The collector writes in batches; the tick also flushes, so a quiet fleet is stored within a second.
    ticker = Ticker(view, housekeeping=housekeeping, each_tick=collector.try_flush)
    subscriber = subscribe(broker, collector, client_id, TOPICS, store, sink)
    try:
        # Event proof stays on the devices: asked for when the dashboard shows it (edgekit.fleet.proofs).
        proofs = ProofFetcher(broker, sign, client_id=f"{client_id}-proofs").start()
    except BaseException:
        subscriber.stop()
        if sink is not None:
            sink.stop()
        store.close()
        raise
    view.stats = lambda: {**collector.stats(), "link": subscriber.stats()}
    app = create_app(
        view,
        ticker,
        artifacts=artifacts if artifacts_port is None else None,
        token=token,
        allowed_hosts=hosts,
        max_sse=max_streams,
        metrics_max_series=metrics_max_series,
        proofs=proofs,
        board=board,
    )
    bundles = None
    if artifacts_port is not None:
        bundles = _artifact_server(artifacts, host, artifacts_port, artifact_token, hosts)
    err_console.print(
        f"[bold]edgekit fleet[/]: collecting from {broker.describe()} into {describe_db(db)} "
        f"(raw windows: {store.layout()}); "
        f"dashboard on http://{host}:{port}/  (metrics: /metrics)"
        + (" — token required" if token else "")
        + (f"; pushing to {sink.url}" if sink is not None else "")
        + (
            f"; bundles on http://{host}:{artifacts_port}/artifacts/"
            + (" (download token required)" if artifact_token else "")
            if artifacts_port is not None
            else ""
        )
    )
    if host in ("0.0.0.0", "::") and not allowed_host:
        err_console.print(
            "[dim]answering only requests for loopback names: pass --allowed-host NAME "
            "for the name (or address) browsers and Prometheus use[/]"
        )
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        if bundles is not None:
            bundles.should_exit = True
        proofs.stop()
        subscriber.stop()
        collector.try_flush()
        if sink is not None:
            sink.stop()
        store.close()


def _artifact_server(folder: Path | None, host: str, port: int, token: str | None, hosts: list[str]) -> Any:
    """``/artifacts/`` alone on its own port, on a thread (see ``--artifacts-port``).

    Guarded as the dashboard is (``edgekit.fleet.access``: the ``Host`` names, and a token off
    loopback), but with the download token the agents hold, not the dashboard's (which would
    let every device read the whole fleet).  It serves only the archives rollouts named in
    the folder (``edgekit.fleet.artifacts``), and nothing else: no API, no telemetry, no writes.
    """
    import threading

    import uvicorn
    from starlette.applications import Starlette
    from starlette.routing import Mount

    from edgekit.fleet.access import access_middleware
    from edgekit.fleet.artifacts import artifacts_app

    assert folder is not None
    app = Starlette(
        routes=[Mount("/artifacts", app=artifacts_app(folder))], middleware=access_middleware(token, hosts)
    )
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    threading.Thread(target=server.run, name="edgekit-fleet-artifacts", daemon=True).start()
    return server


fleet_app.command("collect")(collect_command)


@fleet_app.command("simulate")
def simulate_command(
    mqtt: Annotated[
        str, typer.Option("--mqtt", help="The broker to publish to: mqtt[s]://[user@]host[:port].")
    ],
    fleet: Annotated[str, typer.Option("--fleet", help="Fleet the devices belong to.")] = "demo",
    devices: Annotated[int, typer.Option("--devices", help="How many devices.")] = 4,
    prefix: Annotated[str, typer.Option("--prefix", help="Device ids are PREFIX-01, PREFIX-02, ...")] = "sim",
    interval: Annotated[float, typer.Option("--interval", help="Seconds per telemetry window.")] = 1.0,
    keepalive: Annotated[
        int, typer.Option("--keepalive", help="MQTT keep-alive (s): how soon a silent device's Will fires.")
    ] = 2,
    duration: Annotated[
        float, typer.Option("--duration", help="Seconds to run (0: until SIGTERM / Ctrl-C; load mode: 10).")
    ] = 0.0,
    format: Annotated[str, typer.Option("--format", help="json or sparkplug.")] = "json",
    rate: Annotated[
        float,
        typer.Option(
            "--rate", help="Load mode: this many messages a second over all devices, then a JSON line."
        ),
    ] = 0.0,
    offline: Annotated[
        list[str] | None,
        typer.Option("--offline", metavar="DEVICE@SECONDS", help="That device drops its connection then."),
    ] = None,
    detectors: Annotated[
        int,
        typer.Option(
            "--detectors",
            metavar="N",
            help="The last N devices run a face detector (BlazeFace): per-class detection counts.",
        ),
    ] = 0,
    scale: Annotated[
        bool,
        typer.Option(
            "--scale",
            help="Thousands of devices from one thread, each its own connection: a window every --interval, "
            "outages and restarts, then a JSON line (use --keepalive 30 or more).",
        ),
    ] = False,
    outages: Annotated[
        float,
        typer.Option(
            "--outages", metavar="SHARE", help="Scale mode: this share of the devices loses its link once."
        ),
    ] = 0.0,
    restarts: Annotated[
        float,
        typer.Option(
            "--restarts", metavar="SHARE", help="Scale mode: this share restarts once (a new epoch)."
        ),
    ] = 0.0,
    ledger: Annotated[
        str,
        typer.Option(
            "--ledger",
            metavar="FILE",
            help="Scale mode: write the seqs the broker acknowledged, per device and epoch.",
        ),
    ] = "",
) -> None:
    """Simulated devices publishing realistic telemetry (a fleet to look at, a load to ingest, a fleet at scale)."""
    from edgekit.telemetry import simulate_fleet
    from edgekit.telemetry.simulate import SimOptions, run

    if not 0 <= detectors <= devices:
        raise EdgekitError(
            f"--detectors {detectors}: between 0 and the {devices} devices",
            f"e.g. --devices {max(devices, 4)} --detectors 1",
        )
    options = SimOptions(
        mqtt=mqtt, fleet=fleet, devices=devices, prefix=prefix, interval=interval, keepalive=keepalive,
        duration=duration, format=format, rate=rate, offline=tuple(offline or ()), detectors=detectors,
        scale=scale, outages=outages, restarts=restarts, ledger=ledger,
    )  # fmt: skip
    code = simulate_fleet.run(options) if scale else run(options)
    if code:
        raise typer.Exit(code)
