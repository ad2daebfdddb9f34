"""``edgekit deploy``: a bundle (or a model, built first) onto a device over SSH, or onto a fleet.

Two transports, one of them per run: ``--host user@ip`` (SSH; ``edgekit.deploy.remote``) or
``--fleet F`` (MQTT commands and a canary rollout; ``edgekit.deploy.rollout``).  Either way
the device's agent verifies the bundle and health-gates it before it becomes active; a
refused bundle exits 1 and leaves the device running what it ran.

Exit codes: 0 installed (or rolled back), 1 the device refused it (its step and reason are
printed), 2 anything that kept it from getting there (host key, login, options).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from edgekit.commands.common import console, stdout_to_stderr
from edgekit.commands.deploy_display import DeployDisplay, FleetDisplay, print_outcome
from edgekit.errors import DeployError

deploy_app = typer.Typer(
    help="Build (with --model) and ship a bundle to a device over SSH (--host) or to a fleet over MQTT "
    "(--fleet). The device activates it only if it passes the health gate. Exit 0: active; 1: the device "
    "refused it and kept what it ran; 2: it never got there (host key, login, options).",
    invoke_without_command=True,
)


def register(app: typer.Typer) -> None:
    app.add_typer(deploy_app, name="deploy")


# Options of the SSH transport, shared by `deploy` and `deploy rollback`.
HostOpt = Annotated[
    str | None,
    typer.Option(
        "--host", help="SSH: the device as user@host (your ssh keys, config and known_hosts apply)."
    ),
]
PortOpt = Annotated[int | None, typer.Option("--port", help="SSH port of the device (default 22).")]
KeyOpt = Annotated[Path | None, typer.Option("--key", help="SSH private key to log in with (only this one).")]
KnownHostsOpt = Annotated[
    Path | None,
    typer.Option(
        "--known-hosts",
        help="known_hosts file to check the device's host key against (default ~/.ssh/known_hosts).",
    ),
]
AcceptNewOpt = Annotated[
    bool,
    typer.Option(
        "--accept-new-host-key",
        help="Trust an unknown host key on first use and record it (a changed key is still refused).",
    ),
]
SshConfigOpt = Annotated[
    str | None,
    typer.Option("--ssh-config", help="ssh_config file to use (`none`: none; default ~/.ssh/config)."),
]
ConnectTimeoutOpt = Annotated[
    float, typer.Option("--connect-timeout", help="Seconds to wait for the SSH connection.")
]
RootOpt = Annotated[str, typer.Option("--root", help="The agent's state root on the device.")]
RemoteEdgekitOpt = Annotated[
    str,
    typer.Option("--remote-edgekit", help="edgekit on the device: a path or a command (~/ means its home)."),
]
IdOpt = Annotated[
    str | None, typer.Option("--id", help="Deploy id (default: a new one); a replayed id is not redone.")
]
JsonLinesOpt = Annotated[
    bool, typer.Option("--json", help="Print JSON lines on stdout: each step as it happens, then the result.")
]
# Options of the fleet transport (MQTT).
FleetOpt = Annotated[
    str | None, typer.Option("--fleet", help="MQTT: the fleet to deploy to.", rich_help_panel="Fleet")
]
TargetOpt = Annotated[
    list[str] | None,
    typer.Option("--target", help="Fleet: one device id (repeat for several).", rich_help_panel="Fleet"),
]
GroupOpt = Annotated[
    str | None, typer.Option("--group", help="Fleet: every device in this group.", rich_help_panel="Fleet")
]
UnsignedOpt = Annotated[
    bool,
    typer.Option(
        "--unsigned-commands",
        help="Fleet: send unsigned commands (only agents run with --allow-unsigned-commands take them).",
        rich_help_panel="Fleet",
    ),
]
FleetSignKeyOpt = Annotated[
    Path | None,
    typer.Option(
        "--sign-key",
        help="Fleet: sign each command with this key (the agents trust its .pub.pem).",
        rich_help_panel="Fleet",
    ),
]
MqttOpt = Annotated[
    str | None,
    typer.Option(
        "--mqtt",
        help="Fleet: the broker, mqtt://host:port or mqtts://user@host:port.",
        rich_help_panel="Fleet",
    ),
]


@dataclass(frozen=True)
class FleetRequest:
    """A fleet deploy or rollback as the command line gave it (the MQTT transport reads this)."""

    action: str  # "deploy" | "rollback"
    fleet: str
    targets: tuple[str, ...]
    group: str | None
    mqtt: str | None
    bundle: Path | None = None
    deploy_id: str | None = None
    canary: str | None = None
    canary_window: str | None = None
    slo_p95_ms: float | None = None
    artifacts: Path | None = None
    artifact_url: str | None = None
    as_json: bool = False
    sign_key: Path | None = None
    unsigned: bool = False
    artifact_token_file: Path | None = None
    waves: str | None = None
    wave_window: str | None = None
    state: Path | None = None
    state_db: str | None = None


def _fleet(req: FleetRequest) -> int:
    """Run a fleet deploy or rollback; its exit code (the MQTT transport: ``_fleet_rollout`` below)."""
    return _fleet_rollout(req)


def _one_transport(host: str | None, fleet: str | None, fleet_only: dict[str, Any]) -> None:
    if host and fleet:
        raise DeployError(
            "give --host or --fleet, not both", "--host deploys to one device over SSH, --fleet over MQTT"
        )
    if not host and not fleet:
        raise DeployError(
            "say where to deploy: --host user@ip (one device, SSH) or --fleet F (MQTT)",
            "for example: edgekit deploy --device jetson --model models/efficientnet-lite0 --sign-key KEY.pem "
            "--host nvidia@192.168.1.20",
        )
    given = [name for name, value in fleet_only.items() if value]
    if host and given:
        raise DeployError(
            f"{', '.join(given)} need --fleet", "these choose devices of a fleet; --host is one device"
        )


def _target(
    host: str,
    port: int | None,
    key: Path | None,
    known_hosts: Path | None,
    accept_new: bool,
    ssh_config: str | None,
    connect_timeout: float,
    remote_edgekit: str,
) -> Any:
    from edgekit.deploy.ssh import SshTarget

    return SshTarget(
        host=host,
        port=port,
        key=key,
        known_hosts=known_hosts,
        accept_new_host_key=accept_new,
        ssh_config=ssh_config,
        connect_timeout=connect_timeout,
        remote_edgekit=remote_edgekit,
    )


@deploy_app.callback()
def deploy_command(
    ctx: typer.Context,
    device: Annotated[
        str | None, typer.Option("--device", "-d", help="Device profile or alias (edgekit devices list).")
    ] = None,
    model: Annotated[
        Path | None, typer.Option("--model", "-m", help="A model card directory: built for --device first.")
    ] = None,
    bundle: Annotated[
        Path | None,
        typer.Option("--bundle", "-b", help="A bundle folder or .tar.gz (edgekit build wrote it)."),
    ] = None,
    sign_key: Annotated[
        Path | None,
        typer.Option(
            "--sign-key",
            help="With --model: sign the bundle (devices install signed ones only). With --fleet: "
            "sign each command too (agents take signed ones only).",
        ),
    ] = None,
    host: HostOpt = None,
    port: PortOpt = None,
    key: KeyOpt = None,
    known_hosts: KnownHostsOpt = None,
    accept_new_host_key: AcceptNewOpt = False,
    ssh_config: SshConfigOpt = None,
    connect_timeout: ConnectTimeoutOpt = 10.0,
    root: RootOpt = "/var/lib/edgekit",
    remote_edgekit: RemoteEdgekitOpt = "edgekit",
    deploy_id: IdOpt = None,
    budget: Annotated[
        float | None,
        typer.Option(
            "--budget",
            min=0.001,
            help="SSH: the budget (ms) the device runs at; its health gate holds p99 to it.",
        ),
    ] = None,
    fleet: FleetOpt = None,
    target: TargetOpt = None,
    group: GroupOpt = None,
    mqtt: MqttOpt = None,
    canary: Annotated[
        str | None,
        typer.Option("--canary", help="Fleet: deploy to this share first (10%).", rich_help_panel="Fleet"),
    ] = None,
    canary_window: Annotated[
        str | None,
        typer.Option(
            "--canary-window", help="Fleet: watch the canaries this long (60s).", rich_help_panel="Fleet"
        ),
    ] = None,
    slo_p95_ms: Annotated[
        float | None,
        typer.Option(
            "--slo-p95-ms", help="Fleet: canary p95 limit (default: the budget).", rich_help_panel="Fleet"
        ),
    ] = None,
    waves: Annotated[
        str | None,
        typer.Option(
            "--waves",
            help="Fleet: roll out in waves of these shares, each gated on the SLO (1,10,50,100).",
            rich_help_panel="Fleet",
        ),
    ] = None,
    wave_window: Annotated[
        str | None,
        typer.Option(
            "--wave-window", help="Fleet: watch each wave this long (60s).", rich_help_panel="Fleet"
        ),
    ] = None,
    state: Annotated[
        Path | None,
        typer.Option(
            "--state",
            help="Fleet: the wave rollout's state file; run again to continue (.edgekit/rollouts/<fleet>.json).",
            rich_help_panel="Fleet",
        ),
    ] = None,
    state_db: Annotated[
        str | None,
        typer.Option(
            "--state-db",
            help="Fleet: keep the wave rollout's state in this fleet store too (fleet serve's --db).",
            rich_help_panel="Fleet",
        ),
    ] = None,
    artifacts: Annotated[
        Path | None,
        typer.Option("--artifacts", help="Fleet: folder edgekit fleet serve hosts.", rich_help_panel="Fleet"),
    ] = None,
    artifact_url: Annotated[
        str | None,
        typer.Option(
            "--artifact-url", help="Fleet: URL of that folder for the agents.", rich_help_panel="Fleet"
        ),
    ] = None,
    artifact_token_file: Annotated[
        Path | None,
        typer.Option(
            "--artifact-token-file",
            help="Fleet: the artifact port's download token (or EDGEKIT_ARTIFACT_TOKEN), to check it serves the bundle.",
            rich_help_panel="Fleet",
        ),
    ] = None,
    unsigned_commands: UnsignedOpt = False,
    as_json: JsonLinesOpt = False,
) -> None:
    """Build (with --model) and ship a bundle to a device; it becomes active only if it passes the health gate.

    Exit 0: installed and active. Exit 1: the device refused it and kept what it ran.
    """
    if ctx.invoked_subcommand is not None:
        return
    fleet_only = {
        "--target": target,
        "--group": group,
        "--mqtt": mqtt,
        "--canary": canary,
        "--canary-window": canary_window,
        "--slo-p95-ms": slo_p95_ms,
        "--waves": waves,
        "--wave-window": wave_window,
        "--state": state,
        "--state-db": state_db,
        "--artifacts": artifacts,
        "--artifact-url": artifact_url,
        "--artifact-token-file": artifact_token_file,
        "--unsigned-commands": unsigned_commands,
    }
    _one_transport(host, fleet, fleet_only)
    if artifact_url is not None:  # the --mqtt URL is warned about where it is parsed (BrokerConfig)
        from edgekit.core.redact import warn_secret_on_command_line

        warn_secret_on_command_line(
            artifact_url,
            "the token in",
            "it also goes to every device in the deploy command; serve the bundles without one "
            "(edgekit fleet serve --artifacts-port: devices check each bundle's hash and signature)",
        )
    if fleet and budget is not None:
        raise DeployError(
            "--budget is for --host: over MQTT each agent gates at the budget it runs with",
            "start the agents with `edgekit agent run --budget MS` instead",
        )
    if (model is None) == (bundle is None):
        raise DeployError(
            "give exactly one of --model DIR (built for --device first) or --bundle B",
            "for example --model models/efficientnet-lite0 --sign-key KEY.pem, or --bundle bundles/enl0-x86",
        )
    if model is not None and device is None:
        raise DeployError("--model needs --device: the bundle is built for it", "for example --device jetson")
    profile = _profile(device) if device else None
    if model is not None:
        assert profile is not None
        bundle = _build(model, profile, sign_key, as_json)
    assert bundle is not None
    _check_bundle(bundle, profile)
    if fleet:
        req = FleetRequest(
            "deploy",
            fleet,
            tuple(target or ()),
            group,
            mqtt,
            bundle=bundle,
            deploy_id=deploy_id,
            canary=canary,
            canary_window=canary_window,
            slo_p95_ms=slo_p95_ms,
            artifacts=artifacts,
            artifact_url=artifact_url,
            as_json=as_json,
            sign_key=sign_key,
            unsigned=unsigned_commands,
            artifact_token_file=artifact_token_file,
            waves=waves,
            wave_window=wave_window,
            state=state,
            state_db=state_db,
        )
        raise typer.Exit(_fleet(req))
    assert host is not None
    from edgekit.deploy.remote import deploy_over_ssh

    ssh = _target(
        host, port, key, known_hosts, accept_new_host_key, ssh_config, connect_timeout, remote_edgekit
    )
    with DeployDisplay(as_json, f"deploy {bundle.name} to {host}") as show:
        outcome = deploy_over_ssh(
            ssh, bundle, root=root, deploy_id=deploy_id, profile=profile, progress=show, budget_ms=budget
        )
        show.finish(outcome.result)
    print_outcome(outcome, as_json, "deploy")
    raise typer.Exit(0 if outcome.ok else 1)


@deploy_app.command("rollback")
def rollback_command(
    host: HostOpt = None,
    port: PortOpt = None,
    key: KeyOpt = None,
    known_hosts: KnownHostsOpt = None,
    accept_new_host_key: AcceptNewOpt = False,
    ssh_config: SshConfigOpt = None,
    connect_timeout: ConnectTimeoutOpt = 10.0,
    root: RootOpt = "/var/lib/edgekit",
    remote_edgekit: RemoteEdgekitOpt = "edgekit",
    deploy_id: IdOpt = None,
    fleet: FleetOpt = None,
    target: TargetOpt = None,
    group: GroupOpt = None,
    mqtt: MqttOpt = None,
    sign_key: FleetSignKeyOpt = None,
    unsigned_commands: UnsignedOpt = False,
    as_json: JsonLinesOpt = False,
) -> None:
    """Make the device's previous bundle active again (it is health-checked before the switch)."""
    fleet_only = {
        "--target": target,
        "--group": group,
        "--mqtt": mqtt,
        "--sign-key": sign_key,
        "--unsigned-commands": unsigned_commands,
    }
    _one_transport(host, fleet, fleet_only)
    if fleet:
        req = FleetRequest(
            "rollback",
            fleet,
            tuple(target or ()),
            group,
            mqtt,
            deploy_id=deploy_id,
            as_json=as_json,
            sign_key=sign_key,
            unsigned=unsigned_commands,
        )
        raise typer.Exit(_fleet(req))
    assert host is not None
    from edgekit.deploy.remote import rollback_over_ssh

    ssh = _target(
        host, port, key, known_hosts, accept_new_host_key, ssh_config, connect_timeout, remote_edgekit
    )
    with DeployDisplay(as_json, f"rollback on {host}") as show:
        outcome = rollback_over_ssh(ssh, root=root, deploy_id=deploy_id, progress=show)
        show.finish(outcome.result)
    print_outcome(outcome, as_json, "rollback")
    raise typer.Exit(0 if outcome.ok else 1)


@deploy_app.command("control")
def control_command(
    action: Annotated[str, typer.Argument(help="pause, resume or abort.")],
    fleet: Annotated[str, typer.Option("--fleet", help="The fleet the rollout goes to.")],
    rollout_id: Annotated[str, typer.Option("--id", help="The rollout's id (its first line says it).")],
    mqtt: MqttOpt = None,
    reason: Annotated[str, typer.Option("--reason", help="Why: shown by the rollout and kept.")] = "",
) -> None:
    """Pause, resume or abort a running wave rollout (a retained message it reads, even after a restart).

    pause: no more commands go out until resume; abort: the devices that switched are rolled back.
    """
    from edgekit.deploy.waves import send_control

    send_control(mqtt or "mqtt://127.0.0.1:1883", fleet, rollout_id, action.lower(), reason)
    console.print(f"rollout {rollout_id} of fleet {fleet}: {action.lower()} sent", highlight=False)


def _profile(device: str) -> str:
    from edgekit.device.profiles import get_profile

    return get_profile(device).name


def _build(model: Path, profile: str, sign_key: Path | None, as_json: bool) -> Path:
    """``edgekit build --model MODEL --device PROFILE`` with its defaults: the same folder and cache."""
    from edgekit.commands.build import _with_progress
    from edgekit.convert.build_records import BuildRequest
    from edgekit.convert.builder import build
    from edgekit.convert.modelcard import read_card

    if sign_key is None:
        raise DeployError(
            "a device installs signed bundles only: --model needs --sign-key KEY.pem",
            "make a key with `edgekit keys generate`, and trust its .pub.pem on the device once: "
            "edgekit agent trust KEY.pub.pem",
        )
    card = read_card(model)
    out = Path("bundles") / f"{card.name}-{profile}"
    out.parent.mkdir(parents=True, exist_ok=True)
    req = BuildRequest(card=card, device=profile, out=out, sign_key=sign_key)
    if as_json:
        with stdout_to_stderr():  # stdout carries the deploy's JSON lines only
            result = build(req)
    else:
        result = _with_progress(req, build)
    return Path(result.bundle)


def _check_bundle(bundle: Path, profile: str | None) -> None:
    """Refuse here, before any copy, what the device would refuse: not a bundle, broken, unsigned, wrong device."""
    from edgekit.bundle.verify import verify

    report = verify(bundle)
    if not report.ok:
        first = report.failures[0]
        raise DeployError(
            f"{bundle} does not verify: {first.detail}", first.hint or "rebuild it with edgekit build"
        )
    if report.signature == "unsigned":
        raise DeployError(
            f"{bundle} is not signed, and devices install signed bundles only",
            "build it with --sign-key KEY.pem (edgekit keys generate) and trust the .pub.pem on the device",
        )
    manifest = report.manifest
    if profile and manifest is not None and manifest.device.profile != profile:
        raise DeployError(
            f"{bundle} was built for {manifest.device.profile}, not {profile}",
            f"build it for the device: edgekit build --device {profile} ...",
        )


# -- fleet mode (MQTT): the canary rollout of edgekit.deploy.rollout -----------------------------


def _fleet_rollout(req: FleetRequest) -> int:
    """``edgekit deploy --fleet`` / ``edgekit deploy rollback --fleet``: progress lines, then the report."""
    from edgekit.core.tokens import ARTIFACT_TOKEN_ENV, read_token
    from edgekit.deploy.rollout import run

    token = read_token(req.artifact_token_file, ARTIFACT_TOKEN_ENV, "--artifact-token-file")
    show = FleetDisplay(req.as_json)
    report = run(
        req.fleet,
        req.mqtt or "mqtt://127.0.0.1:1883",
        bundle=req.bundle,
        targets=req.targets,
        group=req.group,
        artifacts=req.artifacts,
        artifact_url=req.artifact_url,
        deploy_id=req.deploy_id,
        canary=req.canary,
        canary_window=req.canary_window,
        slo_p95_ms=req.slo_p95_ms,
        action=req.action,
        sign_key=req.sign_key,
        unsigned=req.unsigned,
        artifact_token=token,
        on_event=show,
        waves=req.waves,
        wave_window=req.wave_window,
        state=req.state,
        state_db=req.state_db,
    )
    show.finish(report.to_dict())
    return 0 if report.ok else 1
