"""``edgekit deploy --fleet F``: a canary rollout of one bundle to a fleet's agents over MQTT.

::

    1. the archive goes into the folder ``edgekit fleet serve --artifacts DIR`` hosts
       (its URL, SHA-256 and size go into each command; each command is signed with
       --sign-key, good for --timeout and once: ``edgekit.deploy.command_trust``)
    2. members: the retained ``edgekit/v1/<fleet>/+/agent`` messages (online ones; --group or --target)
    3. canaries: ceil(share x members), the first by name (a repeatable choice), get the
       deploy command; their final results are awaited (a failed health gate fails the rollout)
    4. their live telemetry is watched for the canary window, from the first window the
       *new* pipeline reports (a status birth that is new since the command, of the new
       version): the merged latency sketch's p95 must stay within --slo-p95-ms (default:
       the budget the device reports) and the miss rate within 1%
    5. a breach, a failure or no telemetry: rollback commands to the canaries that switched,
       stop, exit 1 — the rest never get the command; otherwise the rest get it, and their
       results are awaited

Percentiles are never averaged: the windows' latency sketches are merged, and p95 is
read from the merge.  The windows are taken by the fleet collector, de-duplicated as
``edgekit fleet serve`` de-duplicates them (on ``(device, epoch, seq)``).

The parts: ``publish`` (the artifact), ``link`` (the MQTT client), ``members`` (who, how many
canaries), ``canary`` (the window's telemetry through the fleet collector, and the verdict).
With ``--waves 1,10,50,100`` the artifact goes out in gated waves instead, with pause, abort and
a state file to continue from: ``edgekit.deploy.waves``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.core.names import safe_name
from edgekit.core.units import parse_seconds
from edgekit.deploy.canary import DEFAULT_MISS_RATE, CanaryWatch
from edgekit.deploy.command_trust import load_signing_key, sign_command
from edgekit.deploy.link import FleetLink
from edgekit.deploy.members import Member, canary_count, choose_members, parse_share
from edgekit.deploy.publish import Artifact, check_served, publish_artifact
from edgekit.errors import DeployError
from edgekit.protocol.control import (
    Command,
    deploy_message,
    new_deploy_id,
    rollback_message,
    safe_deploy_id,
)

Event = Callable[[str, dict[str, Any]], None]
"""``on_event(kind, info)``: ``members``, ``send``, ``progress``, ``result``, ``watch``, ``verdict``, ``done``."""

DEFAULT_TIMEOUT_S = 900.0


@dataclass
class RolloutReport:
    """What happened: who got what, each final result, the canaries' health, and the outcome."""

    action: str
    fleet: str
    deploy_id: str
    # deployed | done (a fleet rollback that worked) | canary-failed | rolled-back | partial | failed
    outcome: str = "pending"
    artifact: dict[str, Any] | None = None
    members: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    canaries: list[str] = field(default_factory=list)
    rest: list[str] = field(default_factory=list)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    health: dict[str, dict[str, Any]] = field(default_factory=dict)
    rolled_back: dict[str, dict[str, Any]] = field(default_factory=dict)
    waves: dict[str, Any] | None = None  # a wave rollout's state (edgekit.deploy.waves)
    reason: str = ""
    started_at: float = field(default_factory=time.time)
    ended_at: float | None = None

    @property
    def ok(self) -> bool:
        return self.outcome in ("deployed", "done")  # a wave rollout's final status is one of these too

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "fleet": self.fleet,
            "id": self.deploy_id,
            "ok": self.ok,
            "outcome": self.outcome,
            "reason": self.reason,
            "artifact": self.artifact,
            "members": self.members,
            "skipped": self.skipped,
            "canaries": self.canaries,
            "rest": self.rest,
            "results": self.results,
            "health": self.health,
            "rolled_back": self.rolled_back,
            "waves": self.waves,
            "started_at": round(self.started_at, 3),
            "ended_at": None if self.ended_at is None else round(self.ended_at, 3),
        }


def rollback_id(deploy_id: str) -> str:
    """The id of the rollback that undoes ``deploy_id`` (``<id>-rb``, kept within 64 characters)."""
    return f"{deploy_id[:61]}-rb"


# -- the rollout ----------------------------------------------------------------------------------


@dataclass
class RolloutOptions:
    """What to roll out where, and the canary's rules."""

    fleet: str
    mqtt: str
    targets: Sequence[str] = ()
    group: str | None = None
    bundle: Path | None = None
    artifacts: Path | None = None
    artifact_url: str | None = None
    deploy_id: str | None = None
    canary_share: float | None = None
    canary_window_s: float = 60.0
    slo_p95_ms: float | None = None
    slo_miss_rate: float = DEFAULT_MISS_RATE
    timeout_s: float = DEFAULT_TIMEOUT_S
    startup_grace_s: float = 120.0
    artifact_token: str | None = None  # the artifact port's download token: to check the archive is served
    sign_key: Path | None = None  # Ed25519 private key the agents trust; None: unsigned commands
    unsigned: bool = False  # say so to send unsigned commands (agents with --allow-unsigned-commands)
    waves: list[float] | None = None  # --waves: shares of the fleet, rising to 1 (edgekit.deploy.waves)
    wave_window_s: float = 60.0
    state_path: Path | None = None  # --state: where a wave rollout keeps its state
    state_db: str | None = None  # --state-db: the fleet store to keep it in too


class Rollout:
    """One fleet deploy (``deploy()``) or rollback (``rollback()``); ``report`` says what happened."""

    def __init__(self, options: RolloutOptions, on_event: Event | None = None) -> None:
        o = options
        if not safe_name(o.fleet):
            raise DeployError(f"fleet {o.fleet!r} is not a safe name", "1-128 of A-Z a-z 0-9 . _ -")
        for device in o.targets:
            if not safe_name(device):
                raise DeployError(f"--target {device!r} is not a device id", "1-128 of A-Z a-z 0-9 . _ -")
        if bool(o.targets) == (o.group is not None):
            raise DeployError(
                "say which devices: --target D (repeatable) or --group G", "e.g. --group lobby --canary 10%"
            )
        if o.deploy_id is not None and not safe_deploy_id(o.deploy_id):
            raise DeployError(
                f"--id {o.deploy_id!r} is not a deploy id", "1-64 of A-Z a-z 0-9 . _ - starting with a letter"
            )
        if (o.sign_key is None) != o.unsigned:
            raise DeployError(
                "fleet commands are signed: pass --sign-key KEY.pem (a key the agents trust)"
                if o.sign_key is None
                else "--sign-key and --unsigned-commands contradict each other",
                "agents refuse unsigned commands unless run with --allow-unsigned-commands "
                "(then pass --unsigned-commands)",
            )
        self._key = load_signing_key(o.sign_key) if o.sign_key is not None else None
        self.options = o
        self.on_event = on_event or (lambda kind, info: None)
        self.report = RolloutReport("deploy", o.fleet, o.deploy_id or "")

    def _event(self, kind: str, **info: Any) -> None:
        self.on_event(kind, info)

    def _members(self, link: FleetLink) -> list[Member]:
        o = self.options
        members, skipped = choose_members(link.snapshot_agents(), o.targets, o.group)
        self.report.members = [m.device for m in members]
        self.report.skipped = skipped
        self._event("members", members=[m.device for m in members], skipped=skipped)
        if not members:
            where = f"group {o.group!r}" if o.group is not None else f"targets {', '.join(o.targets)}"
            raise DeployError(
                f"no online agent in fleet {o.fleet!r} for {where}"
                + (f" ({'; '.join(f'{d}: {why}' for d, why in skipped.items())})" if skipped else ""),
                "start `edgekit agent run --fleet F --device-id D [--group G]` on the devices",
            )
        return members

    # -- deploy ---------------------------------------------------------------------------------

    def deploy(self) -> RolloutReport:
        """Run the rollout; never raises for a device's refusal (that is in the report), only for setup errors."""
        o = self.options
        if o.bundle is None or o.artifacts is None or o.artifact_url is None:
            raise DeployError(
                "a fleet deploy needs --bundle (or --model), --artifacts DIR and --artifact-url URL",
                "e.g. --artifacts /srv/edgekit/artifacts --artifact-url http://server:8765/artifacts "
                "(what `edgekit fleet serve --artifacts DIR` serves)",
            )
        from edgekit.core.redact import redact_url

        artifact = publish_artifact(o.bundle, o.artifacts, o.artifact_url)
        problem = check_served(artifact, token=o.artifact_token)
        if problem is not None and "HTTP 404" in problem:
            raise DeployError(
                redact_url(problem), "--artifact-url must be where the server serves --artifacts DIR"
            )
        report = self.report
        report.deploy_id = o.deploy_id or new_deploy_id("d", artifact.sha256)
        report.artifact = {
            "name": artifact.name,
            "url": redact_url(artifact.url),  # the report is printed and logged; the command has the URL
            "sha256": artifact.sha256,
            "size": artifact.size,
            "model": artifact.model,
            "version": artifact.version,
        }
        self._event("artifact", **report.artifact, warning=problem and redact_url(problem))
        if o.waves is not None:
            return self._deploy_waves(artifact)
        link = FleetLink(o.mqtt, o.fleet).connect()
        link.on_progress = lambda body: self._event("progress", **body)
        try:
            self._deploy(link, artifact)
        finally:
            link.close()
            report.ended_at = time.time()
            self._event("done", outcome=report.outcome, ok=report.ok, reason=report.reason)
        return report

    def _deploy_waves(self, artifact: Artifact) -> RolloutReport:
        """``--waves``: edgekit.deploy.waves runs it (or continues the one its state file holds)."""
        from edgekit.deploy.waves import WaveOptions, WaveRollout, default_state_path

        o, report = self.options, self.report
        assert o.waves is not None
        options = WaveOptions(
            shares=o.waves,
            state_path=o.state_path or default_state_path(o.fleet),
            state_db=o.state_db,
            window_s=o.wave_window_s,
            slo_p95_ms=o.slo_p95_ms,
            slo_miss_rate=o.slo_miss_rate,
            startup_grace_s=o.startup_grace_s,
            timeout_s=o.timeout_s,
        )
        waves = WaveRollout(o.fleet, o.mqtt, options, sign_key=o.sign_key, on_event=self.on_event)
        try:
            state = waves.run(artifact, report.deploy_id, o.targets, o.group)
        finally:
            report.ended_at = time.time()
        report.deploy_id = state.id
        report.outcome = state.status
        report.reason = state.reason
        report.members = sorted(d for wave in state.waves for d in wave)
        report.results, report.rolled_back = state.results, state.rolled_back
        report.waves = state.to_dict()
        return report

    def _signed(self, cmd: Command) -> Command:
        return sign_command(cmd, self._key) if self._key is not None else cmd

    def _commands(self, devices: Sequence[str], artifact: Artifact) -> list[Command]:
        rid, ttl = self.report.deploy_id, self.options.timeout_s
        return [
            self._signed(
                deploy_message(
                    rid, d, artifact.url, artifact.sha256, artifact.size, ttl, fleet=self.options.fleet
                )
            )
            for d in devices
        ]

    def _rollbacks(self, rid: str, devices: Sequence[str]) -> list[Command]:
        o = self.options
        return [self._signed(rollback_message(rid, d, o.timeout_s, fleet=o.fleet)) for d in devices]

    def _send_and_wait(
        self, link: FleetLink, commands: Sequence[Command], phase: str, undo: bool = False
    ) -> dict[str, bool]:
        """Send ``commands``, wait for their final results; record them (``undo``: as rollbacks); device -> ok."""
        for cmd in commands:
            self._event("send", device=cmd.device, id=cmd.id, action=cmd.action, phase=phase)
            link.send(cmd)
        keys = [(c.device, c.id) for c in commands]
        finals = link.wait_finals(keys, self.options.timeout_s)
        oks: dict[str, bool] = {}
        for device, rid in keys:
            body = finals.get((device, rid))
            if body is None:
                body = {
                    "ok": False,
                    "step": "timeout",
                    "reason": f"no final result within {self.options.timeout_s:g} s",
                }
            target = self.report.rolled_back if undo else self.report.results
            target[device] = {
                k: body.get(k) for k in ("ok", "step", "reason", "hint", "version", "health", "replayed")
            }
            oks[device] = bool(body.get("ok"))
            self._event("result", device=device, phase=phase, **target[device])
        return oks

    def _deploy(self, link: FleetLink, artifact: Artifact) -> None:
        o, report = self.options, self.report
        members = self._members(link)
        devices = [m.device for m in members]
        share = o.canary_share
        canaries = devices[: canary_count(len(devices), share)] if share is not None else []
        rest = [d for d in devices if d not in canaries]
        report.canaries, report.rest = canaries, rest
        if canaries:
            pipelines = {m.device: m.pipeline for m in members}
            # Sessions that exist now are the old version's: the window must only count the new one's.
            old_sessions = {d: link.snapshot_sessions(d) for d in canaries}
            link.watch(d for d in canaries if pipelines.get(d) != "none")
            oks = self._send_and_wait(link, self._commands(canaries, artifact), "canary")
            if not all(oks.values()):
                failed = [d for d in canaries if not oks[d]]
                report.reason = "canary " + ", ".join(
                    f"{d} failed at {report.results[d].get('step')}: {report.results[d].get('reason')}"
                    for d in failed
                )
                report.outcome = "canary-failed"
                # Only those that switched: a rollback where the install failed would go one version too far.
                self._roll_back(link, [d for d in canaries if oks[d]])
                return
            breaches = self._watch(link, canaries, old_sessions, pipelines, artifact.version)
            if breaches:
                report.reason = "; ".join(f"{d}: {why}" for d, why in breaches.items())
                report.outcome = "rolled-back"
                self._roll_back(link, canaries)
                return
        if rest:
            oks = self._send_and_wait(link, self._commands(rest, artifact), "rest")
            if not all(oks.values()):
                failed = [d for d in rest if not oks[d]]
                report.outcome = _outcome(oks)
                report.reason = ", ".join(
                    f"{d} failed at {report.results[d].get('step')}: {report.results[d].get('reason')}"
                    for d in failed
                )
                return
        report.outcome = "deployed"

    def _roll_back(self, link: FleetLink, devices: Sequence[str]) -> None:
        if not devices:
            return
        rid = rollback_id(self.report.deploy_id)
        self._send_and_wait(link, self._rollbacks(rid, devices), "rollback", undo=True)

    def _watch(
        self,
        link: FleetLink,
        canaries: Sequence[str],
        old_sessions: dict[str, set[str]],
        pipelines: dict[str, str | None],
        version: str,
    ) -> dict[str, str]:
        """Watch the canaries' new pipelines for the window; device -> why it breached (empty: all held)."""
        o = self.options
        watched = [d for d in canaries if pipelines.get(d) != "none"]
        for d in canaries:
            if d not in watched:
                self.report.health[d] = {
                    "device": d,
                    "breach": None,
                    "note": "no pipeline runs there: nothing to watch",
                }
        canary = CanaryWatch(o.fleet, o.slo_p95_ms, o.slo_miss_rate)
        try:
            return self._verdict(link, canary, watched, old_sessions, version)
        finally:
            canary.close()

    def _verdict(
        self,
        link: FleetLink,
        canary: CanaryWatch,
        watched: Sequence[str],
        old_sessions: dict[str, set[str]],
        version: str,
    ) -> dict[str, str]:
        o = self.options
        started = time.monotonic()
        first: dict[str, float] = {}
        self._event("watch", devices=watched, window_s=o.canary_window_s, slo_p95_ms=o.slo_p95_ms)
        while True:
            now = time.monotonic()
            health = {
                d: canary.health(d, link.births(d), link.telemetry_of(d), old_sessions[d], version)
                for d in watched
            }
            for d, h in health.items():
                if h.frames and d not in first:
                    first[d] = now
            waiting = [d for d in watched if d not in first]
            if waiting and now - started > o.startup_grace_s:
                for d in waiting:
                    health[d].breach = f"no telemetry from the new version within {o.startup_grace_s:g} s"
                break
            if not waiting and all(now - first[d] >= o.canary_window_s for d in watched):
                break
            time.sleep(0.25)
        breaches: dict[str, str] = {}
        for d, h in health.items():
            if h.breach is None:
                h.breach = canary.judge(h)
            self.report.health[d] = h.to_dict()
            if h.breach is not None:
                breaches[d] = h.breach
        self._event("verdict", health=self.report.health, breaches=breaches)
        return breaches

    # -- rollback -------------------------------------------------------------------------------

    def rollback(self) -> RolloutReport:
        """Send a rollback command to every chosen device and wait for the results."""
        o, report = self.options, self.report
        report.action = "rollback"
        report.deploy_id = o.deploy_id or new_deploy_id("rb")
        link = FleetLink(o.mqtt, o.fleet).connect()
        link.on_progress = lambda body: self._event("progress", **body)
        try:
            devices = [m.device for m in self._members(link)]
            oks = self._send_and_wait(link, self._rollbacks(report.deploy_id, devices), "rollback")
            report.outcome = "done" if all(oks.values()) else _outcome(oks)
            failed = [d for d in devices if not oks[d]]
            report.reason = ", ".join(f"{d}: {report.results[d].get('reason')}" for d in failed)
        finally:
            link.close()
            report.ended_at = time.time()
            self._event("done", outcome=report.outcome, ok=report.ok, reason=report.reason)
        return report


def _outcome(oks: dict[str, bool]) -> str:
    """``deployed`` (all ok), ``partial`` (some) or ``failed`` (none)."""
    if all(oks.values()):
        return "deployed"
    return "partial" if any(oks.values()) else "failed"


def run(
    fleet: str,
    mqtt: str,
    *,
    bundle: Path | None = None,
    targets: Sequence[str] = (),
    group: str | None = None,
    artifacts: Path | None = None,
    artifact_url: str | None = None,
    deploy_id: str | None = None,
    canary: str | None = None,
    canary_window: str | None = None,
    slo_p95_ms: float | None = None,
    action: str = "deploy",
    sign_key: Path | None = None,
    unsigned: bool = False,
    artifact_token: str | None = None,
    on_event: Event | None = None,
    waves: str | None = None,
    wave_window: str | None = None,
    state: Path | None = None,
    state_db: str | None = None,
) -> RolloutReport:
    """A fleet deploy (``action="deploy"``) or rollback from command-line values (``"10%"``, ``"60s"``)."""
    options = RolloutOptions(
        fleet=fleet,
        mqtt=mqtt,
        targets=tuple(targets),
        group=group,
        bundle=bundle,
        artifacts=artifacts,
        artifact_url=artifact_url,
        deploy_id=deploy_id,
        canary_share=parse_share(canary) if canary else None,
        canary_window_s=parse_seconds(canary_window, "--canary-window") if canary_window else 60.0,
        slo_p95_ms=slo_p95_ms,
        sign_key=sign_key,
        unsigned=unsigned,
        artifact_token=artifact_token,
        waves=None,
        wave_window_s=parse_seconds(wave_window, "--wave-window") if wave_window else 60.0,
        state_path=state,
        state_db=state_db,
    )
    if waves is not None:
        from edgekit.deploy.waves import parse_waves

        if canary is not None:
            raise DeployError(
                "--canary and --waves both say who goes first", "a canary is one wave: --waves 10,100"
            )
        options.waves = parse_waves(waves)
    if slo_p95_ms is not None and not slo_p95_ms > 0:
        raise DeployError(f"--slo-p95-ms {slo_p95_ms} is not positive", "a latency in ms, e.g. 30")
    rollout = Rollout(options, on_event)
    return rollout.rollback() if action == "rollback" else rollout.deploy()
