"""``edgekit agent``: the device side of a deploy, one command at a time.

``install BUNDLE`` verifies, unpacks into the inactive slot, health-gates and switches;
``status`` shows the slots; ``rollback`` switches back; ``trust KEY.pub.pem`` adds a signing
key; ``unit`` prints the systemd unit that runs the long-lived agent (``agent run``).

With ``--json``, ``install`` and ``rollback`` print one JSON line per step as it starts
(``{"step": ..., ...}``) and then ``{"result": {...}}``: what ``edgekit deploy`` streams
over SSH.  Exit codes: 0 done, 1 the bundle was refused (a failed check or health gate;
the active slot is untouched), 2 a usage error (bad id, unreadable key, no such file).
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any

import typer

from edgekit.commands.common import (
    JsonOpt,
    MqttCaOpt,
    MqttCertOpt,
    MqttKeyOpt,
    MqttProtocolOpt,
    console,
    print_json,
    stdout_to_stderr,
)
from edgekit.commands.deploy_display import agreement_text
from edgekit.deploy.health import DEFAULT_RUNS

if TYPE_CHECKING:
    from edgekit.deploy import InstallResult

agent_app = typer.Typer(
    help="The device agent: install, health-gate, activate and roll back bundles in A/B slots.",
    no_args_is_help=True,
)

RootOpt = Annotated[
    Path,
    typer.Option(
        "--root",
        envvar="EDGEKIT_AGENT_ROOT",
        help="The agent's state root (slots, trusted keys, deploy records).",
    ),
]
IdOpt = Annotated[
    str | None,
    typer.Option(
        "--id", help="Deploy id: the same id again returns the recorded outcome (default: a new id)."
    ),
]
UNIT_FILE = Path(__file__).resolve().parents[1] / "deploy" / "edgekit-agent.service"
_DEFAULT_ROOT = Path("/var/lib/edgekit")


def register(app: typer.Typer) -> None:
    """Add ``edgekit agent ...`` to ``app``."""
    app.add_typer(agent_app, name="agent")


def _new_id() -> str:
    return f"local-{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"


class _Lines:
    """Writes one JSON line per event to the real stdout, flushed at once (a reader may be streaming it)."""

    def __init__(self) -> None:
        # A runtime may print on fd 1 while a model loads; that goes to stderr (stdout_to_stderr),
        # so the JSON lines go to a duplicate of the original stdout.
        try:
            self.out: IO[str] = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
            self._owned = True
        except (AttributeError, OSError, ValueError):  # no real fd (a test runner's capture)
            self.out, self._owned = sys.stdout, False

    def __call__(self, doc: dict[str, Any]) -> None:
        self.out.write(json.dumps(doc, default=str, separators=(",", ":")) + "\n")
        self.out.flush()

    def close(self) -> None:
        if self._owned:
            self.out.close()


def _run_json(action: Any) -> InstallResult:
    lines = _Lines()
    try:
        with stdout_to_stderr():
            result: InstallResult = action(lambda step, info: lines({"step": step, **info}))
        lines({"result": result.to_dict()})
    finally:
        lines.close()
    return result


def _run_rich(action: Any, title: str) -> InstallResult:
    started = time.monotonic()
    with console.status(f"{title}…") as status:

        def progress(step: str, info: dict[str, Any]) -> None:
            where = f" (slot {info['slot']})" if "slot" in info and step in ("unpack", "switch") else ""
            console.print(f"  [dim]{time.monotonic() - started:6.1f}s[/] {step}{where}", highlight=False)
            status.update(f"{title}: {step}…")

        result: InstallResult = action(progress)
    _print_result(result)
    return result


def _print_result(r: InstallResult) -> None:
    what = "rollback" if r.action == "rollback" else "install"
    if r.replayed:
        console.print(
            f"[dim]deploy id {r.deploy_id} was seen before: its recorded outcome[/]", highlight=False
        )
    if r.ok:
        console.print(
            f"[green]ok[/]: {r.model} {r.version} is active (slot {r.slot}, deploy {r.deploy_id})",
            highlight=False,
        )
    else:
        console.print(f"[red]{what} failed at {r.step}[/]: {r.reason}", highlight=False)
        if r.hint:
            console.print(f"[yellow]hint:[/] {r.hint}", highlight=False)
        console.print(f"active slot unchanged: {r.active or 'none'}", highlight=False)
    h = r.health or {}
    if h.get("p99_ms") is not None:
        console.print(
            f"health: {h.get('backend')}/{h.get('precision')} p50 {h['p50_ms']:.1f} ms, p99 {h['p99_ms']:.1f} ms "
            f"(budget {h.get('budget_ms')} ms); {agreement_text(h)} on {h.get('frames')} frames "
            f"(threshold {h.get('threshold')})",
            highlight=False,
        )


@agent_app.command("install")
def install_command(
    bundle: Annotated[Path, typer.Argument(help="A bundle folder or .tar.gz (signed by a trusted key).")],
    root: RootOpt = _DEFAULT_ROOT,
    deploy_id: IdOpt = None,
    device: Annotated[
        str | None,
        typer.Option(
            "--device", "--profile", help="Device profile for the health gate (default: detect this host)."
        ),
    ] = None,
    health_runs: Annotated[
        int, typer.Option("--health-runs", min=1, help="Frames the health gate times (its p99 is of these).")
    ] = DEFAULT_RUNS,
    budget: Annotated[
        float | None,
        typer.Option(
            "--budget",
            min=0.001,
            help="Frame budget (ms) the device runs at: the gate's p99 limit (default: the bundle's).",
        ),
    ] = None,
    allow_downgrade: Annotated[
        bool,
        typer.Option(
            "--allow-downgrade",
            help="Install a bundle older (lower serial) than the newest this device installed.",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Install a bundle: verify, unpack into the inactive slot, health-gate, switch. Exit 1 if refused."""
    from edgekit.deploy import StateRoot, install
    from edgekit.errors import DeployError
    from edgekit.protocol.control import check_deploy_id

    deploy_id = deploy_id or _new_id()
    check_deploy_id(deploy_id)
    if not bundle.exists():
        raise DeployError(f"{bundle} does not exist", "pass the bundle folder or .tar.gz to install")
    if device is not None:
        from edgekit.device.profiles import get_profile

        get_profile(device)  # an unknown profile is a usage error, not a failed bundle
    state = StateRoot(root)

    def action(progress: Any) -> InstallResult:
        return install(
            state,
            bundle,
            deploy_id,
            device,
            progress,
            health_runs=health_runs,
            budget_ms=budget,
            allow_downgrade=allow_downgrade,
        )

    result = _run_json(action) if as_json else _run_rich(action, f"installing {bundle.name}")
    raise typer.Exit(0 if result.ok else 1)


@agent_app.command("rollback")
def rollback_command(
    root: RootOpt = _DEFAULT_ROOT, deploy_id: IdOpt = None, as_json: JsonOpt = False
) -> None:
    """Switch back to the other slot's bundle (it must be complete and still verify). Exit 1 if there is none."""
    from edgekit.deploy import StateRoot, rollback
    from edgekit.protocol.control import check_deploy_id

    deploy_id = deploy_id or _new_id()
    check_deploy_id(deploy_id)
    state = StateRoot(root)

    def action(progress: Any) -> InstallResult:
        return rollback(state, deploy_id, progress)

    result = _run_json(action) if as_json else _run_rich(action, "rolling back")
    raise typer.Exit(0 if result.ok else 1)


@agent_app.command("status")
def status_command(
    root: RootOpt = _DEFAULT_ROOT,
    recover: Annotated[
        bool,
        typer.Option("--recover", help="First recover from a crash (what the agent does when it starts)."),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Show the slots, which is active, their versions and the last deploy's health numbers."""
    from edgekit.deploy import StateRoot
    from edgekit.deploy import recover as recover_root

    state = StateRoot(root)
    recovered = recover_root(state) if recover else None
    doc = state.status()
    if recovered is not None:
        doc["recovered"] = recovered
    if as_json:
        print_json(doc)
        return
    console.print(f"state root {doc['root']}", highlight=False)
    for slot, s in doc["slots"].items():
        mark = "[green]*[/]" if slot == doc["active"] else " "
        if s["complete"]:
            console.print(
                f" {mark} slot {slot}: {s['model']} {s['version']} (deploy {s['deploy_id']}, {s['installed_at']})",
                highlight=False,
            )
        else:
            console.print(f" {mark} slot {slot}: empty", highlight=False)
    if doc["active"] is None:
        console.print("[yellow]no bundle is active[/]")
    last = doc.get("last")
    if last:
        verdict = (
            "[green]ok[/]"
            if last.get("ok")
            else f"[red]failed at {last.get('step')}[/]: {last.get('reason')}"
        )
        console.print(f"last: {last.get('action')} {last.get('deploy_id')} {verdict}", highlight=False)
        h = last.get("health") or {}
        if h.get("p99_ms") is not None:
            console.print(
                f"  health: {h.get('backend')}/{h.get('precision')} p50 {h.get('p50_ms')} ms, "
                f"p99 {h.get('p99_ms')} ms (budget {h.get('budget_ms')} ms), {agreement_text(h)} "
                f"on {h.get('frames')} frames",
                highlight=False,
            )
    ids = ", ".join(k["key_id"] or f"{k['file']} (unreadable)" for k in doc["trusted_keys"]) or "none"
    console.print(f"trusted keys: {ids}", highlight=False)


@agent_app.command("trust")
def trust_command(
    key: Annotated[
        Path, typer.Argument(help="The builder's public key (.pub.pem, from edgekit keys generate).")
    ],
    root: RootOpt = _DEFAULT_ROOT,
    as_json: JsonOpt = False,
) -> None:
    """Trust a bundle-signing public key: bundles it signs can be installed here."""
    from edgekit.bundle import key_id, load_public_key
    from edgekit.core.io import write_atomic
    from edgekit.deploy import StateRoot
    from edgekit.deploy.keystore import is_system_root, require_root_for, secure_key_file

    public = load_public_key(key)  # refuses a private key, a non-Ed25519 key, garbage
    kid = key_id(public)
    require_root_for(root)  # the system root's keys are root's, never the agent user's
    if is_system_root(root):  # only keys/: as root, StateRoot() would make the agent's folders root's
        keys_dir = Path(root) / "keys"
        keys_dir.mkdir(parents=True, exist_ok=True)
    else:
        keys_dir = StateRoot(root).keys_dir
    dest = keys_dir / f"{kid}.pub.pem"
    write_atomic(dest, key.read_bytes(), mode=0o644)
    secure_key_file(dest)  # as root: root's, 0644, in a root-owned 0755 keys/
    if as_json:
        print_json({"key_id": kid, "file": str(dest)})
        return
    console.print(f"trusted key [bold]{kid}[/] ({dest})", highlight=False)


@agent_app.command("unit")
def unit_command() -> None:
    """Print the systemd unit for the agent (save it as /etc/systemd/system/edgekit-agent.service)."""
    sys.stdout.write(UNIT_FILE.read_text())


# The long-running `edgekit agent run` (MQTT commands, downloads, the pipeline) is added below
# as its own function by the MQTT side; keep it last in this file.


# -- `edgekit agent run` (the MQTT side) ---------------------------------------------------------


@agent_app.command("run")
def run_agent_command(
    root: RootOpt = _DEFAULT_ROOT,
    mqtt: Annotated[
        str,
        typer.Option(
            "--mqtt", envvar="EDGEKIT_MQTT", help="The fleet's broker: mqtt[s]://[user@]host[:port]."
        ),
    ] = "mqtt://127.0.0.1:1883",
    fleet: Annotated[
        str, typer.Option("--fleet", envvar="EDGEKIT_FLEET", help="Fleet name in the topics.")
    ] = "default",
    device_id: Annotated[
        str | None,
        typer.Option(
            "--device-id", envvar="EDGEKIT_DEVICE_ID", help="This device's id (default: the host name)."
        ),
    ] = None,
    group: Annotated[
        str | None,
        typer.Option(
            "--group", envvar="EDGEKIT_GROUP", help="Group for `edgekit deploy --fleet F --group G`."
        ),
    ] = None,
    source: Annotated[
        str | None,
        typer.Option(
            "--source",
            envvar="EDGEKIT_SOURCE",
            help="Run the active bundle on this source (as `edgekit run --source`); without it, only install.",
        ),
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(
            "--profile",
            "--device",
            envvar="EDGEKIT_PROFILE",
            help="Device profile (default: detect this host).",
        ),
    ] = None,
    telemetry_interval: Annotated[
        float, typer.Option("--telemetry-interval", help="Seconds between the pipeline's telemetry messages.")
    ] = 5.0,
    budget: Annotated[
        float | None,
        typer.Option("--budget", help="The pipeline's frame budget in ms (default: the bundle's)."),
    ] = None,
    max_bundle_mb: Annotated[
        float, typer.Option("--max-bundle-mb", help="Refuse to download a bundle bigger than this.")
    ] = 512.0,
    run_config: Annotated[
        Path | None,
        typer.Option(
            "--run-config",
            help="The pipeline's run file (edgekit run --config): cameras, settings, a detector's zones "
            "and lines. Checked now; the pipeline reads it at each start.",
        ),
    ] = None,
    artifact_origin: Annotated[
        list[str] | None,
        typer.Option(
            "--artifact-origin",
            envvar="EDGEKIT_ARTIFACT_ORIGINS",
            help="Fetch bundles only from here: scheme://host[:port] (repeat; the env var: space-separated). "
            "None: every deploy is refused.",
        ),
    ] = None,
    artifact_token_file: Annotated[
        Path | None,
        typer.Option(
            "--artifact-token-file",
            envvar="EDGEKIT_ARTIFACT_TOKEN_FILE",
            help="The artifact port's download token (edgekit fleet serve --artifact-token-file), sent with "
            "each download; or set EDGEKIT_ARTIFACT_TOKEN.",
        ),
    ] = None,
    allow_unsigned_commands: Annotated[
        bool,
        typer.Option(
            "--allow-unsigned-commands",
            help="A LAB ONLY: take unsigned commands (anyone who can publish on .../cmd commands this device).",
        ),
    ] = False,
    rollback_limit: Annotated[
        int, typer.Option("--rollback-limit", min=1, help="Rollbacks taken per --rollback-window.")
    ] = 3,
    rollback_window: Annotated[
        str, typer.Option("--rollback-window", help="The window of --rollback-limit (10m).")
    ] = "10m",
    download_attempts: Annotated[
        int, typer.Option("--download-attempts", min=1, help="Transfers per download (each resumes).")
    ] = 5,
    mqtt_ca: MqttCaOpt = None,
    mqtt_cert: MqttCertOpt = None,
    mqtt_key: MqttKeyOpt = None,
    mqtt_protocol: MqttProtocolOpt = "3.1.1",
) -> None:
    """Run the device agent: take deploy/rollback commands over MQTT and keep the active bundle running.

    Commands arrive on edgekit/v1/<fleet>/<device>/cmd (QoS 1, kept by the broker while the
    agent is away); results go to .../cmd/result; .../agent (retained) says what is installed.
    """
    import logging
    import socket

    from edgekit.core.names import safe_name
    from edgekit.core.units import parse_seconds
    from edgekit.deploy.agent import AgentConfig, run_agent
    from edgekit.deploy.download import parse_origin
    from edgekit.errors import DeployError
    from edgekit.protocol.broker import BrokerConfig

    device_id = device_id or socket.gethostname()
    for what, value in (("--fleet", fleet), ("--device-id", device_id), ("--group", group)):
        if value is not None and not safe_name(value):
            raise DeployError(
                f"{what} {value!r} cannot be part of an MQTT topic",
                "use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit",
            )
    if profile is not None:
        from edgekit.device.profiles import get_profile

        get_profile(profile)  # an unknown profile is a usage error now, not a failed deploy later
    if not telemetry_interval > 0 or not max_bundle_mb > 0:
        raise DeployError("--telemetry-interval and --max-bundle-mb must be positive", "e.g. 5 and 512")
    origins = tuple(artifact_origin or ())
    for origin in origins:
        try:
            parse_origin(origin)
        except ValueError as err:
            raise DeployError(
                f"--artifact-origin {err}",
                "scheme://host[:port] of the artifact server, e.g. https://fleet.local:8443",
            ) from None
    window_s = parse_seconds(rollback_window, "--rollback-window")
    from edgekit.core.tokens import ARTIFACT_TOKEN_ENV, read_token

    artifact_token = read_token(artifact_token_file, ARTIFACT_TOKEN_ENV, "--artifact-token-file")
    broker = BrokerConfig.from_url(
        mqtt, ca_file=mqtt_ca, cert_file=mqtt_cert, key_file=mqtt_key, protocol=mqtt_protocol
    )
    from edgekit.deploy.keystore import check_trust_store

    check_trust_store(root, Path(root) / "keys")  # refuse a trust store the agent's own user could change
    from edgekit.core.redact import warn_secret_on_command_line

    if source is not None:  # the child gets it in EDGEKIT_SOURCE, we cannot take it off our own
        warn_secret_on_command_line(
            source,
            "the password or token in the source",
            "set EDGEKIT_SOURCE instead",
            logger=logging.getLogger(__name__),
        )
    # A service's log is its record: info lines (each command, each pipeline start) by default.
    wanted = logging.getLevelName(os.environ.get("EDGEKIT_LOG", "INFO").upper())
    top = logging.getLogger()
    if isinstance(wanted, int) and wanted < top.getEffectiveLevel():  # never hide what --debug asked for
        top.setLevel(wanted)
    config = AgentConfig(
        mqtt_url=mqtt,
        fleet=fleet,
        device_id=device_id,
        group=group,
        profile=profile,
        source=source,
        telemetry_interval_s=telemetry_interval,
        budget_ms=budget,
        max_bundle_bytes=int(max_bundle_mb * 1024 * 1024),
        download_attempts=download_attempts,
        artifact_origins=origins,
        artifact_token=artifact_token,
        allow_unsigned_commands=allow_unsigned_commands,
        rollback_limit=rollback_limit,
        rollback_window_s=window_s,
        child_args=_run_file_args(run_config),
    )
    raise typer.Exit(run_agent(root, config, broker))


def _run_file_args(run_config: Path | None) -> tuple[str, ...]:
    """``--config <absolute path>`` for the pipeline, once the file has been read and checked here."""
    if run_config is None:
        return ()
    from edgekit.commands.run_config import load_run_config

    load_run_config(run_config)  # a mistake stops the agent's start, not each pipeline start
    return ("--config", str(run_config.resolve()))
